//! Snapshot files, written crash-safely: temp file, fsync, rename, fsync of the directory.
//! Each file carries a magic, a format version and a SHA-256 checksum, so a torn or corrupt
//! file is detected and skipped in favour of the newest valid one, never loaded. A file of
//! another format version is not skipped but refused: the log behind it may be purged, so
//! starting without it would lose state; the node stops with an error that says what to do.
//! Files are written and read as streams, never whole in memory: the data is written as the
//! router streams it, and openraft gets a handle to the file (`SnapshotFile`), not its bytes.
//!
//! Two kinds of file. A *stream* (format 3) holds the whole state, rows out of memory
//! included: what a node receives from the leader, sends, backs up and restores from. A
//! node's own snapshots are *linked* (format 4): the file holds the families, and the rows
//! stay in run files hard-linked into `<name>.runs/` beside it (synced before the file is
//! renamed into place, so a file in place always has its runs), so a snapshot costs what
//! changed, not the history, and a restart opens the runs instead of reading every row.
//! A linked snapshot is expanded into a stream (`<name>.tstream`, kept and pruned with it)
//! the first time it is sent, and straight into the output file when it is backed up.

use std::collections::HashSet;
use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use sha2::{Digest, Sha256};

use super::types::SnapshotMeta;
use crate::families::snapshot_stream::expand_linked;
use crate::unpoisoned::lock;
use crate::writeback_file::WritebackFile;

const MAGIC: &[u8; 8] = b"TALLYSNP";
/// The snapshot file's format version, raised whenever the layout or the family encoding
/// changes: a file of another version would not decode, so it is refused by its version, not
/// misread. Version 3 carries the state digest before the data, so the data can be streamed.
const FORMAT_VERSION: u32 = 3;
/// A linked snapshot's format version (module docs).
const LINKED_FORMAT_VERSION: u32 = 4;
const SUFFIX: &str = ".tsnap";
/// Beside `<name>.tsnap`: the run files of a linked snapshot, and its expansion.
const RUNS_EXTENSION: &str = "runs";
const STREAM_EXTENSION: &str = "tstream";
/// Snapshots kept on disk: the newest and one fallback.
const KEEP: usize = 2;
/// The buffer of a streamed read or write.
const IO_BUFFER_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("snapshot file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("snapshot file {path} is invalid: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(
        "snapshot file {path} has format version {version} and this tally-node reads only \
         versions {reads} and 4: another release wrote it. Run that release, or start this \
         node from an empty data dir so that it receives a snapshot from the cluster"
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

/// A snapshot's data on disk (a router snapshot stream, `families/snapshot_stream.rs`) and
/// the digest of the state it holds: openraft's snapshot data. It holds the file open, so a
/// snapshot being sent survives the pruning of its file; reads are positioned (`pread`), so
/// clones read at once without sharing a cursor.
#[derive(Clone, Debug)]
pub struct SnapshotFile {
    file: Arc<fs::File>,
    data_offset: u64,
    data_len: u64,
    digest: [u8; 32],
    /// The path of the snapshot directory's file this is (`None`: a received stream).
    saved_as: Option<PathBuf>,
    /// For a linked snapshot (module docs): its directory of runs, and the snapshot
    /// directory that expands it.
    linked: Option<(PathBuf, SnapshotDir)>,
}

impl SnapshotFile {
    /// `data_len` bytes of data at the start of `file` (a received stream), whose state the
    /// sender says has `digest`.
    pub fn received(file: fs::File, data_len: u64, digest: [u8; 32]) -> Self {
        Self::at(file, 0, data_len, digest)
    }

    /// `data_len` bytes of data at `data_offset` in `file`, whose state has `digest`; not
    /// known as a file of a snapshot directory, nor linked, until its directory says so.
    fn at(file: fs::File, data_offset: u64, data_len: u64, digest: [u8; 32]) -> Self {
        Self {
            file: Arc::new(file),
            data_offset,
            data_len,
            digest,
            saved_as: None,
            linked: None,
        }
    }

    /// The directory of run files holding a linked snapshot's rows (`None`: a stream).
    pub fn runs_dir(&self) -> Option<&Path> {
        self.linked.as_ref().map(|(runs, _)| runs.as_path())
    }

    /// This snapshot as a stream, the form another node receives: itself, or a linked
    /// snapshot's expansion, written beside it the first time (it reads every row) and kept
    /// until the snapshot is pruned. Blocking.
    pub fn streamable(&self, meta: &SnapshotMeta) -> Result<SnapshotFile, SnapshotFileError> {
        match &self.linked {
            None => Ok(self.clone()),
            Some((runs, dir)) => dir.expanded(meta, self, runs),
        }
    }

    pub fn len(&self) -> u64 {
        self.data_len
    }

    pub fn is_empty(&self) -> bool {
        self.data_len == 0
    }

    /// The digest of the state the data holds (`FamilyRouter::digest`).
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// Up to `max` bytes of data from `offset`. Blocking.
    pub fn read_chunk(&self, offset: u64, max: usize) -> io::Result<Vec<u8>> {
        let end = self.data_len.min(offset.saturating_add(max as u64));
        let mut chunk = vec![0; end.saturating_sub(offset) as usize];
        self.file
            .read_exact_at(&mut chunk, self.data_offset + offset)?;
        Ok(chunk)
    }

    /// The data as a buffered reader. Blocking.
    pub fn reader(&self) -> impl Read {
        BufReader::with_capacity(
            IO_BUFFER_BYTES,
            DataReader {
                file: Arc::clone(&self.file),
                at: self.data_offset,
                end: self.data_offset + self.data_len,
            },
        )
    }
}

struct DataReader {
    file: Arc<fs::File>,
    at: u64,
    end: u64,
}

impl Read for DataReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.end - self.at).min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let read = self.file.read_at(&mut buf[..want], self.at)?;
        self.at += read as u64;
        Ok(read)
    }
}

