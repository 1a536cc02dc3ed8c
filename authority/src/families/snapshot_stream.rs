//! Router snapshots as a stream: written from a cut family by family and row by row, read
//! back into a family store the same way, so neither side ever holds the whole state in
//! memory (docs/spec.md §5.5). The bytes are exactly `RouterSnapshot::to_bytes`'s (a
//! MessagePack array of the format version, the router state, the maintenance schedule, the
//! family map and, from version 3, the rows families moved out of memory), and the digest is
//! computed while they stream, so a receiver checks what it got against the sender's digest
//! before the new state replaces anything. The rows are not in the digest themselves: each
//! family's encoding (which is) counts and digests its rows (`ColdMeta`), and the receiver
//! checks every family's rows against that as they stream in.
//!
//! A node's own snapshots are *linked* (`write_linked`): the same stream without the rows,
//! then the names of the run files that hold the rows (hard links beside the snapshot file,
//! `cold_view.rs`) and the node's filters over them (`cold_index.rs`). Writing one costs the
//! families, not the history; a restart opens the runs (`restore_linked`) instead of
//! streaming every row into a new store. Only a snapshot sent to another node, or backed up,
//! is expanded into the full stream (`expand_linked`), byte for byte what `write_cut` writes.
//!
//! Every function here blocks on I/O: callers run them on blocking threads.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use sha2::Digest;
use tally_ledger::snapshot::digest_bytes;
use tally_ledger::{ColdMeta, FamilyId, IdMap};

use super::cold_index::{ColdIndex, FiltersToSpill};
use super::cold_runs::Run;
use super::cold_view::ColdView;
use super::config::RouterConfig;
use super::error::RouterError;
use super::family_store::FamilyStore;
use super::filter_spill::StoredFilterWriter;
use super::router::FamilyRouter;
use super::router_state::RouterState;
use super::snapshot::{
    add_family_digest, check_restorable, compose_digest_header, RouterCut, SNAPSHOT_FORMAT_VERSION,
};

/// The fields of a `RouterSnapshot`, as its MessagePack array holds them: four, and from
/// version 3 a fifth when some family has rows out of memory.
const SNAPSHOT_FIELDS: u32 = 5;
const SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS: u32 = 4;
/// Bytes of families written to the store per commit while restoring.
const RESTORE_CHUNK_BYTES: usize = 64 << 20;
/// Run files a linked snapshot may name (a store holds a few dozen).
const MAX_LINKED_RUNS: u32 = 4_096;

/// Writes the cut to `out` (reading its passivated families from the store's view at the
/// cut) and returns the state's digest, equal to `FamilyRouter::digest` at the cut.
pub fn write_cut(cut: RouterCut, out: &mut impl Write) -> Result<[u8; 32], RouterError> {
    let counts = cut.cold.counts();
    let fields = if counts.is_empty() {
        SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS
    } else {
        SNAPSHOT_FIELDS
    };
    let (digest, view) = write_families(cut, fields, out)?;
    if !counts.is_empty() {
        write_cold_rows(&view, &counts, None, out)?;
    }
    Ok(digest)
}

/// Writes the cut as a node's own, linked snapshot: the stream without its rows, then the
/// names of the run files in `runs_dir` (empty, and synced here) that hold them, then the
/// filters over them (those of passivated families read from the cut's view of the store). Returns the state's digest, as `write_cut` would.
pub fn write_linked(
    cut: RouterCut,
    out: &mut impl Write,
    runs_dir: &Path,
) -> Result<[u8; 32], RouterError> {
    let cold = cut.cold.share();
    let runs = cut.view.cold_rows().runs.len() + 1;
    if runs > MAX_LINKED_RUNS as usize {
        // A snapshot no restore would take: refused here, so the older ones stay.
        return Err(RouterError::Store(format!(
            "the store holds {runs} runs of rows, a snapshot links at most {MAX_LINKED_RUNS}"
        )));
    }
    let names = cut.view.cold_rows().link_into(runs_dir)?;
    assert_eq!(
        cut.view.cold_rows().rows(),
        cold.total_rows(),
        "the store's view at the cut holds another number of rows than the index counts"
    );
    let (digest, view) = write_families(cut, SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS, out)?;
    let count = u32::try_from(names.len()).map_err(encode_error)?;
    rmp::encode::write_array_len(out, count).map_err(encode_error)?;
    for name in &names {
        rmp::encode::write_str(out, name).map_err(encode_error)?;
    }
    cold.write_to(out, |family_id| view.filters(family_id))?;
    Ok(digest)
}

