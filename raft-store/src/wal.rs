//! The log's files: a directory of append-only segments, and the in-memory index of where each
//! live entry's bytes are.
//!
//! Every write is one frame (`frame.rs`) appended to the newest segment, followed by one
//! `fdatasync` before the next frame is written (the committed-id hint rides along in the next
//! frame), so only the last frame can ever be torn. Nothing is ever rewritten in place: a
//! truncation and a purge are records too, and replaying the segments in order at open gives
//! back the log, the vote, the committed hint and the purged id exactly as the last durable
//! write left them. An append costs one sequential write and one `fdatasync`, about what the
//! disk's bare `fdatasync` costs (`docs/benchmarks.md`), where a B-tree commit wrote and synced
//! several scattered pages.
//!
//! Segments roll at [`WalConfig::segment_bytes`]. A new segment starts with a header frame that
//! repeats the vote, the committed hint and the purged id, so an older segment holds nothing
//! the newer ones do not, and is deleted as soon as no live entry is in it (after a purge).
//! A segment is created under a temporary name and renamed into place once its header is
//! durable, so a segment file without a valid header is damage, never "not written yet".
//!
//! The newest segment has room reserved ahead of its write point (`preallocate.rs`), so a
//! frame's `fdatasync` commits no allocation or size change; the room reads as zeros, is cut off at open and at a
//! clean close, and a full segment is cut to its frames before the next one starts, so only
//! the newest segment can end in zeros.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use openraft::entry::RaftEntry;
use openraft::storage::LogState;
use openraft::type_config::alias::LogIdOf;
use openraft::RaftTypeConfig;
use serde::de::DeserializeOwned;

use crate::codec::decode;
use crate::error::StoreError;
use crate::frame::{self, Ending, FrameBuilder, Record};
use crate::preallocate::{self, Reserved};

/// The on-disk format this build reads and writes. Bump it on any change to the framing or the
/// encoding of a record. (Version 1 was the single redb file of earlier builds.)
pub const FORMAT_VERSION: u32 = 2;

/// An entry ready to write: its index and its encoded bytes.
pub(crate) type Encoded = (u64, Vec<u8>);

const SEGMENT_SUFFIX: &str = ".wal";
const CREATING_SUFFIX: &str = ".wal.creating";
const LOCK_FILE: &str = "LOCK";

/// Limits of the segment files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalConfig {
    /// A segment that has reached this size gets no more frames: the next write starts a new
    /// one. Smaller segments free disk sooner after a purge; each costs one file.
    pub segment_bytes: u64,
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 64 << 20,
        }
    }
}

/// Where one entry's encoded bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Location {
    segment: u64,
    offset: u64,
    len: u32,
}

/// What the segments say, kept current by every write.
struct WalIndex {
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    /// The last purged index and its encoded log id.
    purged: Option<(u64, Vec<u8>)>,
    /// Index of `entries[0]`.
    first: u64,
    entries: VecDeque<Location>,
    /// Every segment on disk, by sequence number, open for reading.
    segments: BTreeMap<u64, Arc<File>>,
}

impl WalIndex {
    fn empty() -> Self {
        Self {
            vote: None,
            committed: None,
            purged: None,
            first: 0,
            entries: VecDeque::new(),
            segments: BTreeMap::new(),
        }
    }

