//! Snapshot files, written crash-safely: temp file, fsync, rename, fsync of the directory.
//! Each file carries a magic, a format version and a SHA-256 checksum, so a torn or corrupt
//! file is detected and skipped in favour of the newest valid one, never loaded. A file of
//! another format version is not skipped but refused: the log behind it may be purged, so
//! starting without it would lose state; the node stops with an error that says what to do.
//! Files are written and read as streams, never whole in memory: the data is written as the
//! router streams it, and openraft gets a handle to the file (`SnapshotFile`), not its bytes.

use std::collections::HashSet;
use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::types::SnapshotMeta;
use crate::unpoisoned::lock;
use crate::writeback_file::WritebackFile;

const MAGIC: &[u8; 8] = b"TALLYSNP";
/// The snapshot file's format version, raised whenever the layout or the family encoding
/// changes: a file of another version would not decode, so it is refused by its version, not
/// misread. Version 3 carries the state digest before the data, so the data can be streamed.
const FORMAT_VERSION: u32 = 3;
const SUFFIX: &str = ".tsnap";
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
}

impl SnapshotFile {
    /// `data_len` bytes of data at the start of `file` (a received stream), whose state the
    /// sender says has `digest`.
    pub fn received(file: fs::File, data_len: u64, digest: [u8; 32]) -> Self {
        Self {
            file: Arc::new(file),
            data_offset: 0,
            data_len,
            digest,
            saved_as: None,
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
    /// Held while a file is written and old ones pruned. The node's own snapshot builder and
    /// an install from the leader may save at the same time; unserialised, each could prune
    /// what the other had just removed, and the install would fail with "No such file", which
    /// openraft treats as fatal.
    writing: Arc<Mutex<()>>,
    /// Files of this directory whose checksum was read through (or that this process
    /// wrote): files never change once renamed into place, so each is read through once, not
    /// at every load (a node loads its newest snapshot twice at start, then at every send).
    verified: Arc<Mutex<HashSet<PathBuf>>>,
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
            verified: Arc::default(),
        })
    }

    /// Writes a snapshot durably, its data streamed by `write_data` (which returns the
    /// state's digest), then removes all but the newest `KEEP` files. The file is written,
    /// then read back once for its checksum: never held in memory whole. Blocking.
    pub fn save_with(
        &self,
        meta: &SnapshotMeta,
        write_data: impl FnOnce(&mut BufWriter<WritebackFile>) -> io::Result<[u8; 32]>,
    ) -> Result<SnapshotFile, SnapshotFileError> {
        let index = meta.last_log_id.map_or(0, |id| id.index);
        let term = meta.last_log_id.map_or(0, |id| id.leader_id.term);
        let name = format!("snapshot-{index:020}-{term:020}{SUFFIX}");
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SnapshotFileError::Io { path, source }
        };
        let meta_bytes = rmp_serde::to_vec(meta).map_err(|e| SnapshotFileError::Invalid {
            path: path.clone(),
            reason: format!("meta does not encode: {e}"),
        })?;
        // The lock guards no data, so a writer that panicked left nothing half-updated here.
        let _writing = lock(&self.writing);
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
                .map_err(io_err(&tmp))?;
            // Handed to the disk as it is written: a burst of gigabytes at the final sync
            // would hold up the Raft log's fdatasync (writeback_file.rs).
            let mut out = BufWriter::with_capacity(IO_BUFFER_BYTES, WritebackFile::new(file));
            let header = (|| {
                out.write_all(MAGIC)?;
                out.write_all(&FORMAT_VERSION.to_be_bytes())?;
                out.write_all(&(meta_bytes.len() as u64).to_be_bytes())?;
                out.write_all(&meta_bytes)?;
                // The digest and the data length, filled in once the data is written.
                out.write_all(&[0; 40])
            })();
            header.map_err(io_err(&tmp))?;
            let digest = write_data(&mut out).map_err(io_err(&tmp))?;
            let mut file = out
                .into_inner()
                .map_err(|e| io_err(&tmp)(e.into_error()))?
                .into_inner();
            let end = file.stream_position().map_err(io_err(&tmp))?;
            let data_len = end - data_offset;
            let mut fill = digest.to_vec();
            fill.extend_from_slice(&data_len.to_be_bytes());
            file.write_all_at(&fill, digest_at).map_err(io_err(&tmp))?;
            let checksum = checksum_of(&file, end).map_err(io_err(&tmp))?;
            file.seek(SeekFrom::End(0)).map_err(io_err(&tmp))?;
            file.write_all(&checksum).map_err(io_err(&tmp))?;
            file.sync_all().map_err(io_err(&tmp))?;
            (data_len, digest)
        };
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))?;
        let file = fs::File::open(&path).map_err(io_err(&path))?;
        lock(&self.verified).insert(path.clone());
        self.prune()?;
        Ok(SnapshotFile {
            file: Arc::new(file),
            data_offset,
            data_len,
            digest,
            saved_as: Some(path),
        })
    }

    /// Whether `snapshot` is a file of this directory still in place (not pruned).
    fn holds(&self, snapshot: &SnapshotFile) -> bool {
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
            match read(&path, verified) {
                Ok((meta, mut snapshot)) => {
                    lock(&self.verified).insert(path.clone());
                    snapshot.saved_as = Some(path);
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

    /// Copies the newest snapshot that verifies to `out` (a backup): written under a temporary
    /// name, synced and renamed, so `out` is either absent or whole. Files here are never
    /// changed once written, so this is safe while the node runs. Blocking.
    pub fn export_latest(&self, out: &Path) -> Result<Option<SnapshotMeta>, SnapshotFileError> {
        for path in self.files()?.into_iter().rev() {
            match read(&path, false) {
                Ok((meta, _)) => {
                    copy_durably(&path, out)?;
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
        let (meta, _) = read(backup, false)?;
        let index = meta.last_log_id.map_or(0, |id| id.index);
        let term = meta.last_log_id.map_or(0, |id| id.leader_id.term);
        let _writing = lock(&self.writing);
        copy_durably(
            backup,
            &self
                .dir
                .join(format!("snapshot-{index:020}-{term:020}{SUFFIX}")),
        )?;
        Ok(meta)
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
            lock(&self.verified).remove(old);
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

/// Copies `from` to `to` through `<to>.tmp`: written, synced, renamed, directory synced.
fn copy_durably(from: &Path, to: &Path) -> Result<(), SnapshotFileError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SnapshotFileError::Io { path, source }
    };
    let mut name = to.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    let tmp = to.with_file_name(name);
    {
        let mut source = fs::File::open(from).map_err(io_err(from))?;
        let mut target = fs::File::create(&tmp).map_err(io_err(&tmp))?;
        io::copy(&mut source, &mut target).map_err(io_err(&tmp))?;
        target.sync_all().map_err(io_err(&tmp))?;
    }
    fs::rename(&tmp, to).map_err(io_err(to))?;
    let dir = match to.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(&dir))
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
fn read(path: &Path, verified: bool) -> Result<(SnapshotMeta, SnapshotFile), SnapshotFileError> {
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
    if version != FORMAT_VERSION {
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
        SnapshotFile {
            file: Arc::new(file),
            data_offset,
            data_len,
            digest,
            saved_as: None,
        },
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
