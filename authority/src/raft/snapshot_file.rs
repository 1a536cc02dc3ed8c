//! Snapshot files, written crash-safely: temp file, fsync, rename, fsync of the directory.
//! Each file carries a magic, a format version and a SHA-256 checksum, so a torn or corrupt
//! file is detected and skipped in favour of the newest valid one, never loaded. A file of
//! another format version is not skipped but refused: the log behind it may be purged, so
//! starting without it would lose state; the node stops with an error that says what to do.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use sha2::{Digest, Sha256};

use super::types::{Snapshot, SnapshotMeta};

const MAGIC: &[u8; 8] = b"TALLYSNP";
/// The snapshot file's format version, raised whenever the family encoding changes: a file
/// of another version would not decode, so it is refused by its version, not misread.
const FORMAT_VERSION: u32 = 2;
const SUFFIX: &str = ".tsnap";
/// Snapshots kept on disk: the newest and one fallback.
const KEEP: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("snapshot file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("snapshot file {path} is invalid: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(
        "snapshot file {path} has format version {version} and this tally-node reads only \
         version {reads}: another release wrote it. Run that release, or start this node from \
         an empty data dir so that it receives a snapshot from the cluster"
    )]
    Incompatible {
        path: PathBuf,
        version: u32,
        reads: u32,
    },
}

impl From<SnapshotFileError> for io::Error {
    fn from(error: SnapshotFileError) -> Self {
        io::Error::other(error)
    }
}

/// The directory holding a node's snapshots.
#[derive(Clone, Debug)]
pub struct SnapshotDir {
    dir: PathBuf,
    /// Held while a file is written and old ones pruned. The node's own snapshot builder and
    /// an install from the leader may save at the same time; unserialised, each could prune
    /// what the other had just removed, and the install would fail with "No such file", which
    /// openraft treats as fatal.
    writing: Arc<Mutex<()>>,
}

