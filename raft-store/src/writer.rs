//! The one thread that writes the log file.
//!
//! openraft calls `append` from its core task and asks it to return as soon as the entries are
//! readable, reporting durability later through the `IOFlushed` callback. If `append` waited
//! for its fsync, the core could do nothing else meanwhile: the leader would start replicating
//! an entry only after its own fsync, so every command would wait for two fsyncs one after the
//! other (the leader's, then a follower's) instead of side by side. So the store hands every
//! write to this thread, in the order openraft issued them, and returns:
//!
//! - an append is reported through its callback once its frame is durable (`fdatasync` returned);
//! - appends that queued up while a write ran are written together in the next frame (one
//!   fsync for all, the group commit), each callback still called after that commit;
//! - every other write (vote, truncate, purge) takes its turn in the same queue, so it never
//!   overtakes an append issued before it, and the store awaits it;
//! - the committed-id hint is not queued: it waits in the log for the first frame after which
//!   the log holds the entry it names (`Wal::put_committed_hint`).
//!
//! After a failed write the thread refuses every later write: a log that lost one batch
//! must not go on with the next (it would have a hole), and openraft stops on the first error.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use openraft::storage::IOFlushed;
use openraft::type_config::alias::OneshotSenderOf;
use openraft::type_config::async_runtime::oneshot::OneshotSender;
use openraft::type_config::TypeConfigExt;
use openraft::RaftTypeConfig;

use crate::entry_cache::EntryCache;
use crate::error::StoreError;
use crate::metrics::StoreMetrics;
use crate::wal::{Encoded, Wal};

/// Writes waiting for the thread. When it is full, the store waits on a blocking thread for
/// room, so a slow disk holds openraft back instead of queueing without bound.
pub(crate) const MAX_QUEUED_WRITES: usize = 1_024;

/// Most entries written in one frame when appends have queued up.
const MAX_ENTRIES_PER_COMMIT: usize = 4_096;

/// A write other than an append: one frame on the log.
pub(crate) type FileOp = Box<dyn FnOnce(&Wal) -> Result<(), StoreError> + Send>;

pub(crate) enum WriteOp<C: RaftTypeConfig> {
    Append {
        batch: Vec<Encoded>,
        bytes: u64,
        /// The entry cache's generation when the batch was cached (`EntryCache::mark_durable`).
        generation: u64,
        callback: IOFlushed<C>,
    },
    Other {
        op: FileOp,
        /// Told the outcome.
        done: OneshotSenderOf<C, Result<(), StoreError>>,
    },
}

/// The store's end of the queue.
pub(crate) struct LogWriter<C: RaftTypeConfig> {
    /// `None` only while dropping.
    queue: Option<SyncSender<WriteOp<C>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Dropping the store waits for the writes it queued, so the file is closed (and may be opened
/// again) once the store is gone.
impl<C: RaftTypeConfig> Drop for LogWriter<C> {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the raft log writer thread panicked");
            }
        }
    }
}

impl<C: RaftTypeConfig> LogWriter<C> {
    /// Starts the writer thread for `shared`. It ends when the store (the queue's only
    /// sender) is dropped, after writing what was queued.
    pub(crate) fn start<E: Clone + Send + 'static>(
        wal: Arc<Wal>,
        cache: Arc<Mutex<EntryCache<E>>>,
        metrics: Arc<StoreMetrics>,
    ) -> Result<Self, StoreError> {
        let (queue, receiver) = sync_channel(MAX_QUEUED_WRITES);
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".to_owned())
            .spawn(move || run(&wal, &cache, &metrics, &receiver))
            .map_err(|e| StoreError::Thread(e.to_string()))?;
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues `op`; waits (on a blocking thread, never on the async worker) while the queue is
    /// full.
    pub(crate) async fn submit(&self, op: WriteOp<C>) -> Result<(), StoreError> {
        let queue = self.queue.as_ref().ok_or_else(writer_gone)?;
        match queue.try_send(op) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(op)) => {
                let queue = queue.clone();
                match C::spawn_blocking(move || queue.send(op).map_err(|_| ())).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(())) => Err(writer_gone()),
                    Err(e) => Err(StoreError::Thread(e.to_string())),
                }
            }
            Err(TrySendError::Disconnected(_)) => Err(writer_gone()),
        }
    }

    /// Runs `op` in its turn and waits for its outcome.
    pub(crate) async fn write(&self, op: FileOp) -> Result<(), StoreError> {
        let (done, outcome) = C::oneshot();
        self.submit(WriteOp::Other { op, done }).await?;
        outcome.await.map_err(|_| writer_gone())?
    }
}

/// One past the last index of a batch (the store never queues an empty one).
fn end_of(batch: &[Encoded]) -> u64 {
    batch.last().map_or(0, |(index, _)| index + 1)
}

fn writer_gone() -> StoreError {
    StoreError::Thread("the log writer thread has stopped".to_owned())
}

/// Remembers the first failed write and refuses every later one: a log that lost one batch
/// must not go on with the next (it would have a hole).
#[derive(Default)]
struct FirstFailure(Option<String>);

impl FirstFailure {
    fn attempt(
        &mut self,
        write: impl FnOnce() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        if let Some(reason) = &self.0 {
            return Err(StoreError::Thread(reason.clone()));
        }
        let outcome = write();
        if let Err(e) = &outcome {
            tracing::error!(error = %e, "raft log write failed");
            self.0 = Some(format!("an earlier log write failed: {e}"));
        }
        outcome
    }
}

