//! Backups of a node's state: its newest snapshot copied out to one file, and an empty data
//! dir seeded with such a file. A node started on the seeded data dir loads the snapshot (its
//! checksum checked) and replays nothing before it; its peers send the rest.
//!
//! A snapshot holds everything applied up to its log index, including the membership, so a
//! whole cluster lost at once is restored by seeding every member's data dir with the same
//! backup and starting them with their old ids and addresses. Writes acknowledged after the
//! snapshot was taken are not in it: take the backup right after a snapshot
//! (`tally-node backup --endpoint` asks the node for one first).

use std::path::{Path, PathBuf};

use super::snapshot_dir;
use crate::raft::snapshot_file::{SnapshotDir, SnapshotFileError};
use crate::raft::types::SnapshotMeta;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0} holds no snapshot yet (a node writes one every snapshot_every_entries entries; `tally-node backup --endpoint` asks for one now)")]
    NoSnapshot(PathBuf),
    #[error("{0} already holds a node's state (a raft log or snapshots); restore only into an empty data dir, so no acknowledged write is ever replaced")]
    NotEmpty(PathBuf),
    #[error("{0} exists; choose another file, so no earlier backup is overwritten")]
    OutputExists(PathBuf),
    #[error(transparent)]
    Snapshot(#[from] SnapshotFileError),
}

/// Copies the newest valid snapshot of `data_dir` to `out`. Safe while the node runs.
/// Blocking.
pub fn export(data_dir: &Path, out: &Path) -> Result<SnapshotMeta, BackupError> {
    if out.exists() {
        return Err(BackupError::OutputExists(out.to_path_buf()));
    }
    let dir = snapshot_dir(data_dir);
    if !dir.is_dir() {
        return Err(BackupError::NoSnapshot(data_dir.to_path_buf()));
    }
    SnapshotDir::open(dir)?
        .export_latest(out)?
        .ok_or_else(|| BackupError::NoSnapshot(data_dir.to_path_buf()))
}

/// Seeds the empty `data_dir` with the backup `from` (checked first). Blocking.
pub fn restore(from: &Path, data_dir: &Path) -> Result<SnapshotMeta, BackupError> {
    if super::holds_state(data_dir) {
        return Err(BackupError::NotEmpty(data_dir.to_path_buf()));
    }
    Ok(SnapshotDir::open(snapshot_dir(data_dir))?.import(from)?)
}