/// The MessagePack array header, version, router state, schedule and every family, in id
/// order (live ones encoded as they go, passivated ones read from the cut's view). Returns
/// the state's digest and the view, to read the rows from.
fn write_families(
    cut: RouterCut,
    fields: u32,
    out: &mut impl Write,
) -> Result<([u8; 32], super::family_store::StoreView), RouterError> {
    let RouterCut {
        state,
        maintenance_due,
        mut live,
        stored,
        view,
        cold: _,
    } = cut;
    let mut ids: Vec<FamilyId> = stored.iter().cloned().chain(live.keys().cloned()).collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(
        ids.len(),
        before,
        "a family is both live and passivated at the cut"
    );

    rmp::encode::write_array_len(out, fields).map_err(encode_error)?;
    rmp_serde::encode::write(out, &SNAPSHOT_FORMAT_VERSION).map_err(encode_error)?;
    rmp_serde::encode::write(out, &state).map_err(encode_error)?;
    rmp_serde::encode::write(out, &maintenance_due).map_err(encode_error)?;
    let count = u32::try_from(ids.len()).map_err(encode_error)?;
    rmp::encode::write_map_len(out, count).map_err(encode_error)?;
    let mut digest = compose_digest_header(&state, &maintenance_due, ids.len());
    for family_id in ids {
        let bytes = match live.remove(&family_id) {
            // Dropped as soon as it is encoded: an actor copies its family only if it applies
            // a command before the writer got to it.
            Some(family) => family.to_snapshot_bytes(),
            None => view.get(&family_id)?,
        };
        rmp_serde::encode::write(out, &family_id).map_err(encode_error)?;
        let length = u32::try_from(bytes.len()).map_err(encode_error)?;
        rmp::encode::write_bin_len(out, length).map_err(encode_error)?;
        out.write_all(&bytes).map_err(encode_error)?;
        add_family_digest(&mut digest, &family_id, &digest_bytes(&bytes));
    }
    Ok((digest.finalize().into(), view))
}

/// The rows out of memory, family by family in id order, each a map of key → row in key
/// order, read from the store's view at the cut (or a linked snapshot's runs).
/// With `expected`, each family's rows are also checked against the count and digest its
/// encoding gives (rows read from files, which the state's digest does not cover).
fn write_cold_rows(
    view: &impl EachColdRow,
    cold: &BTreeMap<FamilyId, u64>,
    expected: Option<&BTreeMap<FamilyId, ColdMeta>>,
    out: &mut impl Write,
) -> Result<(), RouterError> {
    let families = u32::try_from(cold.len()).map_err(encode_error)?;
    rmp::encode::write_map_len(out, families).map_err(encode_error)?;
    for (family_id, rows) in cold {
        rmp_serde::encode::write(out, family_id).map_err(encode_error)?;
        let count = u32::try_from(*rows).map_err(encode_error)?;
        rmp::encode::write_map_len(out, count).map_err(encode_error)?;
        let mut written = ColdMeta::default();
        view.each_cold_row(family_id, |key, row| {
            match expected {
                Some(_) => written.add(key, row),
                None => written.rows += 1,
            }
            write_bin(out, key)?;
            write_bin(out, row)
        })?;
        let matches = match expected.map(|expected| expected.get(family_id)) {
            Some(meta) => meta == Some(&written),
            None => written.rows == *rows,
        };
        if !matches {
            return Err(RouterError::Store(format!(
                "family {family_id}: the rows out of memory read back ({} of them) are not \
                 those its state counts ({rows})",
                written.rows
            )));
        }
    }
    Ok(())
}

/// Where `write_cold_rows` reads a family's rows from.
trait EachColdRow {
    fn each_cold_row(
        &self,
        family_id: &FamilyId,
        each: impl FnMut(&[u8], &[u8]) -> Result<(), RouterError>,
    ) -> Result<(), RouterError>;
}