/// Appends written in one frame: their entries, and per append its end, cache
/// generation and callback.
struct Group<C: RaftTypeConfig> {
    batch: Vec<Encoded>,
    bytes: u64,
    written: Vec<(u64, u64)>,
    callbacks: Vec<IOFlushed<C>>,
}

impl<C: RaftTypeConfig> Group<C> {
    fn new(batch: Vec<Encoded>, bytes: u64, generation: u64, callback: IOFlushed<C>) -> Self {
        Self {
            written: vec![(end_of(&batch), generation)],
            batch,
            bytes,
            callbacks: vec![callback],
        }
    }

    /// Takes the appends that queued up behind this one, as long as they continue it (the
    /// group commit). Returns the first queued write it did not take.
    fn take_queued(&mut self, receiver: &Receiver<WriteOp<C>>) -> Option<WriteOp<C>> {
        while self.batch.len() < MAX_ENTRIES_PER_COMMIT {
            match receiver.try_recv() {
                Ok(WriteOp::Append {
                    batch,
                    bytes,
                    generation,
                    callback,
                }) if batch.first().map(|(index, _)| *index) == Some(end_of(&self.batch)) => {
                    self.written.push((end_of(&batch), generation));
                    self.batch.extend(batch);
                    self.bytes += bytes;
                    self.callbacks.push(callback);
                }
                Ok(other) => return Some(other),
                Err(_) => return None,
            }
        }
        None
    }
}

fn run<C: RaftTypeConfig, E: Clone>(
    wal: &Wal,
    cache: &Mutex<EntryCache<E>>,
    metrics: &StoreMetrics,
    receiver: &Receiver<WriteOp<C>>,
) {
    let mut failure = FirstFailure::default();
    let mut next: Option<WriteOp<C>> = None;
    loop {
        let op = match next.take() {
            Some(op) => op,
            None => match receiver.recv() {
                Ok(op) => op,
                Err(_) => {
                    // The store is gone and the queue is empty: write the last hint.
                    if let Err(e) = failure.attempt(|| wal.flush_hint()) {
                        tracing::warn!(error = %e, "the last committed-id hint was not written");
                    }
                    return;
                }
            },
        };
        match op {
            WriteOp::Append {
                batch,
                bytes,
                generation,
                callback,
            } => {
                let mut group = Group::new(batch, bytes, generation, callback);
                next = group.take_queued(receiver);
                match failure.attempt(|| wal.append(&group.batch)) {
                    Ok(()) => {
                        let mut cache = cache.lock().expect("entry cache lock");
                        for (end, generation) in group.written {
                            cache.mark_durable(end, generation);
                        }
                        drop(cache);
                        metrics.record_append(group.batch.len() as u64, group.bytes);
                        #[cfg(feature = "failpoints")]
                        crate::failpoint::abort_if_armed(crate::failpoint::LOG_AFTER_APPEND);
                        for callback in group.callbacks {
                            callback.io_completed(Ok(()));
                        }
                    }
                    Err(e) => {
                        for callback in group.callbacks {
                            callback.io_completed(Err(std::io::Error::other(e.to_string())));
                        }
                    }
                }
            }
            WriteOp::Other { op, done } => {
                let outcome = failure.attempt(|| op(wal));
                if outcome.is_ok() {
                    metrics.record_other_commit();
                }
                // The caller may have stopped waiting; the write stands either way.
                let _ = done.send(outcome);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::entry::RaftEntry;
    use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
    use openraft::type_config::TypeConfigExt;

    use crate::LogStore;

    openraft::declare_raft_types!(
        TestConfig:
            D = u64,
            R = u64,
    );
    type C = TestConfig;
    type Entry = <C as openraft::RaftTypeConfig>::Entry;

    fn entry(index: u64) -> Entry {
        let log_id = openraft::LogId {
            leader_id: openraft::impls::leader_id_adv::LeaderId {
                term: 1,
                node_id: 0,
            },
            index,
        };
        Entry::new_normal(log_id, index)
    }

    /// The point of the writer thread: openraft's core gets `append` back while the write is
    /// still waiting for the disk, with the entries already readable, and hears of
    /// durability only once the frame is durable. Appends that queue up meanwhile
    /// share the next frame.
    #[tokio::test]
    #[allow(clippy::await_holding_lock)] // the lock is held on purpose, against another thread
    async fn append_returns_before_its_write_and_queued_appends_share_one_commit() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = LogStore::<C>::open(dir.path().join("raft-log")).expect("open");
        // Holding the active segment holds the writer thread (an OS thread, not this task) at
        // its next write.
        let wal = store.wal.clone();
        let blocker = wal.active.lock().expect("active segment");
        let mut flushed = Vec::new();
        for index in 0..3 {
            let (tx, rx) = C::oneshot();
            tokio::time::timeout(
                Duration::from_secs(10),
                store.append(vec![entry(index)], IOFlushed::signal(tx)),
            )
            .await
            .expect("append must not wait for the disk")
            .expect("append");
            flushed.push(rx);
        }
        let mut reader = store.get_log_reader().await;
        let read = reader.try_get_log_entries(0..3).await.expect("read");
        assert_eq!(read.len(), 3, "entries are readable when append returns");
        for rx in &mut flushed {
            assert!(
                futures_poll_once(rx).await.is_none(),
                "no callback before the write has committed"
            );
        }
        drop(blocker);
        for rx in flushed {
            rx.await.expect("callback").expect("durable");
        }
        let metrics = store.metrics();
        assert_eq!(metrics.entries, 3);
        assert!(
            metrics.appends <= 2,
            "the appends queued behind the blocked one share a commit: {metrics:?}"
        );
    }

    /// Polls `fut` once: `Some` if it was ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
        use std::task::Poll;
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *fut).poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }
}
