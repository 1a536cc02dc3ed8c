//! The router's side of rows out of memory (`tally_ledger::cold`): before a round, every id
//! its commands name is looked up among their families' rows (the filters first, the store on
//! a blocking thread for those they pass), so the ledger gets its answers as input and never
//! waits on the disk; after the round, the rows it moved out are written to the store before
//! the next round can name them.

use std::collections::BTreeMap;

use tally_ledger::{ColdFetch, ColdKey, ColdKeyHash, FamilyId, MovedRow};

use super::batch::FamilyWork;
use super::cold_filter::{page_file_error, BlockRead};
use super::cold_index::Lookup;
use super::cold_keys::{cold_family_prefix, cold_row_key};
use super::error::RouterError;
use super::family_store::{on_blocking_thread, StoreView};
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
        // The ids the filters passed on to the store or to their blocks on disk, and their
        // store keys.
        let mut lookups: Vec<(FamilyId, ColdKey, ColdKeyHash)> = Vec::new();
        let mut store_keys: Vec<(Vec<u8>, Vec<BlockRead>)> = Vec::new();
        for (family_id, family_work) in work {
            let Some(mut filters) = self.cold.family(family_id) else {
                continue;
            };
            let mut fetch = ColdFetch::default();
            for (_, command) in &family_work.commands {
                for key in command.cold_key_refs() {
                    let hash = key.key_hash();
                    let blocks = match filters.lookup(hash) {
                        Lookup::Absent => {
                            fetch.record_absent(hash);
                            continue;
                        }
                        Lookup::Maybe => Vec::new(),
                        Lookup::Read(blocks) => blocks,
                    };
                    lookups.push((family_id.clone(), key.to_key(), hash));
                    store_keys.push((cold_row_key(family_id, &key.to_bytes()), blocks));
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
                .map(|(key, blocks)| look_up(&view, key, blocks))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
        for ((family_id, key, hash), found) in lookups.into_iter().zip(found) {
            let fetch = (fetches.get_mut(&family_id)).expect("a family with a lookup has a fetch");
            let row = match found {
                Found::RuledOut => {
                    self.cold.count_read(false);
                    fetch.record_absent(hash);
                    continue;
                }
                Found::Row { read_blocks, row } => {
                    if read_blocks {
                        self.cold.count_read(true);
                    }
                    row
                }
            };
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

/// What the blocking thread found for one id (`look_up`).
enum Found {
    /// The blocks on disk ruled it out: no filter holds it.
    RuledOut,
    /// The store's answer, and whether blocks on disk were read (and passed it) first.
    Row {
        read_blocks: bool,
        row: Option<Vec<u8>>,
    },
}

/// One id's lookup on the blocking thread. With blocks to read, the store is asked only if
/// one of them may hold the id.
fn look_up(view: &StoreView, key: &[u8], blocks: &[BlockRead]) -> Result<Found, RouterError> {
    for block in blocks {
        let maybe =
            (block.may_contain()).map_err(|error| page_file_error("read a block from", error))?;
        if maybe {
            let row = view.cold_row(key)?;
            return Ok(Found::Row {
                read_blocks: true,
                row,
            });
        }
    }
    if !blocks.is_empty() {
        return Ok(Found::RuledOut);
    }
    let row = view.cold_row(key)?;
    Ok(Found::Row {
        read_blocks: false,
        row,
    })
}
