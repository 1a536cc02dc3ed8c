//! Per-field hashes of a command's identity: what a dedupe row keeps, while its command is
//! retained, to name every field a conflicting command changes (docs/spec.md §5.2).
//!
//! Keeping a clone of the whole command instead would cost every applied command an
//! allocation and a reference-count update per id, on the apply path, only to serve the rare
//! conflict. The hashes are computed in the same pass as the identity digest (see
//! `identity::digest_of`): as the encoder starts a field, the one before it is complete and its
//! slice of the canonical encoding is hashed on its own. A field of a few bytes (an amount,
//! the limits, a currency, a short id) is kept as its bytes instead and hashed only when a
//! conflict or a snapshot asks: most fields are that short, and each hash has a fixed cost.
//! Everything outside this file sees only the hashes.
//!
//! A 64-bit hash can collide; then a differing field goes unnamed, and a conflict whose
//! differences all collided is named `identity` (the SHA-256 digest still tells it apart).
//!
//! The hash is `field_hash`. Its values are part of snapshots and carry no version: a
//! snapshot written by a build with another field hash keeps that build's hashes for the
//! commands it retains, and a conflict with one of those names every field it has instead of
//! the differing ones (the answer is the same `Conflict`) until it is compacted. All nodes of
//! a cluster run one build, so replicas never mix two.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
///
/// A field of at most `MAX_VERBATIM_BYTES` is kept as its bytes until its hash is asked for.
/// Equality, conflicts and the encoding all go through the hashes, so a family restored from a
/// snapshot (which holds hashes only) behaves exactly like the one that applied the commands.
#[derive(Clone, Default)]
pub(crate) struct FieldHashes {
    pub operation_code: u8,
    /// Bit `i` set: `slots[i]` holds field `i`'s bytes (see `pack`), not its hash.
    verbatim: u16,
    slots: [u64; FIELD_COUNT],
}

/// Fields this short are kept as bytes: seven bytes and their length fill one slot.
const MAX_VERBATIM_BYTES: usize = 7;

const _: () = assert!(FIELD_COUNT <= 16, "one bit of `verbatim` per field");

/// `bytes` (at most `MAX_VERBATIM_BYTES`) in the low bytes of a word, their length in the top.
#[inline(always)]
fn pack(bytes: &[u8]) -> u64 {
    assert!(
        bytes.len() <= MAX_VERBATIM_BYTES,
        "a verbatim field is short"
    );
    // Little-endian: the first byte lowest.
    let word = bytes
        .iter()
        .rev()
        .fold(0, |word, &byte| (word << 8) | u64::from(byte));
    word | ((bytes.len() as u64) << 56)
}

/// What `pack` packed.
fn unpack(slot: u64) -> ([u8; 8], usize) {
    let word = slot.to_le_bytes();
    (word, usize::from(word[7]))
}

impl FieldHashes {
    /// Field `field`'s hash, as snapshots keep it.
    fn hash(&self, field: usize) -> u64 {
        if self.verbatim & (1 << field) == 0 {
            return self.slots[field];
        }
        let (word, len) = unpack(self.slots[field]);
        field_hash(&word[..len])
    }

    fn hashes(&self) -> [u64; FIELD_COUNT] {
        std::array::from_fn(|field| self.hash(field))
    }

    /// Names of the fields that differ; a differing kind makes every other field moot.
    pub fn differing(&self, other: &FieldHashes) -> Vec<String> {
        if self.operation_code != other.operation_code {
            return vec!["kind".to_owned()];
        }
        FIELD_NAMES
            .iter()
            .zip(self.hashes().iter().zip(&other.hashes()))
            .filter(|(_, (a, b))| a != b)
            .map(|(name, _)| (*name).to_owned())
            .collect()
    }
}

impl PartialEq for FieldHashes {
    fn eq(&self, other: &Self) -> bool {
        self.operation_code == other.operation_code && self.hashes() == other.hashes()
    }
}

impl Eq for FieldHashes {}

impl fmt::Debug for FieldHashes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FieldHashes")
            .field("operation_code", &self.operation_code)
            .field("hashes", &self.hashes())
            .finish()
    }
}