/// The directory holding a node's snapshots.
#[derive(Clone, Debug)]
pub struct SnapshotDir {
    dir: PathBuf,
    /// Held while a written file is taken in and old ones pruned. The node's own snapshot
    /// builder and an install from the leader may save at the same time; unserialised, each
    /// could prune what the other had just removed, and the install would fail with "No such
    /// file", which openraft treats as fatal. Not held while a file is encoded: the builder
    /// encodes on a niced thread (background.rs), and an install must not wait for it.
    writing: Arc<Mutex<()>>,
    /// Saves under way, by the name they write: pruning leaves what they write alone, and a
    /// second save of the same name waits for the first.
    claims: Arc<Claims>,
    /// Files of this directory whose checksum was read through (or that this process
    /// wrote): files never change once renamed into place, so each is read through once, not
    /// at every load (a node loads its newest snapshot twice at start, then at every send).
    verified: Arc<Mutex<HashSet<PathBuf>>>,
    /// Held while a linked snapshot is expanded for sending (`SnapshotFile::streamable`):
    /// two sends expand it once. Not `writing`: an expansion reads every row, and the
    /// node's next snapshot, or an install from a new leader, must not wait for it.
    expanding: Arc<Mutex<()>>,
}

impl SnapshotDir {
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, SnapshotFileError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| SnapshotFileError::Io {
            path: dir.clone(),
            source,
        })?;
        // What a crash left half-written goes at the next save's pruning, not here: another
        // process (`tally-node backup`) may open the directory of a running node.
        Ok(Self {
            dir,
            writing: Arc::default(),
            claims: Arc::default(),
            verified: Arc::default(),
            expanding: Arc::default(),
        })
    }

    /// Writes a stream snapshot durably, its data streamed by `write_data` (which returns the
    /// state's digest), then removes all but the newest `KEEP` files. The file is written,
    /// then read back once for its checksum: never held in memory whole. Blocking.
    pub fn save_with(
        &self,
        meta: &SnapshotMeta,
        write_data: impl FnOnce(&mut BufWriter<WritebackFile>) -> io::Result<[u8; 32]>,
    ) -> Result<SnapshotFile, SnapshotFileError> {
        let path = self.path_of(meta);
        let claim = self.claims.claim(&path);
        let file = write_container(&path, FORMAT_VERSION, meta, write_data)?;
        self.saved(path, file, claim)
    }

    /// Writes a linked snapshot durably (module docs): `write_data` gets the empty directory
    /// its runs go to (it syncs them there) and streams the rest, then the file is written
    /// as `save_with` writes one. Blocking.
    pub fn save_linked(
        &self,
        meta: &SnapshotMeta,
        write_data: impl FnOnce(&mut BufWriter<WritebackFile>, &Path) -> io::Result<[u8; 32]>,
    ) -> Result<SnapshotFile, SnapshotFileError> {
        let path = self.path_of(meta);
        let runs = path.with_extension(RUNS_EXTENSION);
        let claim = self.claims.claim(&path);
        // One index and term is one state: a snapshot of it already in place (openraft
        // builds one at every trigger, even with nothing applied since) is kept as it is,
        // never rebuilt over its own runs.
        if path.exists() {
            let verified = lock(&self.verified).contains(&path);
            if let Ok((_, in_place)) =
                read(&path, verified).and_then(|read| self.own(path.clone(), read))
            {
                lock(&self.verified).insert(path);
                return Ok(in_place);
            }
        }
        // What is left here was never in place: a save a crash or an error interrupted.
        remove_if_present(&runs)?;
        fs::create_dir(&runs).map_err(io_error(&runs))?;
        sync_dir(&self.dir)?;
        let file = write_container(&path, LINKED_FORMAT_VERSION, meta, |out| {
            write_data(out, &runs)
        });
        let file = match file {
            Ok(file) => file,
            Err(error) => {
                let _ = remove_if_present(&runs);
                return Err(error);
            }
        };
        let mut file = self.saved(path, file, claim)?;
        file.linked = Some((runs, self.clone()));
        Ok(file)
    }

    /// `snapshot-<index>-<term>.tsnap` in this directory.
    fn path_of(&self, meta: &SnapshotMeta) -> PathBuf {
        let index = meta.last_log_id.map_or(0, |id| id.index);
        let term = meta.last_log_id.map_or(0, |id| id.leader_id.term);
        self.dir
            .join(format!("snapshot-{index:020}-{term:020}{SUFFIX}"))
    }

    /// A file just written into place under `claim`: known as verified and as this
    /// directory's own; older ones pruned.
    fn saved(
        &self,
        path: PathBuf,
        mut file: SnapshotFile,
        claim: Claim<'_>,
    ) -> Result<SnapshotFile, SnapshotFileError> {
        let pruned = {
            // The lock guards no data, so a writer that panicked left nothing half-updated.
            let _writing = lock(&self.writing);
            lock(&self.verified).insert(path.clone());
            file.saved_as = Some(path);
            // Given up before this prune, and before `writing` is: every save still writing
            // then prunes after this one, so the last successful save's prune leaves `KEEP`
            // files (a save that failed, or found its file in place, prunes nothing until
            // the next one).
            drop(claim);
            self.prune()?
        };
        // Deleted with no lock held: a stream expansion takes seconds to delete, and an
        // install from the leader must not wait for it to claim its name.
        for trash in pruned {
            remove_if_present(&trash)?;
        }
        Ok(file)
    }

    /// A linked snapshot of this directory as a stream (`SnapshotFile::streamable`). A prune
    /// meanwhile cannot pull what it reads away (the file and its runs are open before it
    /// reads them) and leaves the expansion of a kept snapshot alone; the expansion of a
    /// pruned one fails or is removed at the next prune, and the send is retried with the
    /// newest snapshot. Blocking.
    fn expanded(
        &self,
        meta: &SnapshotMeta,
        linked: &SnapshotFile,
        runs: &Path,
    ) -> Result<SnapshotFile, SnapshotFileError> {
        let Some(saved_as) = linked.saved_as.as_ref() else {
            return Err(SnapshotFileError::Invalid {
                path: runs.to_path_buf(),
                reason: "a linked snapshot that is no file of its directory".into(),
            });
        };
        let path = saved_as.with_extension(STREAM_EXTENSION);
        let _expanding = lock(&self.expanding);
        if lock(&self.verified).contains(&path) {
            if let Ok((_, stream, false)) = read(&path, true) {
                return Ok(stream);
            }
        }
        if !saved_as.exists() {
            return Err(SnapshotFileError::Invalid {
                path: saved_as.clone(),
                reason: "pruned before it could be expanded for sending".into(),
            });
        }
        let stream = write_expansion(&path, meta, linked, runs)?;
        lock(&self.verified).insert(path);
        Ok(stream)
    }

    /// Whether `snapshot` is a file of this directory still in place (not pruned).
    pub fn holds(&self, snapshot: &SnapshotFile) -> bool {
        (snapshot.saved_as.as_ref()).is_some_and(|path| {
            path.parent() == Some(&self.dir) && lock(&self.verified).contains(path)
        })
    }

    /// Copies a snapshot's data (one received from the leader) into a file of this
    /// directory; a file of this directory already (a node's own newest snapshot, installed
    /// at start) is in place and is not copied. Blocking.
    pub fn save_copy(
        &self,
        meta: &SnapshotMeta,
        data: &SnapshotFile,
    ) -> Result<SnapshotFile, SnapshotFileError> {
        if self.holds(data) {
            return Ok(data.clone());
        }
        let data = data.streamable(meta)?;
        self.save_with(meta, |out| {
            io::copy(&mut data.reader(), out)?;
            Ok(data.digest())
        })
    }

    /// The newest snapshot that verifies (its checksum is read through once). Invalid files
    /// are reported and skipped; a file of another format version is an error. Blocking.
    pub fn load_latest(&self) -> Result<Option<(SnapshotMeta, SnapshotFile)>, SnapshotFileError> {
        for path in self.files()?.into_iter().rev() {
            let verified = lock(&self.verified).contains(&path);
            match read(&path, verified).and_then(|read| self.own(path.clone(), read)) {
                Ok((meta, snapshot)) => {
                    lock(&self.verified).insert(path);
                    return Ok(Some((meta, snapshot)));
                }
                Err(error @ SnapshotFileError::Incompatible { .. }) => return Err(error),
                Err(error) => {
                    lock(&self.verified).remove(&path);
                    tracing::error!(%error, "skipping an invalid snapshot file");
                }
            }
        }
        Ok(None)
    }

    /// A file read from this directory as its own: a linked one with its runs, which must
    /// be in place.
    fn own(
        &self,
        path: PathBuf,
        (meta, mut snapshot, linked): (SnapshotMeta, SnapshotFile, bool),
    ) -> Result<(SnapshotMeta, SnapshotFile), SnapshotFileError> {
        if linked {
            let runs = path.with_extension(RUNS_EXTENSION);
            if !runs.is_dir() {
                return Err(SnapshotFileError::Invalid {
                    path,
                    reason: format!("its runs ({}) are missing", runs.display()),
                });
            }
            snapshot.linked = Some((runs, self.clone()));
        }
        snapshot.saved_as = Some(path);
        Ok((meta, snapshot))
    }

    /// Copies the newest snapshot that verifies to `out` (a backup), as a stream (a linked
    /// one expanded into it): written under a temporary name, synced and renamed, so `out`
    /// is either absent or whole. Files here are never changed once written, so this is safe
    /// while the node runs. Blocking.
    pub fn export_latest(&self, out: &Path) -> Result<Option<SnapshotMeta>, SnapshotFileError> {
        for path in self.files()?.into_iter().rev() {
            match read(&path, false).and_then(|read| self.own(path.clone(), read)) {
                Ok((meta, snapshot)) => {
                    match snapshot.runs_dir() {
                        None => copy_durably(&path, out)?,
                        Some(runs) => drop(write_expansion(out, &meta, &snapshot, runs)?),
                    }
                    return Ok(Some(meta));
                }
                Err(error @ SnapshotFileError::Incompatible { .. }) => return Err(error),
                Err(error) => tracing::error!(%error, "skipping an invalid snapshot file"),
            }
        }
        Ok(None)
    }

    /// Takes a backup made by [`SnapshotDir::export_latest`] into this directory, after
    /// checking its magic, version and checksum: the node started on this data dir loads it.
    /// Blocking.
    pub fn import(&self, backup: &Path) -> Result<SnapshotMeta, SnapshotFileError> {
        let (meta, _, linked) = read(backup, false)?;
        if linked {
            return Err(SnapshotFileError::Invalid {
                path: backup.to_path_buf(),
                reason: "a node's own snapshot file, not a backup: make one with \
                         `tally-node backup`"
                    .into(),
            });
        }
        let path = self.path_of(&meta);
        let _claim = self.claims.claim(&path);
        copy_durably(backup, &path)?;
        Ok(meta)
    }

    fn files(&self) -> Result<Vec<PathBuf>, SnapshotFileError> {
        snapshot_files(&self.dir)
    }

    /// Takes all but the newest `KEEP` snapshots out of place, each with its runs and
    /// expansion, and whatever no snapshot in place owns (left by a crash mid-write), but for
    /// what a save under way writes; returns them for the caller to delete once it holds no
    /// lock. Each is renamed to a trash name (`TRASH_PREFIX`), which is quick whatever its
    /// size; trash a crashed process left is taken too. Called with `writing` held.
    fn prune(&self) -> Result<Vec<PathBuf>, SnapshotFileError> {
        // Held to the end: a save claims its name before it writes anything, so no save
        // starts writing what this prune has decided to remove.
        let claimed = lock(&self.claims.names);
        let files = self.files()?;
        let kept = &files[files.len().saturating_sub(KEEP)..];
        let entries = fs::read_dir(&self.dir).map_err(io_error(&self.dir))?;
        let mut gone = Vec::new();
        for entry in entries {
            let path = entry.map_err(io_error(&self.dir))?.path();
            let Some(name) = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
            else {
                continue;
            };
            // Only what a save writes here: anything else an operator put here stays.
            let ours = name.starts_with("snapshot-");
            // `<name>.<ext>` and its `<name>.<ext>.tmp` belong to `<name>.tsnap`.
            let written = path.to_string_lossy();
            let owner = Path::new(written.strip_suffix(".tmp").unwrap_or(&written))
                .with_extension(SUFFIX.trim_start_matches('.'));
            if (ours && !kept.contains(&owner) && !claimed.contains(&owner))
                || is_leftover_trash(&name)
            {
                gone.push(path);
            }
        }
        // Snapshot files first: a crash midway leaves runs without a file (removed at the
        // next save), never a file without its runs.
        gone.sort_by_key(|path| !path.to_string_lossy().ends_with(SUFFIX));
        let mut trash = Vec::with_capacity(gone.len());
        for path in gone {
            lock(&self.verified).remove(&path);
            let renamed = self.dir.join(trash_name());
            match fs::rename(&path, &renamed) {
                Ok(()) => trash.push(renamed),
                // Taken by another process's prune, or by an operator.
                Err(source) if source.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(SnapshotFileError::Io { path, source }),
            }
        }
        Ok(trash)
    }
}

