//! Ids as keys of the compaction queue. Many queue items fall due at the same millisecond, so
//! ties were broken by comparing long ids with shared prefixes (`budget-hold:req-…`); a key
//! ordered by a stable 64-bit hash first compares integers stored inline and reads the id's
//! bytes only on a hash tie. The order is still a pure function of the ids (the hash is fixed
//! here, not `std`'s per-version `DefaultHasher`), so every replica compacts alike.
//!
//! (Not used for the large id-keyed maps: there, ids of recent commands share prefixes and
//! so share tree paths, and hashing them scatters every lookup across the whole tree.)

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{EventId, HoldId};

/// Ids whose text is hashed into a `Keyed` key.
pub(crate) trait IdText: Clone + Ord {
    fn text(&self) -> &str;
}

impl IdText for EventId {
    fn text(&self) -> &str {
        self.as_str()
    }
}

impl IdText for HoldId {
    fn text(&self) -> &str {
        self.as_str()
    }
}

/// A stable 64-bit hash of `text`: the same value on every platform and Rust version.
/// Not collision resistant, and it need not be: ties are broken by the id itself.
pub(crate) fn stable_hash(text: &str) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let bytes = text.as_bytes();
    let mut hash = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        hash = (hash.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        hash = (hash.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    // splitmix64's finalizer: every input bit reaches the high bits the tree compares first.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// An id with its stable hash, ordered by `(hash, id)`. Encoded as the id alone.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Keyed<T> {
    hash: u64,
    id: T,
}

impl<T: IdText> Keyed<T> {
    pub fn new(id: T) -> Self {
        Self {
            hash: stable_hash(id.text()),
            id,
        }
    }

    pub fn id(&self) -> &T {
        &self.id
    }
}

impl<T: IdText> Ord for Keyed<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.hash
            .cmp(&other.hash)
            .then_with(|| self.id.cmp(&other.id))
    }
}

impl<T: IdText> PartialOrd for Keyed<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: fmt::Debug> fmt::Debug for Keyed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.id.fmt(f)
    }
}

impl<T: Serialize> Serialize for Keyed<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.id.serialize(serializer)
    }
}

impl<'de, T: IdText + Deserialize<'de>> Deserialize<'de> for Keyed<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Keyed::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fixed() {
        // Replicas on other platforms or compilers must order keys identically.
        assert_eq!(stable_hash(""), 0);
        assert_eq!(
            stable_hash("budget-hold:req-1:cap:0"),
            stable_hash("budget-hold:req-1:cap:0")
        );
        assert_ne!(
            stable_hash("budget-hold:req-1:cap:0"),
            stable_hash("budget-hold:req-2:cap:0")
        );
        assert_eq!(stable_hash("abcdefghi"), 10_575_191_778_096_273_923);
    }
}