    fn end(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    fn range(&self) -> Option<(u64, u64)> {
        (!self.entries.is_empty()).then(|| (self.first, self.end()))
    }

    fn truncate_from(&mut self, from: u64) {
        let keep = from
            .saturating_sub(self.first)
            .min(self.entries.len() as u64);
        self.entries.truncate(keep as usize);
    }

    fn purge_upto(&mut self, upto: u64) {
        let next = upto.saturating_add(1);
        if next >= self.end() {
            self.entries.clear();
            self.first = next;
        } else if next > self.first {
            self.entries.drain(..(next - self.first) as usize);
            self.first = next;
        }
    }

    /// Segments older than the oldest one a live entry is in, except the newest: they hold
    /// nothing that is still needed.
    fn unneeded_segments(&self, active: u64) -> Vec<u64> {
        let oldest_needed = self
            .entries
            .front()
            .map_or(active, |l| l.segment.min(active));
        self.segments
            .range(..oldest_needed)
            .map(|(sequence, _)| *sequence)
            .collect()
    }
}

/// The segment frames are appended to.
pub(crate) struct ActiveSegment {
    sequence: u64,
    file: Arc<File>,
    /// Where the next frame goes: the end of the last one.
    len: u64,
    /// Where the reserved room ends (`len` or more); the file may be longer after a
    /// reservation that failed part-way, which `release_room` reads from the file itself.
    allocated: u64,
    /// After a reservation failed (say, a nearly full disk), none is tried again before the
    /// log reaches here: a failing `fallocate` per frame would cost every append.
    retry_reserve_at: u64,
}

impl ActiveSegment {
    fn new(sequence: u64, file: Arc<File>, len: u64) -> Self {
        Self {
            sequence,
            file,
            len,
            allocated: len,
            retry_reserve_at: 0,
        }
    }
}

/// A committed-id hint waiting for a frame, and the index it names (`None`: nothing committed).
struct PendingHint {
    index: Option<u64>,
    bytes: Vec<u8>,
}

/// The open log directory, shared by the store, its readers and its writer thread.
pub(crate) struct Wal {
    pub(crate) dir: PathBuf,
    config: WalConfig,
    index: RwLock<WalIndex>,
    /// Held for the whole of a write; only the writer thread writes after open.
    pub(crate) active: Mutex<ActiveSegment>,
    /// The newest committed-id hint not yet in a frame.
    pending_hint: Mutex<Option<PendingHint>>,
    /// Whether room is reserved ahead of writes; off for good once the filesystem says it
    /// cannot.
    reserving: std::sync::atomic::AtomicBool,
    /// Holds the directory's lock for as long as the log is open.
    _lock: File,
    /// What [`crate::LogRelease`] watches. Last, so it drops after `_lock` is closed: fields
    /// drop in order after `Drop::drop`, while an `Arc<Wal>`'s count reaches 0 *before* the
    /// Wal's drop (which gives room back, file I/O) has run; a watch on that count let a
    /// restart meet the lock still held (CI, 2026-12-07: "already open elsewhere").
    released: Arc<()>,
}

impl Wal {
    /// Alive until this Wal has closed its lock (see `released`).
    pub(crate) fn release_token(&self) -> std::sync::Weak<()> {
        Arc::downgrade(&self.released)
    }
}

/// A clean close gives the reserved room back, so a closed log's files hold only frames.
impl Drop for Wal {
    fn drop(&mut self) {
        let Ok(active) = self.active.get_mut() else {
            return;
        };
        let path = self.dir.join(segment_name(active.sequence));
        if let Err(error) = Self::release_room(active, &path) {
            tracing::warn!(%error, "the room reserved ahead of the raft log was not given back");
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn segment_name(sequence: u64) -> String {
    format!("{sequence:020}{SEGMENT_SUFFIX}")
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))
}

impl Wal {
    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            path: self.dir.clone(),
            detail,
        }
    }

    /// Opens the log in `dir`, creating the directory and a first segment if there is none.
    ///
    /// Replays every segment: each frame's checksum is checked, a torn last frame (a write a
    /// crash interrupted, never reported durable) is cut off, and any other damage, a missing
    /// or foreign header, an unknown version or a hole in the log is an error. Blocking.
    pub(crate) fn open(dir: &Path, config: WalConfig) -> Result<Self, StoreError> {
        assert!(
            config.segment_bytes > 0,
            "WalConfig::segment_bytes must be positive"
        );
        if dir.is_file() {
            return Err(StoreError::NotARaftLog {
                path: dir.to_path_buf(),
                detail: "a file where the log's directory should be".to_owned(),
            });
        }
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let lock = lock_dir(dir)?;
        let sequences = list_segments(dir)?;
        let mut index = WalIndex::empty();
        let mut last_len = 0;
        for (position, sequence) in sequences.iter().enumerate() {
            let is_last = position + 1 == sequences.len();
            last_len = replay_segment(dir, *sequence, is_last, &mut index)?;
        }
        let active = match sequences.last() {
            Some(sequence) => {
                ActiveSegment::new(*sequence, index.segments[sequence].clone(), last_len)
            }
            None => {
                let (file, len) = create_segment(dir, 1, &index)?;
                index.segments.insert(1, file.clone());
                ActiveSegment::new(1, file, len)
            }
        };
        if let (Some((upto, _)), Some((first, _))) = (&index.purged, index.range()) {
            if first != upto + 1 {
                return Err(StoreError::Corrupt {
                    path: dir.to_path_buf(),
                    detail: format!(
                        "first entry {first} does not follow the last purged index {upto}"
                    ),
                });
            }
        }
        let wal = Self {
            dir: dir.to_path_buf(),
            config,
            index: RwLock::new(index),
            active: Mutex::new(active),
            pending_hint: Mutex::new(None),
            reserving: std::sync::atomic::AtomicBool::new(true),
            _lock: lock,
            released: Arc::new(()),
        };
        wal.delete_unneeded_segments()?;
        Ok(wal)
    }