/// What a prune took out of place is renamed `<TRASH_PREFIX><pid>-<n>` until it is deleted.
const TRASH_PREFIX: &str = ".pruned-";

/// A trash name no other prune, of this process or another, uses.
fn trash_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{TRASH_PREFIX}{}-{n}", std::process::id())
}

/// Whether `name` is trash that a prune of another process took and did not delete (it
/// crashed): this process's own trash is being deleted by the prune that took it.
fn is_leftover_trash(name: &str) -> bool {
    name.strip_prefix(TRASH_PREFIX)
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(pid, _)| pid != std::process::id().to_string())
}

/// The snapshot files in place in `dir`, oldest first (not what a save is still writing).
fn snapshot_files(dir: &Path) -> Result<Vec<PathBuf>, SnapshotFileError> {
    let entries = fs::read_dir(dir).map_err(io_error(dir))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.to_string_lossy().ends_with(SUFFIX))
        .collect();
    files.sort();
    Ok(files)
}

/// Whether `dir` holds a snapshot file in place (read without opening it as a
/// [`SnapshotDir`], which would create it); a missing directory holds none.
pub fn holds_snapshot(dir: &Path) -> bool {
    snapshot_files(dir).is_ok_and(|files| !files.is_empty())
}

/// The names (`<name>.tsnap`) that saves are writing.
#[derive(Debug, Default)]
struct Claims {
    names: Mutex<HashSet<PathBuf>>,
    released: Condvar,
}

