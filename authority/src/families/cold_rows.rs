//! The router's side of rows out of memory (`tally_ledger::cold`): before a round, every id
//! its commands name is looked up among their families' rows (the filters first, the store on
//! a blocking thread for those they pass), so the ledger gets its answers as input and never
//! waits on the disk; after the round, the rows it moved out are written to the store before
//! the next round can name them.

use std::collections::BTreeMap;

use tally_ledger::{ColdFetch, ColdKey, FamilyId, MovedRow};

use super::batch::FamilyWork;
use super::cold_keys::{cold_family_prefix, cold_row_key};
use super::error::RouterError;
use super::family_store::on_blocking_thread;
use super::router::FamilyRouter;

impl FamilyRouter {
    /// For each family of the round with rows out of memory, the answer for every id its
    /// commands name (`Command::cold_key_refs`). An id the filters rule out is recorded as
    /// not stored by its hash, with no copy of it; only the few they pass go to the store.
    pub(super) async fn fetch_cold(
        &mut self,
        work: &BTreeMap<FamilyId, FamilyWork>,
    ) -> Result<BTreeMap<FamilyId, ColdFetch>, RouterError> {
        let mut fetches = BTreeMap::new();
        // The ids the filters passed on to the store, and their store keys.
        let mut lookups: Vec<(FamilyId, ColdKey)> = Vec::new();
        let mut store_keys: Vec<Vec<u8>> = Vec::new();
        for (family_id, family_work) in work {
            let Some(mut filters) = self.cold.family(family_id) else {
                continue;
            };
            let mut fetch = ColdFetch::default();
            for (_, command) in &family_work.commands {
                for key in command.cold_key_refs() {
                    let hash = key.key_hash();
                    if filters.may_contain(hash) {
                        lookups.push((family_id.clone(), key.to_key()));
                        store_keys.push(cold_row_key(family_id, &key.to_bytes()));
                    } else {
                        fetch.record_absent(hash);
                    }
                }
            }
            fetches.insert(family_id.clone(), fetch);
        }
        if lookups.is_empty() {
            return Ok(fetches);
        }
        let view = self.actors.view()?;
        let found = on_blocking_thread("a row lookup", move || {
            (store_keys.iter())
                .map(|key| view.cold_row(key))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
        for ((family_id, key), row) in lookups.into_iter().zip(found) {
            let fetch = (fetches.get_mut(&family_id)).expect("a family with a lookup has a fetch");
            fetch
                .record(key, row.as_deref())
                .map_err(|error| RouterError::FamilyFailed {
                    family_id,
                    reason: error.to_string(),
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
            // The family's part of every store key, escaped once per family.
            let prefix = cold_family_prefix(&family_id);
            for row in moved {
                self.cold.add(&family_id, &row.key);
                let mut key = Vec::with_capacity(prefix.len() + row.key.len());
                key.extend_from_slice(&prefix);
                key.extend_from_slice(&row.key);
                rows.push((key, row.row));
            }
        }
        let store = self.actors.store().clone();
        if store.hand_over_cold_rows(rows)? {
            return Ok(());
        }
        on_blocking_thread("a row write", move || store.wait_for_cold_rows()).await
    }
}