impl EachColdRow for super::family_store::StoreView {
    fn each_cold_row(
        &self,
        family_id: &FamilyId,
        each: impl FnMut(&[u8], &[u8]) -> Result<(), RouterError>,
    ) -> Result<(), RouterError> {
        self.cold_rows().each_cold_row(family_id, each)
    }
}

impl EachColdRow for ColdView {
    fn each_cold_row(
        &self,
        family_id: &FamilyId,
        each: impl FnMut(&[u8], &[u8]) -> Result<(), RouterError>,
    ) -> Result<(), RouterError> {
        ColdView::each_cold_row(self, family_id, each)
    }
}

fn write_bin(out: &mut impl Write, bytes: &[u8]) -> Result<(), RouterError> {
    let length = u32::try_from(bytes.len()).map_err(encode_error)?;
    rmp::encode::write_bin_len(out, length).map_err(encode_error)?;
    out.write_all(bytes).map_err(encode_error)
}

/// Reads a snapshot stream into `store` (which must be empty) and returns the router it
/// restores with the digest of what was read. The caller compares that digest with the
/// sender's before it lets the router replace anything.
pub fn restore_from(
    config: RouterConfig,
    input: &mut impl Read,
    store: FamilyStore,
) -> Result<(FamilyRouter, [u8; 32]), RouterError> {
    let mut families = StoredFamilies::new(&store);
    // The rows come in the store's key order: one run, each row written once.
    let mut rows = store.sorted_rows();
    let mut cold = ColdIndex::default();
    // And family by family: once the next family's rows begin, the last one's filters are
    // complete and go to the store, so the filters in memory are the family being read and
    // those waiting for the writer's next commit (at most `SPILL_COMMIT_BYTES` of them).
    let mut filters = StoredFilterWriter::new(&store);
    let mut filling: Option<FamilyId> = None;
    let head = read_stream(input, RowsAt::Stream, |item| match item {
        Item::Family(family_id, bytes) => families.add(family_id, bytes),
        Item::ColdRow(family_id, key, row) => {
            if filling.as_ref() != Some(family_id) {
                if let Some(done) = filling.replace(family_id.clone()) {
                    spill_filters(&mut cold, &mut filters, done)?;
                }
            }
            cold.add(family_id, key);
            rows.push(family_id, key, row)
        }
    })?;
    if let Some(done) = filling {
        spill_filters(&mut cold, &mut filters, done)?;
    }
    cold.spilled(&filters.finish()?);
    let stored = families.finish()?;
    rows.finish()?;
    head.into_router(config, store, stored, cold)
}

/// Reads a linked snapshot (`write_linked`) into `store` (which must be empty): the families
/// as `restore_from` does, the runs in `runs_dir` taken in by link (no row is read), the
/// filters loaded. Checks that the filters count, family by family, the rows each family's
/// encoding says it has out of memory, and the runs hold that many rows. Returns the router
/// and the digest of its state.
pub fn restore_linked(
    config: RouterConfig,
    input: &mut impl Read,
    runs_dir: &Path,
    store: FamilyStore,
) -> Result<(FamilyRouter, [u8; 32]), RouterError> {
    let mut families = StoredFamilies::new(&store);
    let head = read_stream(input, RowsAt::Links, |item| match item {
        Item::Family(family_id, bytes) => families.add(family_id, bytes),
        Item::ColdRow(..) => unreachable!("a linked snapshot streams no rows"),
    })?;
    let stored = families.finish()?;
    // The index marks every family's filters in the store as it hands them over; the store
    // holds them all once `filters` is finished.
    let mut filters = StoredFilterWriter::new(&store);
    let spill = |family_id, copy: FiltersToSpill| filters.push(family_id, copy.encode()?).map(drop);
    let (names, cold) = read_links(input, &head, spill)?;
    filters.finish()?;
    for name in &names {
        store.adopt_run(&runs_dir.join(name))?;
    }
    let cold = match cold {
        Some(cold) => cold,
        None => rebuild_filters(&store, &head)?,
    };
    let linked = store.view()?.cold_rows().rows();
    if linked != cold.total_rows() {
        return Err(invalid(format!(
            "the snapshot's runs hold {linked} rows, its families count {}",
            cold.total_rows()
        )));
    }
    head.into_router(config, store, stored, cold)
}

