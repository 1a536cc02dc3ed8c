//! Where passivated families and rows out of memory live: a node-local redb file of each
//! passivated family's canonical encoding, and beside it sorted runs of every row a family
//! moved out of memory (`tally_ledger::cold`, `cold_runs.rs`), so a family the router lets go
//! of, and a family's history, cost disk, not memory (docs/spec.md §5.5).
//!
//! The file is a spill area, not a source of truth. The replicated state is the newest
//! snapshot plus the Raft log; a node rebuilds this file from them whenever it restores, so
//! the file is created empty at start and commits without waiting for the disk
//! (`Durability::None`): a crash loses nothing the node needs. The runs are the exception
//! that keeps a restart short: a node's own snapshot links them (synced) instead of copying
//! their rows, and a restore from it takes them back by link (`adopt_run`). Every `SYNC_EVERY_BYTES` one
//! commit is durable anyway, because redb reuses the pages freed by non-durable commits only
//! after a durable one, and the file would otherwise only grow.
//!
//! All methods block on disk I/O: the router calls them from blocking threads
//! (`tokio::task::spawn_blocking`), never from an async worker.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use redb::backends::InMemoryBackend;
use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, TableDefinition};
use tally_ledger::FamilyId;

use super::cold_buffer::{Added, ColdBuffer, Rows};
use super::cold_keys::push_family_prefix;
use super::cold_runs::{ColdRuns, Run, RunWriter, FOOTER_SPILL_SUFFIX};
use super::cold_view::ColdView;
use super::error::{store_error, RouterError};

/// A table of rows by family id, each row stored in chunks (`CHUNK_BYTES`) under
/// `(family id, chunk number)`.
type ChunkedTable = TableDefinition<'static, (&'static str, u32), &'static [u8]>;
/// A chunked table open for writing.
type ChunkedWrite<'t> = redb::Table<'t, (&'static str, u32), &'static [u8]>;
/// Family id → the family's canonical encoding (`Family::to_snapshot_bytes`).
const FAMILIES: ChunkedTable = TableDefinition::new("families");
/// Family id → the filters over the family's rows out of memory (`ColdIndex::to_spill`), kept
/// here while the family is passivated so that they cost no memory. A family's row is
/// rewritten at each spill; one left over from an earlier spill is never read.
const FILTERS: ChunkedTable = TableDefinition::new("filters");
/// A row is stored in chunks of this size, the last one shorter. redb gives a value a page of
/// its size rounded up to a power of two and writes or replaces it whole: one family of
/// 270 MB (the hot family of a restore's first expiry round) took a 256 MiB page to write and
/// another to read the one it replaced, beside its encoding. In chunks that fit a 1 MiB page,
/// the store's cache and write buffer bound what a write holds.
const CHUNK_BYTES: usize = (1 << 20) - (4 << 10);

/// Bytes written between two durable commits (see the module docs).
const SYNC_EVERY_BYTES: u64 = 64 << 20;

/// The smallest page cache the store is given, whatever the memory budget says.
pub const MIN_STORE_CACHE_BYTES: usize = 4 << 20;

/// Where a node's family stores go: a directory (one file per router: a snapshot install
/// builds a new router beside the old one), or memory.
#[derive(Clone, Debug)]
pub struct FamilyStoreDir {
    dir: Option<PathBuf>,
    cache_bytes: usize,
    next: Arc<AtomicU64>,
}

impl FamilyStoreDir {
    /// `dir` emptied of the stores a previous run left, with their runs and any run writer's
    /// footer file (they are spill areas, rebuilt from the snapshot and the log).
    pub fn open(dir: &Path, cache_bytes: usize) -> Result<Self, RouterError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| store_error("create the family store directory", e))?;
        let entries =
            std::fs::read_dir(dir).map_err(|e| store_error("list the family stores", e))?;
        for entry in entries {
            let path = entry
                .map_err(|e| store_error("list the family stores", e))?
                .path();
            let footer = path
                .to_str()
                .is_some_and(|p| p.ends_with(FOOTER_SPILL_SUFFIX));
            if footer || (path.extension()).is_some_and(|ext| ext == "redb" || ext == "run") {
                std::fs::remove_file(&path)
                    .map_err(|e| store_error("remove an old family store", e))?;
            }
        }
        Ok(Self {
            dir: Some(dir.to_path_buf()),
            cache_bytes,
            next: Arc::default(),
        })
    }

    /// Stores kept in memory (tests, tools).
    pub fn in_memory() -> Self {
        Self {
            dir: None,
            cache_bytes: MIN_STORE_CACHE_BYTES,
            next: Arc::default(),
        }
    }

    /// A new, empty store.
    pub fn create(&self) -> Result<FamilyStore, RouterError> {
        match &self.dir {
            None => FamilyStore::in_memory(),
            Some(dir) => {
                let number = self.next.fetch_add(1, Ordering::Relaxed);
                FamilyStore::create(
                    &dir.join(format!("families-{number:06}.redb")),
                    self.cache_bytes,
                )
            }
        }
    }
}

