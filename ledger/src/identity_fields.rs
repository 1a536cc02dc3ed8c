//! Per-field hashes of a command's identity: what a dedupe row keeps, while its command is
//! retained, to name every field a conflicting command changes (SPEC.md §5.2).
//!
//! Keeping a clone of the whole command instead would cost every applied command an
//! allocation and a reference-count update per id, on the apply path, only to serve the rare
//! conflict. The hashes are computed in the same pass as the identity digest (see
//! `identity::digest_of`): each field's slice of the canonical encoding is hashed on its own.
//! A 64-bit hash can collide; then a differing field goes unnamed, and a conflict whose
//! differences all collided is named `identity` (the SHA-256 digest still tells it apart).

use serde::{Deserialize, Serialize};

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

const K: u64 = 0x517c_c1b7_2722_0a95;

/// Hashes the bytes written for each field as they stream past. Fixed arithmetic, so every
/// platform and compiler gets the same values (they are part of snapshots).
#[derive(Default)]
pub(crate) struct FieldHasher {
    /// Off for a digest alone (a replay's check), which needs no field hashes.
    enabled: bool,
    current: Option<Field>,
    state: u64,
    done: FieldHashes,
}

impl FieldHasher {
    pub fn new(operation_code: u8, enabled: bool) -> Self {
        Self {
            enabled,
            current: None,
            state: 0,
            done: FieldHashes {
                operation_code,
                hashes: [0; FIELD_COUNT],
            },
        }
    }

    /// Bytes written from now on belong to `field`.
    pub fn begin(&mut self, field: Field) {
        if !self.enabled {
            return;
        }
        self.close();
        self.current = Some(field);
        self.state = K;
    }

    #[inline(always)]
    pub fn write(&mut self, bytes: &[u8]) {
        if self.current.is_none() {
            return;
        }
        let mut state = (self.state.rotate_left(5) ^ bytes.len() as u64).wrapping_mul(K);
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            state = (state.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut word = [0u8; 8];
            word[..tail.len()].copy_from_slice(tail);
            state = (state.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        self.state = state;
    }

    fn close(&mut self) {
        if let Some(field) = self.current.take() {
            // splitmix64's finalizer, so no field hashes to the 0 of an absent one by accident
            // of a short input.
            let mut hash = self.state;
            hash ^= hash >> 30;
            hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            hash ^= hash >> 27;
            hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
            self.done.hashes[field as usize] = hash ^ (hash >> 31);
        }
    }

    pub fn finish(mut self) -> FieldHashes {
        self.close();
        self.done
    }
}