impl Claims {
    /// Claims `path` for one save, waiting while another save holds it.
    fn claim(&self, path: &Path) -> Claim<'_> {
        let mut names = lock(&self.names);
        while names.contains(path) {
            names = (self.released.wait(names)).unwrap_or_else(PoisonError::into_inner);
        }
        names.insert(path.to_path_buf());
        Claim {
            claims: self,
            path: path.to_path_buf(),
        }
    }
}

/// One save's claim on its name, given up when dropped (a save that failed included).
struct Claim<'a> {
    claims: &'a Claims,
    path: PathBuf,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(&self.claims.names).remove(&self.path);
        self.claims.released.notify_all();
    }
}

/// Removes the file or directory at `path`; gone already (an operator, or a node sharing the
/// directory by mistake) is what was wanted.
fn remove_if_present(path: &Path) -> Result<(), SnapshotFileError> {
    let removed = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match removed {
        Err(source) if source.kind() != io::ErrorKind::NotFound => Err(SnapshotFileError::Io {
            path: path.to_path_buf(),
            source,
        }),
        _ => Ok(()),
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> SnapshotFileError {
    let path = path.to_path_buf();
    move |source| SnapshotFileError::Io { path, source }
}

/// Writes a snapshot file durably at `path` (through `<path>.tmp`: written, checksummed,
/// synced, renamed, directory synced) with the data `write_data` streams (it returns the
/// state's digest), and opens it. Blocking.
fn write_container(
    path: &Path,
    version: u32,
    meta: &SnapshotMeta,
    write_data: impl FnOnce(&mut BufWriter<WritebackFile>) -> io::Result<[u8; 32]>,
) -> Result<SnapshotFile, SnapshotFileError> {
    let tmp = tmp_path(path);
    let meta_bytes = rmp_serde::to_vec(meta).map_err(|e| SnapshotFileError::Invalid {
        path: path.to_path_buf(),
        reason: format!("meta does not encode: {e}"),
    })?;
    let digest_at = (MAGIC.len() + 4 + 8 + meta_bytes.len()) as u64;
    let data_offset = digest_at + 32 + 8;
    let (data_len, digest) = {
        // Read as well: the checksum is read back from it.
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_error(&tmp))?;
        // Handed to the disk as it is written: a burst of gigabytes at the final sync
        // would hold up the Raft log's fdatasync (writeback_file.rs).
        let mut out = BufWriter::with_capacity(IO_BUFFER_BYTES, WritebackFile::new(file));
        let header = (|| {
            out.write_all(MAGIC)?;
            out.write_all(&version.to_be_bytes())?;
            out.write_all(&(meta_bytes.len() as u64).to_be_bytes())?;
            out.write_all(&meta_bytes)?;
            // The digest and the data length, filled in once the data is written.
            out.write_all(&[0; 40])
        })();
        let written = header.and_then(|()| write_data(&mut out));
        let digest = match written {
            Ok(digest) => digest,
            Err(error) => {
                drop(out);
                let _ = fs::remove_file(&tmp);
                return Err(io_error(&tmp)(error));
            }
        };
        let mut file = out
            .into_inner()
            .map_err(|e| io_error(&tmp)(e.into_error()))?
            .into_inner();
        let end = file.stream_position().map_err(io_error(&tmp))?;
        let data_len = end - data_offset;
        let mut fill = digest.to_vec();
        fill.extend_from_slice(&data_len.to_be_bytes());
        file.write_all_at(&fill, digest_at)
            .map_err(io_error(&tmp))?;
        let checksum = checksum_of(&file, end).map_err(io_error(&tmp))?;
        file.seek(SeekFrom::End(0)).map_err(io_error(&tmp))?;
        file.write_all(&checksum).map_err(io_error(&tmp))?;
        file.sync_all().map_err(io_error(&tmp))?;
        (data_len, digest)
    };
    rename_durably(&tmp, path)?;
    let file = fs::File::open(path).map_err(io_error(path))?;
    Ok(SnapshotFile::at(file, data_offset, data_len, digest))
}

/// Writes the linked snapshot `linked` (runs in `runs`) at `path` as a stream. Every row
/// read from the runs is checked against the count and digest its family's state gives
/// (`expand_linked`), so a stream that does not hold the snapshot's state is never written.
/// Blocking; reads every row.
fn write_expansion(
    path: &Path,
    meta: &SnapshotMeta,
    linked: &SnapshotFile,
    runs: &Path,
) -> Result<SnapshotFile, SnapshotFileError> {
    write_container(path, FORMAT_VERSION, meta, |out| {
        expand_linked(linked.reader(), runs, out).map_err(io::Error::other)
    })
}

/// Copies `from` to `to` through `<to>.tmp`: written, synced, renamed, directory synced.
fn copy_durably(from: &Path, to: &Path) -> Result<(), SnapshotFileError> {
    let tmp = tmp_path(to);
    {
        let mut source = fs::File::open(from).map_err(io_error(from))?;
        let mut target = fs::File::create(&tmp).map_err(io_error(&tmp))?;
        io::copy(&mut source, &mut target).map_err(io_error(&tmp))?;
        target.sync_all().map_err(io_error(&tmp))?;
    }
    rename_durably(&tmp, to)
}

/// `<path>.tmp`, where a file is written before it is renamed into place.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Renames the synced `tmp` to `to` and syncs the directory, so the name is durable too.
fn rename_durably(tmp: &Path, to: &Path) -> Result<(), SnapshotFileError> {
    fs::rename(tmp, to).map_err(io_error(to))?;
    match to.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => sync_dir(Path::new(".")),
    }
}

