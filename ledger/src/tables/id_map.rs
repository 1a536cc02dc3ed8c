//! A map from an id to a row, in id order, whose searches mostly compare integers held in
//! the tree's own nodes.
//!
//! For tables that must be kept in id order (the router's live families and its expiry index
//! by family); a family's own dedupe table and holds need no order and use `IdTable`. Keyed by
//! the id alone, each step of a tree search follows a pointer to another id's bytes: those are
//! seldom in cache, so a search costs a cache miss per key it passes. Here each key also
//! carries the id's first 24 bytes as three big-endian words: comparing the words orders ids
//! exactly as comparing their bytes would, and only ids that agree on all 24 bytes read their
//! bytes. The order is the id order, so consecutive ids still share their path through the
//! tree, and the map encodes exactly as a map keyed by the id alone.
//!
//! Ordering by a 64-bit hash of the id, then the id, would make compares cheaper, but it
//! scatters consecutive ids over the tree, so counter-named requests lose their shared path.

use std::cmp::Ordering;
use std::collections::btree_map::{self, BTreeMap};
use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An id whose bytes the map orders by.
pub trait IdBytes {
    fn id_bytes(&self) -> &[u8];
}

/// How many leading bytes of an id its key holds inline.
const PREFIX_WORDS: usize = 3;

/// How many bytes the words hold.
const INLINE_BYTES: usize = PREFIX_WORDS * 8;

/// The map's key: the id's first 24 bytes (zero-padded, big-endian words), then the id.
/// Ordered by the words first. Two ids differing within their first 24 bytes differ there in
/// the same direction as their bytes (big-endian words compare like the bytes they hold).
/// Ids whose words tie are equal in their first 24 bytes, or one is the other followed by
/// zero bytes (the padding): when both fit in the words, the shorter one is therefore a prefix
/// of the other and comes first, and equal lengths mean equal ids, all without reading the
/// ids' bytes (the length is in the key's own pointer); otherwise the ids themselves are
/// compared. So the order is exactly the ids' order, and short ids (family ids, most hold ids)
/// are found without a cache miss on their bytes.
#[derive(Clone, Debug)]
pub struct IdKey<K> {
    prefix: [u64; PREFIX_WORDS],
    id: K,
}

impl<K: IdBytes + Ord> Ord for IdKey<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.prefix.cmp(&other.prefix).then_with(|| {
            let (len, other_len) = (self.id.id_bytes().len(), other.id.id_bytes().len());
            if len <= INLINE_BYTES && other_len <= INLINE_BYTES {
                len.cmp(&other_len)
            } else {
                self.id.cmp(&other.id)
            }
        })
    }
}

impl<K: IdBytes + Ord> PartialOrd for IdKey<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: IdBytes + Ord> PartialEq for IdKey<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<K: IdBytes + Ord> Eq for IdKey<K> {}

impl<K: IdBytes> IdKey<K> {
    pub fn new(id: K) -> Self {
        Self {
            prefix: prefix_words(id.id_bytes()),
            id,
        }
    }

    pub fn id(&self) -> &K {
        &self.id
    }
}

fn prefix_words(bytes: &[u8]) -> [u64; PREFIX_WORDS] {
    let mut padded = [0u8; INLINE_BYTES];
    let len = bytes.len().min(padded.len());
    padded[..len].copy_from_slice(&bytes[..len]);
    std::array::from_fn(|word| {
        u64::from_be_bytes(
            padded[word * 8..word * 8 + 8]
                .try_into()
                .expect("8 bytes a word"),
        )
    })
}

#[derive(Clone)]
pub struct IdMap<K, V> {
    rows: BTreeMap<IdKey<K>, V>,
}

impl<K: IdBytes + Ord, V: PartialEq> PartialEq for IdMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows
    }
}

impl<K: IdBytes + Ord, V: Eq> Eq for IdMap<K, V> {}

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
    fn key(id: &K) -> IdKey<K> {
        IdKey::new(id.clone())
    }

    pub fn get(&self, id: &K) -> Option<&V> {
        self.rows.get(&Self::key(id))
    }

    pub fn get_mut(&mut self, id: &K) -> Option<&mut V> {
        self.rows.get_mut(&Self::key(id))
    }

    pub fn insert(&mut self, id: K, row: V) -> Option<V> {
        self.rows.insert(IdKey::new(id), row)
    }

    pub fn remove(&mut self, id: &K) -> Option<V> {
        self.rows.remove(&Self::key(id))
    }

    pub fn entry(&mut self, id: K) -> btree_map::Entry<'_, IdKey<K>, V> {
        self.rows.entry(IdKey::new(id))
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

    /// Rows in id order.
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

/// Encoded as a map from id to row in id order: the bytes an id-keyed `BTreeMap` gives.
impl<K: Serialize, V: Serialize> Serialize for IdMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.rows.len()))?;
        for (key, row) in &self.rows {
            map.serialize_entry(&key.id, row)?;
        }
        map.end()
    }
}

/// A table of rows keyed by id, read back from a map in which each id appears once.
pub(crate) trait UniqueRows<K, V>: Default {
    /// Inserts a row under a new id; an id already present is refused and returned.
    fn insert_new(&mut self, id: K, row: V) -> Result<(), K>;
}

