//! [`LogStore`]: openraft's `RaftLogStorage` on the segment files of `wal.rs`.
//!
//! The async methods are a thin shell: encode and check on the calling task, then hand the
//! write (and its `fdatasync`) to the log's writer thread (`writer.rs`), which runs them
//! in the order openraft issued them, as its storage contract requires. `append` returns once
//! its entries are readable (in the entry cache) and reports durability through openraft's
//! callback; the other writes return when they are durable.

use std::io;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::type_config::alias::{LogIdOf, VoteOf};
use openraft::{OptionalSend, RaftTypeConfig};

use crate::codec::encode;
use crate::entry_cache::{CacheLimits, EntryCache};
use crate::error::StoreError;
use crate::metrics::{MetricsSnapshot, StoreMetrics};
use crate::reader::LogReader;
use crate::wal::{Encoded, Wal, WalConfig};
use crate::writer::{FileOp, LogWriter, WriteOp};

/// Default [`StoreConfig::max_entry_bytes`]: 64 MiB, far above any Tally command batch and far
/// below the 4 GiB a record's length field can say.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 64 << 20;

/// Limits of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Largest encoded entry `append` accepts; a larger one fails the whole call with
    /// [`StoreError::EntryTooLarge`] and nothing is written. A bound here keeps one bad client
    /// batch from stalling every follower's replication and the open-time integrity check.
    pub max_entry_bytes: usize,
    /// How much of the log's tail stays in memory, decoded, for replication and apply to read
    /// (see `entry_cache.rs`).
    pub cache: CacheLimits,
    /// The segment files' size.
    pub wal: WalConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            cache: CacheLimits::default(),
            wal: WalConfig::default(),
        }
    }
}

/// The Raft log, vote and committed id of one node, in one directory of segment files.
///
/// Generic over any [`RaftTypeConfig`]: with openraft's `serde` feature (always on for this
/// crate) its entry, vote and log id types are serde types, which is all the store needs.
/// Not `Clone`: exactly one writer, owned by openraft; readers come from
/// [`RaftLogStorage::get_log_reader`] or [`LogStore::reader`].
pub struct LogStore<C: RaftTypeConfig> {
    pub(crate) wal: Arc<Wal>,
    cache: Arc<Mutex<EntryCache<C::Entry>>>,
    metrics: Arc<StoreMetrics>,
    config: StoreConfig,
    writer: LogWriter<C>,
    /// The indices the log holds once every write issued so far is done, `first..end`
    /// (`None`: empty). `append` checks a batch against it before caching or queueing
    /// anything, so a batch that would leave a hole fails at once with nothing changed.
    issued: Option<(u64, u64)>,
    _types: PhantomData<fn() -> C>,
}

/// Whether a [`LogStore`] has let its directory go ([`LogStore::release_watch`]).
#[derive(Clone, Debug)]
pub struct LogRelease {
    /// The Wal's token, dropped after its directory lock.
    lock_held: std::sync::Weak<()>,
}

impl LogRelease {
    /// True once no store, reader or writer of the log is left and the directory's lock is
    /// closed, so the directory can be opened again. The writer thread is joined when the
    /// store drops, so this turns true with the last handle's drop.
    pub fn is_released(&self) -> bool {
        self.lock_held.strong_count() == 0
    }
}

