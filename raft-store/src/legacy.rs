//! Moving a node from the single redb file of earlier builds (format 1) to the segment files.
//!
//! A node upgraded in place finds `raft-log.redb` and no log directory. Its entries, vote,
//! committed hint and purged id are copied as they are (the record encoding did not change)
//! into a new log built under a temporary name, synced, and renamed into place; only then is
//! the old file renamed aside. A crash at any step leaves either the old file alone (the next
//! start imports again) or the complete new log.

use std::fs;
use std::path::{Path, PathBuf};

use openraft::type_config::alias::LogIdOf;
use openraft::RaftTypeConfig;
use redb::{ReadableDatabase, TableDefinition};

use crate::codec::decode;
use crate::error::StoreError;
use crate::wal::{Wal, WalConfig};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");

/// Most entries copied per frame while importing.
const IMPORT_BATCH_ENTRIES: usize = 4_096;

/// What an import copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    pub entries: u64,
    /// Where the old file now is.
    pub old_file_renamed: bool,
}

fn redb_error(path: &Path, detail: impl std::fmt::Display) -> StoreError {
    StoreError::NotARaftLog {
        path: path.to_path_buf(),
        detail: format!("not a readable raft log of an earlier build: {detail}"),
    }
}

/// If `old_file` (an earlier build's redb log) exists and `new_dir` does not, copies it into a
/// new log at `new_dir` and renames the old file to `<old_file>.imported`. Returns `None` when
/// there is nothing to import. Blocking.
pub fn import_redb_log<C: RaftTypeConfig>(
    old_file: &Path,
    new_dir: &Path,
) -> Result<Option<Imported>, StoreError> {
    if !old_file.is_file() || new_dir.exists() {
        return Ok(None);
    }
    let building = with_suffix(new_dir, ".importing");
    if building.exists() {
        fs::remove_dir_all(&building).map_err(|source| StoreError::Io {
            path: building.clone(),
            source,
        })?;
    }
    let db = redb::Database::open(old_file).map_err(|e| redb_error(old_file, e))?;
    let txn = db.begin_read().map_err(|e| redb_error(old_file, e))?;
    let state = txn.open_table(STATE).map_err(|e| redb_error(old_file, e))?;
    let record = |key: &str| -> Result<Option<Vec<u8>>, StoreError> {
        Ok(state
            .get(key)
            .map_err(|e| redb_error(old_file, e))?
            .map(|v| v.value().to_vec()))
    };
    let wal = Wal::open(&building, WalConfig::default())?;
    if let Some(vote) = record("vote")? {
        wal.put_vote(&vote)?;
    }
    if let Some(purged) = record("last_purged")? {
        let log_id: LogIdOf<C> = decode(&purged, || "record last_purged".to_owned())?;
        wal.purge(log_id.index, &purged)?;
    }
    let log = txn.open_table(LOG).map_err(|e| redb_error(old_file, e))?;
    let mut entries = 0u64;
    let mut batch = Vec::with_capacity(IMPORT_BATCH_ENTRIES);
    for item in log.range(0u64..).map_err(|e| redb_error(old_file, e))? {
        let (index, bytes) = item.map_err(|e| redb_error(old_file, e))?;
        batch.push((index.value(), bytes.value().to_vec()));
        if batch.len() == IMPORT_BATCH_ENTRIES {
            entries += batch.len() as u64;
            wal.append(&batch)?;
            batch.clear();
        }
    }
    entries += batch.len() as u64;
    wal.append(&batch)?;
    if let Some(committed) = record("committed")? {
        let id: Option<LogIdOf<C>> = decode(&committed, || "record committed".to_owned())?;
        wal.put_committed_hint(&committed, id.map(|id| id.index));
        wal.flush_hint()?;
    }
    drop(wal);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { path, source }
    };
    fs::rename(&building, new_dir).map_err(io(new_dir))?;
    let parent = new_dir.parent().unwrap_or(Path::new("."));
    fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(io(parent))?;
    let aside = with_suffix(old_file, ".imported");
    let old_file_renamed = fs::rename(old_file, &aside).is_ok();
    tracing::info!(
        from = %old_file.display(),
        to = %new_dir.display(),
        entries,
        "imported the raft log of an earlier build"
    );
    Ok(Some(Imported {
        entries,
        old_file_renamed,
    }))
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}
