//! Per-field hashes of a command's identity: what a dedupe row keeps, while its command is
//! retained, to name every field a conflicting command changes (SPEC.md §5.2).
//!
//! Keeping a clone of the whole command instead would cost every applied command an
//! allocation and a reference-count update per id, on the apply path, only to serve the rare
//! conflict. The hashes are computed in the same pass as the identity digest (see
//! `identity::digest_of`): each field's slice of the canonical encoding is hashed on its own.
//! A 64-bit hash can collide; then a differing field goes unnamed, and a conflict whose
//! differences all collided is named `identity` (the SHA-256 digest still tells it apart).
//!
//! The hash function changed once (2026-11-30: a multiply per 8 bytes of each small write, in
//! one dependent chain, became one independent multiply per 16 bytes of the whole field; the
//! identity's share of `Family::apply` fell from about a quarter). Snapshots written before
//! keep the old hashes for the commands they retain: a conflict with one of those names every
//! field it has instead of the differing ones (the answer is the same `Conflict`) until it is
//! compacted. All nodes of a cluster run one build, so replicas never mix the two.

use serde::{Deserialize, Serialize};

use crate::short_copy::copy_short;

/// An identity field. The order of the variants is the order a conflict names them in, which
/// is the order `Identity::fields` lists them for every operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    FamilyId,
    CapabilityId,
    GrantIndex,
    HoldId,
    RequestedExposureUnits,
    ExposureUnits,
    ReleasedExposureUnits,
    ExposedCostUnits,
    RealizedSpendUnits,
    CostUnits,
    Currency,
    Limits,
    Ancestors,
    NonceId,
}

const FIELD_COUNT: usize = 14;

const FIELD_NAMES: [&str; FIELD_COUNT] = [
    "family_id",
    "capability_id",
    "grant_index",
    "hold_id",
    "requested_exposure_units",
    "exposure_units",
    "released_exposure_units",
    "exposed_cost_units",
    "realized_spend_units",
    "cost_units",
    "currency",
    "limits",
    "ancestors",
    "nonce_id",
];

/// The operation code and one hash per field; fields an operation lacks stay 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FieldHashes {
    pub operation_code: u8,
    hashes: [u64; FIELD_COUNT],
}

impl FieldHashes {
    /// Names of the fields that differ; a differing kind makes every other field moot.
    pub fn differing(&self, other: &FieldHashes) -> Vec<String> {
        if self.operation_code != other.operation_code {
            return vec!["kind".to_owned()];
        }
        FIELD_NAMES
            .iter()
            .zip(self.hashes.iter().zip(&other.hashes))
            .filter(|(_, (a, b))| a != b)
            .map(|(name, _)| (*name).to_owned())
            .collect()
    }
}

/// Where each field's bytes lie in a command's identity encoding, noted as it is written.
pub(crate) struct FieldSpans {
    /// Off for a digest alone (a replay's check), which needs no field hashes.
    enabled: bool,
    operation_code: u8,
    /// The field being written and where its bytes start.
    current: Option<(Field, usize)>,
    /// Each field's bytes, `start..end`; empty for a field the operation lacks.
    spans: [(u32, u32); FIELD_COUNT],
}

impl FieldSpans {
    pub fn new(operation_code: u8, enabled: bool) -> Self {
        Self {
            enabled,
            operation_code,
            current: None,
            spans: [(0, 0); FIELD_COUNT],
        }
    }

    /// Bytes written from `offset` on belong to `field`.
    pub fn begin(&mut self, field: Field, offset: usize) {
        if !self.enabled {
            return;
        }
        self.close(offset);
        self.current = Some((field, offset));
    }

    fn close(&mut self, offset: usize) {
        if let Some((field, start)) = self.current.take() {
            self.spans[field as usize] = span(start, offset);
        }
    }

    /// The hash of each field's slice of `encoding` (the whole encoding, now written).
    pub fn finish(&mut self, encoding: &[u8]) -> FieldHashes {
        let mut hashes = FieldHashes {
            operation_code: self.operation_code,
            hashes: [0; FIELD_COUNT],
        };
        if !self.enabled {
            return hashes;
        }
        self.close(encoding.len());
        for (hash, (start, end)) in hashes.hashes.iter_mut().zip(self.spans) {
            if end > start {
                *hash = field_hash(&encoding[start as usize..end as usize]);
            }
        }
        hashes
    }
}

fn span(start: usize, end: usize) -> (u32, u32) {
    let offset = |at: usize| u32::try_from(at).expect("an identity encodes to far below 4 GiB");
    (offset(start), offset(end))
}

const K1: u64 = 0x243f_6a88_85a3_08d3;
const K2: u64 = 0x1319_8a2e_0370_7344;

/// A field's 64-bit hash. Fixed arithmetic, so every platform and compiler gets the same
/// values (they are part of snapshots). Each 16-byte chunk is one 64×64→128-bit multiply of
/// its two words, folded; the chunks' products do not depend on one another, so they run side
/// by side, and only a rotate-and-xor chains them in order. Never 0 in practice: an absent
/// field's 0 is not produced by accident of a short input (splitmix64's finalizer).
pub(crate) fn field_hash(bytes: &[u8]) -> u64 {
    let mix = |state: u64, block: u128| {
        let (low, high) = (block as u64, (block >> 64) as u64);
        let product = u128::from(low ^ K1) * u128::from(high ^ K2);
        state.rotate_left(23) ^ (product as u64) ^ ((product >> 64) as u64)
    };
    let mut state = K1 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(16);
    for chunk in &mut chunks {
        let block: [u8; 16] = chunk.try_into().expect("chunks of 16 bytes");
        state = mix(state, u128::from_le_bytes(block));
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        // Zero-padded to 16 bytes, little-endian like the whole chunks.
        let mut block = [0u8; 16];
        copy_short(&mut block[..tail.len()], tail);
        state = mix(state, u128::from_le_bytes(block));
    }
    state ^= state >> 30;
    state = state.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    state ^= state >> 27;
    state = state.wrapping_mul(0x94d0_49bb_1331_11eb);
    state ^ (state >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_hashes_are_fixed() {
        // Part of snapshots and of every replica's state: a change here changes the bytes of
        // every retained command (see the module doc). (Checked independently: a Python
        // transcription of `field_hash`'s doc comment gives the same values.)
        assert_eq!(field_hash(b""), 0xe9e0_033e_3bad_af36);
        assert_eq!(
            field_hash(b"budget-hold:7f3c1f0e-2a51-4d0c-9c7b-2f1e6c3b9a10:cap:0"),
            0x729f_b20a_a881_6ef0
        );
    }

    #[test]
    fn one_changed_byte_anywhere_changes_the_hash() {
        let base: Vec<u8> = (0u8..40).collect();
        for at in 0..base.len() {
            let mut changed = base.clone();
            changed[at] ^= 1;
            assert_ne!(field_hash(&changed), field_hash(&base), "byte {at}");
        }
        assert_ne!(field_hash(&base[..39]), field_hash(&base), "length counts");
        let mut zero_padded = base.clone();
        zero_padded.push(0);
        assert_ne!(
            field_hash(&zero_padded),
            field_hash(&base),
            "a trailing zero counts"
        );
    }
}
