//! Rows out of memory on disk as immutable sorted runs, not B-tree pages.
//!
//! Why not the family store's redb tables: a row's key is a random event id, so once the
//! table is larger than a flush every inserted row lands in a different leaf, and each commit
//! copied and wrote a whole 4 KiB page per ~150-byte row (plus its fsync). Profiled on
//! `tally-node dev` at 6,000 commands/s with a 1 s retention, that write was 15% of the
//! node's CPU and grew the file by ~1 KB per row. A run is written once, in key order, block
//! after block, and never changed: ~0.2 KB per row, no page copies, no fsync when written (a
//! run is synced when a snapshot links it, `Run::link_to`; the store's directory is emptied at
//! every start and takes back the runs of the snapshot it restores).
//!
//! Each flush of the buffer (`cold_buffer.rs`) becomes one run; runs of about the same size
//! are merged four at a time on a thread of their own (size tiers, so a row is rewritten
//! about log4(history / flush) times and a lookup checks a few dozen runs at most). Rows are
//! never replaced or removed, so runs can merge in any order; two runs holding the same key
//! are a fault of this node, found when they merge.
//!
//! Format: blocks of about `BLOCK_BYTES`, each entries (key length and row length u32 LE,
//! then the key and the row) and the CRC-32 of those entries (u32 LE); then a footer, the
//! block index (per block: first-key length u32 LE, the key, offset u64 LE, length u32 LE), the
//! row count and block count (u64 LE each) and the CRC-32 of the footer so far (u32 LE); then a
//! fixed trailer: the footer's offset (u64 LE), its length with its CRC (u32 LE) and the magic
//! `TALLYRUN`. The footer is there so that a run opens from its file alone (`Run::open`)
//! without reading its rows: a snapshot links run files (`Run::link_to`) and a restart or a
//! restore takes them back (`ColdRuns::adopt`) instead of rewriting every row.
//!
//! Memory: each run keeps the first key of each group of `GROUP_BLOCKS` blocks (2 MiB of rows,
//! ~0.005% of its bytes), where the group's part of the footer is and its CRC, counted by
//! `ColdRuns::index_bytes` against the budget, and the last group and block it read. A lookup
//! reads the group's part of the footer (~4 KiB, checked against that CRC) and then the block.
//! Keeping every block's first key instead (~0.4% of the bytes, about a byte a row) made memory
//! grow with the history: ~55 MB at 50M rows, ~0.2 GB a year at 5,000 commands/s. Lookups that
//! reach the runs are rare (a replay of an old id, or a filter's false positive), so the second
//! read costs little. The index is read from the footer, never rebuilt from the blocks: a run
//! opens by reading its footer once, checked whole, and keeping the groups' first keys.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::store_error;
use super::error::RouterError;
use crate::unpoisoned::lock;
use crate::writeback_file::WritebackFile;

/// A run's block size: what a lookup reads from disk (one block per run it checks).
const BLOCK_BYTES: usize = 32 << 10;
/// Runs of one size tier merged together.
pub(super) const MERGE_FAN_IN: usize = 4;
/// Blocks per group of a run's index: memory keeps a group's first key and its place in the
/// footer (`GroupPlace`); a lookup reads the group's 64 entries (~4 KiB with ~50-byte keys).
const GROUP_BLOCKS: usize = 64;
/// Entry header: key length and row length, u32 little-endian each.
const ENTRY_HEADER_BYTES: usize = 8;
/// Block trailer: the CRC-32 of the block's entries.
const CRC_BYTES: usize = 4;
/// Memory per entry of a run's index (a group kept, or a block of the group read), beside its
/// first key: the struct and its allocation's overhead, rounded up.
const INDEX_ENTRY_BYTES: usize = 40;
/// The end of every run file, so that a file that is not a whole run is told apart.
const RUN_MAGIC: [u8; 8] = *b"TALLYRUN";
/// Run trailer: the footer's offset (u64) and length (u32), then `RUN_MAGIC`.
const TRAILER_BYTES: usize = 8 + 4 + RUN_MAGIC.len();
/// End of a footer: the row count and the block count, u64 each, then the footer's CRC-32.
const FOOTER_END_BYTES: usize = 8 + 8 + CRC_BYTES;
/// One block in a footer without its key: key length (u32), offset (u64) and length (u32).
const FOOTER_BLOCK_BYTES: usize = 4 + 8 + 4;
/// A footer may be this much larger than an eighth of its file. Footers are ~0.1% of a run
/// (keys far smaller than a block), so the bound only stops a damaged length from making an
/// open allocate gigabytes.
const FOOTER_SLACK_BYTES: u64 = 64 << 10;

/// Where one block of a run sits, and the first key in it.
struct BlockPlace {
    first_key: Box<[u8]>,
    offset: u64,
    len: u32,
}

/// Where one group of `GROUP_BLOCKS` blocks is described in a run's footer, and its first key.
#[derive(Debug, PartialEq, Eq)]
struct GroupPlace {
    first_key: Box<[u8]>,
    /// Where the group's entries start in the run's file, and their bytes.
    entries_offset: u64,
    entries_len: u32,
    /// The CRC-32 of those bytes, taken when they were written or checked at the open: the
    /// footer's own checksum covers it whole only at the open, and a key changed later in its
    /// order would send a lookup to the wrong block and answer "not stored" for a stored row.
    /// A group whose bytes still match is the group the open checked, so a read checks no more.
    entries_crc: u32,
}

impl GroupPlace {
    /// A group that starts at `entries_offset` with `first_key`; `close` gives its extent.
    fn open(first_key: &[u8], entries_offset: u64) -> Self {
        Self {
            first_key: first_key.into(),
            entries_offset,
            entries_len: 0,
            entries_crc: 0,
        }
    }

    /// Ends the group at `end` (in the same terms as its offset), with its entries' CRC.
    fn close(&mut self, end: u64, entries_crc: u32) {
        self.entries_len = u32::try_from(end - self.entries_offset)
            .expect("a group of 64 entries of bounded keys fits 32 bits");
        self.entries_crc = entries_crc;
    }
}

enum RunData {
    /// `remove_on_drop`: the run's own file, gone with it; a file opened to read only
    /// (`Run::open` not owned) is someone else's to keep.
    File {
        file: File,
        path: PathBuf,
        remove_on_drop: bool,
    },
    /// The whole run: blocks, footer and trailer.
    Memory(Vec<u8>),
}

/// One immutable run of rows in key order.
pub(super) struct Run {
    data: RunData,
    groups: Vec<GroupPlace>,
    block_count: usize,
    rows: u64,
    /// Bytes of the blocks: what merge tiers go by.
    bytes: u64,
    /// Bytes of the blocks, the footer and the trailer: what the run takes on disk.
    file_bytes: u64,
    index_bytes: usize,
    /// The last group a lookup read (a range keeps its own): lookups in one group read it once.
    last_group: Mutex<Option<(usize, Arc<[BlockPlace]>)>>,
    /// The last block a lookup read, checked (a range keeps its own).
    last_block: Mutex<Option<(usize, Arc<[u8]>)>>,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let RunData::File {
            path,
            remove_on_drop: true,
            ..
        } = &self.data
        {
            // The last view reading the run is gone; nothing else needs the file.
            remove_run_file(path);
        }
    }
}

fn remove_run_file(path: &std::path::Path) {
    if let Err(error) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), %error, "could not remove a run of rows");
    }
}

impl Run {
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes of the blocks (rows and their checksums), without the footer.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes of the whole run: blocks, footer and trailer (what it takes on disk).
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// The run's file, if it is on disk.
    #[cfg(test)]
    pub fn path(&self) -> Option<&Path> {
        match &self.data {
            RunData::File { path, .. } => Some(path),
            RunData::Memory(_) => None,
        }
    }

    fn from_index(data: RunData, index: RunIndex) -> Self {
        Self {
            data,
            index_bytes: index_bytes(&index.groups),
            groups: index.groups,
            block_count: index.block_count,
            rows: index.rows,
            bytes: index.block_bytes,
            file_bytes: index.file_bytes,
            last_group: Mutex::new(None),
            last_block: Mutex::new(None),
        }
    }

    /// The run in the file at `path`, from its trailer and footer alone (no block is read until
    /// a lookup needs it), checked as far as that goes: a restart or a restore takes runs back
    /// without rewriting their rows. `owned`: the run removes the file when dropped (a file of
    /// this store's), else it leaves it (a snapshot's). Blocking.
    pub fn open(path: &Path, owned: bool) -> Result<Run, RouterError> {
        let file = File::open(path).map_err(|e| file_error("open the run of rows", path, e))?;
        let metadata = (file.metadata()).map_err(|e| file_error("read the size of", path, e))?;
        let index = read_index(path, metadata.len(), |buffer, offset| {
            file.read_exact_at(buffer, offset)
        })?;
        let data = RunData::File {
            file,
            path: path.to_path_buf(),
            remove_on_drop: owned,
        };
        Ok(Run::from_index(data, index))
    }

