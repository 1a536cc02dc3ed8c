//! Which families hold live holds: the families `ListHolds` without a family reads. Node-local
//! and derived, like the actor table: it is neither replicated nor digested nor in snapshots;
//! every replica computes it from its own families.
//!
//! A hold is live until compaction archives it (`HoldSlot::Live`), and `Family::list_holds`
//! answers from live holds only, whatever the filter. So a family without a live hold adds no
//! row to any `ListHolds`, and reading only the families here gives exactly the answer of a
//! scan of every family. It is per family, not per hold: a family's live holds, and whether
//! each is open or final, change inside the ledger without naming the hold in any result
//! (compaction archives holds as a side effect of any command; touching an expired hold
//! expires it and answers an error), so the apply results alone cannot keep a per-hold index
//! exact. Each family's actor reports whether the family holds live holds after each batch
//! (`Family::live_hold_count`, one integer), which keeps this exact. A final hold
//! stays live until compaction archives it (`retention_ms` after it is final), so a family
//! stays here that long after its last hold ended.
//!
//! After a restore every family is passivated and nobody has counted its holds: they are
//! `uncounted`, and reads take them as holding until `rebuild_hold_index` (or the family's
//! next apply) counts them.

use std::collections::BTreeSet;

use tally_ledger::FamilyId;
use tokio::sync::Mutex;

use super::actor_table::{Located, StoredRow};
use super::error::RouterError;
use super::family_store::StoreView;
use super::reads::{decode, off_the_runtime};
use super::router::FamilyRouter;

/// How much one step of `rebuild_hold_index` decodes between two short holds of the lock.
const REBUILD_STEP_FAMILIES: usize = 1_024;
const REBUILD_STEP_BYTES: usize = 8 << 20;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HoldIndex {
    /// Families with at least one live hold.
    holding: BTreeSet<FamilyId>,
    /// Families restored from a snapshot whose holds nobody has counted yet.
    uncounted: BTreeSet<FamilyId>,
}

impl HoldIndex {
    /// The index of a router restored with `families` (every one passivated, none counted).
    pub fn uncounted<'a>(families: impl IntoIterator<Item = &'a FamilyId>) -> Self {
        Self {
            holding: BTreeSet::new(),
            uncounted: families.into_iter().cloned().collect(),
        }
    }

    /// A family's actor applied a batch after which the family holds live holds (`has`), or
    /// not. Touches the set only when that changed (or the family was uncounted).
    pub fn applied(&mut self, family_id: &FamilyId, has: bool) {
        if !self.uncounted.is_empty() {
            self.uncounted.remove(family_id);
        }
        if self.holding.contains(family_id) != has {
            self.set(family_id, has);
        }
    }

    /// Records a count made from the family's bytes; ignored unless it is still uncounted.
    pub fn counted(&mut self, family_id: &FamilyId, has: bool) -> bool {
        let was_uncounted = self.uncounted.remove(family_id);
        if was_uncounted {
            self.set(family_id, has);
        }
        was_uncounted
    }

    fn set(&mut self, family_id: &FamilyId, has: bool) {
        if has {
            self.holding.insert(family_id.clone());
        } else {
            self.holding.remove(family_id);
        }
    }

    /// The families a cross-family `ListHolds` must read: holding ones and uncounted ones.
    pub fn candidates(&self) -> impl Iterator<Item = &FamilyId> {
        self.holding.iter().chain(self.uncounted.iter())
    }

    pub fn holding(&self) -> &BTreeSet<FamilyId> {
        &self.holding
    }

    pub fn uncounted_families(&self) -> &BTreeSet<FamilyId> {
        &self.uncounted
    }
}

/// Counts the live holds of every family a restore left uncounted, decoding their bytes on a
/// blocking thread a step at a time. The lock is held only to pick a step's families and to
/// record their counts, never across the decoding, so apply goes on meanwhile. Until a family
/// is counted a cross-family `ListHolds` reads it anyway, so answers are exact all along; this
/// makes them cheaper. Returns how many families it counted. The state machine runs it after
/// each snapshot install.
pub async fn rebuild_hold_index(router: &Mutex<FamilyRouter>) -> Result<usize, RouterError> {
    let mut counted = 0;
    loop {
        let (step, view) = router.lock().await.uncounted_step()?;
        let Some((first, _)) = step.first() else {
            return Ok(counted);
        };
        let first = first.clone();
        let counts = off_the_runtime(first, move || {
            (step.into_iter())
                .map(|(family_id, row)| {
                    let bytes = view.get(&family_id)?;
                    let has = decode(&family_id, &bytes)?.live_hold_count() > 0;
                    Ok((family_id, row, has))
                })
                .collect::<Result<Vec<_>, RouterError>>()
        })
        .await?;
        // A family whose row changed meanwhile was counted by its apply; a router replaced
        // meanwhile has new rows for every family, so its own rebuild's counts stand and
        // these are dropped. Either way the next step moves on, until none is uncounted.
        counted += router.lock().await.record_counts(counts);
    }
}

impl FamilyRouter {
    /// One step's worth of uncounted families, with their rows and a view to read them.
    #[allow(clippy::type_complexity)]
    fn uncounted_step(&self) -> Result<(Vec<(FamilyId, StoredRow)>, StoreView), RouterError> {
        self.check_running()?;
        let mut step = Vec::new();
        let mut bytes_in_step = 0;
        for family_id in self.holds.uncounted_families() {
            if step.len() >= REBUILD_STEP_FAMILIES || bytes_in_step >= REBUILD_STEP_BYTES {
                break;
            }
            // Uncounted families are passivated: the first apply to one counts it.
            if let Located::Stored(row) = self.actors.locate(family_id) {
                bytes_in_step += row.bytes;
                step.push((family_id.clone(), row));
            }
        }
        Ok((step, self.actors.view()?))
    }

    /// Records counts made from rows that are still the family's (the same version, so a
    /// count taken from another router's rows is never recorded). Returns how many.
    fn record_counts(&mut self, counts: Vec<(FamilyId, StoredRow, bool)>) -> usize {
        let mut recorded = 0;
        for (family_id, row, has) in counts {
            let same = matches!(
                self.actors.locate(&family_id),
                Located::Stored(now) if now == row
            );
            if same && self.holds.counted(&family_id, has) {
                recorded += 1;
            }
        }
        recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_enter_and_leave_as_their_live_holds_come_and_go() {
        let (a, b, c) = (
            FamilyId::from("a"),
            FamilyId::from("b"),
            FamilyId::from("c"),
        );
        let mut index = HoldIndex::uncounted([&c]);
        index.applied(&a, true);
        index.applied(&b, false);
        assert_eq!(index.candidates().collect::<Vec<_>>(), vec![&a, &c]);
        index.applied(&a, true);
        index.applied(&c, false);
        assert!(index.uncounted_families().is_empty(), "its apply counted c");
        assert_eq!(index.candidates().collect::<Vec<_>>(), vec![&a]);
        assert!(!index.counted(&c, true), "c is counted already: ignored");
        index.applied(&a, false);
        assert_eq!(index, HoldIndex::default());
    }
}
