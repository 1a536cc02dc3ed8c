//! Keeps the filters over rows out of memory within their share of the memory budget
//! (`cold_filter`, docs/sizing.md): after each round, pages of the largest filters beyond the
//! share go to the node's page file, and pages on disk whose waiting hashes pile up are read
//! back and have them set. Both a bounded number of pages per round, written and read on a
//! blocking thread, so no round waits on more than a few MiB of disk.

use std::sync::Arc;

use super::cold_filter::{page_file_error, FilterPageFile};
use super::error::RouterError;
use super::family_store::on_blocking_thread;
use super::router::FamilyRouter;

/// Unless configured (`max_filter_bytes`), the filters' share of the memory budget is the
/// families' share (`max_live_bytes`) over this: a quarter of it, an eighth of
/// `memory_budget_bytes`.
const FILTER_SHARE_DIVISOR: usize = 4;
/// Pages (64 KiB) written or read back per round, each: 4 MiB, a few milliseconds of disk.
const MAX_PAGES_PER_ROUND: usize = 64;
/// Hashes that may wait beside pages on disk before the pages with the most are read back:
/// a quarter of the filters' share (8 bytes each), and at least this many. A page read back
/// and written again sets the hashes that waited beside it, so the disk traffic per row of a
/// filter being filled on disk is two pages over the hashes a page gathers: with the waiting
/// hashes an eighth of the share's size as filter bits (a quarter of its bytes, at 8 bytes a
/// hash against 2 bytes a row), ~128 B per row read and as much written while that filter
/// is under 4 times the share. (A sixteenth of the share, first tried: a page read back per
/// ~128 hashes, 1 KiB a row, and throughput 0.74× on a 4 MiB share.)
const MIN_PENDING_LIMIT: usize = 4_096;
const PENDING_SHARE_DIVISOR: usize = 4;

impl FamilyRouter {
    /// The filters' share of the memory budget, in bytes.
    pub(super) fn filter_share_bytes(&self) -> usize {
        (self.config.max_filter_bytes).unwrap_or(self.config.max_live_bytes / FILTER_SHARE_DIVISOR)
    }

    /// How the filters' page file is made when first needed: unnamed, beside the family store
    /// (in the system's temporary directory for a store in memory).
    pub(super) fn page_file_maker(
        &self,
    ) -> impl FnOnce() -> std::io::Result<Arc<FilterPageFile>> + use<> {
        let dir = self.actors.store().scratch_dir();
        move || FilterPageFile::create(dir.as_deref())
    }

    /// Reads back the pages with the most waiting hashes once too many wait, then writes the
    /// pages the filters' memory exceeds its share by to the page file.
    pub(super) async fn keep_filters_in_their_share(&mut self) -> Result<(), RouterError> {
        let share = self.filter_share_bytes();
        let limit = (share / PENDING_SHARE_DIVISOR / 8).max(MIN_PENDING_LIMIT);
        let flushes = self.cold.to_flush(limit, MAX_PAGES_PER_ROUND);
        if !flushes.is_empty() {
            let read = on_blocking_thread("a filter page read", move || {
                (flushes.into_iter())
                    .map(|flush| match flush.read() {
                        Ok(words) => Ok((flush, words)),
                        Err(error) => Err(page_file_error("read a page back from", error)),
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?;
            self.cold.flushed(read);
        }
        let evictions = self.cold.to_evict(share, MAX_PAGES_PER_ROUND);
        if evictions.is_empty() {
            return Ok(());
        }
        let file = self.cold.page_file(self.page_file_maker())?;
        let written = on_blocking_thread("a filter page write", move || {
            (evictions.into_iter())
                .map(|eviction| match file.write(eviction.words()) {
                    Ok(slot) => Ok((eviction, slot)),
                    Err(error) => Err(page_file_error("write a page to", error)),
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
        self.cold.evicted(written);
        Ok(())
    }
}