/// The store of passivated families. Cheap to clone; the file is removed when the last clone
/// (and the last view taken from it) goes away.
#[derive(Clone)]
pub struct FamilyStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    /// `None` for a store in memory (tests and tools).
    path: Option<PathBuf>,
    written_since_sync: AtomicU64,
    /// Reads that went to the store (misses of the actor table), for metrics.
    reads: AtomicU64,
    /// Lookups of rows out of memory that went to the store, for metrics.
    cold_reads: AtomicU64,
    /// Commits that wrote families or filters, for metrics.
    commits: AtomicU64,
    /// Rows out of memory on disk.
    runs: ColdRuns,
    /// The file's part of a view at the last commit, handed to readers until the next write.
    /// Only the tables: a cached view holding the store itself would keep it (and its files)
    /// alive for ever.
    view: Mutex<Option<Tables>>,
    cache_bytes: AtomicUsize,
    /// Rows out of memory not yet on disk (see `cold_buffer.rs`).
    buffer: ColdBuffer,
}

impl Inner {
    /// Makes `writes` in one commit, durable when `SYNC_EVERY_BYTES` were written since the
    /// last durable one; then drops the cached view. Blocking.
    fn commit(&self, writes: &[TableWrite<'_>]) -> Result<(), RouterError> {
        if writes
            .iter()
            .all(|w| w.put.is_empty() && w.remove.is_empty())
        {
            return Ok(());
        }
        let written: u64 = (writes.iter().flat_map(|w| &w.put))
            .map(|(_, bytes)| bytes.len() as u64)
            .sum();
        let before = self
            .written_since_sync
            .fetch_add(written, Ordering::Relaxed);
        let durable = before + written >= SYNC_EVERY_BYTES;
        let mut txn = self.db.begin_write().map_err(|e| store_error("begin", e))?;
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability)
            .map_err(|e| store_error("set durability", e))?;
        // A table with nothing to write is not opened (a spill with no filter to write).
        for write in writes
            .iter()
            .filter(|w| !w.put.is_empty() || !w.remove.is_empty())
        {
            let mut table = txn
                .open_table(write.table)
                .map_err(|e| store_error("open a table", e))?;
            for (family_id, bytes) in &write.put {
                put_chunked(&mut table, family_id.as_str(), bytes)?;
            }
            for family_id in write.remove {
                remove_row(&mut table, family_id.as_str())?;
            }
        }
        txn.commit().map_err(|e| store_error("commit", e))?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        if durable {
            self.written_since_sync.store(0, Ordering::Relaxed);
        }
        self.drop_cached_view();
        Ok(())
    }

    fn drop_cached_view(&self) {
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Writes rows the buffer handed out as one run, tells the buffer (the run joins the
    /// views from then on), then merges runs if some are due. A failure breaks the store:
    /// every later use of it fails (fatal to the node, which rebuilds the store from its
    /// snapshot at start).
    fn write_buffered(&self, rows: &Rows) {
        let result = self.write_run(rows);
        if let Err(error) = &result {
            tracing::error!(%error, "could not write rows out of memory to the family store");
        }
        self.buffer.flushed(result, |run| self.runs.add(run));
        self.runs.merge_while_due();
    }

    fn write_run(&self, rows: &Rows) -> Result<Run, RouterError> {
        let mut writer = self.runs.writer()?;
        for (key, row) in rows {
            writer.push(key, row)?;
        }
        writer.finish()
    }
}

/// What one commit writes to one table.
struct TableWrite<'a> {
    table: ChunkedTable,
    put: Vec<(&'a FamilyId, &'a [u8])>,
    remove: &'a [FamilyId],
}

impl<'a> TableWrite<'a> {
    fn put(table: ChunkedTable, rows: impl IntoIterator<Item = (&'a FamilyId, &'a [u8])>) -> Self {
        Self {
            table,
            put: rows.into_iter().collect(),
            remove: &[],
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Before the database goes: the cached table reads from it.
        self.drop_cached_view();
        if let Some(path) = &self.path {
            // The database is closed right after this; on Linux the open file goes on
            // existing until then. Nothing is lost: the file is a spill area.
            if let Err(error) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), %error, "could not remove a family store");
            }
        }
    }
}

