//! The file's layout: table names, record keys, and the format marker.
//!
//! The marker lets a future build refuse (or migrate) a file it does not understand instead of
//! misreading it, and lets open tell "some other redb file" from "our log".

use std::path::Path;

use redb::{Database, ReadableDatabase, TableDefinition, TableError};

use crate::error::StoreError;

/// Log entries, keyed by their index. The value is the rmp-serde encoded `C::Entry`.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");

/// Single records: vote, committed log id, last purged log id (rmp-serde encoded).
pub(crate) const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");

/// The format marker.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("tally_meta");

pub(crate) const KEY_VOTE: &str = "vote";
pub(crate) const KEY_COMMITTED: &str = "committed";
pub(crate) const KEY_PURGED: &str = "last_purged";

const KEY_MAGIC: &str = "magic";
const KEY_VERSION: &str = "format_version";
const MAGIC: &[u8] = b"tally-raft-log";

/// The on-disk format this build reads and writes. Bump it on any change to the tables or the
/// encoding of a record.
pub const FORMAT_VERSION: u32 = 1;

/// Writes the marker and creates the tables, in one durable transaction.
pub(crate) fn init(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(KEY_MAGIC, MAGIC)?;
        meta.insert(KEY_VERSION, FORMAT_VERSION.to_be_bytes().as_slice())?;
        txn.open_table(LOG)?;
        txn.open_table(STATE)?;
    }
    txn.commit()?;
    Ok(())
}

/// Checks the marker and that every table exists with its expected types.
pub(crate) fn check_format(db: &Database, path: &Path) -> Result<(), StoreError> {
    let not_ours = |detail: String| StoreError::NotARaftLog {
        path: path.to_path_buf(),
        detail,
    };
    let txn = db.begin_read()?;
    let meta = match txn.open_table(META) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => return Err(not_ours("no meta table".into())),
        Err(TableError::Storage(e)) => return Err(e.into()),
        // Wrong key or value types, or a multimap table of that name: someone else's file.
        Err(e) => return Err(not_ours(e.to_string())),
    };
    match meta.get(KEY_MAGIC)? {
        Some(v) if v.value() == MAGIC => {}
        Some(_) => return Err(not_ours("wrong magic".into())),
        None => return Err(not_ours("no magic record".into())),
    }
    let version = match meta.get(KEY_VERSION)? {
        Some(v) => {
            let bytes: [u8; 4] = v.value().try_into().map_err(|_| StoreError::Corrupt {
                path: path.to_path_buf(),
                detail: format!(
                    "format version record is {} bytes, expected 4",
                    v.value().len()
                ),
            })?;
            u32::from_be_bytes(bytes)
        }
        None => return Err(not_ours("no format version record".into())),
    };
    if version != FORMAT_VERSION {
        return Err(StoreError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let missing = |name: &str, e: TableError| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail: format!("table {name}: {e}"),
    };
    txn.open_table(LOG).map_err(|e| missing("raft_log", e))?;
    txn.open_table(STATE)
        .map_err(|e| missing("raft_state", e))?;
    Ok(())
}
