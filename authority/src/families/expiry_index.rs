//! Which families need a maintenance command, and when: the earliest of a family's next hold
//! expiry and next compaction. The leader reads it on a timer to propose `ExpireHolds`, which
//! also runs an idle family's compaction. Replicated state: it is updated only from apply
//! replies, so it does not depend on which families happen to be live.
//!
//! Every round updates it for each family it touched: families are keyed by `IdKey` (the id's
//! first 24 bytes inline, then the id; the same order as the ids), so an update mostly
//! compares integers held in the tree, not id bytes behind pointers.

use std::collections::BTreeSet;

use tally_ledger::{FamilyId, IdKey, IdMap};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpiryIndex {
    by_time: BTreeSet<(u64, IdKey<FamilyId>)>,
    due_at: IdMap<FamilyId, u64>,
}

impl ExpiryIndex {
    pub fn from_map(due_at: IdMap<FamilyId, u64>) -> Self {
        let by_time = due_at
            .iter()
            .map(|(family, at)| (*at, IdKey::new(family.clone())))
            .collect();
        Self { by_time, due_at }
    }

    /// Records a family's next maintenance time (`None`: nothing scheduled). Called for every
    /// family of every applied entry, so an unchanged time costs one lookup and a changed one
    /// updates the family's row in place.
    pub fn set(&mut self, family_id: &FamilyId, due_ms: Option<u64>) {
        let previous = match (self.due_at.get_mut(family_id), due_ms) {
            (Some(stored), Some(at)) if *stored == at => return,
            (Some(stored), Some(at)) => Some(std::mem::replace(stored, at)),
            (Some(_), None) => self.due_at.remove(family_id),
            (None, None) => return,
            (None, Some(at)) => {
                self.due_at.insert(family_id.clone(), at);
                None
            }
        };
        // One key, moved from the old row to the new one.
        let mut row = (0, IdKey::new(family_id.clone()));
        if let Some(previous) = previous {
            row.0 = previous;
            assert!(
                self.by_time.remove(&row),
                "expiry index: {family_id} was in the map but not in the set"
            );
        }
        if let Some(at) = due_ms {
            row.0 = at;
            self.by_time.insert(row);
        }
        assert_eq!(
            self.due_at.len(),
            self.by_time.len(),
            "expiry index halves diverged"
        );
    }

    /// Families whose maintenance time is at or before `now_ms`, earliest first.
    pub fn due(&self, now_ms: u64, limit: usize) -> Vec<FamilyId> {
        self.by_time
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .take(limit)
            .map(|(_, family)| family.id().clone())
            .collect()
    }

    pub fn due_at(&self, family_id: &FamilyId) -> Option<u64> {
        self.due_at.get(family_id).copied()
    }

    /// Every scheduled family and its time: how snapshots and digests carry it (it encodes
    /// as an id-ordered map).
    pub fn as_map(&self) -> &IdMap<FamilyId, u64> {
        &self.due_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_lists_earliest_first_and_moves_on_update() {
        let (a, b) = (FamilyId::from("a"), FamilyId::from("b"));
        let mut index = ExpiryIndex::default();
        index.set(&a, Some(20));
        index.set(&b, Some(10));
        assert_eq!(index.due(20, 10), vec![b.clone(), a.clone()]);
        assert_eq!(index.due(15, 10), vec![b.clone()]);
        index.set(&b, Some(30));
        assert_eq!(index.due(20, 10), vec![a.clone()]);
        index.set(&b, Some(30));
        assert_eq!(
            index.due(30, 10),
            vec![a.clone(), b.clone()],
            "unchanged: still once"
        );
        index.set(&a, None);
        index.set(&FamilyId::from("c"), None);
        assert!(index.due(25, 10).is_empty());
        assert_eq!(index.as_map().len(), 1, "only b is scheduled");
        assert_eq!(index, ExpiryIndex::from_map(index.as_map().clone()));
    }
}