impl FamilyStore {
    /// A new, empty store at `path`, replacing any file there (one a previous run left).
    pub fn create(path: &Path, cache_bytes: usize) -> Result<Self, RouterError> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(store_error("remove the old family store", error)),
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| store_error("create its directory", e))?;
        }
        let cache_bytes = cache_bytes.max(MIN_STORE_CACHE_BYTES);
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(|e| store_error("create the family store", e))?;
        let runs_prefix = format!(
            "{}-rows",
            path.file_stem().unwrap_or_default().to_string_lossy()
        );
        let runs_dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::from_db(
            db,
            Some(path.to_path_buf()),
            cache_bytes,
            ColdRuns::new(Some((runs_dir, runs_prefix))),
        )
    }

    /// A store held in memory: for tests and tools that run a router without a data dir.
    pub fn in_memory() -> Result<Self, RouterError> {
        let db = Database::builder()
            .set_cache_size(MIN_STORE_CACHE_BYTES)
            .create_with_backend(InMemoryBackend::new())
            .map_err(|e| store_error("create an in-memory family store", e))?;
        Self::from_db(db, None, MIN_STORE_CACHE_BYTES, ColdRuns::new(None))
    }

    fn from_db(
        db: Database,
        path: Option<PathBuf>,
        cache_bytes: usize,
        runs: ColdRuns,
    ) -> Result<Self, RouterError> {
        let txn = db.begin_write().map_err(|e| store_error("begin", e))?;
        for table in [FAMILIES, FILTERS] {
            txn.open_table(table)
                .map_err(|e| store_error("create the tables", e))?;
        }
        txn.commit().map_err(|e| store_error("commit", e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                path,
                written_since_sync: AtomicU64::new(0),
                reads: AtomicU64::new(0),
                cold_reads: AtomicU64::new(0),
                commits: AtomicU64::new(0),
                runs,
                view: Mutex::new(None),
                buffer: ColdBuffer::default(),
                cache_bytes: AtomicUsize::new(cache_bytes),
            }),
        })
    }

    /// Writes `put` and removes `remove` in one commit. Blocking.
    pub fn write(
        &self,
        put: &[(FamilyId, Arc<Vec<u8>>)],
        remove: &[FamilyId],
    ) -> Result<(), RouterError> {
        let families = (put.iter()).map(|(family_id, bytes)| (family_id, bytes.as_slice()));
        let mut write = TableWrite::put(FAMILIES, families);
        write.remove = remove;
        self.inner.commit(&[write])
    }

    /// Writes passivated families and their filters (`ColdIndex::to_spill`) in one commit.
    /// Blocking.
    pub fn write_with_filters(
        &self,
        families: &[(FamilyId, Arc<Vec<u8>>)],
        filters: &[(FamilyId, Vec<u8>)],
    ) -> Result<(), RouterError> {
        let families = (families.iter()).map(|(family_id, bytes)| (family_id, bytes.as_slice()));
        let filters = (filters.iter()).map(|(family_id, bytes)| (family_id, bytes.as_slice()));
        self.inner.commit(&[
            TableWrite::put(FAMILIES, families),
            TableWrite::put(FILTERS, filters),
        ])
    }

    /// Hands over rows moved out of memory (`(cold_row_key, row)`): they are in every view
    /// taken from now on, and reach disk a few MiB at a time, as one run, on a thread of their
    /// own (`cold_buffer.rs`, `cold_runs.rs`). A row is handed over once: the same key again
    /// is a fault of this node. Never blocks: returns `false` when the buffer is full while
    /// the disk falls behind, and then the caller calls `wait_for_cold_rows` (which blocks)
    /// before it hands more over.
    pub fn hand_over_cold_rows(&self, rows: Vec<(Vec<u8>, Vec<u8>)>) -> Result<bool, RouterError> {
        match self.inner.buffer.add(rows)? {
            Added::Held => Ok(true),
            Added::Flush(rows) => self.start_writer(rows).map(|()| true),
            Added::Full => Ok(false),
        }
    }

    /// After `hand_over_cold_rows` returned `false`: waits for the write under way, then
    /// starts the next. Blocking.
    pub fn wait_for_cold_rows(&self) -> Result<(), RouterError> {
        match self.inner.buffer.flush_when_free()? {
            Some(rows) => self.start_writer(rows),
            None => Ok(()),
        }
    }

    /// `hand_over_cold_rows`, waiting if it must. Blocking.
    #[cfg(test)]
    pub fn write_cold_rows(&self, rows: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), RouterError> {
        if self.hand_over_cold_rows(rows)? {
            return Ok(());
        }
        self.wait_for_cold_rows()
    }

    fn start_writer(&self, rows: Arc<Rows>) -> Result<(), RouterError> {
        let inner = Arc::clone(&self.inner);
        std::thread::Builder::new()
            .name("tally-cold-rows".into())
            .spawn(move || inner.write_buffered(&rows))
            .map(drop)
            .map_err(|error| store_error("start the rows writer", error))
    }

    /// A writer of rows that come in the store's key order (a snapshot's rows, as a restore
    /// reads them): they go straight to one run, each written once, without the buffer's
    /// sorting or later merges. Rows handed over meanwhile stay apart, in the buffer.
    pub fn sorted_rows(&self) -> SortedRows<'_> {
        SortedRows {
            store: self,
            writer: None,
            key: Vec::new(),
        }
    }

    /// Takes a run file of a node's own snapshot into the store (`ColdRuns::adopt`): a link,
    /// not a copy, read like any run written here. Blocking.
    pub fn adopt_run(&self, path: &Path) -> Result<(), RouterError> {
        self.inner.runs.adopt(path)
    }

    /// Writes every row handed over to disk now (tests). Blocking.
    pub fn flush_cold_rows(&self) -> Result<(), RouterError> {
        if let Some(rows) = self.inner.buffer.take_all()? {
            self.inner.write_buffered(&rows);
        }
        // Fails if that write did.
        self.inner.buffer.snapshot(|| Ok(())).map(drop)
    }

    /// Memory that rows out of memory still take in the store: those waiting for disk and
    /// the runs' block indexes (counted in the budget).
    pub fn cold_memory_bytes(&self) -> usize {
        self.inner.buffer.bytes() + self.inner.runs.index_bytes()
    }

    /// The part of `cold_memory_bytes` the runs' indexes take: what stays in memory per run
    /// whatever the load, so what grows with the history.
    pub fn cold_run_index_bytes(&self) -> usize {
        self.inner.runs.index_bytes()
    }

    /// How many runs of rows are on disk, and how many merges of runs finished.
    pub fn cold_run_counts(&self) -> (usize, u64) {
        self.inner.runs.counts()
    }

    /// A consistent view of the last commit, with the rows out of memory: later writes do
    /// not change what it reads. Cheap (the file's part is shared until the next write of a
    /// family, the runs are shared); what it reads stays on disk for as long as it lives, so
    /// readers drop it when done.
    pub fn view(&self) -> Result<StoreView, RouterError> {
        let (buffered, (file, runs)) =
            (self.inner.buffer).snapshot(|| Ok((self.file_view()?, self.inner.runs.list()?)))?;
        Ok(StoreView {
            file,
            rows: ColdView { buffered, runs },
        })
    }

    fn file_view(&self) -> Result<FileView, RouterError> {
        let mut cached = self
            .inner
            .view
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(tables) = cached.as_ref() {
            return Ok(FileView {
                tables: tables.clone(),
                store: Arc::clone(&self.inner),
            });
        }
        let txn = self
            .inner
            .db
            .begin_read()
            .map_err(|e| store_error("begin a read", e))?;
        let open = |table| {
            (txn.open_table(table))
                .map(Arc::new)
                .map_err(|e| store_error("open a table", e))
        };
        let tables = Tables {
            families: open(FAMILIES)?,
            filters: open(FILTERS)?,
        };
        *cached = Some(tables.clone());
        Ok(FileView {
            tables,
            store: Arc::clone(&self.inner),
        })
    }

    /// The store's size on disk (its file and its runs of rows), if it is on disk.
    pub fn file_bytes(&self) -> Option<u64> {
        let path = self.inner.path.as_ref()?;
        let file = std::fs::metadata(path).ok().map_or(0, |meta| meta.len());
        Some(file + self.inner.runs.bytes())
    }

    /// Reads of a family from the store so far.
    pub fn reads(&self) -> u64 {
        self.inner.reads.load(Ordering::Relaxed)
    }

    /// Commits that wrote families or filters so far (a passivation is one per bounded
    /// group of families).
    pub fn commits(&self) -> u64 {
        self.inner.commits.load(Ordering::Relaxed)
    }

    /// Lookups of a row out of memory that went to the store so far.
    pub fn cold_reads(&self) -> u64 {
        self.inner.cold_reads.load(Ordering::Relaxed)
    }

    /// The page cache the store was given, counted against the memory budget.
    pub fn cache_bytes(&self) -> usize {
        self.inner.cache_bytes.load(Ordering::Relaxed)
    }

    /// Where node-local scratch files go beside the store (the filters' pages): its
    /// directory, or none for a store in memory.
    pub fn scratch_dir(&self) -> Option<PathBuf> {
        let path = self.inner.path.as_ref()?;
        Some(path.parent().unwrap_or(Path::new(".")).to_path_buf())
    }
}