impl<K: IdBytes + Clone + Ord, V> UniqueRows<K, V> for IdMap<K, V> {
    fn insert_new(&mut self, id: K, row: V) -> Result<(), K> {
        match self.entry(id) {
            btree_map::Entry::Vacant(slot) => {
                slot.insert(row);
                Ok(())
            }
            btree_map::Entry::Occupied(taken) => Err(taken.key().id().clone()),
        }
    }
}

/// Decodes a map of `(id, row)` entries into `T`, refusing an id that appears twice.
pub(crate) fn deserialize_unique_rows<'de, D, T, K, V>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: UniqueRows<K, V>,
    K: Deserialize<'de> + fmt::Debug,
    V: Deserialize<'de>,
{
    struct RowsVisitor<T, K, V>(PhantomData<(T, K, V)>);

    impl<'de, T, K, V> Visitor<'de> for RowsVisitor<T, K, V>
    where
        T: UniqueRows<K, V>,
        K: Deserialize<'de> + fmt::Debug,
        V: Deserialize<'de>,
    {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map from id to row, each id once")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            let mut rows = T::default();
            while let Some((id, row)) = map.next_entry::<K, V>()? {
                rows.insert_new(id, row)
                    .map_err(|id| serde::de::Error::custom(format!("id {id:?} appears twice")))?;
            }
            Ok(rows)
        }
    }

    deserializer.deserialize_map(RowsVisitor(PhantomData))
}

impl<'de, K, V> Deserialize<'de> for IdMap<K, V>
where
    K: Deserialize<'de> + IdBytes + Clone + Ord + fmt::Debug,
    V: Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_unique_rows(deserializer)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ids::EventId;
    use proptest::prelude::*;

    fn key(bytes: &[u8]) -> IdKey<EventId> {
        IdKey::new(EventId::new(
            String::from_utf8(bytes.to_vec()).expect("utf-8"),
        ))
    }

    proptest! {
        /// The keys order ids exactly as their bytes do, around the 24-byte boundary, across
        /// zero bytes (which the padding also uses) and for ids that are prefixes of others.
        #[test]
        fn keys_order_ids_as_their_bytes_do(
            a in proptest::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0x7f)], 0..30),
            b in proptest::collection::vec(prop_oneof![Just(0u8), Just(b'a'), Just(b'b'), Just(0x7f)], 0..30),
            shared in 0usize..30,
        ) {
            // Often share a long prefix, so the bytes past the inline words decide.
            let shared = shared.min(a.len());
            let b: Vec<u8> = a[..shared].iter().chain(&b).copied().collect();
            prop_assert_eq!(key(&a).cmp(&key(&b)), a.cmp(&b));
            prop_assert_eq!(key(&a) == key(&b), a == b);
        }
    }

    /// Ids whose words tie: one is the other plus zero bytes (the padding's value), or both
    /// agree on the 24 inline bytes. Up to 24 bytes the lengths decide, without the bytes.
    #[test]
    fn ids_whose_words_tie_are_ordered_as_their_bytes() {
        let x24 = "x".repeat(24);
        let ids: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"\0".to_vec(),
            b"a".to_vec(),
            b"a\0".to_vec(),
            b"a\0\0".to_vec(),
            x24.clone().into_bytes(),
            format!("{x24}\0").into_bytes(),
            format!("{x24}a").into_bytes(),
            format!("{x24}b").into_bytes(),
            format!("{x24}b\0").into_bytes(),
        ];
        for a in &ids {
            for b in &ids {
                // Separate allocations, so equality cannot come from sharing one.
                assert_eq!(key(a).cmp(&key(b)), a.cmp(b), "{a:?} vs {b:?}");
                assert_eq!(key(a) == key(b), a == b, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn behaves_as_a_map_and_encodes_as_an_id_keyed_map() {
        let mut map: IdMap<EventId, u32> = IdMap::default();
        let mut model = BTreeMap::new();
        for n in 0..500u32 {
            let id = EventId::new(format!("budget-hold:{}:cap:0", n * 7919 % 1000));
            assert_eq!(map.insert(id.clone(), n), model.insert(id, n));
        }
        for n in (0..1000u32).step_by(3) {
            let id = EventId::new(format!("budget-hold:{n}:cap:0"));
            assert_eq!(map.get(&id), model.get(&id));
            assert_eq!(map.contains_key(&id), model.contains_key(&id));
            assert_eq!(map.remove(&id), model.remove(&id));
        }
        assert_eq!(map.len(), model.len());
        let rows: Vec<(EventId, u32)> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(rows, model.clone().into_iter().collect::<Vec<_>>());

        let bytes = rmp_serde::to_vec(&map).expect("encodes");
        assert_eq!(
            bytes,
            rmp_serde::to_vec(&model).expect("encodes"),
            "the same bytes as the id-keyed map it replaced"
        );
        let back: IdMap<EventId, u32> = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, map);
    }

    /// A msgpack map that names id `e` twice.
    pub(crate) fn map_with_a_repeated_id() -> Vec<u8> {
        let mut bytes = vec![0x82];
        for (k, v) in [("e", 1u32), ("e", 2u32)] {
            bytes.extend(rmp_serde::to_vec(k).expect("encodes"));
            bytes.extend(rmp_serde::to_vec(&v).expect("encodes"));
        }
        bytes
    }

    #[test]
    fn a_repeated_id_is_refused() {
        let refused = rmp_serde::from_slice::<IdMap<EventId, u32>>(&map_with_a_repeated_id());
        assert!(refused.is_err_and(|e| e.to_string().contains("appears twice")));
    }
}
