//! Reading the log: openraft's [`RaftLogReader`] for replication tasks, and the synchronous
//! reads the store itself uses.
//!
//! Reads run on the calling task: redb serves them from its page cache or with a short `pread`,
//! and a read transaction is an MVCC snapshot, so replication tasks read while an append is
//! committing and see either all of it or none of it. Every read checks what it returns (each
//! entry stored under its own index, no hole in a range), so damage that slipped past the
//! checksum check on open surfaces as an error, never as a shorter log.

use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use openraft::entry::RaftEntry;
use openraft::storage::{LogState, RaftLogReader};
use openraft::type_config::alias::{LogIdOf, VoteOf};
use openraft::{OptionalSend, RaftTypeConfig};
use redb::{Database, ReadableDatabase, ReadableTable};
use serde::de::DeserializeOwned;

use crate::codec::decode;
use crate::entry_cache::EntryCache;
use crate::error::StoreError;
use crate::metrics::StoreMetrics;
use crate::schema::{KEY_PURGED, KEY_VOTE, LOG, STATE};

/// The open database, shared by the store and its readers.
pub(crate) struct Shared {
    pub(crate) db: Database,
    pub(crate) path: PathBuf,
}

impl Shared {
    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            detail,
        }
    }

    /// Entries with index in `range`, in order, each checked against its key and its
    /// neighbour.
    pub(crate) fn read_entries<C: RaftTypeConfig>(
        &self,
        range: impl RangeBounds<u64>,
    ) -> Result<Vec<C::Entry>, StoreError> {
        let Some((start, end)) = half_open(range) else {
            return Ok(Vec::new());
        };
        let txn = self.db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let iter = match end {
            Some(end) => log.range(start..end)?,
            None => log.range(start..)?,
        };
        let mut out: Vec<C::Entry> = Vec::new();
        let mut prev: Option<u64> = None;
        for item in iter {
            let (k, v) = item?;
            let key = k.value();
            let entry: C::Entry = decode(v.value(), || format!("log entry {key}"))?;
            let (_, index) = entry.log_id_parts();
            if index != key {
                return Err(self.corrupt(format!("entry stored under key {key} has index {index}")));
            }
            if let Some(p) = prev {
                if key != p + 1 {
                    return Err(self.corrupt(format!("hole in the log between {p} and {key}")));
                }
            }
            prev = Some(key);
            out.push(entry);
        }
        Ok(out)
    }

    /// One record of the state table.
    pub(crate) fn read_record<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let txn = self.db.begin_read()?;
        let state = txn.open_table(STATE)?;
        match state.get(key)? {
            Some(v) => Ok(Some(decode(v.value(), || format!("record {key}"))?)),
            None => Ok(None),
        }
    }

    /// The indices the stored log holds, `first..end`, or `None` when it is empty.
    pub(crate) fn stored_range(&self) -> Result<Option<(u64, u64)>, StoreError> {
        let txn = self.db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let first = log.first()?.map(|(k, _)| k.value());
        let last = log.last()?.map(|(k, _)| k.value());
        Ok(first.zip(last).map(|(first, last)| (first, last + 1)))
    }

    /// The last purged id and the last log id, from one snapshot of the file.
    pub(crate) fn read_log_state<C: RaftTypeConfig>(&self) -> Result<LogState<C>, StoreError> {
        let txn = self.db.begin_read()?;
        let state = txn.open_table(STATE)?;
        let last_purged_log_id: Option<LogIdOf<C>> = match state.get(KEY_PURGED)? {
            Some(v) => Some(decode(v.value(), || "record last_purged".to_string())?),
            None => None,
        };
        let log = txn.open_table(LOG)?;
        let last_in_log = match log.last()? {
            Some((k, v)) => {
                let key = k.value();
                let entry: C::Entry = decode(v.value(), || format!("log entry {key}"))?;
                let log_id = entry.log_id();
                if log_id.index != key {
                    return Err(self.corrupt(format!(
                        "entry stored under key {key} has index {}",
                        log_id.index
                    )));
                }
                Some(log_id)
            }
            None => None,
        };
        let last_log_id = last_in_log.or_else(|| last_purged_log_id.clone());
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    /// Checks, at open, that the stored log has no hole: keys are consecutive and the first
    /// one follows the last purged id.
    ///
    /// Reads keys only (values are not decoded), once per open.
    pub(crate) fn verify_log<C: RaftTypeConfig>(&self) -> Result<(), StoreError> {
        let purged: Option<LogIdOf<C>> = self.read_record(KEY_PURGED)?;
        let txn = self.db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let mut prev: Option<u64> = None;
        for item in log.range(0u64..)? {
            let (k, _) = item?;
            let key = k.value();
            match (prev, &purged) {
                (Some(p), _) if key != p + 1 => {
                    return Err(self.corrupt(format!("hole in the log between {p} and {key}")));
                }
                (None, Some(purged)) if key != purged.index + 1 => {
                    return Err(self.corrupt(format!(
                        "first entry {key} does not follow the last purged index {}",
                        purged.index
                    )));
                }
                _ => {}
            }
            prev = Some(key);
        }
        Ok(())
    }
}

/// Turns any range of indexes into `start..end` (`end` exclusive, `None` = unbounded), or
/// `None` if the range is empty.
fn half_open(range: impl RangeBounds<u64>) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => None,
    };
    match end {
        Some(end) if end <= start => None,
        _ => Some((start, end)),
    }
}

/// A cheap, cloneable read handle for openraft's replication tasks and state machine worker:
/// the cached tail of the log when the range starts there, else the file.
pub struct RedbLogReader<C: RaftTypeConfig> {
    shared: Arc<Shared>,
    cache: Arc<Mutex<EntryCache<C::Entry>>>,
    metrics: Arc<StoreMetrics>,
    _types: PhantomData<fn() -> C>,
}

impl<C: RaftTypeConfig> RedbLogReader<C> {
    pub(crate) fn new(
        shared: Arc<Shared>,
        cache: Arc<Mutex<EntryCache<C::Entry>>>,
        metrics: Arc<StoreMetrics>,
    ) -> Self {
        Self {
            shared,
            cache,
            metrics,
            _types: PhantomData,
        }
    }
}

impl<C: RaftTypeConfig> Clone for RedbLogReader<C> {
    fn clone(&self) -> Self {
        Self::new(
            self.shared.clone(),
            self.cache.clone(),
            self.metrics.clone(),
        )
    }
}

impl<C: RaftTypeConfig> RaftLogReader<C> for RedbLogReader<C>
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
                    entries.extend(self.shared.read_entries::<C>(next..first)?);
                    next = first;
                }
                _ => {
                    entries.extend(match end {
                        Some(end) => self.shared.read_entries::<C>(next..end)?,
                        None => self.shared.read_entries::<C>(next..)?,
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
        Ok(self.shared.read_record(KEY_VOTE)?)
    }
}

#[cfg(test)]
mod tests {
    use super::half_open;

    #[test]
    #[allow(clippy::reversed_empty_ranges)] // empty ranges are the point of the test
    fn half_open_normalises_every_bound() {
        assert_eq!(half_open(..), Some((0, None)));
        assert_eq!(half_open(3..7), Some((3, Some(7))));
        assert_eq!(half_open(3..=7), Some((3, Some(8))));
        assert_eq!(half_open(5..5), None);
        assert_eq!(half_open(6..=5), None);
        assert_eq!(half_open(..=u64::MAX), Some((0, None)));
        assert_eq!(
            half_open((
                std::ops::Bound::Excluded(u64::MAX),
                std::ops::Bound::Unbounded
            )),
            None
        );
    }
}
