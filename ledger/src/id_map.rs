//! A map from an id to a row, ordered by a stable hash of the id first and the id second.
//!
//! The dedupe table and the holds are the family's largest maps and every command searches
//! them. Ordered by the id itself, each step of a tree search follows a pointer to another
//! id's bytes and compares them: kernels name requests by random UUIDs, so those bytes are
//! seldom in cache, and ids sharing a long prefix (`budget-hold:`) compare slowly. Ordered
//! by `(hash, id)`, a search compares integers stored in the tree node itself and reads the
//! bytes of one id, the match (or of a colliding one: the order stays total and exact).
//!
//! Still an ordered container, as replicated state must be (DESIGN.md): the hash is a fixed
//! function of the id's bytes, the same on every replica, platform and version, so every
//! replica iterates and encodes the map in the same order. Encoded as a plain map from id to
//! row in that order; decoding accepts any order (and refuses a repeated id).

use std::collections::btree_map::{self, BTreeMap};
use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An id whose bytes the map hashes.
pub trait IdBytes {
    fn id_bytes(&self) -> &[u8];
}

/// The map's key: the id's stable hash, then the id (derived order: hash first).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HashedId<K> {
    hash: u64,
    id: K,
}

impl<K: IdBytes> HashedId<K> {
    pub fn new(id: K) -> Self {
        Self {
            hash: stable_hash(id.id_bytes()),
            id,
        }
    }

    pub fn id(&self) -> &K {
        &self.id
    }
}

/// A 64-bit hash of `bytes` that never changes: 8 bytes at a time, little-endian, each
/// multiplied into the state, then a final mix so nearby ids spread over the whole range.
/// Not a defence against chosen collisions, and it need not be: colliding ids only fall
/// back to comparing bytes, as an id-ordered map always does.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut state = (bytes.len() as u64).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let word = u64::from_le_bytes(word.try_into().expect("chunks of 8 bytes"));
        state = (state ^ word).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    state = (state ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    // The finalizer of splitmix64.
    state = (state ^ (state >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    state ^ (state >> 31)
}

#[derive(Clone, PartialEq, Eq)]
pub struct IdMap<K, V> {
    rows: BTreeMap<HashedId<K>, V>,
}

impl<K, V> Default for IdMap<K, V> {
    fn default() -> Self {
        Self {
            rows: BTreeMap::new(),
        }
    }
}

impl<K: IdBytes + Clone + Ord, V> IdMap<K, V> {
    /// Searching takes a key that owns its id: for the shared ids of this crate that is a
    /// reference-count increment, paid once per search.
    fn key(id: &K) -> HashedId<K> {
        HashedId::new(id.clone())
    }

    pub fn get(&self, id: &K) -> Option<&V> {
        self.rows.get(&Self::key(id))
    }

    pub fn get_mut(&mut self, id: &K) -> Option<&mut V> {
        self.rows.get_mut(&Self::key(id))
    }

    pub fn insert(&mut self, id: K, row: V) -> Option<V> {
        self.rows.insert(HashedId::new(id), row)
    }

    pub fn remove(&mut self, id: &K) -> Option<V> {
        self.rows.remove(&Self::key(id))
    }

    pub fn entry(&mut self, id: K) -> btree_map::Entry<'_, HashedId<K>, V> {
        self.rows.entry(HashedId::new(id))
    }

    pub fn contains_key(&self, id: &K) -> bool {
        self.rows.contains_key(&Self::key(id))
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows in the map's order (by hash, then id): the same on every replica.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.rows.iter().map(|(key, row)| (&key.id, row))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.rows.values()
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for IdMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.rows.iter().map(|(key, row)| (&key.id, row)))
            .finish()
    }
}

impl<K: Serialize, V: Serialize> Serialize for IdMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.rows.len()))?;
        for (key, row) in &self.rows {
            map.serialize_entry(&key.id, row)?;
        }
        map.end()
    }
}