impl<C: RaftTypeConfig> LogStore<C>
where
    C::Entry: Clone,
{
    /// Opens the log in the directory `path` with [`StoreConfig::default`], creating it if it
    /// does not exist.
    ///
    /// See [`LogStore::open_with`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, StoreConfig::default())
    }

    /// Opens the log in the directory `path`, creating the directory if it does not exist.
    ///
    /// Every segment is read once and each frame's checksum checked. A torn last frame (a
    /// write a crash interrupted, never reported durable) is cut off; anything else that is
    /// damaged, foreign, of another format version, or leaves a hole in the log is an error,
    /// never an empty or shorter store. Another store holding the directory open is
    /// [`StoreError::AlreadyOpen`].
    ///
    /// Blocking: call it before handing the store to openraft, or from a blocking thread.
    pub fn open_with(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self, StoreError> {
        assert!(
            config.max_entry_bytes > 0,
            "StoreConfig::max_entry_bytes must be positive"
        );
        let path = path.as_ref().to_path_buf();
        let wal = Arc::new(Wal::open(&path, config.wal)?);
        let cache = Arc::new(Mutex::new(EntryCache::new(config.cache)));
        let metrics = Arc::new(StoreMetrics::default());
        let issued = wal.stored_range();
        let writer = LogWriter::start(wal.clone(), cache.clone(), metrics.clone())?;
        Ok(Self {
            issued,
            wal,
            cache,
            metrics,
            config,
            writer,
            _types: PhantomData,
        })
    }

    /// The directory this store writes.
    pub fn path(&self) -> &Path {
        &self.wal.dir
    }

    /// How many segment files the log has now (they roll at [`WalConfig::segment_bytes`] and
    /// go once purged).
    pub fn segment_count(&self) -> usize {
        self.wal.segment_count()
    }

    /// The limits this store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The counters now (fsyncs, entries appended; see [`MetricsSnapshot::entries_per_fsync`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// The live counters, to keep for export after the store is moved into openraft.
    pub fn metrics_handle(&self) -> Arc<StoreMetrics> {
        self.metrics.clone()
    }

    /// A watch that tells when every handle to this log (the store, its readers and its
    /// writer thread) is gone, and with them the directory's lock: a process that stops a
    /// store and opens the directory again waits for it instead of failing as
    /// [`StoreError::AlreadyOpen`].
    pub fn release_watch(&self) -> LogRelease {
        LogRelease {
            lock_held: self.wal.release_token(),
        }
    }

    /// A read handle that shares this store's files.
    pub fn reader(&self) -> LogReader<C> {
        LogReader::new(self.wal.clone(), self.cache.clone(), self.metrics.clone())
    }

    /// Encodes a batch, asserting it is contiguous and rejecting an entry over the limit.
    fn encode_batch(&self, entries: &[C::Entry]) -> Result<(Vec<Encoded>, u64), StoreError> {
        let mut out: Vec<Encoded> = Vec::new();
        let mut bytes = 0u64;
        for entry in entries {
            let (_, index) = entry.log_id_parts();
            if let Some((prev, _)) = out.last() {
                assert!(
                    index == prev + 1,
                    "openraft handed append a non-contiguous batch: {index} after {prev}"
                );
            }
            let encoded = encode(entry, || format!("log entry {index}"))?;
            if encoded.len() > self.config.max_entry_bytes {
                return Err(StoreError::EntryTooLarge {
                    index,
                    size: encoded.len(),
                    max: self.config.max_entry_bytes,
                });
            }
            bytes += encoded.len() as u64;
            out.push((index, encoded));
        }
        Ok((out, bytes))
    }

    /// Runs one durable write in its turn on the writer thread and waits for it.
    async fn write_durable<F>(&self, op: F) -> Result<(), StoreError>
    where
        F: FnOnce(&Wal) -> Result<(), StoreError> + Send + 'static,
    {
        self.writer.write(Box::new(op) as FileOp).await
    }
}

/// Tells openraft an append failed, through the callback as well as the return value, so the
/// failure is seen whichever path openraft is waiting on.
fn report_failure<C: RaftTypeConfig>(callback: IOFlushed<C>, e: StoreError) -> io::Error {
    tracing::error!(error = %e, "raft log append failed");
    let err = io::Error::from(e);
    callback.io_completed(Err(io::Error::new(err.kind(), err.to_string())));
    err
}

