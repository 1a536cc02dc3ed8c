//! Reading the log: openraft's [`RaftLogReader`] for replication tasks and the state machine.
//!
//! Reads run on the calling task: the newest entries come from the in-memory tail
//! (`entry_cache.rs`), older ones with a `pread` of the segment that holds them (the page
//! cache usually has them). The index maps every live entry to its bytes; a reader copies the
//! locations under a short lock and reads without it, so a write never waits for a reader.
//! Every read checks what it returns (each entry under its own index, no hole in a range), so
//! damage that slipped past the checksums at open surfaces as an error, never as a shorter log.

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};

use openraft::storage::RaftLogReader;
use openraft::type_config::alias::VoteOf;
use openraft::{OptionalSend, RaftTypeConfig};

use crate::entry_cache::EntryCache;
use crate::metrics::StoreMetrics;
use crate::wal::{half_open, Wal};

/// A cheap, cloneable read handle for openraft's replication tasks and state machine worker:
/// the cached tail of the log when the range starts there, else the file.
pub struct LogReader<C: RaftTypeConfig> {
    wal: Arc<Wal>,
    cache: Arc<Mutex<EntryCache<C::Entry>>>,
    metrics: Arc<StoreMetrics>,
    _types: PhantomData<fn() -> C>,
}

impl<C: RaftTypeConfig> LogReader<C> {
    pub(crate) fn new(
        wal: Arc<Wal>,
        cache: Arc<Mutex<EntryCache<C::Entry>>>,
        metrics: Arc<StoreMetrics>,
    ) -> Self {
        Self {
            wal,
            cache,
            metrics,
            _types: PhantomData,
        }
    }
}

impl<C: RaftTypeConfig> Clone for LogReader<C> {
    fn clone(&self) -> Self {
        Self::new(self.wal.clone(), self.cache.clone(), self.metrics.clone())
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for LogReader<C>
where
    C::Entry: Clone,
{
    /// Entries in `range` that are present; an error if a present range has a hole or an
    /// entry does not decode.
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        let Some((start, end)) = half_open(range) else {
            return Ok(Vec::new());
        };
        // Entries not yet written are only in the cache, and the cache never evicts them
        // (`entry_cache.rs`), so the file answers up to where the cached tail begins and the
        // cache the rest. If the tail moved on meanwhile, what it let go is in the file: read
        // on from there.
        let mut entries = Vec::new();
        let mut next = start;
        let mut from_cache = true;
        loop {
            let (cached, first_cached) = {
                let cache = self.cache.lock().expect("entry cache lock");
                (cache.range(next, end), cache.first_cached())
            };
            if let Some(tail) = cached {
                entries.extend(tail);
                break;
            }
            from_cache = false;
            match first_cached {
                Some(first) if next < first && end.is_none_or(|end| end > first) => {
                    entries.extend(self.wal.read_entries::<C>(next..first)?);
                    next = first;
                }
                _ => {
                    entries.extend(match end {
                        Some(end) => self.wal.read_entries::<C>(next..end)?,
                        None => self.wal.read_entries::<C>(next..)?,
                    });
                    break;
                }
            }
        }
        self.metrics.record_read(from_cache);
        Ok(entries)
    }

    /// The vote as of the last `save_vote` that returned.
    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(self.wal.vote()?)
    }
}