    /// Appends a batch, which must continue the stored log; one frame, one `fdatasync`.
    ///
    /// An empty log accepts any first index: after a purge past the last entry, or a snapshot
    /// install, the log restarts there.
    pub(crate) fn append(&self, batch: &[Encoded]) -> Result<(), StoreError> {
        let Some((first, _)) = batch.first() else {
            return Ok(());
        };
        if let Some((_, end)) = self.read_index().range() {
            if *first != end {
                return Err(StoreError::NotContiguous {
                    expected: end,
                    got: *first,
                });
            }
        }
        let body: usize = batch
            .iter()
            .map(|(_, b)| b.len() + frame::RECORD_HEADER_BYTES + frame::ENTRY_INDEX_BYTES)
            .sum();
        let mut builder = FrameBuilder::with_capacity(body);
        let offsets: Vec<usize> = batch
            .iter()
            .map(|(index, bytes)| builder.entry(*index, bytes))
            .collect();
        let end = first + batch.len() as u64;
        let (segment, frame_offset) = self.write_frame(builder, Some(end))?;
        let mut index = self.write_index();
        if index.entries.is_empty() {
            index.first = *first;
        }
        for ((_, bytes), offset) in batch.iter().zip(offsets) {
            index.entries.push_back(Location {
                segment,
                offset: frame_offset + offset as u64,
                len: u32::try_from(bytes.len()).expect("entries are capped below 4 GiB"),
            });
        }
        Ok(())
    }

    /// Writes the vote durably.
    pub(crate) fn put_vote(&self, bytes: &[u8]) -> Result<(), StoreError> {
        let mut builder = FrameBuilder::new();
        builder.vote(bytes);
        self.write_frame(builder, None)?;
        self.write_index().vote = Some(bytes.to_vec());
        Ok(())
    }

    /// Keeps the committed-id hint (naming entry `index`) for the first frame after which the
    /// log holds that entry, with no write of its own: a crash before that frame only loses the
    /// hint (a restarted node replays a little less). The store calls this from openraft's
    /// core without waking the writer thread, so the hint may arrive while the append of the
    /// entry it names is still queued: a frame ending before `index` leaves it pending, and a
    /// durable log never names a committed entry it does not hold.
    pub(crate) fn put_committed_hint(&self, bytes: &[u8], index: Option<u64>) {
        let bytes = bytes.to_vec();
        *self.pending_hint.lock().expect("hint lock") = Some(PendingHint { index, bytes });
    }

    /// Writes a hint still waiting for a frame (when the log closes), if the log holds the
    /// entry it names.
    pub(crate) fn flush_hint(&self) -> Result<(), StoreError> {
        let Some(hint) = self.take_ready_hint(self.durable_end()) else {
            return Ok(());
        };
        let mut builder = FrameBuilder::new();
        builder.committed(&hint);
        self.write_frame(builder, None)?;
        self.write_index().committed = Some(hint);
        Ok(())
    }

    /// The pending hint, taken if the log holds the entry it names once it ends at `log_end`.
    fn take_ready_hint(&self, log_end: u64) -> Option<Vec<u8>> {
        let mut pending = self.pending_hint.lock().expect("hint lock");
        let ready = pending
            .as_ref()
            .is_some_and(|hint| hint.index.is_none_or(|index| index < log_end));
        ready.then(|| pending.take().expect("checked just above").bytes)
    }

    /// One past the last index the durable log holds, as an entry or under the purged id.
    fn durable_end(&self) -> u64 {
        let index = self.read_index();
        let purged_end = index.purged.as_ref().map_or(0, |(upto, _)| upto + 1);
        index.range().map_or(0, |(_, end)| end).max(purged_end)
    }