/// Writes a linked snapshot (`write_linked`, runs in `runs_dir`) out as the full stream
/// `write_cut` would have written at its cut, byte for byte: the families copied as they are,
/// the rows read from the runs; `input` is read once, from its start. Returns the state's
/// digest. Reads every row: for a snapshot sent to another
/// node or backed up, never on the apply path.
pub fn expand_linked(
    input: impl Read,
    runs_dir: &Path,
    out: &mut impl Write,
) -> Result<[u8; 32], RouterError> {
    // The runs first: open, they outlive a prune of the snapshot by the node meanwhile.
    let mut opened = BTreeMap::new();
    for entry in std::fs::read_dir(runs_dir).map_err(decode_error)? {
        let path = entry.map_err(decode_error)?.path();
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        opened.insert(name.unwrap_or_default(), Arc::new(Run::open(&path, false)?));
    }
    // A snapshot links a run exactly when some family has rows out of memory (no run is
    // empty), so the header, which says whether rows follow, is known before the families
    // are read, and they are read once, copied as they come.
    let fields = if opened.is_empty() {
        SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS
    } else {
        SNAPSHOT_FIELDS
    };
    rmp::encode::write_array_len(out, fields).map_err(encode_error)?;
    let mut input = input;
    // The header is one byte in both forms (a fixarray), checked as `read_stream` reads it.
    let mut header = [0u8; 1];
    input.read_exact(&mut header).map_err(decode_error)?;
    let mut tee = Tee {
        input: (&header[..]).chain(input),
        out: &mut *out,
        failed: None,
    };
    let head = read_stream(&mut tee, RowsAt::Links, |_| Ok(()));
    if let Some(error) = tee.failed.take() {
        return Err(encode_error(error));
    }
    let head = head?;
    let mut input = tee.input;
    // Only the counts are needed: each family's filters are dropped as they are read.
    let (names, cold) = read_links(&mut input, &head, |_, _| Ok(()))?;
    let runs = (names.iter())
        .map(|name| {
            opened.remove(name).ok_or_else(|| {
                invalid(format!("run {name} is missing from {}", runs_dir.display()))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let view = ColdView::of_runs(runs);
    // Filters saved before they were blocked were not checked: the families' counts are.
    let counts = match cold {
        Some(cold) => cold.counts(),
        None => (head.cold_meta.iter())
            .map(|(family_id, meta)| (family_id.clone(), meta.rows))
            .collect(),
    };
    let counted: u64 = counts.values().sum();
    if view.rows() != counted {
        return Err(invalid(format!(
            "the snapshot's runs hold {} rows, its families count {counted}",
            view.rows(),
        )));
    }
    if !counts.is_empty() {
        write_cold_rows(&view, &counts, Some(&head.cold_meta), out)?;
    }
    Ok(head.digest)
}

/// Reads `input`, writing every byte read, but the first, to `out` too.
struct Tee<R, W> {
    input: R,
    out: W,
    failed: Option<std::io::Error>,
}

impl<R: Read, W: Write> Read for Tee<std::io::Chain<&[u8], R>, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let header = !self.input.get_ref().0.is_empty();
        let read = self.input.read(buf)?;
        let copied = if header {
            &buf[1.min(read)..read]
        } else {
            &buf[..read]
        };
        if let Err(error) = self.out.write_all(copied) {
            let kind = error.kind();
            self.failed = Some(error);
            return Err(kind.into());
        }
        Ok(read)
    }
}

/// What follows the families in a linked snapshot: the run files' names and the filters,
/// checked against the families' own counts (`head.cold_meta`), and nothing after them;
/// `None` for filters saved before they were blocked (`ColdIndex::read_any_spilling`).
fn read_links(
    input: &mut impl Read,
    head: &Head,
    spill: impl FnMut(FamilyId, FiltersToSpill) -> Result<(), RouterError>,
) -> Result<(Vec<String>, Option<ColdIndex>), RouterError> {
    let count = rmp::decode::read_array_len(input).map_err(decode_error)?;
    if count > MAX_LINKED_RUNS {
        return Err(invalid(format!(
            "a linked snapshot names {count} runs, at most {MAX_LINKED_RUNS}"
        )));
    }
    let mut names = Vec::with_capacity(count as usize);
    for at in 0..count {
        let mut name = [0u8; 16];
        let name = rmp::decode::read_str(input, &mut name)
            .map_err(|error| invalid(format!("run name {at} does not decode: {error:?}")))?;
        if name != format!("{at:06}.run") {
            return Err(invalid(format!("run {at} is named {name:?}")));
        }
        names.push(name.to_string());
    }
    let Some(cold) = ColdIndex::read_any_spilling(input, spill)? else {
        return Ok((names, None));
    };
    let mut rest = [0u8; 1];
    if input.read(&mut rest).map_err(decode_error)? != 0 {
        return Err(invalid("bytes after the filters".into()));
    }
    check_counts(&cold, head)?;
    Ok((names, Some(cold)))
}

/// Hands the complete filters of `family_id` (being restored, so passivated) to `filters`,
/// and drops from memory those of the families its commit wrote.
fn spill_filters(
    cold: &mut ColdIndex,
    filters: &mut StoredFilterWriter<'_>,
    family_id: FamilyId,
) -> Result<(), RouterError> {
    for (family_id, copy) in cold.to_spill(std::slice::from_ref(&family_id)) {
        let bytes = copy.encode()?;
        drop(copy);
        let written = filters.push(family_id, bytes)?;
        cold.spilled(&written);
    }
    Ok(())
}

/// The filters of a linked snapshot saved before they were blocked, rebuilt from the rows of
/// its runs (read once, family by family): what the first start of a new build costs.
fn rebuild_filters(store: &FamilyStore, head: &Head) -> Result<ColdIndex, RouterError> {
    let view = store.view()?;
    let mut cold = ColdIndex::default();
    for family_id in head.cold_meta.keys() {
        view.each_cold_row(family_id, |key, _| {
            cold.add(family_id, key);
            Ok(())
        })?;
    }
    tracing::info!(
        rows = cold.total_rows(),
        "rebuilt the filters of a snapshot saved by an older build"
    );
    check_counts(&cold, head)?;
    Ok(cold)
}

/// The filters must count, family by family, the rows each family's encoding says it has out
/// of memory.
fn check_counts(cold: &ColdIndex, head: &Head) -> Result<(), RouterError> {
    let counted = (head.cold_meta.iter()).map(|(id, meta)| (id.clone(), meta.rows));
    if !counted.eq(cold.counts()) {
        return Err(invalid(
            "the filters count other rows than the families say they have out of memory".into(),
        ));
    }
    Ok(())
}

/// Families read from a stream, written to the store a chunk at a time.
struct StoredFamilies<'s> {
    store: &'s FamilyStore,
    stored: BTreeMap<FamilyId, usize>,
    chunk: Vec<(FamilyId, Arc<Vec<u8>>)>,
    chunk_bytes: usize,
}

impl<'s> StoredFamilies<'s> {
    fn new(store: &'s FamilyStore) -> Self {
        Self {
            store,
            stored: BTreeMap::new(),
            chunk: Vec::new(),
            chunk_bytes: 0,
        }
    }

    fn add(&mut self, family_id: FamilyId, bytes: Vec<u8>) -> Result<(), RouterError> {
        self.stored.insert(family_id.clone(), bytes.len());
        self.chunk_bytes += bytes.len();
        self.chunk.push((family_id, Arc::new(bytes)));
        if self.chunk_bytes >= RESTORE_CHUNK_BYTES {
            self.store.write(&self.chunk, &[])?;
            self.chunk.clear();
            self.chunk_bytes = 0;
        }
        Ok(())
    }

    /// Writes the last chunk; returns every family and its length.
    fn finish(self) -> Result<BTreeMap<FamilyId, usize>, RouterError> {
        self.store.write(&self.chunk, &[])?;
        Ok(self.stored)
    }
}

/// What a snapshot stream hands on, in order: every family, then every row out of memory.
enum Item<'a> {
    Family(FamilyId, Vec<u8>),
    ColdRow(&'a FamilyId, &'a [u8], &'a [u8]),
}

/// Reads a snapshot stream through, keeping nothing, and returns its digest: how a receiver
/// checks a snapshot before handing it on.
pub fn digest_of(input: &mut impl Read) -> Result<[u8; 32], RouterError> {
    Ok(read_stream(input, RowsAt::Stream, |_| Ok(()))?.digest)
}

/// Where a stream's rows out of memory are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RowsAt {
    /// In the stream, after the families (`write_cut`).
    Stream,
    /// In run files the stream names after the families (`write_linked`).
    Links,
}