    /// The run in the file at `path`, read whole into memory and checked as `open` checks it
    /// (a store that keeps its runs in memory).
    fn read_into_memory(path: &Path) -> Result<Run, RouterError> {
        let data = std::fs::read(path).map_err(|e| file_error("read the run of rows", path, e))?;
        let file_bytes = u64::try_from(data.len()).expect("a length in memory fits 64 bits");
        let index = read_index(path, file_bytes, |buffer, offset| {
            read_slice_at(&data, buffer, offset)
        })?;
        Ok(Run::from_index(RunData::Memory(data), index))
    }

    /// Makes `dest`, which must not exist, a durable copy of this run for a snapshot: its file
    /// synced (runs are written without fsync) then hard-linked, or copied and the copy synced
    /// where linking fails (`dest` on another filesystem); a run in memory is written out and
    /// synced. The caller fsyncs `dest`'s directory, so that the name itself is durable.
    /// Blocking.
    pub fn link_to(&self, dest: &Path) -> Result<(), RouterError> {
        match &self.data {
            RunData::File { file, path, .. } => {
                (file.sync_data()).map_err(|e| file_error("sync the run of rows", path, e))?;
                if let Some(copy) = link_or_copy(path, dest)? {
                    (copy.sync_all()).map_err(|e| file_error("sync the run of rows", dest, e))?;
                }
                Ok(())
            }
            RunData::Memory(data) => write_synced(dest, data),
        }
    }

    /// Reads `buffer.len()` bytes of the run at `offset`. Blocking.
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
        match &self.data {
            RunData::Memory(data) => read_slice_at(data, buffer, offset),
            RunData::File { file, .. } => file.read_exact_at(buffer, offset),
        }
    }

    /// A damage found after the run was opened.
    fn damaged(&self, what: &str) -> RouterError {
        match &self.data {
            RunData::File { path, .. } => damaged(path, what),
            RunData::Memory(_) => {
                RouterError::Store(format!("a run of rows out of memory is damaged: {what}"))
            }
        }
    }

    /// The places of group `index`'s blocks, read from the footer and checked against the CRC
    /// the open or the writer took of them. Blocking.
    fn group(&self, index: usize) -> Result<Arc<[BlockPlace]>, RouterError> {
        if let Some((cached, places)) = lock(&self.last_group).as_ref() {
            if *cached == index {
                return Ok(Arc::clone(places));
            }
        }
        let place = &self.groups[index];
        let count = GROUP_BLOCKS.min(self.block_count - index * GROUP_BLOCKS);
        let read_at = |buffer: &mut [u8], offset| self.read_at(buffer, offset);
        let end = place.entries_offset + u64::from(place.entries_len);
        let mut entries = FooterStream::new(&read_at, place.entries_offset, end);
        let mut places = Vec::with_capacity(count);
        for _ in 0..count {
            let block = (entries.block())
                .map_err(|e| store_error("read a run's block index", e))?
                .ok_or_else(|| self.damaged("a group of its block index is cut short"))?;
            places.push(block);
        }
        if !entries.at_end() || entries.take_group_crc() != place.entries_crc {
            return Err(self.damaged(&format!(
                "group {index} of its block index does not match its checksum"
            )));
        }
        let places: Arc<[BlockPlace]> = places.into();
        *lock(&self.last_group) = Some((index, Arc::clone(&places)));
        Ok(places)
    }

    /// Block `index` at `place`, its checksum verified, through the run's cached block.
    /// Blocking.
    fn block(&self, index: usize, place: &BlockPlace) -> Result<Arc<[u8]>, RouterError> {
        if let Some((cached, bytes)) = lock(&self.last_block).as_ref() {
            if *cached == index {
                return Ok(Arc::clone(bytes));
            }
        }
        let bytes = self.read_block(place)?;
        *lock(&self.last_block) = Some((index, Arc::clone(&bytes)));
        Ok(bytes)
    }

    /// The block at `place`, its checksum verified. Blocking.
    fn read_block(&self, place: &BlockPlace) -> Result<Arc<[u8]>, RouterError> {
        let len = place.len as usize;
        let mut buffer = vec![0; len];
        (self.read_at(&mut buffer, place.offset))
            .map_err(|e| store_error("read a block of rows", e))?;
        let bytes: Arc<[u8]> = Arc::from(buffer);
        let (entries, crc) = bytes.split_at(len - CRC_BYTES);
        let stored = u32::from_le_bytes(crc.try_into().expect("four bytes"));
        if crc32fast::hash(entries) != stored {
            return Err(RouterError::Store(format!(
                "a block of rows out of memory is damaged (offset {})",
                place.offset
            )));
        }
        Ok(bytes)
    }

    /// The block that holds `key` if any block does (the first block for a key before it),
    /// with the places of its group. Blocking: reads the group's part of the footer.
    fn block_of(&self, key: &[u8]) -> Result<(usize, Arc<[BlockPlace]>), RouterError> {
        let group = (self.groups)
            .partition_point(|group| &*group.first_key <= key)
            .saturating_sub(1);
        let places = self.group(group)?;
        let within = (places.partition_point(|block| &*block.first_key <= key)).saturating_sub(1);
        Ok((group * GROUP_BLOCKS + within, places))
    }

    /// The row under `key`, if this run holds it. Blocking.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, RouterError> {
        if self.groups.is_empty() || key < &*self.groups[0].first_key {
            return Ok(None);
        }
        let (index, places) = self.block_of(key)?;
        let block = self.block(index, &places[index % GROUP_BLOCKS])?;
        for entry in Entries::of(&block) {
            let (entry_key, row) = entry?;
            if entry_key == key {
                return Ok(Some(row.to_vec()));
            }
            if entry_key > key {
                break;
            }
        }
        Ok(None)
    }

    /// The rows with keys in `start..end` (to the last row without an end), in key order.
    /// Blocking (reads as it goes).
    pub fn range(self: &Arc<Self>, start: &[u8], end: Option<&[u8]>) -> RunRange {
        RunRange {
            run: Arc::clone(self),
            next_block: None,
            group: None,
            block: None,
            at: 0,
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
        }
    }
}

/// What a run's footer says: where its groups of blocks are and how many rows they hold.
struct RunIndex {
    groups: Vec<GroupPlace>,
    block_count: usize,
    rows: u64,
    /// Bytes of the blocks, which is where the footer starts.
    block_bytes: u64,
    /// Bytes of the blocks, the footer and the trailer.
    file_bytes: u64,
}

/// Memory a run's index takes (counted in the budget): the groups' first keys and places, and
/// the group and block a run keeps read (a block's bytes, a group's places with their keys).
fn index_bytes(groups: &[GroupPlace]) -> usize {
    let largest_group = (groups.iter())
        .map(|group| group.entries_len as usize + GROUP_BLOCKS * INDEX_ENTRY_BYTES)
        .max()
        .unwrap_or(0);
    let places: usize = (groups.iter())
        .map(|group| group.first_key.len() + INDEX_ENTRY_BYTES)
        .sum();
    places + largest_group + BLOCK_BYTES
}

/// The end of a block: where the next one starts.
fn block_end(block: &BlockPlace) -> u64 {
    (block.offset).saturating_add(u64::from(block.len))
}

/// Footer bytes a run's writer keeps in memory before it moves them to a file beside the
/// run: a merge into a run of 10 GB has ~20 MB of footer, which would otherwise stay in memory
/// until the run ends, more as the history grows.
const FOOTER_MEMORY_BYTES: usize = 1 << 20;

/// The suffix of a writer's temporary footer file (`FooterWriter`), in the runs' directory.
pub(super) const FOOTER_SPILL_SUFFIX: &str = ".footer";

/// A run's footer as it is written: each block's entry, and the groups they form. Entries
/// past `memory_bytes` wait in a temporary file in the run's directory (removed when the
/// writer is done or dropped; a crash's leftover is removed with the store's old files), so
/// writing a run of any size holds at most that much of its footer.
#[derive(Default)]
struct FooterWriter {
    /// Entries not yet moved to `spill`.
    entries: Vec<u8>,
    /// Bytes of all entries so far, in `spill` or in `entries`.
    entries_len: u64,
    /// Where `spill` goes (the run's directory); `None` for a run in memory, which keeps its
    /// footer with it.
    spill_dir: Option<PathBuf>,
    spill: Option<tempfile::NamedTempFile>,
    memory_bytes: usize,
    /// The CRC of all entries, and of the last group's.
    crc: crc32fast::Hasher,
    group_crc: crc32fast::Hasher,
    /// Entries' offsets are within the entries until `finish` adds where the footer starts.
    groups: Vec<GroupPlace>,
    block_count: usize,
}

