//! Rows out of memory on disk as immutable sorted runs, not B-tree pages.
//!
//! Why not the family store's redb tables: a row's key is a random event id, so once the
//! table is larger than a flush every inserted row lands in a different leaf, and each commit
//! copied and wrote a whole 4 KiB page per ~150-byte row (plus its fsync). Profiled on
//! `tally-node dev` at 6,000 commands/s with a 1 s retention, that write was 15% of the
//! node's CPU and grew the file by ~1 KB per row. A run is written once, in key order, block
//! after block, and never changed: ~0.2 KB per row, no page copies, no fsync (the directory
//! is a spill area rebuilt from the snapshot and the log at every start, like the redb file).
//!
//! Each flush of the buffer (`cold_buffer.rs`) becomes one run; runs of about the same size
//! are merged four at a time on a thread of their own (size tiers, so a row is rewritten
//! about log4(history / flush) times and a lookup checks a few dozen runs at most). Rows are
//! never replaced or removed, so runs can merge in any order; two runs holding the same key
//! are a fault of this node, found when they merge.
//!
//! Memory: each run keeps the first key and place of each block (~0.5% of its bytes), counted
//! by `ColdRuns::index_bytes` against the budget, and the last block it read.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::RouterError;
use super::family_store::store_error;
use crate::unpoisoned::lock;
use crate::writeback_file::WritebackFile;

/// A run's block size: what a lookup reads from disk (one block per run it checks).
const BLOCK_BYTES: usize = 32 << 10;
/// Runs of one size tier merged together.
pub(super) const MERGE_FAN_IN: usize = 4;
/// Entry header: key length and row length, u32 little-endian each.
const ENTRY_HEADER_BYTES: usize = 8;
/// Block trailer: the CRC-32 of the block's entries.
const CRC_BYTES: usize = 4;
/// Memory per block of a run's index, beside its first key.
const INDEX_ENTRY_BYTES: usize = 40;

/// Where one block of a run sits, and the first key in it.
struct BlockPlace {
    first_key: Box<[u8]>,
    offset: u64,
    len: u32,
}

enum RunData {
    File { file: File, path: PathBuf },
    Memory(Vec<u8>),
}

/// One immutable run of rows in key order.
pub(super) struct Run {
    data: RunData,
    blocks: Vec<BlockPlace>,
    rows: u64,
    bytes: u64,
    index_bytes: usize,
    /// The last block read, checked: scans (snapshots) read each block once.
    last_block: Mutex<Option<(usize, Arc<[u8]>)>>,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let RunData::File { path, .. } = &self.data {
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

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Block `index`, its checksum verified. Blocking.
    fn block(&self, index: usize) -> Result<Arc<[u8]>, RouterError> {
        let mut last = lock(&self.last_block);
        if let Some((cached, bytes)) = last.as_ref() {
            if *cached == index {
                return Ok(Arc::clone(bytes));
            }
        }
        let place = &self.blocks[index];
        let len = place.len as usize;
        let bytes: Arc<[u8]> = match &self.data {
            RunData::Memory(data) => {
                let start = usize::try_from(place.offset).expect("a run in memory fits memory");
                Arc::from(&data[start..start + len])
            }
            RunData::File { file, .. } => {
                let mut buffer = vec![0; len];
                (file.read_exact_at(&mut buffer, place.offset))
                    .map_err(|e| store_error("read a block of rows", e))?;
                Arc::from(buffer)
            }
        };
        let (entries, crc) = bytes.split_at(len - CRC_BYTES);
        let stored = u32::from_le_bytes(crc.try_into().expect("four bytes"));
        if crc32fast::hash(entries) != stored {
            return Err(RouterError::Store(format!(
                "a block of rows out of memory is damaged (offset {})",
                place.offset
            )));
        }
        *last = Some((index, Arc::clone(&bytes)));
        Ok(bytes)
    }

    /// The block that holds `key` if any block does.
    fn block_of(&self, key: &[u8]) -> usize {
        (self.blocks)
            .partition_point(|block| &*block.first_key <= key)
            .saturating_sub(1)
    }

    /// The row under `key`, if this run holds it. Blocking.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, RouterError> {
        if self.blocks.is_empty() || key < &*self.blocks[0].first_key {
            return Ok(None);
        }
        let block = self.block(self.block_of(key))?;
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
            next_block: self.block_of(start),
            block: None,
            at: 0,
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
        }
    }
}

