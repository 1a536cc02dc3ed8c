//! Opening the file: create it crash-safely the first time, and otherwise refuse anything that
//! is not an intact Tally raft log.
//!
//! A new file is initialised under a temporary name and renamed into place, so a file at the
//! real path always carries the format marker: if it does not, it is someone else's file or a
//! damaged one, never "a log that has not been written yet". That is what lets open turn a
//! truncated or overwritten file into an error instead of a fresh, empty log.

use std::fs::{self, File};
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use redb::{Builder, Database, DatabaseError};

use crate::error::StoreError;
use crate::schema;

/// Opens the log at `path`, creating it if no file exists there.
pub(crate) fn open_database(path: &Path) -> Result<Database, StoreError> {
    let exists = path.try_exists().map_err(|source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if !exists {
        create(path)?;
    }
    let db = open_existing(path)?;
    schema::check_format(&db, path)?;
    Ok(db)
}

/// Opens an existing file with redb's full integrity check.
///
/// Without the check redb trusts a cleanly closed file and may panic on one altered outside
/// redb; with it every page of the committed trees is checksummed and damage is
/// `StorageError::Corrupted`. The check reads the whole file, which bounds how large the log
/// should grow between purges. Should redb still panic on some malformed page, the panic is
/// caught here and reported as [`StoreError::Corrupt`]: open must fail, not abort the node
/// with a backtrace nobody can act on.
fn open_existing(path: &Path) -> Result<Database, StoreError> {
    let mut builder = Builder::new();
    builder.set_check_integrity_on_open(true);
    match panic::catch_unwind(AssertUnwindSafe(|| builder.open(path))) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(map_open_error(path, e)),
        Err(payload) => Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("redb panicked while opening: {}", panic_message(&*payload)),
        }),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Sorts redb's open errors into the cases an operator acts on differently.
fn map_open_error(path: &Path, e: DatabaseError) -> StoreError {
    let path = path.to_path_buf();
    match e {
        DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen { path },
        DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => {
            StoreError::Corrupt { path, detail }
        }
        DatabaseError::Storage(redb::StorageError::Io(source)) => match source.kind() {
            // redb reports "not a redb file" (bad magic, too short for a header) as InvalidData.
            io::ErrorKind::InvalidData => StoreError::NotADatabase {
                path,
                detail: source.to_string(),
            },
            // A read past the end: the file was cut short.
            io::ErrorKind::UnexpectedEof => StoreError::Corrupt {
                path,
                detail: format!("file is shorter than its header says (truncated?): {source}"),
            },
            _ => StoreError::Io { path, source },
        },
        other => StoreError::Redb(redb::Error::from(other)),
    }
}

/// Creates and initialises a new log at `path`, atomically.
///
/// Steps: initialise `<path>.creating` (redb fsyncs the commit), close it, rename it onto
/// `path`, fsync the directory so the rename itself survives a crash. A crash before the
/// rename leaves only the temporary file, which the next attempt replaces.
fn create(path: &Path) -> Result<(), StoreError> {
    let io_err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| StoreError::Io { path: p, source }
    };
    let tmp = temp_path(path);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&tmp)(e)),
    }
    {
        let db = Builder::new()
            .create(&tmp)
            .map_err(|e| map_open_error(&tmp, e))?;
        schema::init(&db)?;
        db.close().map_err(|e| map_open_error(&tmp, e))?;
    }
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))?;
    let dir = parent_dir(path);
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(&dir))?;
    tracing::info!(path = %path.display(), "created new raft log");
    Ok(())
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".creating");
    path.with_file_name(name)
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
