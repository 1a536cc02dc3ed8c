//! Router snapshots as a stream: written from a cut family by family, read back into a family
//! store family by family, so neither side ever holds the whole state in memory (docs/spec.md
//! §5.5). The bytes are exactly `RouterSnapshot::to_bytes`'s (a MessagePack array of the
//! format version, the router state, the maintenance schedule and the family map), and the
//! digest is computed while they stream, so a receiver checks what it got against the
//! sender's digest before the new state replaces anything.
//!
//! Every function here blocks on I/O: callers run them on blocking threads.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;

use sha2::Digest;
use tally_ledger::snapshot::digest_bytes;
use tally_ledger::{FamilyId, IdMap};

use super::config::RouterConfig;
use super::error::RouterError;
use super::family_store::FamilyStore;
use super::router::FamilyRouter;
use super::router_state::RouterState;
use super::snapshot::{
    add_family_digest, check_restorable, compose_digest_header, RouterCut, SNAPSHOT_FORMAT_VERSION,
};

/// The fields of a `RouterSnapshot`, as its MessagePack array holds them.
const SNAPSHOT_FIELDS: u32 = 4;
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

    rmp::encode::write_array_len(out, SNAPSHOT_FIELDS).map_err(encode_error)?;
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
    Ok(digest.finalize().into())
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
    let (state, maintenance_due, digest) = read_stream(input, |family_id, bytes| {
        stored.insert(family_id.clone(), bytes.len());
        chunk_bytes += bytes.len();
        chunk.push((family_id, Arc::new(bytes)));
        if chunk_bytes >= RESTORE_CHUNK_BYTES {
            store.write(&chunk, &[])?;
            chunk.clear();
            chunk_bytes = 0;
        }
        Ok(())
    })?;
    store.write(&chunk, &[])?;
    let router = FamilyRouter::from_stored(config, state, maintenance_due, store, stored)?;
    Ok((router, digest))
}

/// Reads a snapshot stream through, keeping nothing, and returns its digest: how a receiver
/// checks a snapshot before handing it on.
pub fn digest_of(input: &mut impl Read) -> Result<[u8; 32], RouterError> {
    let (_, _, digest) = read_stream(input, |_, _| Ok(()))?;
    Ok(digest)
}

/// Decodes the stream's header, hands each family to `each` in order, and checks the whole
/// (version, alarms, order, no bytes after the end, maintenance only for families present).
fn read_stream(
    input: &mut impl Read,
    mut each: impl FnMut(FamilyId, Vec<u8>) -> Result<(), RouterError>,
) -> Result<(RouterState, IdMap<FamilyId, u64>, [u8; 32]), RouterError> {
    let fields = rmp::decode::read_array_len(input).map_err(decode_error)?;
    if fields != SNAPSHOT_FIELDS {
        return Err(invalid(format!(
            "a router snapshot has {SNAPSHOT_FIELDS} fields, got {fields}"
        )));
    }
    let version: u32 = rmp_serde::decode::from_read(&mut *input).map_err(decode_error)?;
    let state: RouterState = rmp_serde::decode::from_read(&mut *input).map_err(decode_error)?;
    check_restorable(version, &state)?;
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
        let length = rmp::decode::read_bin_len(input).map_err(decode_error)?;
        let mut bytes = Vec::new();
        input
            .take(u64::from(length))
            .read_to_end(&mut bytes)
            .map_err(decode_error)?;
        if bytes.len() != length as usize {
            return Err(invalid(format!("family {family_id} is cut short")));
        }
        add_family_digest(&mut digest, &family_id, &digest_bytes(&bytes));
        if maintenance_due.get(&family_id).is_some() {
            scheduled_present += 1;
        }
        previous = Some(family_id.clone());
        each(family_id, bytes)?;
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

fn invalid(reason: String) -> RouterError {
    RouterError::Snapshot(reason)
}

fn encode_error(error: impl std::fmt::Display) -> RouterError {
    RouterError::Snapshot(format!("could not write the snapshot stream: {error}"))
}

fn decode_error(error: impl std::fmt::Display) -> RouterError {
    RouterError::Snapshot(format!("could not read the snapshot stream: {error}"))
}