/// Rows written in the store's key order straight to one run (`FamilyStore::sorted_rows`).
/// Dropped unfinished, it leaves nothing behind.
pub struct SortedRows<'s> {
    store: &'s FamilyStore,
    writer: Option<RunWriter>,
    /// The last key's bytes, reused.
    key: Vec<u8>,
}

impl SortedRows<'_> {
    /// Adds the row `key` names within `family_id`. Keys must come in the store's order
    /// (families in id order, then keys in order), each once: anything else is refused.
    /// Blocking.
    pub fn push(
        &mut self,
        family_id: &FamilyId,
        key: &[u8],
        row: &[u8],
    ) -> Result<(), RouterError> {
        let writer = match &mut self.writer {
            Some(writer) => writer,
            None => self.writer.insert(self.store.inner.runs.writer()?),
        };
        self.key.clear();
        push_family_prefix(&mut self.key, family_id);
        self.key.extend_from_slice(key);
        writer.push(&self.key, row)
    }

    /// Finishes the run: its rows are in every view taken from now on. Blocking.
    pub fn finish(self) -> Result<(), RouterError> {
        if let Some(writer) = self.writer {
            let run = writer.finish()?;
            self.store.inner.runs.add(run);
        }
        Ok(())
    }
}

/// A read-only view of the store at one commit, with the rows out of memory on disk and
/// those not on disk yet (see `FamilyStore::view`).
#[derive(Clone)]
pub struct StoreView {
    file: FileView,
    rows: ColdView,
}

