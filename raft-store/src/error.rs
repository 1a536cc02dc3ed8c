//! The store's typed errors, and how they cross openraft's `io::Error` boundary.
//!
//! openraft's storage traits return `std::io::Error`; a [`StoreError`] travels inside it as the
//! error's source, so a caller can `downcast_ref::<StoreError>()` to tell a corrupt file from a
//! too-large entry.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong opening, reading or writing the Raft log.
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

    /// A file or directory that was not written by this crate (no Tally segment header where
    /// one must be).
    #[error("raft log {path}: not a Tally raft log ({detail})")]
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

    /// The log is damaged: a frame failing its checksum with valid data after it, a missing
    /// segment, or an invariant of the log broken (a hole, an entry under the wrong index).
    #[error("raft log {path}: corrupt: {detail}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was found.
        detail: String,
    },

    /// Another process (or another store in this one) holds the log open.
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

    /// The writer thread did not report back (it panicked or stopped after a failed write).
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
            StoreError::NotARaftLog { .. }
            | StoreError::UnsupportedVersion { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Decode { .. } => io::ErrorKind::InvalidData,
            StoreError::AlreadyOpen { .. } => io::ErrorKind::WouldBlock,
            StoreError::Encode { .. } | StoreError::Thread(_) => io::ErrorKind::Other,
        }
    }
}

impl From<StoreError> for io::Error {
    fn from(e: StoreError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}