    /// Voids every entry with index `>= from`, durably.
    pub(crate) fn truncate_from(&self, from: u64) -> Result<(), StoreError> {
        let mut builder = FrameBuilder::new();
        builder.truncate_from(from);
        self.write_frame(builder, None)?;
        self.write_index().truncate_from(from);
        Ok(())
    }

    /// Drops every entry with index `<= upto` and records `log_id` (encoded) as the last purged
    /// id, in one durable frame; then deletes the segments no live entry is in.
    pub(crate) fn purge(&self, upto: u64, log_id: &[u8]) -> Result<(), StoreError> {
        let mut builder = FrameBuilder::new();
        builder.purged(upto, log_id);
        self.write_frame(builder, None)?;
        {
            let mut index = self.write_index();
            index.purged = Some((upto, log_id.to_vec()));
            index.purge_upto(upto);
        }
        self.delete_unneeded_segments()
    }

    /// Appends one frame to the newest segment (rolling to a new one first if it is full),
    /// with the pending hint if the log holds its entry once this frame is written, and syncs
    /// it. `log_end` is one past the frame's last entry (`None`: a frame without entries).
    /// Returns the segment and the frame's offset in it.
    fn write_frame(
        &self,
        mut builder: FrameBuilder,
        log_end: Option<u64>,
    ) -> Result<(u64, u64), StoreError> {
        let mut active = self.active.lock().expect("active segment lock");
        if active.len >= self.config.segment_bytes {
            self.roll(&mut active)?;
        }
        let hint = self.take_ready_hint(log_end.unwrap_or_else(|| self.durable_end()));
        if let Some(hint) = &hint {
            // After the entries, so the offsets the caller took stay right.
            builder.committed(hint);
        }
        let bytes = builder.finish();
        let offset = active.len;
        let path = self.dir.join(segment_name(active.sequence));
        self.reserve_room(&mut active, bytes.len() as u64, &path);
        active
            .file
            .write_all_at(&bytes, offset)
            .map_err(io_error(&path))?;
        active.len += bytes.len() as u64;
        active.allocated = active.allocated.max(active.len);
        active.file.sync_data().map_err(io_error(&path))?;
        if let Some(hint) = hint {
            // What a new segment's header repeats: only a hint already in a durable frame.
            self.write_index().committed = Some(hint);
        }
        Ok((active.sequence, offset))
    }