impl<'de, K, V> Deserialize<'de> for IdMap<K, V>
where
    K: Deserialize<'de> + IdBytes + Clone + Ord + fmt::Debug,
    V: Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdMapVisitor<K, V>(PhantomData<(K, V)>);

        impl<'de, K, V> Visitor<'de> for IdMapVisitor<K, V>
        where
            K: Deserialize<'de> + IdBytes + Clone + Ord + fmt::Debug,
            V: Deserialize<'de>,
        {
            type Value = IdMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from id to row, each id once")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<IdMap<K, V>, A::Error> {
                let mut rows = IdMap::default();
                while let Some((id, row)) = map.next_entry::<K, V>()? {
                    if let btree_map::Entry::Vacant(slot) = rows.entry(id.clone()) {
                        slot.insert(row);
                    } else {
                        return Err(serde::de::Error::custom(format!("id {id:?} appears twice")));
                    }
                }
                Ok(rows)
            }
        }

        deserializer.deserialize_map(IdMapVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::EventId;

    #[test]
    fn the_hash_is_fixed_for_ever() {
        // Replicas of every version and platform must order the map alike: these values may
        // never change (a change is a snapshot format change). Computed by an independent
        // model of the function (a dozen lines of Python), not by this code.
        assert_eq!(stable_hash(b""), 0x0000_0000_0000_0000);
        assert_eq!(stable_hash(b"a"), 0x6137_32f6_c54c_1e84);
        assert_eq!(
            stable_hash(b"budget-hold:req-1:cap:0:authorize"),
            0x11a4_6aa6_ada6_a972
        );
        assert_ne!(stable_hash(b"ab"), stable_hash(b"ba"));
        assert_ne!(stable_hash(b"a"), stable_hash(b"a\0"), "the length counts");
    }

    #[test]
    fn behaves_as_a_map_and_round_trips_in_one_order() {
        let mut map: IdMap<EventId, u32> = IdMap::default();
        let mut model = BTreeMap::new();
        for n in 0..500u32 {
            let id = EventId::new(format!("budget-hold:{}:cap:0", n * 7919 % 1000));
            assert_eq!(map.insert(id.clone(), n), model.insert(id, n));
        }
        for n in (0..1000u32).step_by(3) {
            let id = EventId::new(format!("budget-hold:{n}:cap:0"));
            assert_eq!(map.get(&id), model.get(&id));
            assert_eq!(map.remove(&id), model.remove(&id));
        }
        assert_eq!(map.len(), model.len());
        assert_eq!(map.iter().count(), model.len());
        let mut rows: Vec<(EventId, u32)> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let order: Vec<EventId> = rows.iter().map(|(k, _)| k.clone()).collect();
        rows.sort();
        assert_eq!(rows, model.into_iter().collect::<Vec<_>>());

        let bytes = rmp_serde::to_vec(&map).expect("encodes");
        let back: IdMap<EventId, u32> = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, map);
        assert_eq!(rmp_serde::to_vec(&back).expect("encodes"), bytes);
        let decoded_order: Vec<EventId> = back.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(decoded_order, order, "iteration order is the map's own");

        // The same rows sent in id order (as an id-ordered map encodes) decode to the same map.
        let sorted: BTreeMap<EventId, u32> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let from_sorted: IdMap<EventId, u32> =
            rmp_serde::from_slice(&rmp_serde::to_vec(&sorted).expect("encodes")).expect("decodes");
        assert_eq!(from_sorted, map);
    }

    #[test]
    fn a_repeated_id_is_refused() {
        let entries = vec![("e", 1u32), ("e", 2u32)];
        let mut bytes = vec![0x82];
        for (k, v) in entries {
            bytes.extend(rmp_serde::to_vec(k).expect("encodes"));
            bytes.extend(rmp_serde::to_vec(&v).expect("encodes"));
        }
        let refused = rmp_serde::from_slice::<IdMap<EventId, u32>>(&bytes);
        assert!(refused.is_err_and(|e| e.to_string().contains("appears twice")));
    }
}
