//! The filters over a passivated family's rows out of memory live in the family store with
//! the family, not in memory (docs/sizing.md): they cost 2 bytes a row, for ever, so a node
//! that kept every family's filters in memory would grow without bound over months of
//! history however small its hot state. A family's filters go to the store in the commit
//! that passivates the family (and, for every family, when a router is restored: all of them
//! start passivated) and come back in the read that brings the family back, before a round
//! looks its ids up in them. Snapshots read them from the store's view at their cut. Reads of
//! a passivated family's rows never use the filters (they go to the store), so nothing else
//! waits for them.

use std::collections::BTreeMap;

use super::cold_index::{ColdIndex, FiltersToSpill, PageRoom, SpilledFilters};
use super::error::RouterError;
use super::family_store::{FamilyStore, StoreView};
use super::router::FamilyRouter;
use tally_ledger::FamilyId;

impl FamilyRouter {
    /// Passivates `families` and moves their filters to the store with them (writing only
    /// those whose copy there is not current), a bounded group per commit
    /// (`passivation_groups`).
    pub(super) async fn passivate(&mut self, families: &[FamilyId]) -> Result<(), RouterError> {
        for group in self.passivation_groups(families) {
            let copies = self.cold.to_spill(&group);
            self.actors
                .passivate(&group, move || encode(copies))
                .await?;
            self.cold.spilled(&group);
        }
        Ok(())
    }

    /// Reads the stored bytes of `families` (stored ones, about to be activated) and brings
    /// the filters of those that have them in the store back, both read (and the filters
    /// decoded) on one blocking thread: their pages in memory up to the filters' share, the
    /// rest written to the page file as they are decoded (`ColdIndex::read_back_room`).
    pub(super) async fn fetch_stored(
        &mut self,
        families: Vec<FamilyId>,
    ) -> Result<BTreeMap<FamilyId, Vec<u8>>, RouterError> {
        let in_store = self.cold.in_store(&families);
        let (share, make_file) = (self.filter_share_bytes(), self.page_file_maker());
        let room = self.cold.read_back_room(&in_store, share, make_file)?;
        let (fetched, filters) = self
            .actors
            .fetch(families, move |view| read_filters(view, in_store, room))
            .await?;
        for (family_id, filters) in filters {
            self.cold.reload(&family_id, filters)?;
        }
        Ok(fetched)
    }

    /// Moves the filters of every passivated family still in memory to the store: what a
    /// router built with passivated families does before it applies anything. Restores spill
    /// them as they read them (`snapshot_stream.rs`), so this finds only filters rebuilt from
    /// an older build's runs. A commit at least every `SPILL_COMMIT_BYTES` of encoded filters,
    /// each dropping its families' filters from memory. Blocking (restores run on a blocking
    /// thread).
    pub(super) fn spill_stored_filters(&mut self) -> Result<(), RouterError> {
        let stored: Vec<FamilyId> = self.actors.stored().keys().cloned().collect();
        let copies = self.cold.to_spill(&stored);
        let mut writer = StoredFilterWriter::new(self.actors.store());
        for (family_id, filters) in copies {
            let bytes = filters.encode()?;
            drop(filters);
            let written = writer.push(family_id, bytes)?;
            self.cold.spilled(&written);
        }
        self.cold.spilled(&writer.finish()?);
        Ok(())
    }
}

/// Encoded filters written to the family store per commit while a router is restored or
/// built (`StoredFilterWriter`).
const SPILL_COMMIT_BYTES: usize = 64 << 20;

/// Writes families' encoded filters (`FiltersToSpill::encode`) to the family store, a commit
/// at least every `SPILL_COMMIT_BYTES`: a restore holds one commit's encodings and the family
/// it reads, never every family's filters (a year of history at 100 commands/s is ~8 GB of
/// them). Blocking.
pub(crate) struct StoredFilterWriter<'s> {
    store: &'s FamilyStore,
    batch: Vec<(FamilyId, Vec<u8>)>,
    batch_bytes: usize,
    commit_bytes: usize,
}