    /// Reserves room for a frame of `frame_bytes` and the ones after it, unless it is there.
    /// A reservation that fails (say, no space for a whole step) leaves the frame to grow the
    /// file, which fails only if the frame itself has no room.
    fn reserve_room(&self, active: &mut ActiveSegment, frame_bytes: u64, path: &Path) {
        use std::sync::atomic::Ordering;
        if active.len + frame_bytes <= active.allocated
            || active.len < active.retry_reserve_at
            || !self.reserving.load(Ordering::Relaxed)
        {
            return;
        }
        let room = frame_bytes.max(preallocate::STEP_BYTES);
        match preallocate::reserve(&active.file, active.len, room) {
            Ok(Reserved::Done) => active.allocated = active.len + room,
            Ok(Reserved::Unsupported) => {
                tracing::info!(
                    path = %path.display(),
                    "this filesystem cannot reserve room ahead of the raft log: appends grow the file"
                );
                self.reserving.store(false, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::warn!(
                    path = %path.display(),
                    %error,
                    "could not reserve room ahead of the raft log; appending without it for the next 4 MiB"
                );
                active.retry_reserve_at = active.len + room;
            }
        }
    }

    /// Cuts whatever follows the active segment's last frame, durably: before the segment
    /// stops being the newest (only the newest may end in zeros), and at a clean close. The
    /// file's own size decides, not `allocated`: a reservation that failed part-way may have
    /// grown the file without saying so.
    fn release_room(active: &mut ActiveSegment, path: &Path) -> Result<(), StoreError> {
        let size = active.file.metadata().map_err(io_error(path))?.len();
        if size > active.len {
            active.file.set_len(active.len).map_err(io_error(path))?;
            active.file.sync_all().map_err(io_error(path))?;
        }
        active.allocated = active.len;
        Ok(())
    }

    /// Starts the next segment, its header repeating the vote, hint and purged id (the full
    /// segment's frames are all synced already).
    fn roll(&self, active: &mut ActiveSegment) -> Result<(), StoreError> {
        Self::release_room(active, &self.dir.join(segment_name(active.sequence)))?;
        let sequence = active.sequence + 1;
        let (file, len) = create_segment(&self.dir, sequence, &self.read_index())?;
        self.write_index().segments.insert(sequence, file.clone());
        *active = ActiveSegment::new(sequence, file, len);
        tracing::debug!(sequence, "raft log rolled to a new segment");
        Ok(())
    }

    fn delete_unneeded_segments(&self) -> Result<(), StoreError> {
        let active = self.active.lock().expect("active segment lock").sequence;
        let unneeded = self.read_index().unneeded_segments(active);
        for sequence in unneeded {
            let path = self.dir.join(segment_name(sequence));
            self.write_index().segments.remove(&sequence);
            // Readers that already hold the file keep reading it; the name goes now. A crash
            // before the unlink is durable leaves a segment the next open replays harmlessly:
            // the purge record after it drops its entries again.
            fs::remove_file(&path).map_err(io_error(&path))?;
        }
        Ok(())
    }

    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, WalIndex> {
        self.index.read().expect("log index lock")
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, WalIndex> {
        self.index.write().expect("log index lock")
    }

    /// Entries with index in `range` that the log holds, in order, each checked against its
    /// index.
    pub(crate) fn read_entries<C: RaftTypeConfig>(
        &self,
        range: impl RangeBounds<u64>,
    ) -> Result<Vec<C::Entry>, StoreError> {
        let Some((start, end)) = half_open(range) else {
            return Ok(Vec::new());
        };
        let runs = {
            let index = self.read_index();
            let start = start.max(index.first);
            let end = end.unwrap_or(u64::MAX).min(index.end());
            if start >= end {
                return Ok(Vec::new());
            }
            runs_of(&index, start, end)
        };
        let mut out = Vec::new();
        let mut next = start.max(runs.first().map_or(start, |r| r.first_index));
        for run in runs {
            let buffer = run.read(&self.dir)?;
            for location in &run.locations {
                let at = (location.offset - run.offset) as usize;
                let bytes = &buffer[at..at + location.len as usize];
                let entry: C::Entry = decode(bytes, || format!("log entry {next}"))?;
                let (_, index) = entry.log_id_parts();
                if index != next {
                    return Err(self.corrupt(format!("entry expected at {next} has index {index}")));
                }
                next += 1;
                out.push(entry);
            }
        }
        Ok(out)
    }

    /// The indices the log holds, `first..end`, or `None` when it is empty.
    pub(crate) fn stored_range(&self) -> Option<(u64, u64)> {
        self.read_index().range()
    }

    pub(crate) fn vote<T: DeserializeOwned>(&self) -> Result<Option<T>, StoreError> {
        self.decode_record(|i| i.vote.clone(), "vote")
    }

    pub(crate) fn committed<T: DeserializeOwned>(&self) -> Result<Option<T>, StoreError> {
        self.decode_record(|i| i.committed.clone(), "committed log id")
    }

    pub(crate) fn purged<T: DeserializeOwned>(&self) -> Result<Option<T>, StoreError> {
        self.decode_record(
            |i| i.purged.as_ref().map(|(_, b)| b.clone()),
            "last purged id",
        )
    }

    fn decode_record<T: DeserializeOwned>(
        &self,
        field: impl FnOnce(&WalIndex) -> Option<Vec<u8>>,
        what: &str,
    ) -> Result<Option<T>, StoreError> {
        let bytes = field(&self.read_index());
        bytes
            .map(|b| decode(&b, || format!("record {what}")))
            .transpose()
    }

    /// The last purged id and the last log id.
    pub(crate) fn read_log_state<C: RaftTypeConfig>(&self) -> Result<LogState<C>, StoreError> {
        let last_purged_log_id: Option<LogIdOf<C>> = self.purged()?;
        let last_in_log = match self.stored_range() {
            Some((_, end)) => self
                .read_entries::<C>(end - 1..end)?
                .last()
                .map(|e| e.log_id()),
            None => None,
        };
        Ok(LogState {
            last_log_id: last_in_log.or_else(|| last_purged_log_id.clone()),
            last_purged_log_id,
        })
    }

    /// How many segment files the log has now.
    pub(crate) fn segment_count(&self) -> usize {
        self.read_index().segments.len()
    }
}

/// Entries next to each other in one segment, read with one `pread`.
struct Run {
    sequence: u64,
    file: Arc<File>,
    first_index: u64,
    offset: u64,
    end: u64,
    locations: Vec<Location>,
}

impl Run {
    fn read(&self, dir: &Path) -> Result<Vec<u8>, StoreError> {
        let mut buffer = vec![0; (self.end - self.offset) as usize];
        self.file
            .read_exact_at(&mut buffer, self.offset)
            .map_err(io_error(&dir.join(segment_name(self.sequence))))?;
        Ok(buffer)
    }
}

/// Most bytes read with one `pread`; a longer stretch of entries is split into several.
const MAX_RUN_BYTES: u64 = 4 << 20;

fn runs_of(index: &WalIndex, start: u64, end: u64) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for i in start..end {
        let location = index.entries[(i - index.first) as usize];
        let entry_end = location.offset + u64::from(location.len);
        match runs.last_mut() {
            Some(run)
                if run.sequence == location.segment
                    && location.offset >= run.end
                    && entry_end - run.offset <= MAX_RUN_BYTES =>
            {
                run.end = entry_end;
                run.locations.push(location);
            }
            _ => runs.push(Run {
                sequence: location.segment,
                file: index.segments[&location.segment].clone(),
                first_index: i,
                offset: location.offset,
                end: entry_end,
                locations: vec![location],
            }),
        }
    }
    runs
}

/// Turns any range of indexes into `start..end` (`end` exclusive, `None` = unbounded), or
/// `None` if the range is empty.
pub(crate) fn half_open(range: impl RangeBounds<u64>) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => None,
    };
    match end {
        Some(end) if end <= start => None,
        _ => Some((start, end)),
    }
}

