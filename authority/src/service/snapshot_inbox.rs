//! Receiving a snapshot from the leader: the chunks go to a file in the data dir as they
//! arrive, not into memory, and each chunk must arrive within `snapshot_chunk_timeout_ms`.
//! A sender that stalls (a slow or hostile peer) then holds one file handle and one slot
//! for at most that long, never a growing buffer, and never the node's attention: only one
//! install streams at a time, a second is refused at once with UNAVAILABLE.
//!
//! The finished file is handed on open (openraft's snapshot data is a file handle,
//! `SnapshotFile`), so the install streams it into a family store: no copy of it is ever
//! whole in memory, and there is no size cap beyond the disk's (the disk watcher's `NoSpace`
//! alarm, docs/spec.md §5.6).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tally_api::pb::SnapshotChunk;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tonic::Status;

/// Where incoming snapshots are written, under the node's data dir. Files left by a node
/// that stopped mid-install are removed when the node starts.
pub const INCOMING_DIR: &str = "snapshots-incoming";

/// One snapshot stream received completely: its decoded header and its data, in a file
/// that is already unlinked (it lives as long as the handle).
pub struct Received<H> {
    pub header: H,
    pub file: std::fs::File,
    pub len: u64,
}

pub struct SnapshotInbox {
    dir: PathBuf,
    chunk_timeout: Duration,
    /// One install at a time: a second would only compete for the same disk and memory.
    streaming: Arc<Semaphore>,
    /// Names each stream's file uniquely within this process.
    next_file: AtomicU64,
}

impl SnapshotInbox {
    /// Prepares `<data_dir>/snapshots-incoming`, removing what an earlier run left there.
    pub fn open(data_dir: &Path, chunk_timeout: Duration) -> std::io::Result<Self> {
        assert!(
            !chunk_timeout.is_zero(),
            "a zero chunk timeout would refuse every snapshot"
        );
        let dir = data_dir.join(INCOMING_DIR);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            chunk_timeout,
            streaming: Arc::new(Semaphore::new(1)),
            next_file: AtomicU64::new(0),
        })
    }

    /// Receives one stream of chunks into a file and returns its contents. `on_header`
    /// decodes the first chunk's header before any data is written, and may refuse it (the
    /// caller checks who sends).
    pub async fn receive<S, H>(
        &self,
        mut chunks: S,
        on_header: impl FnOnce(&[u8]) -> Result<H, Status>,
    ) -> Result<Received<H>, Status>
    where
        S: Stream<Item = Result<SnapshotChunk, Status>> + Unpin,
    {
        let _slot = self.streaming.clone().try_acquire_owned().map_err(|_| {
            Status::unavailable("another snapshot is being installed on this node; retry later")
        })?;
        let path = self.dir.join(format!(
            "{}.part",
            self.next_file.fetch_add(1, Ordering::Relaxed)
        ));
        let result = self.receive_into(&path, &mut chunks, on_header).await;
        // The file is scratch space whatever happened: the data is returned or refused.
        let _ = tokio::fs::remove_file(&path).await;
        result
    }

    async fn receive_into<S, H>(
        &self,
        path: &Path,
        chunks: &mut S,
        on_header: impl FnOnce(&[u8]) -> Result<H, Status>,
    ) -> Result<Received<H>, Status>
    where
        S: Stream<Item = Result<SnapshotChunk, Status>> + Unpin,
    {
        let mut file = tokio::fs::File::create(path)
            .await
            .map_err(|e| disk_error(path, e))?;
        let mut on_header = Some(on_header);
        let mut header = None;
        let mut written: u64 = 0;
        loop {
            let chunk = match tokio::time::timeout(self.chunk_timeout, chunks.next()).await {
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!(
                        "no snapshot chunk for {} ms after {written} bytes; the install is \
                         abandoned",
                        self.chunk_timeout.as_millis()
                    )))
                }
                Ok(None) => {
                    return Err(Status::invalid_argument(if header.is_none() {
                        "snapshot stream without a header".to_owned()
                    } else {
                        format!("snapshot stream ended before its last chunk, at {written} bytes")
                    }))
                }
                Ok(Some(chunk)) => chunk?,
            };
            if let Some(decode) = on_header.take() {
                header = Some(decode(&chunk.header)?);
            }
            if chunk.offset != written {
                return Err(Status::invalid_argument(format!(
                    "snapshot chunk at offset {} after {written} bytes",
                    chunk.offset
                )));
            }
            let size = chunk.data.len() as u64;
            file.write_all(&chunk.data)
                .await
                .map_err(|e| disk_error(path, e))?;
            written += size;
            if chunk.done {
                break;
            }
        }
        file.flush().await.map_err(|e| disk_error(path, e))?;
        drop(file);
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| disk_error(path, e))?
            .into_std()
            .await;
        let len = file.metadata().map_err(|e| disk_error(path, e))?.len();
        assert_eq!(
            len, written,
            "the snapshot file holds exactly the chunks written to it"
        );
        Ok(Received {
            header: header.expect("a stream that ended with its last chunk had a first chunk"),
            file,
            len,
        })
    }
}