impl<'s> StoredFilterWriter<'s> {
    pub fn new(store: &'s FamilyStore) -> Self {
        Self::with_commit_bytes(store, SPILL_COMMIT_BYTES)
    }

    fn with_commit_bytes(store: &'s FamilyStore, commit_bytes: usize) -> Self {
        Self {
            store,
            batch: Vec::new(),
            batch_bytes: 0,
            commit_bytes,
        }
    }

    /// Adds a family's filters; returns the families whose filters the store now holds (none
    /// until a commit).
    pub fn push(
        &mut self,
        family_id: FamilyId,
        bytes: Vec<u8>,
    ) -> Result<Vec<FamilyId>, RouterError> {
        self.batch_bytes += bytes.len();
        self.batch.push((family_id, bytes));
        if self.batch_bytes < self.commit_bytes {
            return Ok(Vec::new());
        }
        self.commit()
    }

    /// Commits what is left; returns those families.
    pub fn finish(mut self) -> Result<Vec<FamilyId>, RouterError> {
        self.commit()
    }

    fn commit(&mut self) -> Result<Vec<FamilyId>, RouterError> {
        if self.batch.is_empty() {
            return Ok(Vec::new());
        }
        self.store.write_with_filters(&[], &self.batch)?;
        self.batch_bytes = 0;
        Ok(self
            .batch
            .drain(..)
            .map(|(family_id, _)| family_id)
            .collect())
    }
}

fn encode(
    copies: Vec<(FamilyId, FiltersToSpill)>,
) -> Result<Vec<(FamilyId, Vec<u8>)>, RouterError> {
    (copies.into_iter())
        .map(|(family_id, filters)| Ok((family_id, filters.encode()?)))
        .collect()
}

/// The filters of `families` as the view holds them, decoded as they are read a chunk at a
/// time, their pages placed by `room`. Blocking.
fn read_filters(
    view: &StoreView,
    families: Vec<FamilyId>,
    mut room: PageRoom,
) -> Result<Vec<(FamilyId, SpilledFilters)>, RouterError> {
    (families.into_iter())
        .map(|family_id| {
            let input = view.filters_reader(&family_id)?;
            let filters = ColdIndex::decode_spilled(&family_id, input, &mut room)?;
            Ok((family_id, filters))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Filters reach the store a commit at a time: a push says which families the commit it
    /// made wrote (none before the batch is full), `finish` writes the rest, and the store
    /// holds each family's bytes as pushed.
    #[test]
    fn filters_are_written_a_commit_at_a_time() {
        let store = FamilyStore::in_memory().expect("an in-memory store");
        let stored = |family_id: &FamilyId| store.view().expect("a view").filters(family_id);
        let mut writer = StoredFilterWriter::with_commit_bytes(&store, 10);
        let (a, b, c) = (
            FamilyId::from("a"),
            FamilyId::from("b"),
            FamilyId::from("c"),
        );
        assert!(writer.push(a.clone(), vec![1; 4]).expect("held").is_empty());
        assert_eq!(
            writer.push(b.clone(), vec![2; 6]).expect("committed"),
            [a.clone(), b.clone()]
        );
        assert!(stored(&a).expect("written") == [1; 4]);
        assert!(writer.push(c.clone(), vec![3; 1]).expect("held").is_empty());
        assert!(stored(&c).is_err(), "not written yet");
        assert_eq!(writer.finish().expect("committed"), [c]);
        assert!(stored(&FamilyId::from("c")).expect("written") == [3; 1]);
        assert!(stored(&b).expect("written") == [2; 6]);
        let empty = StoredFilterWriter::new(&store);
        assert!(
            empty.finish().expect("nothing to fail").is_empty(),
            "nothing to commit"
        );
    }
}
