//! The store's typed errors, and how they cross openraft's `io::Error` boundary.
//!
//! openraft's storage traits return `std::io::Error`; a [`StoreError`] travels inside it as the
//! error's source, so a caller can `downcast_ref::<StoreError>()` to tell a corrupt file from a
//! too-large entry.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong opening, reading or writing the Raft log file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file (or its directory) could not be read or written at the OS level.
    #[error("raft log {path}: {source}")]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },

    /// The file is not a redb database at all (wrong magic, random bytes, empty).
    #[error("raft log {path}: not a redb database: {detail}")]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// What redb said.
        detail: String,
    },

    /// The file is a redb database but was not written by this crate (no Tally format marker).
    #[error("raft log {path}: a redb database, but not a Tally raft log ({detail})")]
    NotARaftLog {
        /// The file.
        path: PathBuf,
        /// Which part of the marker is missing or wrong.
        detail: String,
    },

    /// The file was written by a format version this build does not read.
    #[error(
        "raft log {path}: format version {found} is not supported (this build reads {supported})"
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },

    /// The file is damaged: truncated, overwritten, failing a checksum, or breaking an
    /// invariant of the log (a hole, an entry stored under the wrong index).
    #[error("raft log {path}: corrupt: {detail}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was found.
        detail: String,
    },

    /// Another process (or another store in this one) holds the file open.
    #[error("raft log {path}: already open elsewhere")]
    AlreadyOpen {
        /// The file.
        path: PathBuf,
    },

    /// An entry, once encoded, is larger than [`crate::StoreConfig::max_entry_bytes`]; nothing
    /// of the batch was written.
    #[error("log entry {index} is {size} bytes encoded, over the limit of {max} bytes")]
    EntryTooLarge {
        /// Index of the entry.
        index: u64,
        /// Its encoded size.
        size: usize,
        /// The configured limit.
        max: usize,
    },

    /// An append does not continue the stored log; writing it would leave a hole or overwrite
    /// entries without a truncate. Nothing of the batch was written.
    #[error("append does not continue the log: expected index {expected}, got {got}")]
    NotContiguous {
        /// The index that would continue the log.
        expected: u64,
        /// The first index of the batch.
        got: u64,
    },

    /// A value could not be encoded with rmp-serde.
    #[error("encode {what}: {source}")]
    Encode {
        /// Which record.
        what: String,
        /// The encoder's error.
        source: rmp_serde::encode::Error,
    },

    /// A stored record could not be decoded: the file is damaged, or was written with a
    /// different type config.
    #[error("decode {what}: {source}")]
    Decode {
        /// Which record.
        what: String,
        /// The decoder's error.
        source: rmp_serde::decode::Error,
    },

    /// Any other redb failure (I/O during a transaction, a failed commit, ...).
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),

    /// The blocking thread that runs a transaction did not report back (it panicked).
    #[error("storage thread failed: {0}")]
    Thread(String),
}

impl StoreError {
    /// The `io::ErrorKind` that best describes this error for openraft.
    fn kind(&self) -> io::ErrorKind {
        match self {
            StoreError::Io { source, .. } => source.kind(),
            StoreError::EntryTooLarge { .. } | StoreError::NotContiguous { .. } => {
                io::ErrorKind::InvalidInput
            }
            StoreError::NotADatabase { .. }
            | StoreError::NotARaftLog { .. }
            | StoreError::UnsupportedVersion { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Decode { .. } => io::ErrorKind::InvalidData,
            StoreError::AlreadyOpen { .. } => io::ErrorKind::WouldBlock,
            StoreError::Encode { .. } | StoreError::Redb(_) | StoreError::Thread(_) => {
                io::ErrorKind::Other
            }
        }
    }
}

impl From<StoreError> for io::Error {
    fn from(e: StoreError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> StoreError {
                StoreError::Redb(redb::Error::from(e))
            }
        }
    )*};
}

from_redb!(
    redb::StorageError,
    redb::TransactionError,
    redb::TableError,
    redb::CommitError,
    redb::SetDurabilityError
);