/// What a stream's head says, once its families are read.
struct Head {
    state: RouterState,
    maintenance_due: IdMap<FamilyId, u64>,
    digest: [u8; 32],
    /// Each family's count and digest of rows out of memory, as its encoding says.
    cold_meta: BTreeMap<FamilyId, ColdMeta>,
}

impl Head {
    /// The router the stream restores, its families in `store` (`stored` names them), and
    /// the digest of its state.
    fn into_router(
        self,
        config: RouterConfig,
        store: FamilyStore,
        stored: BTreeMap<FamilyId, usize>,
        cold: ColdIndex,
    ) -> Result<(FamilyRouter, [u8; 32]), RouterError> {
        let router = FamilyRouter::from_stored(
            config,
            self.state,
            self.maintenance_due,
            store,
            stored,
            cold,
        )?;
        Ok((router, self.digest))
    }
}

/// Decodes the stream's header, hands each family and then each row out of memory to `each`
/// in order, and checks the whole (version, alarms, order, no bytes after the end,
/// maintenance only for families present, every family's rows against its `ColdMeta`).
/// With `RowsAt::Links` it stops after the families (the caller reads the links).
fn read_stream(
    input: &mut impl Read,
    rows_at: RowsAt,
    mut each: impl FnMut(Item<'_>) -> Result<(), RouterError>,
) -> Result<Head, RouterError> {
    let fields = rmp::decode::read_array_len(input).map_err(decode_error)?;
    let allowed: &[u32] = match rows_at {
        RowsAt::Stream => &[SNAPSHOT_FIELDS, SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS],
        RowsAt::Links => &[SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS],
    };
    if !allowed.contains(&fields) {
        return Err(invalid(format!(
            "a router snapshot here has {allowed:?} fields, got {fields}"
        )));
    }
    let version: u32 = rmp_serde::decode::from_read(&mut *input).map_err(decode_error)?;
    let state: RouterState = rmp_serde::decode::from_read(&mut *input).map_err(decode_error)?;
    check_restorable(version, &state)?;
    let with_cold_rows = fields == SNAPSHOT_FIELDS;
    if with_cold_rows && version < 3 {
        return Err(invalid(format!(
            "a version {version} router snapshot cannot hold rows out of memory"
        )));
    }
    // Each family's count and digest of rows out of memory, as its encoding says.
    let mut expected: BTreeMap<FamilyId, ColdMeta> = BTreeMap::new();
    let maintenance_due: IdMap<FamilyId, u64> =
        rmp_serde::decode::from_read(&mut *input).map_err(decode_error)?;
    let count = rmp::decode::read_map_len(input).map_err(decode_error)? as usize;
    let mut digest = compose_digest_header(&state, &maintenance_due, count);
    let mut previous: Option<FamilyId> = None;
    let mut scheduled_present = 0;
    for _ in 0..count {
        let family_id: FamilyId =
            rmp_serde::decode::from_read(&mut *input).map_err(decode_error)?;
        if previous.as_ref().is_some_and(|p| *p >= family_id) {
            return Err(invalid(format!("family {family_id} out of order")));
        }
        let bytes = read_bin(input, || format!("family {family_id}"))?;
        add_family_digest(&mut digest, &family_id, &digest_bytes(&bytes));
        if maintenance_due.get(&family_id).is_some() {
            scheduled_present += 1;
        }
        previous = Some(family_id.clone());
        let meta = ColdMeta::of_family_bytes(&bytes)
            .map_err(|error| invalid(format!("family {family_id} does not decode: {error}")))?;
        if !meta.is_empty() {
            expected.insert(family_id.clone(), meta);
        }
        each(Item::Family(family_id, bytes))?;
    }
    if scheduled_present != maintenance_due.len() {
        return Err(invalid(
            "maintenance scheduled for a family which has no state".into(),
        ));
    }
    if rows_at == RowsAt::Stream {
        if with_cold_rows {
            read_cold_rows(input, &expected, &mut each)?;
        } else if let Some((family_id, meta)) = expected.first_key_value() {
            return Err(invalid(format!(
                "family {family_id} counts {} rows out of memory, the snapshot holds none",
                meta.rows
            )));
        }
        let mut rest = [0u8; 1];
        if input.read(&mut rest).map_err(decode_error)? != 0 {
            return Err(invalid("bytes after the last family".into()));
        }
    }
    Ok(Head {
        state,
        maintenance_due,
        digest: digest.finalize().into(),
        cold_meta: expected,
    })
}

/// Reads the rows out of memory: families in id order, each with exactly the rows its
/// `ColdMeta` counts and digests, keys in order; none for a family whose meta has none.
fn read_cold_rows(
    input: &mut impl Read,
    expected: &BTreeMap<FamilyId, ColdMeta>,
    each: &mut impl FnMut(Item<'_>) -> Result<(), RouterError>,
) -> Result<(), RouterError> {
    let families = rmp::decode::read_map_len(input).map_err(decode_error)? as usize;
    if families == 0 {
        return Err(invalid("an empty field of rows out of memory".into()));
    }
    if families != expected.len() {
        return Err(invalid(format!(
            "{} families have rows out of memory, the stream holds rows of {families}",
            expected.len()
        )));
    }
    let mut previous: Option<FamilyId> = None;
    for _ in 0..families {
        let family_id: FamilyId =
            rmp_serde::decode::from_read(&mut *input).map_err(decode_error)?;
        if previous.as_ref().is_some_and(|p| *p >= family_id) {
            return Err(invalid(format!("rows of family {family_id} out of order")));
        }
        let Some(meta) = expected.get(&family_id) else {
            return Err(invalid(format!(
                "rows for family {family_id}, which has none out of memory"
            )));
        };
        let count = rmp::decode::read_map_len(input).map_err(decode_error)?;
        let mut read = ColdMeta::default();
        // Reused row after row: a restore reads millions.
        let (mut key, mut row, mut previous_key) = (Vec::new(), Vec::new(), Vec::new());
        for at in 0..count {
            read_bin_into(input, &mut key, || format!("a row of family {family_id}"))?;
            read_bin_into(input, &mut row, || format!("a row of family {family_id}"))?;
            if at > 0 && previous_key >= key {
                return Err(invalid(format!("rows of family {family_id} out of order")));
            }
            read.add(&key, &row);
            each(Item::ColdRow(&family_id, &key, &row))?;
            std::mem::swap(&mut previous_key, &mut key);
        }
        if read != *meta {
            return Err(invalid(format!(
                "family {family_id}: its rows out of memory do not match its count and digest \
                 ({} rows read, {} counted)",
                read.rows, meta.rows
            )));
        }
        previous = Some(family_id);
    }
    Ok(())
}

/// One MessagePack `bin`; `what` names it when the stream ends inside it.
fn read_bin(input: &mut impl Read, what: impl Fn() -> String) -> Result<Vec<u8>, RouterError> {
    let mut bytes = Vec::new();
    read_bin_into(input, &mut bytes, what)?;
    Ok(bytes)
}

/// Room reserved up front for a `bin`: its whole length when it is this small or smaller
/// (every row), so reading it takes no reallocation; larger ones (families) grow as they are
/// read, so a damaged length cannot make the reader allocate it.
const BIN_RESERVE_BYTES: usize = 64 << 10;

/// `read_bin` into `bytes`, replacing what it held (buffers reused row after row).
fn read_bin_into(
    input: &mut impl Read,
    bytes: &mut Vec<u8>,
    what: impl Fn() -> String,
) -> Result<(), RouterError> {
    let length = rmp::decode::read_bin_len(input).map_err(decode_error)?;
    bytes.clear();
    bytes.reserve((length as usize).min(BIN_RESERVE_BYTES));
    input
        .take(u64::from(length))
        .read_to_end(bytes)
        .map_err(decode_error)?;
    if bytes.len() != length as usize {
        return Err(invalid(format!("{} is cut short", what())));
    }
    Ok(())
}

fn invalid(reason: String) -> RouterError {
    RouterError::Snapshot(reason)
}

fn encode_error(error: impl std::fmt::Display) -> RouterError {
    RouterError::Snapshot(format!("could not write the snapshot stream: {error}"))
}

fn decode_error(error: impl std::fmt::Display) -> RouterError {
    RouterError::Snapshot(format!("could not read the snapshot stream: {error}"))
}