/// Takes the directory's lock, so two stores (in one process or two) never write one log.
fn lock_dir(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_error(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(StoreError::AlreadyOpen {
            path: dir.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(source)) => Err(StoreError::Io { path, source }),
    }
}

/// The segments in `dir`, by sequence number; removes a segment left half-created by a crash.
fn list_segments(dir: &Path) -> Result<Vec<u64>, StoreError> {
    let mut sequences = Vec::new();
    for item in fs::read_dir(dir).map_err(io_error(dir))? {
        let item = item.map_err(io_error(dir))?;
        let name = item.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(CREATING_SUFFIX) {
            let path = item.path();
            fs::remove_file(&path).map_err(io_error(&path))?;
            continue;
        }
        if let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) {
            let sequence = stem.parse::<u64>().map_err(|_| StoreError::NotARaftLog {
                path: item.path(),
                detail: "a .wal file whose name is not a segment number".to_owned(),
            })?;
            sequences.push(sequence);
        }
    }
    sequences.sort_unstable();
    for pair in sequences.windows(2) {
        if pair[1] != pair[0] + 1 {
            return Err(StoreError::Corrupt {
                path: dir.to_path_buf(),
                detail: format!("segments {} to {} are missing", pair[0] + 1, pair[1] - 1),
            });
        }
    }
    Ok(sequences)
}

/// Creates segment `sequence` with a header frame carrying `index`'s vote, hint and purged id:
/// written and synced under a temporary name, then renamed into place and the directory
/// synced. Returns the file, open for reading and writing, and its length.
fn create_segment(
    dir: &Path,
    sequence: u64,
    index: &WalIndex,
) -> Result<(Arc<File>, u64), StoreError> {
    let path = dir.join(segment_name(sequence));
    let temp = dir.join(format!("{sequence:020}{CREATING_SUFFIX}"));
    let mut builder = FrameBuilder::new();
    builder.header(FORMAT_VERSION, sequence);
    if let Some(vote) = &index.vote {
        builder.vote(vote);
    }
    if let Some(committed) = &index.committed {
        builder.committed(committed);
    }
    if let Some((upto, log_id)) = &index.purged {
        builder.purged(*upto, log_id);
    }
    let bytes = builder.finish();
    {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&temp)
            .map_err(io_error(&temp))?;
        file.write_all(&bytes).map_err(io_error(&temp))?;
        file.sync_all().map_err(io_error(&temp))?;
    }
    fs::rename(&temp, &path).map_err(io_error(&path))?;
    sync_dir(dir)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_error(&path))?;
    Ok((Arc::new(file), bytes.len() as u64))
}