fn disk_error(path: &Path, error: std::io::Error) -> Status {
    Status::unavailable(format!(
        "incoming snapshot file {}: {error}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, data: &[u8], done: bool) -> Result<SnapshotChunk, Status> {
        Ok(SnapshotChunk {
            header: b"hdr".to_vec().into(),
            offset,
            data: data.to_vec().into(),
            done,
        })
    }

    fn contents(mut file: std::fs::File) -> Vec<u8> {
        use std::io::Read;
        let mut data = Vec::new();
        file.read_to_end(&mut data).expect("read");
        data
    }

    fn inbox(dir: &Path, timeout_ms: u64) -> SnapshotInbox {
        SnapshotInbox::open(dir, Duration::from_millis(timeout_ms)).expect("inbox")
    }

    #[tokio::test]
    async fn chunks_are_joined_in_order_and_the_file_is_removed() {
        let dir = tempfile::tempdir().expect("dir");
        let inbox = inbox(dir.path(), 1_000);
        let stream = futures_util::stream::iter(vec![
            chunk(0, b"abc", false),
            chunk(3, b"de", false),
            chunk(5, b"", true),
        ]);
        let received = inbox
            .receive(stream, |header| Ok(header.to_vec()))
            .await
            .expect("received");
        assert_eq!(contents(received.file), b"abcde");
        assert_eq!(received.len, 5);
        assert_eq!(received.header, b"hdr");
        let left = std::fs::read_dir(dir.path().join(INCOMING_DIR))
            .expect("dir")
            .count();
        assert_eq!(left, 0, "no scratch file is left behind");
    }

    #[tokio::test]
    async fn a_stalled_sender_is_dropped_after_the_chunk_timeout_and_frees_the_slot() {
        let dir = tempfile::tempdir().expect("dir");
        let inbox = inbox(dir.path(), 100);
        let stalled = futures_util::stream::iter(vec![chunk(0, b"abc", false)])
            .chain(futures_util::stream::pending());
        let status = inbox
            .receive(Box::pin(stalled), |_| Ok(()))
            .await
            .err()
            .expect("a stalled stream is refused");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        let next = futures_util::stream::iter(vec![chunk(0, b"x", true)]);
        let received = inbox
            .receive(next, |_| Ok(()))
            .await
            .expect("slot free again");
        assert_eq!(contents(received.file), b"x");
    }

    #[tokio::test]
    async fn a_second_install_while_one_streams_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("dir");
        let inbox = Arc::new(inbox(dir.path(), 5_000));
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let first = {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
                inbox.receive(stream, |_| Ok(())).await.map(|r| r.len)
            })
        };
        tx.send(chunk(0, b"a", false)).await.expect("send");
        // Wait until the first stream holds the slot.
        while inbox.streaming.available_permits() != 0 {
            tokio::task::yield_now().await;
        }
        let status = inbox
            .receive(
                futures_util::stream::iter(vec![chunk(0, b"b", true)]),
                |_| Ok(()),
            )
            .await
            .err()
            .expect("refused while another streams");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        tx.send(chunk(1, b"b", true)).await.expect("send");
        assert_eq!(first.await.expect("task").expect("first"), 2);
    }

    #[tokio::test]
    async fn a_gap_in_offsets_and_a_refused_header_are_errors() {
        let dir = tempfile::tempdir().expect("dir");
        let inbox = inbox(dir.path(), 1_000);
        let gap = futures_util::stream::iter(vec![chunk(0, b"ab", false), chunk(3, b"c", true)]);
        let status = inbox.receive(gap, |_| Ok(())).await.err().expect("gap");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        let refused = futures_util::stream::iter(vec![chunk(0, b"ab", true)]);
        let status = inbox
            .receive(refused, |_| -> Result<(), Status> {
                Err(Status::permission_denied("not a member"))
            })
            .await
            .err()
            .expect("refused");
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        let empty = futures_util::stream::iter(Vec::new());
        let status = inbox.receive(empty, |_| Ok(())).await.err().expect("empty");
        assert!(status.message().contains("without a header"), "{status:?}");
    }
}
