//! The router's side of rows out of memory (`tally_ledger::cold`): before a round, every id
//! its commands name is looked up among their families' rows (the filters first, the store on
//! a blocking thread for those they pass), so the ledger gets its answers as input and never
//! waits on the disk; after the round, the rows it moved out are written to the store before
//! the next round can name them.

use std::collections::BTreeMap;

use tally_ledger::{ColdFetch, ColdKey, FamilyId, MovedRow};

use super::batch::FamilyWork;
use super::error::RouterError;
use super::family_store::{cold_row_key, on_blocking_thread};
use super::router::FamilyRouter;

/// One id a round looks up: its family, its key, and its store key when the filters passed it.
struct Lookup {
    family_id: FamilyId,
    key: ColdKey,
    store_key: Option<Vec<u8>>,
}

impl FamilyRouter {
    /// For each family of the round with rows out of memory, the answer for every id its
    /// commands name (`Command::cold_keys`).
    pub(super) async fn fetch_cold(
        &mut self,
        work: &BTreeMap<FamilyId, FamilyWork>,
    ) -> Result<BTreeMap<FamilyId, ColdFetch>, RouterError> {
        let mut lookups = Vec::new();
        for (family_id, family_work) in work {
            if self.cold.rows(family_id) == 0 {
                continue;
            }
            for (_, command) in &family_work.commands {
                for key in command.cold_keys() {
                    let bytes = key.to_bytes();
                    let store_key = (self.cold.may_contain(family_id, &bytes))
                        .then(|| cold_row_key(family_id, &bytes));
                    lookups.push(Lookup {
                        family_id: family_id.clone(),
                        key,
                        store_key,
                    });
                }
            }
        }
        if lookups.is_empty() {
            return Ok(BTreeMap::new());
        }
        let found = if lookups.iter().any(|lookup| lookup.store_key.is_some()) {
            let view = self.actors.view()?;
            let keys: Vec<Option<Vec<u8>>> = lookups.iter().map(|l| l.store_key.clone()).collect();
            on_blocking_thread("a row lookup", move || {
                keys.into_iter()
                    .map(|key| key.map_or(Ok(None), |key| view.cold_row(&key)))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?
        } else {
            vec![None; lookups.len()]
        };
        let mut fetches: BTreeMap<FamilyId, ColdFetch> = BTreeMap::new();
        for (lookup, row) in lookups.into_iter().zip(found) {
            let fetch = fetches.entry(lookup.family_id.clone()).or_default();
            fetch.record(lookup.key, row.as_deref()).map_err(|error| {
                RouterError::FamilyFailed {
                    family_id: lookup.family_id,
                    reason: error.to_string(),
                }
            })?;
        }
        Ok(fetches)
    }

    /// Checks a family's count of rows out of memory after a batch against the index plus the
    /// rows the batch moved: they differ only if this node lost or invented a row (fatal).
    pub(super) fn check_cold_count(
        &self,
        family_id: &FamilyId,
        family_rows: u64,
        moved: usize,
    ) -> Result<(), RouterError> {
        let indexed = self.cold.rows(family_id);
        if family_rows != indexed + moved as u64 {
            return Err(RouterError::FamilyFailed {
                family_id: family_id.clone(),
                reason: format!(
                    "the family counts {family_rows} rows out of memory, this node stored \
                     {indexed} and the batch moved {moved}"
                ),
            });
        }
        Ok(())
    }

    /// Hands the rows the round moved out of memory to the store and counts them in the
    /// index. On the router's task: the store only takes them into memory, and a blocking
    /// thread is needed only while the disk falls behind.
    pub(super) async fn store_moved(
        &mut self,
        moved: Vec<(FamilyId, Vec<MovedRow>)>,
    ) -> Result<(), RouterError> {
        if moved.iter().all(|(_, rows)| rows.is_empty()) {
            return Ok(());
        }
        let mut rows = Vec::with_capacity(moved.iter().map(|(_, rows)| rows.len()).sum());
        for (family_id, moved) in moved {
            for row in moved {
                self.cold.add(&family_id, &row.key);
                rows.push((cold_row_key(&family_id, &row.key), row.row));
            }
        }
        let store = self.actors.store().clone();
        if store.hand_over_cold_rows(rows)? {
            return Ok(());
        }
        on_blocking_thread("a row write", move || store.wait_for_cold_rows()).await
    }
}