impl<C: RaftTypeConfig> RaftLogStorage<C> for LogStore<C>
where
    C::Entry: Clone,
{
    type LogReader = LogReader<C>;

    /// Last purged id and last log id.
    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        let mut state = self.wal.read_log_state::<C>()?;
        // Entries issued but not yet written are the log's tail too.
        let stored_end = state.last_log_id.as_ref().map_or(0, |id| id.index + 1);
        if self.issued.is_some_and(|(_, end)| end > stored_end) {
            let last = self.cache.lock().expect("entry cache lock").last();
            if let Some(entry) = last {
                state.last_log_id = Some(entry.log_id());
            }
        }
        Ok(state)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader()
    }

    /// Durable when it returns `Ok`: one frame, one `fdatasync`.
    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), io::Error> {
        let bytes = encode(vote, || "vote".to_string())?;
        Ok(self.write_durable(move |wal| wal.put_vote(&bytes)).await?)
    }

    /// The committed id is a restart hint (how far to replay before the leader says more), so
    /// it is neither queued nor waited for, and written without an fsync of its own: the next
    /// frame that leaves the log holding the entry it names carries it (`Wal::put_committed_hint`).
    /// Queueing it woke the writer thread once per commit for no write, about a tenth of a
    /// follower's context switches per entry. A crash may lose the latest value; the node
    /// then applies a little less at start-up and learns the rest from the leader.
    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let bytes = encode(&committed, || "committed log id".to_string())?;
        self.wal
            .put_committed_hint(&bytes, committed.map(|id| id.index));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        let stored: Option<Option<LogIdOf<C>>> = self.wal.committed()?;
        Ok(stored.flatten())
    }

    /// All entries of the call go into one frame: one `fdatasync`, the group commit. The
    /// callback is called after the `fdatasync`; a crash before that leaves all or none of
    /// the batch (a torn frame is cut off at open). A batch that does not continue the
    /// stored log, or holds an entry over [`StoreConfig::max_entry_bytes`], fails whole with
    /// nothing written.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<C::Entry> = entries.into_iter().collect();
        let (batch, bytes) = match self.encode_batch(&entries) {
            Ok(b) => b,
            Err(e) => return Err(report_failure(callback, e)),
        };
        let Some(&(first_index, _)) = batch.first() else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let end = batch.last().map_or(first_index, |(index, _)| index + 1);
        match self.issued {
            Some((_, expected)) if expected != first_index => {
                return Err(report_failure(
                    callback,
                    StoreError::NotContiguous {
                        expected,
                        got: first_index,
                    },
                ));
            }
            Some((first, _)) => self.issued = Some((first, end)),
            None => self.issued = Some((first_index, end)),
        }
        let sizes: Vec<usize> = batch.iter().map(|(_, bytes)| bytes.len()).collect();
        // Readable from now on, as openraft requires when `append` returns; durable when the
        // writer thread has committed them and called `callback`.
        let generation = {
            let mut cache = self.cache.lock().expect("entry cache lock");
            cache.extend(first_index, entries.into_iter().zip(sizes).collect());
            cache.generation()
        };
        self.writer
            .submit(WriteOp::Append {
                batch,
                bytes,
                generation,
                callback,
            })
            .await?;
        Ok(())
    }

    /// Deletes entries after `last_log_id` (all of them for `None`); durable when it returns.
    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let from = match last_log_id {
            None => 0,
            Some(id) => match id.index.checked_add(1) {
                Some(from) => from,
                None => return Ok(()), // nothing can follow u64::MAX
            },
        };
        // Cut before the file changes, so no reader gets from here what the file no longer has.
        self.cache
            .lock()
            .expect("entry cache lock")
            .truncate_from(from);
        self.issued = match self.issued {
            Some((first, _)) if from <= first => None,
            Some((first, end)) => Some((first, end.min(from))),
            None => None,
        };
        self.write_durable(move |wal| wal.truncate_from(from))
            .await?;
        Ok(())
    }

    /// Deletes entries up to and including `log_id` and records it as the last purged id, in
    /// one frame; durable when it returns. Segments no live entry is in are deleted. A purge below the recorded one is a no-op:
    /// purging never moves backwards.
    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), io::Error> {
        let current: Option<LogIdOf<C>> = self.wal.purged()?;
        if let Some(current) = current {
            if current.index > log_id.index {
                tracing::warn!(%current, requested = %log_id, "purge below the last purged id ignored");
                return Ok(());
            }
        }
        let upto = log_id.index;
        let bytes = encode(&log_id, || "last purged log id".to_string())?;
        self.cache
            .lock()
            .expect("entry cache lock")
            .purge_upto(upto);
        self.issued = match self.issued {
            Some((_, end)) if upto.saturating_add(1) >= end => None,
            Some((first, end)) => Some((first.max(upto + 1), end)),
            None => None,
        };
        self.write_durable(move |wal| wal.purge(upto, &bytes))
            .await?;
        Ok(())
    }
}

impl<C: RaftTypeConfig> std::fmt::Debug for LogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("path", &self.wal.dir)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