impl FooterWriter {
    fn new(spill_dir: Option<PathBuf>, memory_bytes: usize) -> Self {
        Self {
            spill_dir,
            memory_bytes,
            ..Self::default()
        }
    }

    fn push(&mut self, first_key: &[u8], offset: u64, len: u32) -> Result<(), RouterError> {
        if self.block_count.is_multiple_of(GROUP_BLOCKS) {
            self.close_group();
            (self.groups).push(GroupPlace::open(first_key, self.entries_len));
        }
        let key_len = u32::try_from(first_key.len()).map_err(|e| store_error("index a key", e))?;
        let start = self.entries.len();
        self.entries.extend_from_slice(&key_len.to_le_bytes());
        self.entries.extend_from_slice(first_key);
        self.entries.extend_from_slice(&offset.to_le_bytes());
        self.entries.extend_from_slice(&len.to_le_bytes());
        let entry = &self.entries[start..];
        self.crc.update(entry);
        self.group_crc.update(entry);
        self.entries_len += entry.len() as u64;
        self.block_count += 1;
        if self.entries.len() >= self.memory_bytes {
            self.spill_entries()?;
        }
        Ok(())
    }

    /// Moves the entries in memory to the spill file (none for a run in memory).
    fn spill_entries(&mut self) -> Result<(), RouterError> {
        let Some(dir) = &self.spill_dir else {
            return Ok(());
        };
        if self.spill.is_none() {
            let file = (tempfile::Builder::new().suffix(FOOTER_SPILL_SUFFIX))
                .tempfile_in(dir)
                .map_err(|e| store_error("create a run's index file", e))?;
            self.spill = Some(file);
        }
        let spill = self.spill.as_mut().expect("created above");
        (spill.as_file_mut().write_all(&self.entries))
            .map_err(|e| store_error("write a run's index file", e))?;
        self.entries.clear();
        Ok(())
    }

    /// Sets the last group's length and checksum to the entries written since it started.
    fn close_group(&mut self) {
        let crc = std::mem::take(&mut self.group_crc).finalize();
        if let Some(last) = self.groups.last_mut() {
            last.close(self.entries_len, crc);
        }
    }

    /// Writes the footer (the entries, the counts and the CRC) with `write`, and gives the
    /// groups, placed for a footer that starts at `footer_offset` in the run, the block count
    /// and the footer's length.
    fn finish(
        mut self,
        rows: u64,
        footer_offset: u64,
        mut write: impl FnMut(&[u8]) -> Result<(), RouterError>,
    ) -> Result<(Vec<GroupPlace>, usize, u32), RouterError> {
        self.close_group();
        if let Some(mut spill) = self.spill.take() {
            let spilled = self.entries_len - self.entries.len() as u64;
            let file = spill.as_file_mut();
            (file.seek(SeekFrom::Start(0)))
                .map_err(|e| store_error("read a run's index file", e))?;
            let mut buffer = vec![0; self.memory_bytes.min(FOOTER_READ_BYTES)];
            let mut copied = 0;
            loop {
                let read = (file.read(&mut buffer))
                    .map_err(|e| store_error("read a run's index file", e))?;
                if read == 0 {
                    break;
                }
                write(&buffer[..read])?;
                copied += read as u64;
            }
            if copied != spilled {
                return Err(RouterError::Store(format!(
                    "a run's index file held {copied} bytes, not the {spilled} written to it"
                )));
            }
        }
        write(&self.entries)?;
        let mut end = [0; FOOTER_END_BYTES];
        end[..8].copy_from_slice(&rows.to_le_bytes());
        end[8..16].copy_from_slice(&(self.block_count as u64).to_le_bytes());
        self.crc.update(&end[..16]);
        end[16..].copy_from_slice(&self.crc.finalize().to_le_bytes());
        write(&end)?;
        let footer_len = u32::try_from(self.entries_len + FOOTER_END_BYTES as u64)
            .map_err(|e| store_error("write a run's index", e))?;
        for group in &mut self.groups {
            group.entries_offset += footer_offset;
        }
        Ok((self.groups, self.block_count, footer_len))
    }
}

/// The trailer of a run whose footer starts at `footer_offset` and is `footer_len` long.
fn encode_trailer(footer_offset: u64, footer_len: u32) -> [u8; TRAILER_BYTES] {
    let mut trailer = [0; TRAILER_BYTES];
    trailer[..8].copy_from_slice(&footer_offset.to_le_bytes());
    trailer[8..12].copy_from_slice(&footer_len.to_le_bytes());
    trailer[12..].copy_from_slice(&RUN_MAGIC);
    trailer
}

/// The error for a run file at `path` that is not a whole, undamaged run.
fn damaged(path: &Path, what: &str) -> RouterError {
    RouterError::Store(format!(
        "the run of rows {} is damaged: {what}",
        path.display()
    ))
}

/// An I/O error on the run file at `path`.
fn file_error(what: &str, path: &Path, error: impl std::fmt::Display) -> RouterError {
    store_error(&format!("{what} {}", path.display()), error)
}

/// Reads `buffer.len()` bytes of `data` at `offset`, as `read_exact_at` reads a file.
fn read_slice_at(data: &[u8], buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    let bytes = (start.checked_add(buffer.len()))
        .and_then(|end| data.get(start..end))
        .ok_or(std::io::ErrorKind::UnexpectedEof)?;
    buffer.copy_from_slice(bytes);
    Ok(())
}

/// The index of the run of `file_bytes` bytes at `path`, from its trailer and footer (read
/// with `read_at`), checked: the trailer's magic and lengths, the footer's CRC, and an index
/// that tiles the blocks from offset 0 in key order. The footer is read in pieces of
/// `FOOTER_READ_BYTES` (or one entry, if a damaged key length asks for more), so opening a run
/// of any size holds about that much of it.
fn read_index(
    path: &Path,
    file_bytes: u64,
    read_at: impl Fn(&mut [u8], u64) -> std::io::Result<()>,
) -> Result<RunIndex, RouterError> {
    let (footer_offset, footer_len) = read_trailer(path, file_bytes, &read_at)?;
    let read_error = |e| file_error("read the footer of the run of rows", path, e);
    let entries_len = footer_len - FOOTER_END_BYTES;
    let mut end = [0; FOOTER_END_BYTES];
    read_at(&mut end, footer_offset + entries_len as u64).map_err(read_error)?;
    let rows = u64::from_le_bytes(end[..8].try_into().expect("eight bytes"));
    let block_count = u64::from_le_bytes(end[8..16].try_into().expect("eight bytes"));
    let crc = u32::from_le_bytes(end[16..].try_into().expect("four bytes"));
    if block_count > (entries_len / FOOTER_BLOCK_BYTES) as u64 {
        return Err(damaged(
            path,
            &format!("{block_count} blocks in a short index"),
        ));
    }
    let mut footer = FooterStream::new(&read_at, footer_offset, footer_offset + entries_len as u64);
    let mut groups: Vec<GroupPlace> = Vec::new();
    let mut previous: Option<BlockPlace> = None;
    for number in 0..block_count {
        let entry_offset = footer.position();
        let starts_group = number.is_multiple_of(GROUP_BLOCKS as u64);
        if starts_group {
            let group_crc = footer.take_group_crc();
            if let Some(last) = groups.last_mut() {
                last.close(entry_offset, group_crc);
            }
        }
        let block = (footer.block().map_err(read_error)?)
            .ok_or_else(|| damaged(path, "the block index is cut short"))?;
        check_next_block(path, previous.as_ref(), &block)?;
        if starts_group {
            groups.push(GroupPlace::open(&block.first_key, entry_offset));
        }
        previous = Some(block);
    }
    let (entries_end, group_crc) = (footer.position(), footer.take_group_crc());
    if let Some(last) = groups.last_mut() {
        last.close(entries_end, group_crc);
    }
    if !footer.at_end() {
        return Err(damaged(path, "bytes after the block index"));
    }
    footer.crc.update(&end[..16]);
    if footer.crc.finalize() != crc {
        return Err(damaged(path, "the footer's checksum does not match"));
    }
    let block_count = usize::try_from(block_count).expect("blocks read fit memory");
    check_counts(path, previous.as_ref(), block_count, rows, footer_offset)?;
    Ok(RunIndex {
        groups,
        block_count,
        rows,
        block_bytes: footer_offset,
        file_bytes,
    })
}

/// How much of a footer an open reads at a time.
const FOOTER_READ_BYTES: usize = 1 << 20;