type Table = Arc<ReadOnlyTable<(&'static str, u32), &'static [u8]>>;

/// The file's tables at one commit.
#[derive(Clone)]
struct Tables {
    families: Table,
    filters: Table,
}

/// The file's part of a view.
#[derive(Clone)]
struct FileView {
    tables: Tables,
    /// Keeps the database (and its file) alive while the view is read.
    store: Arc<Inner>,
}

impl StoreView {
    /// Each family's encoding passed through `each`, in the order given. Blocking.
    pub fn read_each<T>(
        &self,
        families: Vec<FamilyId>,
        each: impl Fn(Vec<u8>) -> T,
    ) -> Result<Vec<(FamilyId, T)>, RouterError> {
        families
            .into_iter()
            .map(|family_id| {
                let bytes = self.get(&family_id)?;
                Ok((family_id, each(bytes)))
            })
            .collect()
    }

    /// The stored row under `key` (`cold_row_key`), if any. Blocking.
    pub fn cold_row(&self, key: &[u8]) -> Result<Option<Vec<u8>>, RouterError> {
        let (row, from_disk) = self.rows.cold_row(key)?;
        if from_disk {
            self.file.store.cold_reads.fetch_add(1, Ordering::Relaxed);
        }
        Ok(row)
    }

    /// Every row `family_id` moved out of memory, in key order, as `(key within the family,
    /// row)`, passed to `each`. Blocking.
    pub fn each_cold_row(
        &self,
        family_id: &FamilyId,
        each: impl FnMut(&[u8], &[u8]) -> Result<(), RouterError>,
    ) -> Result<(), RouterError> {
        self.rows.each_cold_row(family_id, each)
    }

    /// The rows out of memory the view holds (`cold_view.rs`).
    pub(super) fn cold_rows(&self) -> &ColdView {
        &self.rows
    }

    /// The family's encoding. A family the router says is stored but the view lacks is a
    /// fault of this node (fatal): its state cannot be found.
    pub fn get(&self, family_id: &FamilyId) -> Result<Vec<u8>, RouterError> {
        self.file.store.reads.fetch_add(1, Ordering::Relaxed);
        let missing = "passivated, but missing from the family store";
        read_row(&self.file.tables.families, family_id, missing)
    }

    /// The family's filters as `FamilyStore::write_with_filters` wrote them last. A family
    /// the index says has its filters here but the view lacks is a fault of this node (fatal).
    pub fn filters(&self, family_id: &FamilyId) -> Result<Vec<u8>, RouterError> {
        read_row(&self.file.tables.filters, family_id, FILTERS_MISSING)
    }

    /// The family's filters as `filters` gives them, read a chunk at a time: a reader that
    /// decodes as it reads holds one chunk (under 1 MiB) of them, not all. Blocking.
    pub fn filters_reader(&self, family_id: &FamilyId) -> Result<RowReader, RouterError> {
        RowReader::open(&self.file.tables.filters, family_id, FILTERS_MISSING)
    }
}

const FILTERS_MISSING: &str = "its filters are spilled, but missing from the family store";

/// A family's row read a chunk at a time (`StoreView::filters_reader`), with `read_row`'s
/// checks: chunks numbered from 0 without a gap, every one but the last full. A broken row
/// reads as an error of kind `InvalidData` that names the family.
pub struct RowReader {
    family_id: FamilyId,
    chunks: redb::Range<'static, (&'static str, u32), &'static [u8]>,
    chunk: redb::AccessGuard<'static, &'static [u8]>,
    number: u32,
    /// Bytes of `chunk` already read.
    at: usize,
}

impl RowReader {
    fn open(table: &Table, family_id: &FamilyId, missing: &str) -> Result<Self, RouterError> {
        let read_error = |e| store_error("read a family", e);
        let id = family_id.as_str();
        let mut chunks = (table.range((id, 0)..=(id, u32::MAX))).map_err(read_error)?;
        let first = chunks.next().transpose().map_err(read_error)?;
        let Some((key, chunk)) = first.filter(|(key, _)| key.value().1 == 0) else {
            return Err(RouterError::FamilyFailed {
                family_id: family_id.clone(),
                reason: missing.into(),
            });
        };
        drop(key);
        Ok(Self {
            family_id: family_id.clone(),
            chunks,
            chunk,
            number: 0,
            at: 0,
        })
    }

    fn broken(&self, why: impl std::fmt::Display) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("family {}'s row is broken: {why}", self.family_id),
        )
    }
}

impl std::io::Read for RowReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let chunk = self.chunk.value();
            if self.at < chunk.len() {
                let n = buf.len().min(chunk.len() - self.at);
                buf[..n].copy_from_slice(&chunk[self.at..self.at + n]);
                self.at += n;
                return Ok(n);
            }
            let full = chunk.len() == CHUNK_BYTES;
            let Some(next) = self.chunks.next() else {
                return Ok(0);
            };
            let (key, chunk) = next.map_err(|error| self.broken(error))?;
            let number = key.value().1;
            if !full || Some(number) != self.number.checked_add(1) {
                return Err(self.broken(format_args!(
                    "chunk {number} after chunk {} of {} bytes",
                    self.number,
                    self.chunk.value().len()
                )));
            }
            (self.chunk, self.number, self.at) = (chunk, number, 0);
        }
    }
}