/// Syncs a directory, so that the names in it are durable.
fn sync_dir(dir: &Path) -> Result<(), SnapshotFileError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))
}

/// SHA-256 of the file's first `len` bytes, read through once.
fn checksum_of(file: &fs::File, len: u64) -> io::Result<[u8; 32]> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; IO_BUFFER_BYTES];
    let mut at = 0;
    while at < len {
        let want = (len - at).min(buffer.len() as u64) as usize;
        file.read_exact_at(&mut buffer[..want], at)?;
        hasher.update(&buffer[..want]);
        at += want as u64;
    }
    Ok(hasher.finalize().into())
}

/// Opens the snapshot file at `path`, its checksum read through unless it was `verified`
/// before.
fn read(
    path: &Path,
    verified: bool,
) -> Result<(SnapshotMeta, SnapshotFile, bool), SnapshotFileError> {
    let invalid = |reason: &str| SnapshotFileError::Invalid {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    let io_err = |source| SnapshotFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = fs::File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    let fixed = (MAGIC.len() + 4 + 8 + 32 + 8 + 32) as u64;
    if len < fixed {
        return Err(invalid("too short"));
    }
    let mut head = [0u8; 20];
    file.read_exact_at(&mut head, 0).map_err(io_err)?;
    if &head[..8] != MAGIC {
        return Err(invalid("not a Tally snapshot"));
    }
    let version = u32::from_be_bytes(head[8..12].try_into().map_err(|_| invalid("header"))?);
    let mut stored_checksum = [0u8; 32];
    file.read_exact_at(&mut stored_checksum, len - 32)
        .map_err(io_err)?;
    if !verified && checksum_of(&file, len - 32).map_err(io_err)? != stored_checksum {
        return Err(invalid("checksum mismatch"));
    }
    if version != FORMAT_VERSION && version != LINKED_FORMAT_VERSION {
        return Err(SnapshotFileError::Incompatible {
            path: path.to_path_buf(),
            version,
            reads: FORMAT_VERSION,
        });
    }
    let meta_len = u64::from_be_bytes(head[12..20].try_into().map_err(|_| invalid("header"))?);
    if meta_len > len - fixed {
        return Err(invalid("truncated meta"));
    }
    let mut meta_bytes = vec![0; meta_len as usize];
    file.read_exact_at(&mut meta_bytes, 20).map_err(io_err)?;
    let meta: SnapshotMeta =
        rmp_serde::from_slice(&meta_bytes).map_err(|e| invalid(&format!("meta: {e}")))?;
    let mut tail = [0u8; 40];
    file.read_exact_at(&mut tail, 20 + meta_len)
        .map_err(io_err)?;
    let digest: [u8; 32] = tail[..32].try_into().map_err(|_| invalid("digest"))?;
    let data_len = u64::from_be_bytes(tail[32..].try_into().map_err(|_| invalid("length"))?);
    let data_offset = 20 + meta_len + 40;
    if data_offset
        .checked_add(data_len)
        .and_then(|end| end.checked_add(32))
        != Some(len)
    {
        return Err(invalid("data length does not match the file"));
    }
    Ok((
        meta,
        SnapshotFile::at(file, data_offset, data_len, digest),
        version == LINKED_FORMAT_VERSION,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(snapshots: &SnapshotDir, index: u64, data: &[u8]) -> SnapshotFile {
        let mut meta = SnapshotMeta::default();
        if index > 0 {
            meta.last_log_id = Some(openraft::testing::log_id::<crate::raft::types::TypeConfig>(
                1, 1, index,
            ));
        }
        snapshots
            .save_with(&meta, |out| {
                out.write_all(data)?;
                Ok([index as u8; 32])
            })
            .unwrap_or_else(|error| panic!("save of {index} failed: {error}"))
    }

    /// The names in `dir`, sorted.
    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = (fs::read_dir(dir).expect("dir"))
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    fn data_of(file: &SnapshotFile) -> Vec<u8> {
        let mut data = Vec::new();
        file.reader().read_to_end(&mut data).expect("read");
        data
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
                        save(&snapshots, round * 4 + writer + 1, &[7; 4096]);
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().expect("a writer panicked");
        }
        let files = snapshots.files().expect("lists");
        assert_eq!(files.len(), KEEP, "{files:?}");
        let (meta, newest) = snapshots.load_latest().expect("loads").expect("a file");
        assert_eq!(meta.last_log_id.map(|id| id.index), Some(160));
        assert_eq!(newest.digest(), [160; 32]);
        assert_eq!(data_of(&newest), vec![7; 4096]);
    }

    /// A prune renames what it removes and deletes it after giving up its locks: nothing of
    /// it is left once the save returns, and trash a crashed process left is deleted too,
    /// while trash this process is still deleting is not touched.
    #[test]
    fn pruned_files_are_deleted_outside_the_locks_and_crash_leftovers_with_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        let crashed = dir.path().join(format!("{TRASH_PREFIX}4294967295-7"));
        fs::create_dir(&crashed).expect("mkdir");
        fs::write(crashed.join("run"), b"rows").expect("write");
        let ours = dir
            .path()
            .join(format!("{TRASH_PREFIX}{}-999999", std::process::id()));
        fs::write(&ours, b"being deleted").expect("write");
        for index in 1..=4 {
            save(&snapshots, index, &[index as u8; 1024]);
        }
        let left = names_in(dir.path());
        let ours_name = ours
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            left,
            vec![
                ours_name,
                format!("snapshot-{:020}-{:020}{SUFFIX}", 3, 1),
                format!("snapshot-{:020}-{:020}{SUFFIX}", 4, 1),
            ],
            "the pruned snapshots and the crashed process's trash are gone, the rest stays"
        );
    }

    /// The node's own snapshot is encoded on a niced thread (background.rs); an install from
    /// the leader that saves meanwhile must neither wait for that encoder nor prune the file
    /// it is writing.
    #[test]
    fn a_save_does_not_wait_for_one_still_encoding_nor_prune_its_file() {
        use std::sync::mpsc;
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        save(&snapshots, 1, b"one");
        save(&snapshots, 2, b"two");
        let (started, encoding) = mpsc::channel();
        let (finish, finished) = mpsc::channel::<()>();
        let slow = {
            let snapshots = snapshots.clone();
            std::thread::spawn(move || {
                let saved = snapshots.save_with(&meta_at(3), |out| {
                    out.write_all(&[3; 4096])?;
                    out.flush()?;
                    started.send(()).expect("the test waits");
                    finished.recv().expect("the test lets it finish");
                    Ok([3; 32])
                });
                saved.map(|file| data_of(&file))
            })
        };
        encoding.recv().expect("the slow save started");
        let (saved, newer) = mpsc::channel();
        let quick = {
            let snapshots = snapshots.clone();
            std::thread::spawn(move || saved.send(data_of(&save(&snapshots, 4, b"four"))))
        };
        let quick_data = newer.recv_timeout(std::time::Duration::from_secs(10));
        finish.send(()).expect("the slow save waits");
        assert_eq!(
            quick_data.as_deref(),
            Ok(&b"four"[..]),
            "a save waited for another one's encoder"
        );
        quick.join().expect("quick").expect("sent");
        let slow_data = slow.join().expect("the slow save panicked");
        assert_eq!(slow_data.expect("the slow save succeeds"), vec![3; 4096]);
        let files = snapshots.files().expect("lists");
        assert_eq!(
            files,
            [
                snapshots.path_of(&meta_at(3)),
                snapshots.path_of(&meta_at(4))
            ]
        );
        let (meta, newest) = snapshots.load_latest().expect("loads").expect("a file");
        assert_eq!(
            (meta.last_log_id.map(|id| id.index), newest.digest()),
            (Some(4), [4; 32])
        );
    }

    #[test]
    fn data_streams_back_in_chunks_and_survives_pruning_of_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        let data: Vec<u8> = (0..3 * IO_BUFFER_BYTES + 5)
            .map(|i| (i % 251) as u8)
            .collect();
        let first = save(&snapshots, 1, &data);
        assert_eq!(first.len(), data.len() as u64);
        assert_eq!(first.read_chunk(0, 10).expect("chunk"), data[..10]);
        let tail_at = data.len() as u64 - 3;
        assert_eq!(
            first.read_chunk(tail_at, 100).expect("chunk"),
            data[data.len() - 3..]
        );
        // Two newer saves prune the first file; the open handle still reads it.
        save(&snapshots, 2, b"two");
        save(&snapshots, 3, b"three");
        assert_eq!(data_of(&first), data);
        let copied = snapshots
            .save_copy(&SnapshotMeta::default(), &first)
            .expect("copy");
        assert_eq!((data_of(&copied), copied.digest()), (data, [1; 32]));
    }

    /// A file is read through for its checksum once per directory handle (its writer's, or
    /// the first load's), and a file of the directory is known as one, so a node installing
    /// its own snapshot at start neither reads it through again nor copies it.
    #[test]
    fn a_file_is_verified_once_and_known_as_the_directorys_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        let saved = save(&snapshots, 1, &[5; 4096]);
        assert!(snapshots.holds(&saved));
        let path = snapshots.files().expect("lists").remove(0);
        // Damage one byte of the data, leaving the checksum as it was.
        let mut bytes = fs::read(&path).expect("read");
        let at = bytes.len() - 32 - 100;
        bytes[at] ^= 1;
        fs::write(&path, bytes).expect("write");

        let (_, loaded) = snapshots.load_latest().expect("loads").expect("a file");
        assert!(snapshots.holds(&loaded), "loaded from this directory");
        (snapshots.save_copy(&SnapshotMeta::default(), &loaded)).expect("in place");
        assert_eq!(
            snapshots.files().expect("lists").len(),
            1,
            "a file of the directory is not copied into it again"
        );
        let fresh = SnapshotDir::open(dir.path()).expect("open again");
        assert!(
            fresh.load_latest().expect("loads").is_none(),
            "a new handle reads the checksum through and skips the damaged file"
        );
        let other = tempfile::tempdir().expect("tempdir");
        let other = SnapshotDir::open(other.path()).expect("open");
        assert!(!other.holds(&saved));
        let received = SnapshotFile::received(fs::File::open(&path).expect("open"), 10, [0; 32]);
        assert!(
            !snapshots.holds(&received),
            "a received stream is copied in"
        );
    }

    fn meta_at(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::testing::log_id::<crate::raft::types::TypeConfig>(
                1, 1, index,
            )),
            ..SnapshotMeta::default()
        }
    }

    fn save_linked(snapshots: &SnapshotDir, index: u64) -> Result<SnapshotFile, SnapshotFileError> {
        snapshots.save_linked(&meta_at(index), |out, runs| {
            fs::write(runs.join("000000.run"), index.to_be_bytes())?;
            out.write_all(b"linked")?;
            Ok([index as u8; 32])
        })
    }

    /// A linked snapshot keeps its runs beside it, and pruning takes them (and an expansion)
    /// with the file, as it takes whatever a crash left half-written; a linked file whose
    /// runs are gone is skipped for the older snapshot; a linked file is no backup, and a
    /// failed save leaves nothing.
    #[test]
    fn linked_snapshots_keep_their_runs_and_go_with_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        save(&snapshots, 1, b"stream");
        let linked = save_linked(&snapshots, 2).expect("saved");
        let runs = linked.runs_dir().expect("linked").to_path_buf();
        assert_eq!(
            fs::read(runs.join("000000.run")).expect("run"),
            2u64.to_be_bytes()
        );
        let (meta, loaded) = snapshots.load_latest().expect("loads").expect("a file");
        assert_eq!(meta.last_log_id.map(|id| id.index), Some(2));
        assert_eq!(
            (loaded.runs_dir(), data_of(&loaded)),
            (Some(runs.as_path()), b"linked".to_vec())
        );

        let hidden = dir.path().join("hidden");
        fs::rename(&runs, &hidden).expect("hide the runs");
        let fresh = SnapshotDir::open(dir.path()).expect("open again");
        let (meta, older) = fresh.load_latest().expect("loads").expect("the older file");
        assert_eq!(
            meta.last_log_id.map(|id| id.index),
            Some(1),
            "runs gone: skipped"
        );
        assert_eq!(older.runs_dir(), None);
        fs::rename(&hidden, &runs).expect("put the runs back");

        let name = |index: u64, tail: &str| {
            dir.path()
                .join(format!("snapshot-{index:020}-{:020}{tail}", 1))
        };
        fs::write(name(9, ".tsnap.tmp"), b"half written").expect("write");
        fs::create_dir(name(7, ".runs")).expect("an orphan run dir");
        fs::write(name(2, ".tstream"), b"an expansion").expect("write");
        let refused = snapshots
            .import(&name(2, ".tsnap"))
            .expect_err("not a backup");
        assert!(
            refused.to_string().contains("tally-node backup"),
            "{refused}"
        );

        fs::write(dir.path().join("notes.txt"), b"an operator's").expect("write");
        save_linked(&snapshots, 3).expect("saved");
        save_linked(&snapshots, 4).expect("saved");
        // The same index and term again (openraft builds at every trigger): the one in place
        // is kept, its runs untouched, and nothing is written.
        let again = snapshots
            .save_linked(&meta_at(4), |_, _| {
                panic!("rebuilt over the snapshot in place")
            })
            .expect("the snapshot in place");
        let runs_of_4 = again.runs_dir().expect("linked").join("000000.run");
        assert_eq!(fs::read(runs_of_4).expect("run"), 4u64.to_be_bytes());
        assert!(
            dir.path().join("notes.txt").exists(),
            "not a snapshot's: kept"
        );
        fs::remove_file(dir.path().join("notes.txt")).expect("remove");
        let left = names_in(dir.path());
        let expected: Vec<String> = [(3, ".runs"), (3, ".tsnap"), (4, ".runs"), (4, ".tsnap")]
            .map(|(index, tail)| format!("snapshot-{index:020}-{:020}{tail}", 1))
            .into();
        assert_eq!(left, expected);

        // An expansion under way (for a send) of a snapshot that stays is left alone.
        fs::write(name(4, ".tstream.tmp"), b"being expanded").expect("write");
        save_linked(&snapshots, 5).expect("saved");
        assert!(name(4, ".tstream.tmp").exists() && !name(3, ".tsnap").exists());

        let failed = snapshots.save_linked(&meta_at(6), |_, runs| {
            fs::write(runs.join("000000.run"), b"x")?;
            Err(io::Error::other("the cut could not be written"))
        });
        assert!(failed.is_err());
        assert!(
            !name(6, ".runs").exists() && !name(6, ".tsnap.tmp").exists(),
            "nothing left"
        );
    }

    #[test]
    fn a_torn_file_is_skipped_and_another_version_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = SnapshotDir::open(dir.path()).expect("open");
        save(&snapshots, 0, b"state");
        let path = snapshots.files().expect("lists").remove(0);
        let (_, loaded) = snapshots.load_latest().expect("loads").expect("one file");
        assert_eq!(data_of(&loaded), b"state");

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