/// A footer's entries read front to back in pieces, their CRC taken as they are read.
struct FooterStream<'r, R> {
    read_at: &'r R,
    /// The run's offset of the next byte not yet read, and of the entries' end.
    next: u64,
    end: u64,
    buffer: Vec<u8>,
    /// The next byte not yet taken in `buffer`.
    at: usize,
    crc: crc32fast::Hasher,
    /// The CRC of the bytes taken since the last `take_group_crc`.
    group_crc: crc32fast::Hasher,
}

impl<'r, R: Fn(&mut [u8], u64) -> std::io::Result<()>> FooterStream<'r, R> {
    /// The entries from `start` to `end` (offsets in the run), read with `read_at`.
    fn new(read_at: &'r R, start: u64, end: u64) -> Self {
        Self {
            read_at,
            next: start,
            end,
            buffer: Vec::new(),
            at: 0,
            crc: crc32fast::Hasher::new(),
            group_crc: crc32fast::Hasher::new(),
        }
    }

    /// The run's offset of the next byte to take.
    fn position(&self) -> u64 {
        self.next - (self.buffer.len() - self.at) as u64
    }

    fn at_end(&self) -> bool {
        self.next == self.end && self.at == self.buffer.len()
    }

    /// The next `len` bytes, `None` if the entries end first.
    fn take(&mut self, len: usize) -> std::io::Result<Option<&[u8]>> {
        if self.buffer.len() - self.at < len {
            self.buffer.drain(..self.at);
            self.at = 0;
            let needed = (len - self.buffer.len()) as u64;
            let left = self.end - self.next;
            if needed > left {
                return Ok(None);
            }
            let read = usize::try_from(left.min(needed.max(FOOTER_READ_BYTES as u64)))
                .expect("at most a footer's bytes");
            let start = self.buffer.len();
            self.buffer.resize(start + read, 0);
            (self.read_at)(&mut self.buffer[start..], self.next)?;
            self.crc.update(&self.buffer[start..]);
            self.next += read as u64;
        }
        self.at += len;
        let taken = &self.buffer[self.at - len..self.at];
        self.group_crc.update(taken);
        Ok(Some(taken))
    }

    /// The CRC of the bytes taken since the last call, and a fresh start.
    fn take_group_crc(&mut self) -> u32 {
        std::mem::take(&mut self.group_crc).finalize()
    }

    fn take_array<const N: usize>(&mut self) -> std::io::Result<Option<[u8; N]>> {
        Ok(self
            .take(N)?
            .map(|bytes| bytes.try_into().expect("N bytes")))
    }

    /// The next block's place, `None` if the entries end first.
    fn block(&mut self) -> std::io::Result<Option<BlockPlace>> {
        let Some(key_len) = self.take_array()? else {
            return Ok(None);
        };
        let Some(first_key) = self.take(u32::from_le_bytes(key_len) as usize)? else {
            return Ok(None);
        };
        let first_key: Box<[u8]> = first_key.into();
        let (Some(offset), Some(len)) = (self.take_array()?, self.take_array()?) else {
            return Ok(None);
        };
        Ok(Some(BlockPlace {
            first_key,
            offset: u64::from_le_bytes(offset),
            len: u32::from_le_bytes(len),
        }))
    }
}

/// The footer's offset and length from the trailer of the run of `file_bytes` bytes at
/// `path`, checked to lie just before the trailer and to be of a size a run's footer can have.
fn read_trailer(
    path: &Path,
    file_bytes: u64,
    read_at: &impl Fn(&mut [u8], u64) -> std::io::Result<()>,
) -> Result<(u64, usize), RouterError> {
    let Some(trailer_offset) = file_bytes.checked_sub(TRAILER_BYTES as u64) else {
        return Err(damaged(path, "shorter than a run's trailer"));
    };
    let mut trailer = [0; TRAILER_BYTES];
    (read_at(&mut trailer, trailer_offset))
        .map_err(|e| file_error("read the trailer of the run of rows", path, e))?;
    if trailer[12..] != RUN_MAGIC {
        return Err(damaged(path, "not a run (its magic is wrong)"));
    }
    let footer_offset = u64::from_le_bytes(trailer[..8].try_into().expect("eight bytes"));
    let footer_len = u32::from_le_bytes(trailer[8..12].try_into().expect("four bytes"));
    if footer_offset.checked_add(u64::from(footer_len)) != Some(trailer_offset) {
        return Err(damaged(path, "the footer is not where the trailer says"));
    }
    if (footer_len as usize) < FOOTER_END_BYTES
        || u64::from(footer_len) > file_bytes / 8 + FOOTER_SLACK_BYTES
    {
        return Err(damaged(path, &format!("a footer of {footer_len} bytes")));
    }
    Ok((footer_offset, footer_len as usize))
}

/// Checks that `block` follows `previous` (or starts the run): right after it, with a greater
/// first key, and longer than its checksum.
fn check_next_block(
    path: &Path,
    previous: Option<&BlockPlace>,
    block: &BlockPlace,
) -> Result<(), RouterError> {
    if block.offset != previous.map_or(0, block_end) {
        return Err(damaged(path, &format!("a block at {}", block.offset)));
    }
    if (block.len as usize) <= CRC_BYTES {
        return Err(damaged(path, &format!("a block of {} bytes", block.len)));
    }
    if previous.is_some_and(|previous| previous.first_key >= block.first_key) {
        return Err(damaged(path, "block keys out of order"));
    }
    Ok(())
}

/// Checks that the blocks, the last of which is `last`, end where the footer starts and can
/// hold `rows` rows (at least one a block, at most one per entry header's bytes).
fn check_counts(
    path: &Path,
    last: Option<&BlockPlace>,
    block_count: usize,
    rows: u64,
    block_bytes: u64,
) -> Result<(), RouterError> {
    if last.map_or(0, block_end) != block_bytes {
        return Err(damaged(
            path,
            "the blocks do not end where the footer starts",
        ));
    }
    let entries_bytes = block_bytes - (block_count * CRC_BYTES) as u64;
    if rows < block_count as u64 || rows > entries_bytes / ENTRY_HEADER_BYTES as u64 {
        return Err(damaged(
            path,
            &format!("{rows} rows in {block_count} blocks"),
        ));
    }
    Ok(())
}

/// Makes `dest` a hard link to `source`, or a copy of it where linking fails (another
/// filesystem); the copy, not synced, is returned. Blocking.
fn link_or_copy(source: &Path, dest: &Path) -> Result<Option<File>, RouterError> {
    let Err(error) = std::fs::hard_link(source, dest) else {
        return Ok(None);
    };
    tracing::warn!(
        source = %source.display(),
        dest = %dest.display(),
        %error,
        "could not link a run of rows; copying it"
    );
    copy_file(source, dest).map(Some)
}

/// Copies `source` to `dest`, which must not exist; a copy cut short is removed. Blocking.
fn copy_file(source: &Path, dest: &Path) -> Result<File, RouterError> {
    let mut from = File::open(source).map_err(|e| file_error("open the run of rows", source, e))?;
    let mut to = File::create_new(dest).map_err(|e| file_error("create a run of rows", dest, e))?;
    if let Err(error) = std::io::copy(&mut from, &mut to) {
        remove_run_file(dest);
        return Err(file_error("copy the run of rows to", dest, error));
    }
    Ok(to)
}

/// Writes `bytes` to `dest`, which must not exist, and syncs it. Blocking.
fn write_synced(dest: &Path, bytes: &[u8]) -> Result<(), RouterError> {
    let mut file =
        File::create_new(dest).map_err(|e| file_error("create a run of rows", dest, e))?;
    (file.write_all(bytes)).map_err(|e| file_error("write the run of rows", dest, e))?;
    (file.sync_all()).map_err(|e| file_error("sync the run of rows", dest, e))
}