impl SnapshotDir {
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, SnapshotFileError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| SnapshotFileError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Self {
            dir,
            writing: Arc::default(),
        })
    }

    /// Writes `snapshot` durably, then removes all but the newest `KEEP` files.
    pub fn save(&self, snapshot: &Snapshot) -> Result<PathBuf, SnapshotFileError> {
        let index = snapshot.meta.last_log_id.map_or(0, |id| id.index);
        let term = snapshot.meta.last_log_id.map_or(0, |id| id.leader_id.term);
        let name = format!("snapshot-{index:020}-{term:020}{SUFFIX}");
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SnapshotFileError::Io { path, source }
        };
        let bytes = encode(&snapshot.meta, &snapshot.snapshot)?;
        // The lock guards no data, so a writer that panicked left nothing half-updated here.
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        {
            let mut file = fs::File::create(&tmp).map_err(io_err(&tmp))?;
            file.write_all(&bytes).map_err(io_err(&tmp))?;
            file.sync_all().map_err(io_err(&tmp))?;
        }
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))?;
        self.prune()?;
        Ok(path)
    }

    /// The newest snapshot that verifies. Invalid files are reported and skipped; a file of
    /// another format version is an error.
    pub fn load_latest(&self) -> Result<Option<Snapshot>, SnapshotFileError> {
        for path in self.files()?.into_iter().rev() {
            match read(&path) {
                Ok(snapshot) => return Ok(Some(snapshot)),
                Err(error @ SnapshotFileError::Incompatible { .. }) => return Err(error),
                Err(error) => tracing::error!(%error, "skipping an invalid snapshot file"),
            }
        }
        Ok(None)
    }

    fn files(&self) -> Result<Vec<PathBuf>, SnapshotFileError> {
        let entries = fs::read_dir(&self.dir).map_err(|source| SnapshotFileError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.to_string_lossy().ends_with(SUFFIX))
            .collect();
        files.sort();
        Ok(files)
    }

    fn prune(&self) -> Result<(), SnapshotFileError> {
        let files = self.files()?;
        for old in files.iter().take(files.len().saturating_sub(KEEP)) {
            match fs::remove_file(old) {
                // Gone already (an operator, or a node sharing the directory by mistake):
                // what pruning wanted.
                Err(source) if source.kind() != io::ErrorKind::NotFound => {
                    return Err(SnapshotFileError::Io {
                        path: old.clone(),
                        source,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn encode(meta: &SnapshotMeta, data: &[u8]) -> Result<Vec<u8>, SnapshotFileError> {
    let meta_bytes = rmp_serde::to_vec(meta).map_err(|e| SnapshotFileError::Invalid {
        path: PathBuf::new(),
        reason: format!("meta does not encode: {e}"),
    })?;
    let mut out = Vec::with_capacity(data.len() + meta_bytes.len() + 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    out.extend_from_slice(&(meta_bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(&meta_bytes);
    out.extend_from_slice(&(data.len() as u64).to_be_bytes());
    out.extend_from_slice(data);
    let checksum = Sha256::digest(&out);
    out.extend_from_slice(&checksum);
    Ok(out)
}

fn read(path: &Path) -> Result<Snapshot, SnapshotFileError> {
    let invalid = |reason: &str| SnapshotFileError::Invalid {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| SnapshotFileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() < MAGIC.len() + 4 + 8 + 8 + 32 {
        return Err(invalid("too short"));
    }
    let (body, checksum) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != checksum {
        return Err(invalid("checksum mismatch"));
    }
    if &body[..8] != MAGIC {
        return Err(invalid("not a Tally snapshot"));
    }
    let version = u32::from_be_bytes(body[8..12].try_into().map_err(|_| invalid("header"))?);
    if version != FORMAT_VERSION {
        return Err(SnapshotFileError::Incompatible {
            path: path.to_path_buf(),
            version,
            reads: FORMAT_VERSION,
        });
    }
    let mut at: usize = 12;
    let mut take = |len: usize| -> Result<&[u8], SnapshotFileError> {
        let end = at
            .checked_add(len)
            .filter(|end| *end <= body.len())
            .ok_or_else(|| invalid("truncated"))?;
        let slice = &body[at..end];
        at = end;
        Ok(slice)
    };
    let meta_len =
        u64::from_be_bytes(take(8)?.try_into().map_err(|_| invalid("meta length"))?) as usize;
    let meta: SnapshotMeta =
        rmp_serde::from_slice(take(meta_len)?).map_err(|e| invalid(&format!("meta: {e}")))?;
    let data_len =
        u64::from_be_bytes(take(8)?.try_into().map_err(|_| invalid("data length"))?) as usize;
    let data = take(data_len)?.to_vec();
    Ok(Snapshot {
        meta,
        snapshot: data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(data: &[u8]) -> Snapshot {
        Snapshot {
            meta: SnapshotMeta::default(),
            snapshot: data.to_vec(),
        }
    }

    /// Rewrites the file's version field and checksum, as another release would have.
    fn set_version(path: &Path, version: u32) {
        let mut bytes = fs::read(path).expect("read");
        let body_len = bytes.len() - 32;
        bytes[8..12].copy_from_slice(&version.to_be_bytes());
        let checksum = Sha256::digest(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&checksum);
        fs::write(path, bytes).expect("write");
    }

    fn snapshot_at(index: u64, data: &[u8]) -> Snapshot {
        let mut snapshot = snapshot(data);
        snapshot.meta.last_log_id = Some(
            openraft::testing::log_id::<crate::raft::types::TypeConfig>(1, 1, index),
        );
        snapshot
    }

    /// The snapshot builder and an install from the leader may save at the same time, and
    /// each prunes old files: neither may fail because the other removed a file first.
    #[test]
    fn concurrent_saves_all_succeed_and_keep_the_newest_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        let writers: Vec<_> = (0..4u64)
            .map(|writer| {
                let snapshots = snapshots.clone();
                std::thread::spawn(move || {
                    for round in 0..40u64 {
                        let index = round * 4 + writer + 1;
                        snapshots
                            .save(&snapshot_at(index, &[7; 4096]))
                            .unwrap_or_else(|error| panic!("save of {index} failed: {error}"));
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().expect("a writer panicked");
        }
        let files = snapshots.files().expect("lists");
        assert_eq!(files.len(), KEEP, "{files:?}");
        let newest = snapshots.load_latest().expect("loads").expect("a file");
        assert_eq!(newest.meta.last_log_id.map(|id| id.index), Some(160));
    }

    #[test]
    fn a_torn_file_is_skipped_and_another_version_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        let path = snapshots.save(&snapshot(b"state")).expect("save");
        let loaded = snapshots.load_latest().expect("loads").expect("one file");
        assert_eq!(loaded.snapshot, b"state");

        set_version(&path, FORMAT_VERSION - 1);
        let refused = snapshots.load_latest().expect_err("another version");
        assert!(
            matches!(refused, SnapshotFileError::Incompatible { version, .. } if version == FORMAT_VERSION - 1),
            "{refused}"
        );
        assert!(refused.to_string().contains("empty data dir"), "{refused}");

        let mut torn = fs::read(&path).expect("read");
        torn.truncate(torn.len() / 2);
        fs::write(&path, torn).expect("write");
        assert!(
            snapshots
                .load_latest()
                .expect("a torn file is skipped")
                .is_none(),
            "no valid file left"
        );
    }
}
