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

use super::cold_index::{ColdIndex, FiltersToSpill, SpilledFilters};
use super::error::RouterError;
use super::family_store::StoreView;
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
    /// the filters of those that have them in the store back into memory, both read (and the
    /// filters decoded) on one blocking thread.
    pub(super) async fn fetch_stored(
        &mut self,
        families: Vec<FamilyId>,
    ) -> Result<BTreeMap<FamilyId, Vec<u8>>, RouterError> {
        let in_store = self.cold.in_store(&families);
        let (fetched, filters) = self
            .actors
            .fetch(families, move |view| read_filters(view, in_store))
            .await?;
        for (family_id, filters) in filters {
            self.cold.reload(&family_id, filters)?;
        }
        Ok(fetched)
    }

    /// Moves the filters of every passivated family to the store: what a router restored
    /// from a snapshot does before it applies anything, since all its families start
    /// passivated. A commit at least every `SPILL_COMMIT_BYTES` of encoded filters, each
    /// dropping its families' filters from memory, so a restart holds the filters and one
    /// commit's encoding, not two copies of them all. Blocking (restores run on a blocking
    /// thread).
    pub(super) fn spill_stored_filters(&mut self) -> Result<(), RouterError> {
        let stored: Vec<FamilyId> = self.actors.stored().keys().cloned().collect();
        let mut batch: Vec<(FamilyId, Vec<u8>)> = Vec::new();
        let mut batch_bytes = 0;
        let mut copies = self.cold.to_spill(&stored).into_iter().peekable();
        while let Some((family_id, filters)) = copies.next() {
            let bytes = filters.encode()?;
            drop(filters);
            batch_bytes += bytes.len();
            batch.push((family_id, bytes));
            if batch_bytes >= SPILL_COMMIT_BYTES || copies.peek().is_none() {
                self.actors.store().write_with_filters(&[], &batch)?;
                let spilled: Vec<FamilyId> = batch.drain(..).map(|(id, _)| id).collect();
                self.cold.spilled(&spilled);
                batch_bytes = 0;
            }
        }
        Ok(())
    }
}

/// Encoded filters a restored router writes to its store per commit (`spill_stored_filters`).
const SPILL_COMMIT_BYTES: usize = 64 << 20;

fn encode(
    copies: Vec<(FamilyId, FiltersToSpill)>,
) -> Result<Vec<(FamilyId, Vec<u8>)>, RouterError> {
    (copies.into_iter())
        .map(|(family_id, filters)| Ok((family_id, filters.encode()?)))
        .collect()
}

/// The filters of `families` as the view holds them, decoded. Blocking.
fn read_filters(
    view: &StoreView,
    families: Vec<FamilyId>,
) -> Result<Vec<(FamilyId, SpilledFilters)>, RouterError> {
    (families.into_iter())
        .map(|family_id| {
            let filters = ColdIndex::decode_spilled(&family_id, &view.filters(&family_id)?)?;
            Ok((family_id, filters))
        })
        .collect()
}