/// Rows of one run in key order, between two keys (`Run::range`).
pub(super) struct RunRange {
    run: Arc<Run>,
    /// `None` until the first row is asked for: finding the first block reads the footer.
    next_block: Option<usize>,
    /// The group of `next_block`'s blocks, kept by the range itself so that lookups in the
    /// same run (which share the run's cached group) do not make a scan read it again.
    group: Option<(usize, Arc<[BlockPlace]>)>,
    block: Option<Arc<[u8]>>,
    /// Where the next entry starts in `block`.
    at: usize,
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl RunRange {
    /// Block `index` of the run, through the range's own group. Blocking.
    fn read_block(&mut self, index: usize) -> Result<Arc<[u8]>, RouterError> {
        let group_index = index / GROUP_BLOCKS;
        let places = match &self.group {
            Some((cached, places)) if *cached == group_index => Arc::clone(places),
            _ => {
                let places = self.run.group(group_index)?;
                self.group = Some((group_index, Arc::clone(&places)));
                places
            }
        };
        self.run.read_block(&places[index % GROUP_BLOCKS])
    }
}

impl Iterator for RunRange {
    type Item = Result<(Vec<u8>, Vec<u8>), RouterError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let block = match &self.block {
                Some(block) => Arc::clone(block),
                None => {
                    let next_block = match self.next_block {
                        Some(next_block) => next_block,
                        None if self.run.block_count == 0 => return None,
                        None => match self.run.block_of(&self.start) {
                            Ok((first, places)) => {
                                self.group = Some((first / GROUP_BLOCKS, places));
                                first
                            }
                            Err(error) => {
                                self.next_block = Some(self.run.block_count);
                                return Some(Err(error));
                            }
                        },
                    };
                    if next_block >= self.run.block_count {
                        self.next_block = Some(next_block);
                        return None;
                    }
                    let block = match self.read_block(next_block) {
                        Ok(block) => block,
                        Err(error) => return Some(Err(error)),
                    };
                    self.next_block = Some(next_block + 1);
                    self.at = 0;
                    self.block = Some(Arc::clone(&block));
                    block
                }
            };
            let mut entries = Entries::at(&block, self.at);
            let Some(entry) = entries.next() else {
                self.block = None;
                continue;
            };
            self.at = entries.at;
            let (key, row) = match entry {
                Ok(entry) => entry,
                Err(error) => return Some(Err(error)),
            };
            if key < self.start.as_slice() {
                continue;
            }
            if self.end.as_deref().is_some_and(|end| key >= end) {
                self.next_block = Some(self.run.block_count);
                self.block = None;
                return None;
            }
            return Some(Ok((key.to_vec(), row.to_vec())));
        }
    }
}

/// The entries of a block's checked bytes (its trailer excluded).
struct Entries<'a> {
    entries: &'a [u8],
    at: usize,
}

impl<'a> Entries<'a> {
    fn of(block: &'a [u8]) -> Self {
        Self::at(block, 0)
    }

    fn at(block: &'a [u8], at: usize) -> Self {
        Self {
            entries: &block[..block.len() - CRC_BYTES],
            at,
        }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), RouterError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = &self.entries[self.at..];
        if rest.is_empty() {
            return None;
        }
        let damaged = || RouterError::Store("a block of rows out of memory is malformed".into());
        if rest.len() < ENTRY_HEADER_BYTES {
            self.at = self.entries.len();
            return Some(Err(damaged()));
        }
        let key_len = u32::from_le_bytes(rest[0..4].try_into().expect("four bytes")) as usize;
        let row_len = u32::from_le_bytes(rest[4..8].try_into().expect("four bytes")) as usize;
        let end = ENTRY_HEADER_BYTES + key_len + row_len;
        if rest.len() < end {
            self.at = self.entries.len();
            return Some(Err(damaged()));
        }
        self.at += end;
        let key = &rest[ENTRY_HEADER_BYTES..ENTRY_HEADER_BYTES + key_len];
        Some(Ok((key, &rest[ENTRY_HEADER_BYTES + key_len..end])))
    }
}

/// Writes one run, rows in strictly increasing key order.
pub(super) struct RunWriter {
    out: RunOut,
    block: Vec<u8>,
    first_key: Option<Box<[u8]>>,
    last_key: Vec<u8>,
    footer: FooterWriter,
    offset: u64,
    rows: u64,
}

enum RunOut {
    /// Handed to the disk as it is written: a merge or a restore writes gigabytes in one go,
    /// which left dirty would hold up the Raft log's `fdatasync` (`writeback_file.rs`).
    File {
        out: BufWriter<WritebackFile>,
        path: PathBuf,
    },
    Memory(Vec<u8>),
}

impl RunWriter {
    fn new(out: RunOut, footer_memory_bytes: usize) -> Self {
        let spill_dir = match &out {
            RunOut::File { path, .. } => path.parent().map(Path::to_path_buf),
            RunOut::Memory(_) => None,
        };
        Self {
            out,
            block: Vec::with_capacity(BLOCK_BYTES + BLOCK_BYTES / 4),
            first_key: None,
            last_key: Vec::new(),
            footer: FooterWriter::new(spill_dir, footer_memory_bytes),
            offset: 0,
            rows: 0,
        }
    }

    /// Adds a row; its key must be greater than the last one (the same key twice is a fault of
    /// this node: a row moved out of memory twice). Blocking.
    pub fn push(&mut self, key: &[u8], row: &[u8]) -> Result<(), RouterError> {
        if self.rows > 0 && key <= self.last_key.as_slice() {
            return Err(RouterError::Store(if key == self.last_key.as_slice() {
                format!("a row out of memory was stored twice (key {key:02x?})")
            } else {
                "rows out of memory reached a run out of key order".into()
            }));
        }
        let key_len = u32::try_from(key.len()).map_err(|e| store_error("write a key", e))?;
        let row_len = u32::try_from(row.len()).map_err(|e| store_error("write a row", e))?;
        if self.first_key.is_none() {
            self.first_key = Some(key.into());
        }
        self.block.extend_from_slice(&key_len.to_le_bytes());
        self.block.extend_from_slice(&row_len.to_le_bytes());
        self.block.extend_from_slice(key);
        self.block.extend_from_slice(row);
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        self.rows += 1;
        if self.block.len() >= BLOCK_BYTES {
            self.finish_block()?;
        }
        Ok(())
    }

    fn finish_block(&mut self) -> Result<(), RouterError> {
        let Some(first_key) = self.first_key.take() else {
            return Ok(());
        };
        let crc = crc32fast::hash(&self.block);
        self.block.extend_from_slice(&crc.to_le_bytes());
        write_out(&mut self.out, &self.block, "write a block of rows")?;
        let len = u32::try_from(self.block.len()).map_err(|e| store_error("write a block", e))?;
        self.footer.push(&first_key, self.offset, len)?;
        self.offset += u64::from(len);
        self.block.clear();
        Ok(())
    }

    /// The run written, to read from now on. Blocking. Not synced: the directory is a spill
    /// area (module docs).
    pub fn finish(mut self) -> Result<Run, RouterError> {
        self.finish_block()?;
        let out = &mut self.out;
        let (groups, block_count, footer_len) =
            (std::mem::take(&mut self.footer)).finish(self.rows, self.offset, |bytes| {
                write_out(out, bytes, "write a run's index")
            })?;
        let trailer = encode_trailer(self.offset, footer_len);
        write_out(&mut self.out, &trailer, "write a run's trailer")?;
        let data = match std::mem::replace(&mut self.out, RunOut::Memory(Vec::new())) {
            RunOut::File { out, path } => match out.into_inner() {
                Ok(file) => RunData::File {
                    file: file.into_inner(),
                    path,
                    remove_on_drop: true,
                },
                Err(error) => {
                    remove_run_file(&path);
                    return Err(store_error("write a run of rows", error.into_error()));
                }
            },
            RunOut::Memory(data) => RunData::Memory(data),
        };
        let index = RunIndex {
            groups,
            block_count,
            rows: self.rows,
            block_bytes: self.offset,
            file_bytes: self.offset + u64::from(footer_len) + TRAILER_BYTES as u64,
        };
        Ok(Run::from_index(data, index))
    }
}

/// Appends `bytes` to the run being written; `what` names them in an error.
fn write_out(out: &mut RunOut, bytes: &[u8], what: &str) -> Result<(), RouterError> {
    match out {
        RunOut::File { out, .. } => out.write_all(bytes).map_err(|e| store_error(what, e)),
        RunOut::Memory(data) => {
            data.extend_from_slice(bytes);
            Ok(())
        }
    }
}

impl Drop for RunWriter {
    fn drop(&mut self) {
        // A run not finished (a write or a merge that failed) leaves no file behind.
        if let RunOut::File { path, .. } = &self.out {
            remove_run_file(path);
        }
    }
}

/// The runs of one family store, and the merging of them.
pub(super) struct ColdRuns {
    /// Where run files go and how they are named (`<prefix>-<n>.run`); `None` in memory.
    dir: Option<(PathBuf, String)>,
    next: AtomicU64,
    state: Mutex<RunsState>,
    /// What a writer keeps of a footer in memory (`FooterWriter`).
    footer_memory_bytes: usize,
}

#[derive(Default)]
struct RunsState {
    runs: Vec<Arc<Run>>,
    merging: bool,
    /// A merge that failed: the store is broken from then on (fatal).
    failed: Option<String>,
    merges: u64,
}

impl ColdRuns {
    pub fn new(dir: Option<(PathBuf, String)>) -> Self {
        Self {
            dir,
            next: AtomicU64::new(0),
            state: Mutex::default(),
            footer_memory_bytes: FOOTER_MEMORY_BYTES,
        }
    }

    /// The same runs with writers that keep at most `bytes` of a footer in memory (tests: a
    /// footer that reaches its file without writing a run of gigabytes).
    #[cfg(test)]
    fn with_footer_memory_bytes(mut self, bytes: usize) -> Self {
        self.footer_memory_bytes = bytes;
        self
    }