/// Replays one segment into `index`; returns its valid length. Only the last segment may end
/// in a torn frame, which is cut off (a write a crash interrupted before its `fdatasync`
/// returned, so never reported durable).
fn replay_segment(
    dir: &Path,
    sequence: u64,
    is_last: bool,
    index: &mut WalIndex,
) -> Result<u64, StoreError> {
    let path = dir.join(segment_name(sequence));
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.clone(),
        detail,
    };
    let data = fs::read(&path).map_err(io_error(&path))?;
    let (frames, ending) = frame::parse(&data).map_err(&corrupt)?;
    let (version, stored_sequence) =
        frame::segment_header(&frames).map_err(|detail| StoreError::NotARaftLog {
            path: path.clone(),
            detail: detail.to_owned(),
        })?;
    if version != FORMAT_VERSION {
        return Err(StoreError::UnsupportedVersion {
            path: path.clone(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if stored_sequence != sequence {
        return Err(corrupt(format!(
            "the header says segment {stored_sequence}"
        )));
    }
    for frame in &frames {
        for record in &frame.records {
            replay_record(record, sequence, index).map_err(&corrupt)?;
        }
    }
    let valid_len = match ending {
        Ending::Clean => data.len(),
        Ending::Torn { valid_len } if is_last => {
            if data[valid_len..].iter().all(|&b| b == 0) {
                // Room reserved ahead of the writes (`preallocate.rs`), or a write of which
                // nothing reached the disk: nothing was lost either way.
                tracing::debug!(
                    path = %path.display(),
                    zero_bytes = data.len() - valid_len,
                    "cutting off the zeros after the raft log's last frame"
                );
            } else {
                tracing::warn!(
                    path = %path.display(),
                    dropped_bytes = data.len() - valid_len,
                    "cutting off a torn write at the end of the raft log (a crash interrupted it)"
                );
            }
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io_error(&path))?;
            file.set_len(valid_len as u64).map_err(io_error(&path))?;
            file.sync_all().map_err(io_error(&path))?;
            valid_len
        }
        Ending::Torn { valid_len } => {
            return Err(corrupt(format!(
                "damaged after byte {valid_len}, in a segment that is not the newest"
            )))
        }
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_error(&path))?;
    index.segments.insert(sequence, Arc::new(file));
    Ok(valid_len as u64)
}

fn replay_record(record: &Record<'_>, segment: u64, index: &mut WalIndex) -> Result<(), String> {
    match record {
        Record::Header { .. } => {}
        Record::Entry {
            index: entry_index,
            bytes,
            bytes_offset,
        } => {
            if index.entries.is_empty() {
                index.first = *entry_index;
            } else if *entry_index != index.end() {
                return Err(format!(
                    "hole in the log: entry {entry_index} after {}",
                    index.end() - 1
                ));
            }
            index.entries.push_back(Location {
                segment,
                offset: *bytes_offset as u64,
                len: u32::try_from(bytes.len()).map_err(|_| "entry over 4 GiB".to_owned())?,
            });
        }
        Record::Vote(bytes) => index.vote = Some(bytes.to_vec()),
        Record::Committed(bytes) => index.committed = Some(bytes.to_vec()),
        Record::Purged { upto, log_id } => {
            index.purged = Some((*upto, log_id.to_vec()));
            index.purge_upto(*upto);
        }
        Record::TruncateFrom(from) => index.truncate_from(*from),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::reversed_empty_ranges)] // empty ranges are the point of the test
    fn half_open_normalises_every_bound() {
        assert_eq!(half_open(..), Some((0, None)));
        assert_eq!(half_open(3..7), Some((3, Some(7))));
        assert_eq!(half_open(3..=7), Some((3, Some(8))));
        assert_eq!(half_open(5..5), None);
        assert_eq!(half_open(6..=5), None);
        assert_eq!(half_open(..=u64::MAX), Some((0, None)));
        assert_eq!(
            half_open((Bound::Excluded(u64::MAX), Bound::Unbounded)),
            None
        );
    }

    /// A reservation that fails part-way may grow the file without the log knowing (as
    /// ext4's `fallocate` does when it runs out of space): the zeros it left must still be cut
    /// before the segment stops being the newest, or the next open refuses the log.
    #[test]
    fn a_file_grown_behind_the_logs_back_is_cut_before_it_rolls() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("raft-log");
        let config = WalConfig {
            segment_bytes: 4096,
        };
        let wal = Wal::open(&path, config).expect("open");
        wal.reserving
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let entry = |index: u64| vec![(index, vec![index as u8; 1000])];
        wal.append(&entry(0)).expect("append");
        {
            let active = wal.active.lock().expect("active");
            assert_eq!(active.allocated, active.len, "nothing reserved");
            active
                .file
                .set_len(active.len + 3 * 4096)
                .expect("grow the file as a failed reservation would");
        }
        for index in 1..12 {
            wal.append(&entry(index)).expect("append");
        }
        assert!(wal.read_index().segments.len() >= 2, "the log rolled");
        drop(wal);
        let wal = Wal::open(&path, config).expect("the log opens again");
        assert_eq!(wal.read_index().range(), Some((0, 12)));
    }

    /// The store hands the committed-id hint over without waiting for the writer thread, so
    /// the hint may name an entry whose append is still queued. No frame may carry it before
    /// the log holds that entry: a crash right after would leave a committed id past the
    /// log's end.
    #[test]
    fn a_hint_waits_for_the_frame_that_holds_its_entry() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("raft-log");
        let entries = |range: std::ops::Range<u64>| -> Vec<Encoded> {
            range.map(|index| (index, vec![index as u8; 8])).collect()
        };
        let committed = |wal: &Wal| wal.read_index().committed.clone();
        let wal = Wal::open(&path, WalConfig::default()).expect("open");
        wal.append(&entries(0..3)).expect("append");
        wal.put_committed_hint(b"names 4", Some(4));
        wal.put_vote(b"vote")
            .expect("a frame before entry 4 is in the log");
        wal.flush_hint().expect("nor at close");
        assert_eq!(committed(&wal), None, "the hint is still waiting");
        drop(wal);
        let wal = Wal::open(&path, WalConfig::default()).expect("open again");
        assert_eq!(committed(&wal), None, "no durable frame names entry 4");
        assert_eq!(wal.read_index().vote.as_deref(), Some(&b"vote"[..]));

        wal.put_committed_hint(b"names 4", Some(4));
        wal.append(&entries(3..5))
            .expect("the append that holds entry 4");
        assert_eq!(committed(&wal).as_deref(), Some(&b"names 4"[..]));
        wal.put_committed_hint(b"names 2", Some(2));
        wal.put_vote(b"vote 2")
            .expect("entry 2 is in the log: any frame carries it");
        drop(wal);
        let wal = Wal::open(&path, WalConfig::default()).expect("open a third time");
        assert_eq!(committed(&wal).as_deref(), Some(&b"names 2"[..]));
        assert_eq!(wal.read_index().range(), Some((0, 5)));
    }

    #[test]
    fn a_segment_of_another_format_version_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("raft-log");
        drop(Wal::open(&path, WalConfig::default()).expect("open"));
        let mut builder = FrameBuilder::new();
        builder.header(FORMAT_VERSION + 1, 1);
        fs::write(path.join(segment_name(1)), builder.finish()).expect("write");
        let Err(error) = Wal::open(&path, WalConfig::default()) else {
            panic!("a newer format must not open")
        };
        assert!(
            matches!(error, StoreError::UnsupportedVersion { found, .. } if found == FORMAT_VERSION + 1),
            "{error:?}"
        );
    }

    fn at(segment: u64) -> Location {
        Location {
            segment,
            offset: 0,
            len: 1,
        }
    }

    #[test]
    fn purge_and_truncate_keep_the_index_contiguous() {
        let mut index = WalIndex::empty();
        index.first = 5;
        index.entries.extend([at(1), at(1), at(2), at(3)]);
        index.truncate_from(8);
        assert_eq!(index.range(), Some((5, 8)));
        index.purge_upto(5);
        assert_eq!(index.range(), Some((6, 8)));
        assert_eq!(index.unneeded_segments(3), Vec::<u64>::new());
        index.purge_upto(6);
        index
            .segments
            .insert(1, Arc::new(File::open("/dev/null").expect("null")));
        index
            .segments
            .insert(2, Arc::new(File::open("/dev/null").expect("null")));
        assert_eq!(
            index.unneeded_segments(3),
            vec![1],
            "only segment 2 holds entry 7"
        );
        index.purge_upto(100);
        assert_eq!(index.range(), None);
        assert_eq!(
            index.first, 101,
            "an append after a full purge starts past it"
        );
        assert_eq!(index.unneeded_segments(3), vec![1, 2]);
        index.truncate_from(0);
        assert_eq!(index.range(), None);
    }
}