/// A family's row in `table`, its chunks joined; a row missing is the family's failure,
/// `missing` says why.
fn read_row(table: &Table, family_id: &FamilyId, missing: &str) -> Result<Vec<u8>, RouterError> {
    let read_error = |e| store_error("read a family", e);
    let id = family_id.as_str();
    let Some(first) = table.get((id, 0)).map_err(read_error)? else {
        return Err(RouterError::FamilyFailed {
            family_id: family_id.clone(),
            reason: missing.into(),
        });
    };
    // Most rows are one short chunk: one lookup, as before rows had chunks.
    if first.value().len() < CHUNK_BYTES {
        return Ok(first.value().to_vec());
    }
    // Every chunk but the last is full, so the last tells the row's length before it is read.
    let mut rest = (table.range((id, 1)..=(id, u32::MAX))).map_err(read_error)?;
    let last = rest.next_back().transpose().map_err(read_error)?;
    let full_chunks = last.as_ref().map_or(1, |(key, _)| key.value().1 as usize);
    let last_bytes = last.as_ref().map_or(0, |(_, chunk)| chunk.value().len());
    let mut bytes = Vec::with_capacity(full_chunks * CHUNK_BYTES + last_bytes);
    bytes.extend_from_slice(first.value());
    for (number, chunk) in (1..).zip(rest) {
        let (key, chunk) = chunk.map_err(read_error)?;
        if key.value().1 != number || chunk.value().len() != CHUNK_BYTES {
            return Err(RouterError::Store(format!(
                "family {family_id}'s row is broken at chunk {number}"
            )));
        }
        bytes.extend_from_slice(chunk.value());
    }
    if bytes.len() != full_chunks * CHUNK_BYTES {
        return Err(RouterError::Store(format!(
            "family {family_id}'s row lacks chunks: {} bytes before its last chunk, {} expected",
            bytes.len(),
            full_chunks * CHUNK_BYTES
        )));
    }
    if let Some((_, last)) = last {
        bytes.extend_from_slice(last.value());
    }
    Ok(bytes)
}

/// Writes `bytes` as `family_id`'s row in chunks (at least one, so an empty row is found),
/// and removes the chunks an earlier, longer row left beyond them.
fn put_chunked(
    table: &mut ChunkedWrite<'_>,
    family_id: &str,
    bytes: &[u8],
) -> Result<(), RouterError> {
    let count = bytes.len().div_ceil(CHUNK_BYTES).max(1);
    let count = u32::try_from(count).map_err(|_| {
        RouterError::Store(format!(
            "family {family_id}'s row of {} bytes is too large",
            bytes.len()
        ))
    })?;
    // Only a row whose chunk `count - 1` was full can have left chunks beyond it.
    let mut longer_before = false;
    for number in 0..count {
        let start = number as usize * CHUNK_BYTES;
        let chunk = &bytes[start..bytes.len().min(start + CHUNK_BYTES)];
        let replaced = table
            .insert((family_id, number), chunk)
            .map_err(|e| store_error("write a family", e))?;
        longer_before = replaced.is_some_and(|old| old.value().len() == CHUNK_BYTES);
    }
    if longer_before {
        remove_chunks_from(table, family_id, count)?;
    }
    Ok(())
}

/// Removes `family_id`'s row, if any.
fn remove_row(table: &mut ChunkedWrite<'_>, family_id: &str) -> Result<(), RouterError> {
    let first = table
        .remove((family_id, 0))
        .map_err(|e| store_error("remove a family", e))?;
    if first.is_some_and(|first| first.value().len() == CHUNK_BYTES) {
        remove_chunks_from(table, family_id, 1)?;
    }
    Ok(())
}

/// Removes `family_id`'s chunks numbered `first` and on.
fn remove_chunks_from(
    table: &mut ChunkedWrite<'_>,
    family_id: &str,
    first: u32,
) -> Result<(), RouterError> {
    table
        .retain_in((family_id, first)..=(family_id, u32::MAX), |_, _| false)
        .map_err(|e| store_error("remove a family", e))
}

/// Runs store I/O (and the encoding or decoding that goes with it) on a blocking thread,
/// never on an async worker; a task that could not finish is a store fault.
pub(super) async fn on_blocking_thread<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T, RouterError> + Send + 'static,
) -> Result<T, RouterError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| RouterError::Store(format!("{what} stopped: {error}")))?
}

#[cfg(test)]
mod tests {
    use super::super::cold_keys::cold_row_key;
    use super::*;

    fn bytes(text: &str) -> Arc<Vec<u8>> {
        Arc::new(text.as_bytes().to_vec())
    }

    #[test]
    fn a_view_keeps_reading_the_commit_it_was_taken_at() {
        let store = FamilyStore::in_memory().expect("store");
        let fam = FamilyId::from("fam");
        store
            .write(&[(fam.clone(), bytes("one"))], &[])
            .expect("write");
        let before = store.view().expect("view");
        store
            .write(&[(fam.clone(), bytes("two"))], &[])
            .expect("write");
        assert_eq!(before.get(&fam).expect("read"), b"one");
        assert_eq!(store.view().expect("view").get(&fam).expect("read"), b"two");
        store
            .write(&[], std::slice::from_ref(&fam))
            .expect("remove");
        assert!(matches!(
            store.view().expect("view").get(&fam),
            Err(RouterError::FamilyFailed { .. })
        ));
        assert_eq!(store.reads(), 3);
    }

