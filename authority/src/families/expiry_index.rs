//! Which families need a maintenance command, and when: the earliest of a family's next hold
//! expiry and next compaction. The leader reads it on a timer to propose `ExpireHolds`, which
//! also runs an idle family's compaction. Replicated state: it is updated only from apply
//! replies, so it does not depend on which families happen to be live.
//!
//! Every round updates it for each family it touched: families are keyed by `IdKey` (the id's
//! first 24 bytes inline, then the id; the same order as the ids), so an update mostly
//! compares integers held in the tree, not id bytes behind pointers.
//!
//! A lowered retention (rules version 3) brings every family's time forward by the same
//! amount. The index holds each time plus an offset it then raises, so that costs nothing
//! however many families are scheduled; the offset is not state: what the index answers, and
//! how it encodes, is the times.

use std::borrow::Cow;
use std::collections::BTreeSet;

use tally_ledger::{FamilyId, IdKey, IdMap};

/// Past this offset the stored values are rewritten as the times themselves, so `time +
/// offset` never nears `u64::MAX` (cluster times are ~2^41 ms, a lowering at most a year).
const MAX_OFFSET_MS: u64 = 1 << 60;

#[derive(Clone, Debug, Default)]
pub struct ExpiryIndex {
    /// `(time + offset_ms, family)`.
    by_time: BTreeSet<(u64, IdKey<FamilyId>)>,
    /// `time + offset_ms` by family.
    due_at: IdMap<FamilyId, u64>,
    /// How far every time has been brought forward since the values were stored as times.
    offset_ms: u64,
}

impl PartialEq for ExpiryIndex {
    fn eq(&self, other: &Self) -> bool {
        self.as_map() == other.as_map()
    }
}

impl Eq for ExpiryIndex {}

impl ExpiryIndex {
    pub fn from_map(due_at: IdMap<FamilyId, u64>) -> Self {
        let by_time = due_at
            .iter()
            .map(|(family, at)| (*at, IdKey::new(family.clone())))
            .collect();
        Self {
            by_time,
            due_at,
            offset_ms: 0,
        }
    }

    /// Every family's time moves `by_ms` earlier (a time before `by_ms` becomes 0).
    pub fn bring_forward(&mut self, by_ms: u64) {
        self.offset_ms = self.offset_ms.saturating_add(by_ms);
        if self.offset_ms > MAX_OFFSET_MS {
            *self = Self::from_map(self.as_map().into_owned());
        }
    }

    /// Records a family's next maintenance time (`None`: nothing scheduled). Called for every
    /// family of every applied entry, so an unchanged time costs one lookup and a changed one
    /// updates the family's row in place.
    pub fn set(&mut self, family_id: &FamilyId, due_ms: Option<u64>) {
        let due_ms = due_ms.map(|at| {
            at.checked_add(self.offset_ms)
                .expect("maintenance times are cluster times, far below u64::MAX - offset")
        });
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
        let horizon = now_ms.saturating_add(self.offset_ms);
        self.by_time
            .iter()
            .take_while(|(at, _)| *at <= horizon)
            .take(limit)
            .map(|(_, family)| family.id().clone())
            .collect()
    }

    pub fn due_at(&self, family_id: &FamilyId) -> Option<u64> {
        (self.due_at.get(family_id)).map(|at| at.saturating_sub(self.offset_ms))
    }

    /// Every scheduled family and its time: how snapshots and digests carry it (it encodes
    /// as an id-ordered map). Borrowed unless a lowered retention moved the times.
    pub fn as_map(&self) -> Cow<'_, IdMap<FamilyId, u64>> {
        if self.offset_ms == 0 {
            return Cow::Borrowed(&self.due_at);
        }
        let mut times = IdMap::default();
        for (family, at) in self.due_at.iter() {
            times.insert(family.clone(), at.saturating_sub(self.offset_ms));
        }
        Cow::Owned(times)
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
        assert_eq!(index, ExpiryIndex::from_map(index.as_map().into_owned()));
    }

    /// Bringing every time forward answers as an index rebuilt with the earlier times, moves
    /// a time that was earlier than the shift to 0, and a later `set` stores the time given.
    #[test]
    fn bringing_times_forward_answers_as_an_index_built_with_them() {
        let (a, b, c) = (
            FamilyId::from("a"),
            FamilyId::from("b"),
            FamilyId::from("c"),
        );
        let mut index = ExpiryIndex::default();
        index.set(&a, Some(1_000));
        index.set(&b, Some(50));
        index.bring_forward(100);
        let mut rebuilt = ExpiryIndex::default();
        rebuilt.set(&a, Some(900));
        rebuilt.set(&b, Some(0));
        assert_eq!(index, rebuilt);
        assert_eq!(index.as_map(), rebuilt.as_map());
        assert_eq!((index.due_at(&a), index.due_at(&b)), (Some(900), Some(0)));
        assert_eq!(index.due(899, 10), vec![b.clone()]);
        assert_eq!(index.due(900, 10), vec![b.clone(), a.clone()]);
        index.set(&c, Some(950));
        index.set(&a, Some(2_000));
        assert_eq!(index.due_at(&c), Some(950));
        assert_eq!(index.due(1_999, 10), vec![b.clone(), c.clone()]);
        index.bring_forward(MAX_OFFSET_MS);
        assert_eq!(index.offset_ms, 0, "rewritten as times past the limit");
        assert_eq!(index.due(0, 10), vec![a.clone(), b.clone(), c.clone()]);
        assert_eq!(index, ExpiryIndex::from_map(index.as_map().into_owned()));
    }
}