/// Rows of one run in key order, between two keys (`Run::range`).
pub(super) struct RunRange {
    run: Arc<Run>,
    next_block: usize,
    block: Option<Arc<[u8]>>,
    /// Where the next entry starts in `block`.
    at: usize,
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Iterator for RunRange {
    type Item = Result<(Vec<u8>, Vec<u8>), RouterError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let block = match &self.block {
                Some(block) => Arc::clone(block),
                None => {
                    if self.next_block >= self.run.blocks.len() {
                        return None;
                    }
                    let block = match self.run.block(self.next_block) {
                        Ok(block) => block,
                        Err(error) => return Some(Err(error)),
                    };
                    self.next_block += 1;
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
                self.next_block = self.run.blocks.len();
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
    blocks: Vec<BlockPlace>,
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
    fn new(out: RunOut) -> Self {
        Self {
            out,
            block: Vec::with_capacity(BLOCK_BYTES + BLOCK_BYTES / 4),
            first_key: None,
            last_key: Vec::new(),
            blocks: Vec::new(),
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
        match &mut self.out {
            RunOut::File { out, .. } => {
                (out.write_all(&self.block)).map_err(|e| store_error("write a block of rows", e))?
            }
            RunOut::Memory(data) => data.extend_from_slice(&self.block),
        }
        let len = u32::try_from(self.block.len()).map_err(|e| store_error("write a block", e))?;
        self.blocks.push(BlockPlace {
            first_key,
            offset: self.offset,
            len,
        });
        self.offset += u64::from(len);
        self.block.clear();
        Ok(())
    }

    /// The run written, to read from now on. Blocking. Not synced: the directory is a spill
    /// area (module docs).
    pub fn finish(mut self) -> Result<Run, RouterError> {
        self.finish_block()?;
        let data = match std::mem::replace(&mut self.out, RunOut::Memory(Vec::new())) {
            RunOut::File { out, path } => match out.into_inner() {
                Ok(file) => RunData::File {
                    file: file.into_inner(),
                    path,
                },
                Err(error) => {
                    remove_run_file(&path);
                    return Err(store_error("write a run of rows", error.into_error()));
                }
            },
            RunOut::Memory(data) => RunData::Memory(data),
        };
        let index_bytes = (self.blocks.iter())
            .map(|block| block.first_key.len() + INDEX_ENTRY_BYTES)
            .sum();
        Ok(Run {
            data,
            index_bytes,
            blocks: std::mem::take(&mut self.blocks),
            rows: self.rows,
            bytes: self.offset,
            last_block: Mutex::new(None),
        })
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
        }
    }

    fn state(&self) -> MutexGuard<'_, RunsState> {
        lock(&self.state)
    }

    /// A writer for a new run (a new file, or memory).
    pub fn writer(&self) -> Result<RunWriter, RouterError> {
        let Some((dir, prefix)) = &self.dir else {
            return Ok(RunWriter::new(RunOut::Memory(Vec::new())));
        };
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{prefix}-{number:06}.run"));
        let file = File::create_new(&path).map_err(|e| store_error("create a run of rows", e))?;
        Ok(RunWriter::new(RunOut::File {
            out: BufWriter::with_capacity(BLOCK_BYTES * 4, WritebackFile::new(file)),
            path,
        }))
    }

    /// Adds a run just written: every view taken from now on reads it.
    pub fn add(&self, run: Run) {
        self.state().runs.push(Arc::new(run));
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

    /// Bytes of all runs on disk (or in memory).
    pub fn bytes(&self) -> u64 {
        self.state().runs.iter().map(|run| run.bytes()).sum()
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
            assert!(run.blocks.len() > 5, "{} blocks", run.blocks.len());
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
}