    /// Rows longer than a chunk, rewritten shorter and longer, read back exactly; an empty
    /// row is found; a removed row leaves no chunk behind; a neighbour whose id extends the
    /// family's is untouched.
    #[test]
    fn rows_in_chunks_read_back_exactly_whatever_they_replaced() {
        let dir = tempfile::tempdir().expect("dir");
        let store = FamilyStore::create(&dir.path().join("families.redb"), 0).expect("create");
        let (fam, neighbour) = (FamilyId::from("fam"), FamilyId::from("fam\0x"));
        let row = |len: usize| Arc::new((0..len).map(|n| (n % 251) as u8).collect::<Vec<u8>>());
        let read = |family_id: &FamilyId| store.view().expect("view").get(family_id);
        store
            .write(&[(neighbour.clone(), row(CHUNK_BYTES + 1))], &[])
            .expect("write");
        for len in [2 * CHUNK_BYTES + 7, CHUNK_BYTES, 0, 3 * CHUNK_BYTES, 5] {
            store.write(&[(fam.clone(), row(len))], &[]).expect("write");
            assert_eq!(read(&fam).expect("read"), *row(len), "a row of {len} bytes");
        }
        store
            .write(&[], std::slice::from_ref(&fam))
            .expect("remove");
        assert!(read(&fam).is_err(), "a removed row is missing");
        store
            .write(&[(fam.clone(), row(3 * CHUNK_BYTES + 1))], &[])
            .expect("write");
        store
            .write(&[], std::slice::from_ref(&fam))
            .expect("remove");
        // A row of one full chunk is read through the range of its chunks.
        store
            .write(&[(fam.clone(), row(CHUNK_BYTES))], &[])
            .expect("write");
        assert_eq!(
            read(&fam).expect("read"),
            *row(CHUNK_BYTES),
            "no chunk of an old row is left"
        );
        assert_eq!(read(&neighbour).expect("read"), *row(CHUNK_BYTES + 1));
    }

    /// A family's filters read a chunk at a time come out as `filters` joins them, whatever
    /// the length and however small the reads; a missing row is the family's failure, and a
    /// row that lost a chunk reads as broken data naming the family.
    #[test]
    fn filters_read_a_chunk_at_a_time_read_as_joined() {
        use std::io::Read;
        let dir = tempfile::tempdir().expect("dir");
        let store = FamilyStore::create(&dir.path().join("families.redb"), 0).expect("create");
        let fam = FamilyId::from("fam");
        let row = |len: usize| (0..len).map(|n| (n % 251) as u8).collect::<Vec<u8>>();
        for len in [2 * CHUNK_BYTES + 7, CHUNK_BYTES, 0, 5] {
            store
                .write_with_filters(&[], &[(fam.clone(), row(len))])
                .expect("write");
            let view = store.view().expect("view");
            let mut reader = view.filters_reader(&fam).expect("opens");
            let (mut read, mut buf) = (Vec::new(), [0u8; 4_099]);
            loop {
                let n = reader.read(&mut buf).expect("reads");
                if n == 0 {
                    break;
                }
                read.extend_from_slice(&buf[..n]);
            }
            assert!(read == row(len), "a row of {len} bytes");
            assert!(read == view.filters(&fam).expect("joined"));
        }
        let view = store.view().expect("view");
        assert!(matches!(
            view.filters_reader(&FamilyId::from("other")),
            Err(RouterError::FamilyFailed { .. })
        ));

        store
            .write_with_filters(&[], &[(fam.clone(), row(3 * CHUNK_BYTES))])
            .expect("write");
        let txn = store.inner.db.begin_write().expect("begin");
        txn.open_table(FILTERS)
            .expect("open")
            .remove(("fam", 1))
            .expect("remove a chunk");
        txn.commit().expect("commit");
        let view = store.view().expect("view");
        let mut reader = view.filters_reader(&fam).expect("opens");
        let error = std::io::copy(&mut reader, &mut std::io::sink()).expect_err("broken");
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
        assert!(
            error.to_string().contains("family fam's row is broken"),
            "{error}"
        );
    }