    fn state(&self) -> MutexGuard<'_, RunsState> {
        lock(&self.state)
    }

    /// A writer for a new run (a new file, or memory).
    pub fn writer(&self) -> Result<RunWriter, RouterError> {
        let Some((dir, prefix)) = &self.dir else {
            return Ok(RunWriter::new(
                RunOut::Memory(Vec::new()),
                self.footer_memory_bytes,
            ));
        };
        let path = self.next_run_path(dir, prefix);
        let file = File::create_new(&path).map_err(|e| store_error("create a run of rows", e))?;
        Ok(RunWriter::new(
            RunOut::File {
                out: BufWriter::with_capacity(BLOCK_BYTES * 4, WritebackFile::new(file)),
                path,
            },
            self.footer_memory_bytes,
        ))
    }

    /// Where this store's next run file goes.
    fn next_run_path(&self, dir: &Path, prefix: &str) -> PathBuf {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        dir.join(format!("{prefix}-{number:06}.run"))
    }

    /// Adds a run just written: every view taken from now on reads it.
    pub fn add(&self, run: Run) {
        self.state().runs.push(Arc::new(run));
    }

    /// Takes the run file at `source` (a snapshot's) into this store, checked as `Run::open`
    /// checks it; it merges like any other run. On disk `source` is hard-linked under the
    /// store's next run name (copied where linking fails), so dropping the store's run removes
    /// that link only, never the snapshot's file; in memory the file is read whole. Blocking.
    pub fn adopt(&self, source: &Path) -> Result<(), RouterError> {
        let run = match &self.dir {
            Some((dir, prefix)) => {
                let path = self.next_run_path(dir, prefix);
                link_or_copy(source, &path)?;
                // A file that is no run leaves no link behind.
                Run::open(&path, true).inspect_err(|_| remove_run_file(&path))?
            }
            None => Run::read_into_memory(source)?,
        };
        self.add(run);
        Ok(())
    }

    /// The runs now, for a view: later adds and merges do not change them.
    pub fn list(&self) -> Result<Vec<Arc<Run>>, RouterError> {
        let state = self.state();
        match &state.failed {
            Some(reason) => Err(RouterError::Store(format!(
                "an earlier merge of rows out of memory failed: {reason}"
            ))),
            None => Ok(state.runs.clone()),
        }
    }

    /// Memory the runs' block indexes take (counted in the budget).
    pub fn index_bytes(&self) -> usize {
        self.state().runs.iter().map(|run| run.index_bytes).sum()
    }

    /// Bytes of all runs on disk (or in memory), footers included.
    pub fn bytes(&self) -> u64 {
        self.state().runs.iter().map(|run| run.file_bytes()).sum()
    }

    /// How many runs there are, and how many merges finished.
    pub fn counts(&self) -> (usize, u64) {
        let state = self.state();
        (state.runs.len(), state.merges)
    }

    /// Merges runs for as long as some tier holds `MERGE_FAN_IN` of them. Returns at once if
    /// another thread is merging (it will see the new run when it looks again). Blocking: the
    /// caller is a writer thread that has finished its flush.
    pub fn merge_while_due(&self) {
        loop {
            let chosen = {
                let mut state = self.state();
                if state.merging || state.failed.is_some() {
                    return;
                }
                let Some(chosen) = due_merge(&state.runs) else {
                    return;
                };
                state.merging = true;
                chosen
            };
            let merged = self.merge(&chosen);
            let mut state = self.state();
            state.merging = false;
            match merged {
                Ok(run) => {
                    state
                        .runs
                        .retain(|run| !chosen.iter().any(|old| Arc::ptr_eq(old, run)));
                    state.runs.push(Arc::new(run));
                    state.merges += 1;
                }
                Err(error) => {
                    tracing::error!(%error, "could not merge runs of rows out of memory");
                    state.failed = Some(error.to_string());
                    return;
                }
            }
        }
    }

    fn merge(&self, runs: &[Arc<Run>]) -> Result<Run, RouterError> {
        let mut writer = self.writer()?;
        let sources = (runs.iter())
            .map(|run| Box::new(run.range(&[], None)) as RowSource<'_>)
            .collect();
        merge_sorted(sources, |key, row| writer.push(key, row))?;
        let run = writer.finish()?;
        let expected: u64 = runs.iter().map(|run| run.rows()).sum();
        assert_eq!(
            run.rows(),
            expected,
            "a merge of runs wrote another number of rows than the runs hold"
        );
        Ok(run)
    }
}

/// The runs to merge next: `MERGE_FAN_IN` runs of the lowest tier that has as many, where a
/// run's tier is log4 of its size in flushes.
fn due_merge(runs: &[Arc<Run>]) -> Option<Vec<Arc<Run>>> {
    let flush = super::cold_buffer::FLUSH_BYTES as u64;
    let tier = |run: &Arc<Run>| (run.bytes() / flush).max(1).ilog(MERGE_FAN_IN as u64);
    let lowest = (runs.iter().map(tier))
        .filter(|t| runs.iter().filter(|run| tier(run) == *t).count() >= MERGE_FAN_IN)
        .min()?;
    Some(
        (runs.iter())
            .filter(|run| tier(run) == lowest)
            .take(MERGE_FAN_IN)
            .cloned()
            .collect(),
    )
}

/// Rows from one place, in key order.
pub(super) type RowSource<'a> =
    Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>), RouterError>> + 'a>;