/// The encoded form: the operation code and every field's hash.
#[derive(Serialize, Deserialize)]
#[serde(rename = "FieldHashes")]
struct EncodedHashes {
    operation_code: u8,
    hashes: [u64; FIELD_COUNT],
}

impl Serialize for FieldHashes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        EncodedHashes {
            operation_code: self.operation_code,
            hashes: self.hashes(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for FieldHashes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let encoded = EncodedHashes::deserialize(deserializer)?;
        Ok(Self {
            operation_code: encoded.operation_code,
            verbatim: 0,
            slots: encoded.hashes,
        })
    }
}

/// Hashes each field of a command's identity encoding as the encoder finishes writing it.
pub(crate) struct FieldHasher {
    /// Off for a digest alone (a replay's check), which needs no field hashes.
    enabled: bool,
    /// The field being written and where its bytes start.
    current: Option<(Field, usize)>,
    hashes: FieldHashes,
}

impl FieldHasher {
    pub fn new(operation_code: u8, enabled: bool) -> Self {
        Self {
            enabled,
            current: None,
            hashes: FieldHashes {
                operation_code,
                ..FieldHashes::default()
            },
        }
    }

    /// Bytes written from now on belong to `field`; `encoding` is all written so far, so the
    /// field before it is complete.
    #[inline]
    pub fn begin(&mut self, field: Field, encoding: &[u8]) {
        if !self.enabled {
            return;
        }
        self.close(encoding);
        self.current = Some((field, encoding.len()));
    }

    #[inline]
    fn close(&mut self, encoding: &[u8]) {
        let Some((field, start)) = self.current.take() else {
            return;
        };
        let bytes = &encoding[start..];
        let at = field as usize;
        if bytes.is_empty() {
            return;
        }
        if bytes.len() <= MAX_VERBATIM_BYTES {
            self.hashes.slots[at] = pack(bytes);
            self.hashes.verbatim |= 1 << at;
        } else {
            self.hashes.slots[at] = field_hash(bytes);
        }
    }

    /// Every field's hash, once the whole `encoding` is written (none when disabled: no field
    /// was begun).
    pub fn finish(mut self, encoding: &[u8]) -> FieldHashes {
        self.close(encoding);
        self.hashes
    }
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
        // Zero-padded to 16 bytes, little-endian like the whole chunks: the first byte lowest.
        let block = tail
            .iter()
            .rev()
            .fold(0, |block, &byte| (block << 8) | u128::from(byte));
        state = mix(state, block);
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
    fn kept_bytes_and_hashes_are_one_value() {
        // Every length a field can have, on both sides of `MAX_VERBATIM_BYTES`.
        let encoding: Vec<u8> = (0u8..64).map(|b| b.wrapping_mul(37)).collect();
        for len in 1..=20 {
            let mut hasher = FieldHasher::new(2, true);
            hasher.begin(Field::FamilyId, &encoding[..2]);
            hasher.begin(Field::HoldId, &encoding[..3]);
            let live = hasher.finish(&encoding[..3 + len]);
            assert_eq!(
                live.hash(Field::FamilyId as usize),
                field_hash(&encoding[2..3])
            );
            assert_eq!(
                live.hash(Field::HoldId as usize),
                field_hash(&encoding[3..3 + len]),
                "{len} bytes"
            );
            assert_eq!(live.hash(Field::NonceId as usize), 0, "an absent field");
            // Restored from its encoding (hashes only): equal, encoded alike, same conflicts.
            let bytes = rmp_serde::to_vec(&live).expect("encodes");
            let restored: FieldHashes = rmp_serde::from_slice(&bytes).expect("decodes");
            assert_eq!(restored.verbatim, 0);
            assert_eq!(restored, live);
            assert_eq!(rmp_serde::to_vec(&restored).expect("encodes"), bytes);
            let mut other = FieldHasher::new(2, true);
            other.begin(Field::FamilyId, &encoding[..2]);
            other.begin(Field::HoldId, &encoding[..4]);
            let other = other.finish(&encoding[..4 + len]);
            assert_eq!(live.differing(&other), ["family_id", "hold_id"]);
            assert_eq!(restored.differing(&other), ["family_id", "hold_id"]);
            assert_eq!(live.differing(&restored), Vec::<String>::new());
        }
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