    /// Rows handed over are read from memory until written, then from a run on disk, and a
    /// family's rows come out in key order wherever each one is; a view keeps what it saw.
    #[test]
    fn rows_out_of_memory_read_alike_from_the_buffer_and_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let store = FamilyStore::create(&dir.path().join("families.redb"), 0).expect("create");
        let (fam, other) = (FamilyId::from("fam"), FamilyId::from("fa"));
        let row = |n: u32| (cold_row_key(&fam, &n.to_be_bytes()), vec![n as u8; 8]);
        let rows_of = |view: &StoreView, family: &FamilyId| {
            let mut rows = Vec::new();
            view.each_cold_row(family, |key, row| {
                rows.push((key.to_vec(), row.to_vec()));
                Ok(())
            })
            .expect("reads");
            rows
        };
        store
            .write_cold_rows(vec![row(2), row(0), (cold_row_key(&other, b"x"), vec![9])])
            .expect("hand over");
        let before = store.view().expect("view");
        assert_eq!(before.cold_row(&row(2).0).expect("read"), Some(row(2).1));
        store.flush_cold_rows().expect("flush");
        assert_eq!(store.cold_reads(), 0, "read from memory");
        store
            .write_cold_rows(vec![row(1), row(3)])
            .expect("hand over");
        let view = store.view().expect("view");
        let keys: Vec<Vec<u8>> = (rows_of(&view, &fam).into_iter())
            .map(|(key, _)| key)
            .collect();
        let expected: Vec<Vec<u8>> = (0u32..4).map(|n| n.to_be_bytes().to_vec()).collect();
        assert_eq!(keys, expected, "file and memory merged in key order");
        assert_eq!(rows_of(&view, &other), vec![(b"x".to_vec(), vec![9])]);
        assert_eq!(
            rows_of(&before, &fam).len(),
            2,
            "an older view keeps what it saw"
        );
        assert_eq!(view.cold_row(&row(0).0).expect("read"), Some(row(0).1));
        assert_eq!(store.cold_reads(), 1, "read from the file");
        assert!(
            store.write_cold_rows(vec![row(1)]).is_err(),
            "handed over twice"
        );
        let runs = || run_files(dir.path());
        assert_eq!(runs(), 1, "one flush, one run on disk");
        drop((store, view, before));
        assert_eq!(runs(), 0, "the runs go with the store");
    }

    /// The run files in `dir`.
    fn run_files(dir: &Path) -> usize {
        (std::fs::read_dir(dir).expect("dir"))
            .filter(|entry| {
                let path = entry.as_ref().expect("entry").path();
                path.extension().is_some_and(|ext| ext == "run")
            })
            .count()
    }

    /// Rows in the store's key order go to one run in one pass, read like any other; rows out
    /// of order, or twice, are refused and leave no run behind.
    #[test]
    fn sorted_rows_go_to_one_run_and_refuse_any_other_order() {
        let dir = tempfile::tempdir().expect("dir");
        let store = FamilyStore::create(&dir.path().join("families.redb"), 0).expect("create");
        let runs = || run_files(dir.path());
        // Ids where one is a prefix of another, or holds a zero byte, in id order.
        let families: Vec<FamilyId> = ["fa", "fa\0", "fam", "fb"].map(FamilyId::from).into();
        let mut sorted = store.sorted_rows();
        for family_id in &families {
            for n in 0u32..3_000 {
                let row = [family_id.as_str().as_bytes(), &n.to_be_bytes()].concat();
                sorted
                    .push(family_id, &n.to_be_bytes(), &row)
                    .expect("in order");
            }
        }
        sorted.finish().expect("finish");
        assert_eq!(store.cold_run_counts(), (1, 0), "one run, no merge");
        assert_eq!(runs(), 1);
        let view = store.view().expect("view");
        for family_id in &families {
            let mut count = 0u32;
            view.each_cold_row(family_id, |key, row| {
                assert_eq!(key, count.to_be_bytes());
                assert_eq!(row, [family_id.as_str().as_bytes(), key].concat());
                count += 1;
                Ok(())
            })
            .expect("reads");
            assert_eq!(count, 3_000, "every row of {family_id:?}");
        }
        let key = cold_row_key(&families[1], &7u32.to_be_bytes());
        assert!(view.cold_row(&key).expect("read").is_some());

        for (first, second) in [(5u32, 4u32), (5, 5)] {
            let mut sorted = store.sorted_rows();
            (sorted.push(&families[3], &first.to_be_bytes(), b"r")).expect("first");
            assert!(
                (sorted.push(&families[3], &second.to_be_bytes(), b"r")).is_err(),
                "{second} after {first}"
            );
            drop(sorted);
        }
        let mut sorted = store.sorted_rows();
        (sorted.push(&families[3], b"x", b"r")).expect("first");
        assert!(
            sorted.push(&families[0], b"y", b"r").is_err(),
            "a family before the last one"
        );
        drop(sorted);
        assert_eq!(runs(), 1, "refused writes left no run");
    }

    #[test]
    fn a_store_dir_starts_empty_and_names_each_store_anew() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("families-000000.redb"), b"old").expect("write");
        std::fs::write(dir.path().join("families-000000-rows-000003.run"), b"old").expect("write");
        let footer = format!(".tmpAbC123{FOOTER_SPILL_SUFFIX}");
        std::fs::write(dir.path().join(&footer), b"a crashed writer's").expect("write");
        std::fs::write(dir.path().join("notes.txt"), b"kept").expect("write");
        let stores = FamilyStoreDir::open(dir.path(), 0).expect("open");
        assert!(!dir.path().join("families-000000.redb").exists());
        assert!(!dir.path().join("families-000000-rows-000003.run").exists());
        assert!(!dir.path().join(&footer).exists());
        assert!(dir.path().join("notes.txt").exists());
        let (first, second) = (stores.create().expect("one"), stores.create().expect("two"));
        assert!(dir.path().join("families-000000.redb").exists());
        assert!(dir.path().join("families-000001.redb").exists());
        drop((first, second));
        assert!(!dir.path().join("families-000001.redb").exists());
    }

    #[test]
    fn a_file_store_starts_empty_and_is_removed_when_dropped() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("families.redb");
        let fam = FamilyId::from("fam");
        {
            let store = FamilyStore::create(&path, 0).expect("create");
            store
                .write(&[(fam.clone(), bytes("state"))], &[])
                .expect("write");
            assert!(store.file_bytes().expect("a file") > 0);
            assert_eq!(store.cache_bytes(), MIN_STORE_CACHE_BYTES);
        }
        assert!(!path.exists(), "the spill file outlived its store");
        std::fs::write(&path, b"left over by a crash").expect("write");
        let store = FamilyStore::create(&path, 0).expect("create over a leftover");
        assert!(store.view().expect("view").get(&fam).is_err());
    }
}