/// Merges key-ordered sources whose keys are distinct across them into one key order; the same
/// key in two sources is a fault of this node (a row stored twice).
pub(super) fn merge_sorted(
    sources: Vec<RowSource<'_>>,
    mut each: impl FnMut(&[u8], &[u8]) -> Result<(), RouterError>,
) -> Result<(), RouterError> {
    let mut heads = Vec::with_capacity(sources.len());
    for mut source in sources {
        if let Some(row) = source.next().transpose()? {
            heads.push((row, source));
        }
    }
    while !heads.is_empty() {
        let mut smallest = 0;
        for (index, ((key, _), _)) in heads.iter().enumerate().skip(1) {
            let least = &heads[smallest].0 .0;
            if key == least {
                return Err(RouterError::Store(format!(
                    "a row out of memory is stored twice (key {key:02x?})"
                )));
            }
            if key < least {
                smallest = index;
            }
        }
        let ((key, row), source) = &mut heads[smallest];
        each(key, row)?;
        match source.next().transpose()? {
            Some(next) => heads[smallest].0 = next,
            None => drop(heads.swap_remove(smallest)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> Vec<u8> {
        format!("fam\0\x01{n:08}").into_bytes()
    }

    fn row(n: u32) -> Vec<u8> {
        vec![(n % 251) as u8; 100 + (n % 50) as usize]
    }

    fn write(runs: &ColdRuns, numbers: impl Iterator<Item = u32>) -> Run {
        let mut writer = runs.writer().expect("writer");
        for n in numbers {
            writer.push(&key(n), &row(n)).expect("push");
        }
        writer.finish().expect("finish")
    }

    fn all(run: &Arc<Run>) -> Vec<(Vec<u8>, Vec<u8>)> {
        run.range(&[], None)
            .collect::<Result<_, _>>()
            .expect("reads")
    }

    /// A run of many blocks answers every key it holds and none it does not, and reads any
    /// range in key order, on disk as in memory.
    #[test]
    fn a_run_answers_every_key_and_range() {
        let dir = tempfile::tempdir().expect("dir");
        for runs in [
            ColdRuns::new(None),
            ColdRuns::new(Some((dir.path().to_path_buf(), "t".into()))),
        ] {
            let run = Arc::new(write(&runs, (0..2_000).map(|n| n * 2)));
            assert!(run.block_count > 5, "{} blocks", run.block_count);
            assert_eq!(run.rows(), 2_000);
            for n in 0..4_000 {
                let found = run.get(&key(n)).expect("get");
                assert_eq!(found, (n % 2 == 0).then(|| row(n)), "key {n}");
            }
            assert_eq!(run.get(b"a").expect("get"), None, "before the first key");
            assert_eq!(run.get(b"z").expect("get"), None, "after the last key");
            let rows: Vec<_> = (run.range(&key(301), Some(&key(3_001))))
                .collect::<Result<_, _>>()
                .expect("reads");
            let expected: Vec<_> = (151..=1_500).map(|n| (key(n * 2), row(n * 2))).collect();
            assert_eq!(rows, expected);
            assert_eq!(all(&run).len(), 2_000);
        }
    }

    /// A run of several groups of blocks finds every key it holds and none it does not,
    /// across the groups' edges, reads ranges that cross them, and opens from its file to the
    /// same groups; its index keeps a key per group, not per block.
    #[test]
    fn a_run_of_several_groups_answers_every_key_and_range() {
        let dir = tempfile::tempdir().expect("dir");
        let on_disk = ColdRuns::new(Some((dir.path().to_path_buf(), "t".into())));
        let rows = 60_000;
        for runs in [ColdRuns::new(None), on_disk] {
            let run = Arc::new(write(&runs, (0..rows).map(|n| n * 2)));
            assert!(run.groups.len() >= 3, "{} groups", run.groups.len());
            assert_eq!(run.block_count.div_ceil(GROUP_BLOCKS), run.groups.len());
            // Twice the rows: the index grows by a key per group, not per block.
            let twice = write(&runs, (0..rows * 2).map(|n| n * 2 + 1));
            assert_eq!(
                twice.index_bytes - run.index_bytes,
                (twice.groups.len() - run.groups.len()) * (key(0).len() + INDEX_ENTRY_BYTES),
                "{} and {} blocks",
                run.block_count,
                twice.block_count
            );
            drop(twice);
            for n in 0..rows * 2 {
                let found = run.get(&key(n)).expect("get");
                assert_eq!(found, (n % 2 == 0).then(|| row(n)), "key {n}");
            }
            for group in &run.groups[1..] {
                let first = &group.first_key;
                assert!(
                    run.get(first).expect("get").is_some(),
                    "a group's first key"
                );
            }
            // Backwards, so that no lookup finds its group or block kept from the one before.
            for n in (0..rows * 2).rev().step_by(7) {
                let found = run.get(&key(n)).expect("get");
                assert_eq!(found, (n % 2 == 0).then(|| row(n)), "key {n} backwards");
            }
            let (from, to) = (rows / 3, rows + rows / 2);
            let range: Vec<_> = (run.range(&key(from), Some(&key(to))))
                .collect::<Result<_, _>>()
                .expect("reads");
            let expected: Vec<_> = (from.div_ceil(2)..to.div_ceil(2))
                .map(|n| (key(n * 2), row(n * 2)))
                .collect();
            assert_eq!(range, expected);
            assert_eq!(all(&run).len(), rows as usize);
            if let Some(path) = run.path() {
                let opened = Run::open(path, false).expect("open");
                assert_eq!(opened.index_bytes, run.index_bytes);
                assert_eq!(
                    opened.groups, run.groups,
                    "the open finds the groups the writer made, checksums included"
                );
            }
        }
    }

    /// A writer that keeps little of its footer in memory moves the rest to a file beside the
    /// run and writes the same run, byte for byte; the file goes when the run is done or
    /// abandoned.
    #[test]
    fn a_footer_past_its_memory_goes_to_a_file_and_the_run_is_the_same() {
        let footer_files = |dir: &Path| {
            (std::fs::read_dir(dir).expect("dir"))
                .filter(|entry| {
                    let name = entry.as_ref().expect("entry").file_name();
                    name.to_string_lossy().ends_with(FOOTER_SPILL_SUFFIX)
                })
                .count()
        };
        let (whole, spilled) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let expected = write(
            &ColdRuns::new(Some((whole.path().to_path_buf(), "t".into()))),
            0..60_000,
        );
        let runs = ColdRuns::new(Some((spilled.path().to_path_buf(), "t".into())))
            .with_footer_memory_bytes(4 << 10);
        let mut writer = runs.writer().expect("writer");
        for n in 0..60_000 {
            writer.push(&key(n), &row(n)).expect("push");
        }
        assert_eq!(
            footer_files(spilled.path()),
            1,
            "the footer went to its file"
        );
        let run = writer.finish().expect("finish");
        assert_eq!(
            footer_files(spilled.path()),
            0,
            "and the file went with the run"
        );
        let bytes = |run: &Run| std::fs::read(run.path().expect("on disk")).expect("read");
        assert!(
            bytes(&run) == bytes(&expected),
            "the same run, byte for byte"
        );
        assert_eq!(run.groups, expected.groups);
        assert_eq!(run.get(&key(59_999)).expect("get"), Some(row(59_999)));

        let mut writer = runs.writer().expect("writer");
        for n in 0..40_000 {
            writer.push(&key(n), &row(n)).expect("push");
        }
        assert_eq!(footer_files(spilled.path()), 1);
        drop(writer);
        assert_eq!(
            footer_files(spilled.path()),
            0,
            "an abandoned run leaves no footer file"
        );
    }

    /// A group of the footer damaged after the run was opened is found when it is read: a
    /// lookup there fails with an error, never a wrong answer, and other groups still read.
    #[test]
    fn a_group_damaged_after_the_open_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let runs = ColdRuns::new(Some((dir.path().to_path_buf(), "t".into())));
        let run = write(&runs, 0..60_000);
        assert!(run.groups.len() >= 3);
        let group = &run.groups[1];
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(run.path().expect("on disk"))
            .expect("open");
        // The second entry's first key: the order or the group's bytes no longer hold.
        let offset =
            group.entries_offset + FOOTER_BLOCK_BYTES as u64 + group.first_key.len() as u64 + 4;
        file.write_all_at(&[0xff; 8], offset).expect("damage");
        let in_group = GROUP_BLOCKS * 60_000 / run.block_count + 10;
        let error = run.get(&key(in_group as u32)).expect_err("damaged");
        assert!(error.to_string().contains("damaged"), "{error}");
        assert_eq!(run.get(&key(5)).expect("the first group"), Some(row(5)));

        // A key raised within its order: without the group's checksum the lookup of the
        // block's first key would go to the block before and answer "not stored".
        let run = write(&runs, 0..60_000);
        let places = run.group(1).expect("the second group");
        let stored = places[1].first_key.to_vec();
        *lock(&run.last_group) = None;
        let group = &run.groups[1];
        let last_byte = group.entries_offset
            + (FOOTER_BLOCK_BYTES + places[0].first_key.len() + 4 + stored.len() - 1) as u64;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(run.path().expect("on disk"))
            .expect("open");
        let raised = stored.last().expect("a key") + 1;
        file.write_all_at(&[raised], last_byte).expect("damage");
        let error = run.get(&stored).expect_err("a wrong answer");
        assert!(error.to_string().contains("checksum"), "{error}");
    }

    #[test]
    fn a_run_refuses_a_key_twice_or_out_of_order_and_a_damaged_block() {
        let dir = tempfile::tempdir().expect("dir");
        let runs = ColdRuns::new(Some((dir.path().to_path_buf(), "t".into())));
        let mut writer = runs.writer().expect("writer");
        writer.push(&key(2), &row(2)).expect("push");
        assert!(writer.push(&key(2), &row(2)).is_err(), "the same key twice");
        assert!(writer.push(&key(1), &row(1)).is_err(), "out of key order");
        drop(writer);
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "a run not finished leaves no file"
        );
        let run = write(&runs, 0..1_000);
        let RunData::File { path, .. } = &run.data else {
            panic!("a run on disk")
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .expect("open");
        file.write_all_at(&[0xaa], 100).expect("damage");
        let error = run.get(&key(1)).expect_err("damaged");
        assert!(error.to_string().contains("damaged"), "{error}");
        assert!(run.get(&key(999)).is_ok(), "other blocks read");
    }

    /// Four runs of one size merge into one that holds all their rows in key order; the old
    /// files go once no view holds them, and a key in two runs is refused.
    #[test]
    fn runs_of_one_size_merge_into_one() {
        let dir = tempfile::tempdir().expect("dir");
        let runs = ColdRuns::new(Some((dir.path().to_path_buf(), "t".into())));
        for part in 0..MERGE_FAN_IN as u32 - 1 {
            runs.add(write(&runs, (0..500).map(|n| n * 4 + part)));
            runs.merge_while_due();
        }
        assert_eq!(runs.counts(), (3, 0), "not due yet");
        let held = runs.list().expect("list");
        runs.add(write(&runs, (0..500).map(|n| n * 4 + 3)));
        runs.merge_while_due();
        assert_eq!(runs.counts(), (1, 1));
        let merged = runs.list().expect("list").remove(0);
        let expected: Vec<_> = (0..2_000).map(|n| (key(n), row(n))).collect();
        assert_eq!(all(&merged), expected);
        let files = || std::fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(files(), 4, "a view's runs stay while it lives");
        drop(held);
        assert_eq!(files(), 1, "merged runs removed");
        let duplicate = Arc::new(write(&runs, 10..20));
        let sources = vec![
            Box::new(merged.range(&[], None)) as RowSource<'_>,
            Box::new(duplicate.range(&[], None)),
        ];
        let error = merge_sorted(sources, |_, _| Ok(())).expect_err("a key twice");
        assert!(error.to_string().contains("stored twice"), "{error}");
    }

    fn run_path(run: &Run) -> PathBuf {
        run.path().expect("a run on disk").to_path_buf()
    }

    /// `opened` answers every lookup and range as `written` does, and counts the same.
    fn assert_same_run(written: &Arc<Run>, opened: &Arc<Run>) {
        assert_eq!(opened.rows(), written.rows(), "rows");
        assert_eq!(opened.bytes(), written.bytes(), "bytes");
        assert_eq!(opened.file_bytes(), written.file_bytes(), "file bytes");
        assert_eq!(opened.index_bytes, written.index_bytes, "index bytes");
        assert_eq!(opened.block_count, written.block_count, "blocks");
        assert_eq!(opened.groups.len(), written.groups.len(), "groups");
        for n in 0..4_000 {
            let found = opened.get(&key(n)).expect("get");
            assert_eq!(found, written.get(&key(n)).expect("get"), "key {n}");
        }
        let range = |run: &Arc<Run>| -> Vec<_> {
            (run.range(&key(301), Some(&key(3_001))))
                .collect::<Result<_, _>>()
                .expect("reads")
        };
        assert_eq!(range(opened), range(written));
        assert_eq!(all(opened), all(written));
    }

    /// A run opened from its file alone (written on disk, or in memory and linked out) answers
    /// as the run written did; the file holds exactly `file_bytes`.
    #[test]
    fn a_run_opened_from_its_file_answers_as_written() {
        let dir = tempfile::tempdir().expect("dir");
        let on_disk = ColdRuns::new(Some((dir.path().to_path_buf(), "t".into())));
        let written = Arc::new(write(&on_disk, (0..2_000).map(|n| n * 2)));
        let path = run_path(&written);
        assert_eq!(
            std::fs::metadata(&path).expect("size").len(),
            written.file_bytes()
        );
        assert!(written.file_bytes() > written.bytes(), "a footer");
        assert_same_run(&written, &Arc::new(Run::open(&path, false).expect("open")));

        let in_memory = Arc::new(write(&ColdRuns::new(None), (0..2_000).map(|n| n * 2)));
        let linked = dir.path().join("memory.run");
        in_memory.link_to(&linked).expect("link");
        assert_eq!(
            std::fs::metadata(&linked).expect("size").len(),
            in_memory.file_bytes()
        );
        assert_same_run(
            &in_memory,
            &Arc::new(Run::open(&linked, false).expect("open")),
        );
    }

    /// A file that is not a whole, undamaged run is refused with an error, by `open` and by
    /// an adopt into memory alike.
    #[test]
    fn open_refuses_a_damaged_or_cut_short_run() {
        let dir = tempfile::tempdir().expect("dir");
        let runs = ColdRuns::new(Some((dir.path().to_path_buf(), "t".into())));
        let run = write(&runs, 0..2_000);
        let spill = dir.path().join("spill");
        std::fs::create_dir(&spill).expect("dir");
        let file_bytes = run.file_bytes();
        let footer_offset = run.bytes();
        let trailer_offset = file_bytes - TRAILER_BYTES as u64;
        // The second block's first key ends with its number's lowest digit, which its block's
        // later rows and the next block's first key differ from in a higher one.
        let key_len = key(0).len() as u64;
        let last_key_byte = footer_offset + FOOTER_BLOCK_BYTES as u64 + 2 * key_len + 4 - 1;
        let mut huge_footer = encode_trailer(0, trailer_offset as u32).to_vec();
        huge_footer.truncate(12);
        type Damage = Box<dyn Fn(&File)>;
        let cases: Vec<(&str, Damage, &str)> = vec![
            (
                "cut short",
                Box::new(move |file| file.set_len(file_bytes - 1).expect("cut")),
                "damaged",
            ),
            (
                "a byte of the footer flipped",
                Box::new(move |file| file.write_all_at(&[0xaa], footer_offset + 5).expect("flip")),
                "damaged",
            ),
            (
                "a byte of a key in the footer flipped, the keys still in order",
                Box::new(move |file| file.write_all_at(&[0xaa], last_key_byte).expect("flip")),
                "checksum",
            ),
            (
                "a wrong magic",
                Box::new(move |file| file.write_all_at(b"X", file_bytes - 1).expect("magic")),
                "magic",
            ),
            (
                "a footer claimed to be most of the file",
                Box::new(move |file| {
                    file.write_all_at(&huge_footer, trailer_offset)
                        .expect("len")
                }),
                "a footer of",
            ),
            (
                "empty",
                Box::new(|file| file.set_len(0).expect("empty")),
                "damaged",
            ),
        ];
        for (number, (case, damage, message)) in cases.iter().enumerate() {
            let path = dir.path().join(format!("case-{number}.run"));
            std::fs::copy(run_path(&run), &path).expect("copy");
            Run::open(&path, false).expect("opens before the damage");
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open");
            damage(&file);
            let error = Run::open(&path, false).err().expect(case);
            assert!(error.to_string().contains(message), "{case}: {error}");
            let in_memory = ColdRuns::new(None);
            assert!(in_memory.adopt(&path).is_err(), "{case}: adopted");
            assert_eq!(in_memory.counts(), (0, 0), "{case}");
            let on_disk = ColdRuns::new(Some((spill.clone(), "t".into())));
            assert!(on_disk.adopt(&path).is_err(), "{case}: adopted on disk");
            assert_eq!(on_disk.counts(), (0, 0), "{case}");
            let left = std::fs::read_dir(&spill).expect("dir").count();
            assert_eq!(left, 0, "{case}: a refused file leaves no link");
            assert!(path.exists(), "{case}: a file opened not owned stays");
        }
    }

    /// A linked run outlives the run it came from; a run opened not owned leaves its file; an
    /// adopted run is the store's own link, removed with the store while the snapshot's file
    /// stays and still opens.
    #[test]
    fn linked_and_adopted_runs_remove_only_their_own_files() {
        let dir = tempfile::tempdir().expect("dir");
        let (first, second, snapshot) = (dir.path().join("a"), dir.path().join("b"), dir.path());
        std::fs::create_dir(&first).expect("dir");
        std::fs::create_dir(&second).expect("dir");
        let files = |dir: &Path| std::fs::read_dir(dir).expect("dir").count();
        let written = Arc::new(write(
            &ColdRuns::new(Some((first.clone(), "t".into()))),
            0..1_000,
        ));
        let expected = all(&written);
        let linked = snapshot.join("linked.run");
        written.link_to(&linked).expect("link");
        drop(written);
        assert_eq!(files(&first), 0, "the written run removed its file");
        let opened = Arc::new(Run::open(&linked, false).expect("open"));
        assert_eq!(all(&opened), expected);
        drop(opened);
        assert!(linked.exists(), "a run opened not owned leaves its file");

        let store = ColdRuns::new(Some((second.clone(), "t".into())));
        store.adopt(&linked).expect("adopt");
        let adopted = store.list().expect("list");
        assert_eq!(adopted.len(), 1);
        let own = run_path(&adopted[0]);
        assert_eq!(own, second.join("t-000000.run"), "the store's own name");
        assert_eq!(all(&adopted[0]), expected);
        assert_eq!(store.bytes(), std::fs::metadata(&own).expect("size").len());
        drop(adopted);
        drop(store);
        assert_eq!(files(&second), 0, "the store's link removed");
        let again = Arc::new(Run::open(&linked, false).expect("the snapshot's file opens"));
        assert_eq!(all(&again), expected);
    }

    /// An adopted run merges with runs written after it, on disk and in memory, and the
    /// merged run holds every row in key order; the snapshot's file stays.
    #[test]
    fn an_adopted_run_merges_with_written_ones() {
        let dir = tempfile::tempdir().expect("dir");
        let (spill, snapshot) = (dir.path().join("spill"), dir.path().join("snapshot"));
        std::fs::create_dir(&spill).expect("dir");
        std::fs::create_dir(&snapshot).expect("dir");
        let source = snapshot.join("0.run");
        (write(&ColdRuns::new(None), (0..500).map(|n| n * 4)))
            .link_to(&source)
            .expect("link");
        for runs in [
            ColdRuns::new(None),
            ColdRuns::new(Some((spill.clone(), "t".into()))),
        ] {
            runs.adopt(&source).expect("adopt");
            for part in 1..MERGE_FAN_IN as u32 {
                runs.add(write(&runs, (0..500).map(|n| n * 4 + part)));
                runs.merge_while_due();
            }
            assert_eq!(runs.counts(), (1, 1), "merged");
            let merged = runs.list().expect("list").remove(0);
            let expected: Vec<_> = (0..2_000).map(|n| (key(n), row(n))).collect();
            assert_eq!(all(&merged), expected);
        }
        assert_eq!(
            std::fs::read_dir(&spill).expect("dir").count(),
            0,
            "the merged runs and the store's link are gone with the store"
        );
        assert_eq!(Run::open(&source, false).expect("open").rows(), 500);
    }
}
