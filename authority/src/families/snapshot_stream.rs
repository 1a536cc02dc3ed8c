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
//! Every function here blocks on I/O: callers run them on blocking threads.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;

use sha2::Digest;
use tally_ledger::snapshot::digest_bytes;
use tally_ledger::{ColdMeta, FamilyId, IdMap};

use super::cold_index::ColdIndex;
use super::config::RouterConfig;
use super::error::RouterError;
use super::family_store::{FamilyStore, StoreView};
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

/// Writes the cut to `out` (reading its passivated families from the store's view at the
/// cut) and returns the state's digest, equal to `FamilyRouter::digest` at the cut.
pub fn write_cut(cut: RouterCut, out: &mut impl Write) -> Result<[u8; 32], RouterError> {
    let RouterCut {
        state,
        maintenance_due,
        mut live,
        stored,
        view,
        cold,
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

    let fields = if cold.is_empty() {
        SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS
    } else {
        SNAPSHOT_FIELDS
    };
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
    if !cold.is_empty() {
        write_cold_rows(&view, &cold, out)?;
    }
    Ok(digest.finalize().into())
}

/// The rows out of memory, family by family in id order, each a map of key → row in key
/// order, read from the store's view at the cut.
fn write_cold_rows(
    view: &StoreView,
    cold: &BTreeMap<FamilyId, u64>,
    out: &mut impl Write,
) -> Result<(), RouterError> {
    let families = u32::try_from(cold.len()).map_err(encode_error)?;
    rmp::encode::write_map_len(out, families).map_err(encode_error)?;
    for (family_id, rows) in cold {
        rmp_serde::encode::write(out, family_id).map_err(encode_error)?;
        let count = u32::try_from(*rows).map_err(encode_error)?;
        rmp::encode::write_map_len(out, count).map_err(encode_error)?;
        let mut written = 0u64;
        view.each_cold_row(family_id, |key, row| {
            written += 1;
            write_bin(out, key)?;
            write_bin(out, row)
        })?;
        assert_eq!(
            written, *rows,
            "family {family_id}: the store's view at the cut holds another number of rows"
        );
    }
    Ok(())
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
    let mut stored = BTreeMap::new();
    let mut chunk: Vec<(FamilyId, Arc<Vec<u8>>)> = Vec::new();
    let mut chunk_bytes = 0;
    // The rows come in the store's key order: one run, each row written once.
    let mut rows = store.sorted_rows();
    let mut cold = ColdIndex::default();
    let read = read_stream(input, |item| {
        match item {
            Item::Family(family_id, bytes) => {
                stored.insert(family_id.clone(), bytes.len());
                chunk_bytes += bytes.len();
                chunk.push((family_id, Arc::new(bytes)));
                if chunk_bytes >= RESTORE_CHUNK_BYTES {
                    store.write(&chunk, &[])?;
                    chunk.clear();
                    chunk_bytes = 0;
                }
            }
            Item::ColdRow(family_id, key, row) => {
                cold.add(family_id, key);
                rows.push(family_id, key, row)?;
            }
        }
        Ok(())
    })?;
    store.write(&chunk, &[])?;
    rows.finish()?;
    let (state, maintenance_due, digest) = read;
    let router = FamilyRouter::from_stored(config, state, maintenance_due, store, stored, cold)?;
    Ok((router, digest))
}

/// What a snapshot stream hands on, in order: every family, then every row out of memory.
enum Item<'a> {
    Family(FamilyId, Vec<u8>),
    ColdRow(&'a FamilyId, &'a [u8], &'a [u8]),
}

/// Reads a snapshot stream through, keeping nothing, and returns its digest: how a receiver
/// checks a snapshot before handing it on.
pub fn digest_of(input: &mut impl Read) -> Result<[u8; 32], RouterError> {
    let (_, _, digest) = read_stream(input, |_| Ok(()))?;
    Ok(digest)
}

/// Decodes the stream's header, hands each family and then each row out of memory to `each`
/// in order, and checks the whole (version, alarms, order, no bytes after the end,
/// maintenance only for families present, every family's rows against its `ColdMeta`).
fn read_stream(
    input: &mut impl Read,
    mut each: impl FnMut(Item<'_>) -> Result<(), RouterError>,
) -> Result<(RouterState, IdMap<FamilyId, u64>, [u8; 32]), RouterError> {
    let fields = rmp::decode::read_array_len(input).map_err(decode_error)?;
    if fields != SNAPSHOT_FIELDS && fields != SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS {
        return Err(invalid(format!(
            "a router snapshot has {SNAPSHOT_FIELDS_WITHOUT_COLD_ROWS} or {SNAPSHOT_FIELDS} \
             fields, got {fields}"
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
    if scheduled_present != maintenance_due.len() {
        return Err(invalid(
            "maintenance scheduled for a family which has no state".into(),
        ));
    }
    Ok((state, maintenance_due, digest.finalize().into()))
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
