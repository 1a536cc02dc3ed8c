//! A table from an id to a row, found by hashing the id, encoded in id order.
//!
//! The dedupe table and the holds are a family's largest maps: every command looks its
//! `event_id` up and inserts a row, and every hold command finds its hold. In an ordered
//! tree (`IdMap`) each of those walks a path of a dozen nodes and inserts in the middle of a
//! node, moving half of it; kernels name requests by random UUIDs, so the path is cold. Here a
//! lookup is one hash of the id and, mostly, one probe.
//!
//! This is the one place replicated state lives in a hash table (docs/architecture.md asks for
//! ordered containers): what that rule protects, that no answer, byte or digest depends on an
//! iteration order, holds here by construction. Commands only look rows up by id, and the
//! encoding sorts the rows by id first, so the bytes are those of an id-keyed ordered map. The
//! hash is seeded at random per table, so a client cannot choose ids that collide, and no
//! replica's answers can depend on the seed.
//!
//! Each row keeps its id's hash. A table that doubles moves its rows by their stored hashes,
//! never reading an id's bytes (each a likely cache miss). The encoding sorts the rows, off
//! the apply path (snapshots encode on a blocking thread, see the router's cut).
//!
//! Past `SPLIT_AT_ROWS` rows a table splits into `SHARDS` tables by bits 32..40 of the row
//! hash, each doubling on its own, so no single apply waits for millions of rows to move
//! (every replica applies that command at the same log index, so such a wait stalls them all).
//! The largest move is then one shard's, for one more load per lookup (the shard's header).
//! The shards' bits are apart from the low bits a shard uses for its buckets and the top seven
//! it keeps as tags, so a shard filters its probes as well as one table does.
//! `ledger/benches/growth.rs` measures the slowest apply while a family grows; figures are in
//! docs/benchmarks.md.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use foldhash::fast::RandomState;
use hashbrown::hash_table::{self, HashTable};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::tables::id_map::{deserialize_unique_rows, UniqueRows};

#[derive(Clone)]
struct Row<K, V> {
    hash: u64,
    id: K,
    value: V,
}

/// An id's hash in one table, as `IdTable::find` computed it (meaningless in another table:
/// each has its own seed).
#[derive(Clone, Copy, Debug)]
pub struct RowHash(u64);

/// Rows at which a table splits into `SHARDS` (a family's dedupe table crosses it after about
/// 1,400 tool calls). Below it one table's doubling moves at most this many rows, and the
/// split moves them once more. It is also the most a snapshot's cut makes the next command
/// copy of an unsplit table (`Arc::make_mut` of the family clones it whole): at 65,536 rows,
/// the first command after each cut copied two tables of up to 65,536 rows in every family,
/// ~56 ms per family on the apply path, and a 3-node dev cluster of 20 such families stalled
/// for seconds at every snapshot (docs/benchmarks.md, "Snapshots without a stall"). The
/// extra load per lookup of a split table costs a fresh family little
/// (`cargo bench -p tally-ledger --bench apply`, "ledger fresh family").
const SPLIT_AT_ROWS: usize = 1 << 12;

/// Tables a split table keeps (a power of two): the largest single move is then about
/// 1/256 of the rows, for 8 KiB of table headers, paid only by tables past `SPLIT_AT_ROWS`.
const SHARDS: usize = 256;

const _: () = assert!(SHARDS.is_power_of_two() && SHARDS <= 1 << 8);

/// The shard of a row: bits 32..40 of its hash, apart from the low bits a shard's buckets use
/// and the top seven bits `hashbrown` keeps as each row's tag.
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize & (SHARDS - 1)
}

#[derive(Clone)]
enum Layout<K, V> {
    /// Up to `SPLIT_AT_ROWS` rows (a dedupe table's first ~1,400 tool calls).
    One(HashTable<Row<K, V>>),
    /// `SHARDS` tables, the row of hash `h` in `shard_of(h)`. A table never joins again (rows
    /// leave these tables rarely: tombstones, no holds). Each shard is shared copy-on-write:
    /// a clone of a split table (a snapshot's cut of its family) costs `SHARDS` reference
    /// counts, and a write then copies only the shard it touches, not the family's largest
    /// table on the apply path.
    Split(Box<[Arc<HashTable<Row<K, V>>>; SHARDS]>),
}

impl<K: Clone, V: Clone> Layout<K, V> {
    #[inline]
    fn table_mut(&mut self, hash: u64) -> &mut HashTable<Row<K, V>> {
        match self {
            Self::One(table) => table,
            Self::Split(shards) => Arc::make_mut(&mut shards[shard_of(hash)]),
        }
    }
}

impl<K, V> Layout<K, V> {
    #[inline]
    fn table(&self, hash: u64) -> &HashTable<Row<K, V>> {
        match self {
            Self::One(table) => table,
            Self::Split(shards) => &shards[shard_of(hash)],
        }
    }

    /// Every table, without allocating: `len` runs after each batch (the family's footprint).
    fn tables(&self) -> impl Iterator<Item = &HashTable<Row<K, V>>> {
        let (one, shards) = match self {
            Self::One(table) => (Some(table), &[][..]),
            Self::Split(shards) => (None, &shards[..]),
        };
        one.into_iter().chain(shards.iter().map(|shard| &**shard))
    }

    /// Before a row may be added: a full single table splits, its rows moved by their stored
    /// hashes (the one move of `SPLIT_AT_ROWS` rows a table makes at once after this).
    #[inline]
    fn make_room(&mut self) {
        if matches!(self, Self::One(table) if table.len() >= SPLIT_AT_ROWS) {
            self.split();
        }
    }

    #[cold]
    fn split(&mut self) {
        let Self::One(table) = std::mem::replace(self, Self::One(HashTable::new())) else {
            unreachable!("only a single table splits");
        };
        // Room for a shard's share: `hashbrown` rounds it up to 32 buckets (28 rows), as
        // many buckets in all as the single table had. Twice that would leave every split
        // table with twice the buckets it needs.
        let mut shards: Vec<HashTable<Row<K, V>>> = (0..SHARDS)
            .map(|_| HashTable::with_capacity(SPLIT_AT_ROWS / SHARDS))
            .collect();
        for row in table {
            shards[shard_of(row.hash)].insert_unique(row.hash, row, |row| row.hash);
        }
        let shards: Box<[Arc<HashTable<Row<K, V>>>; SHARDS]> = shards
            .into_iter()
            .map(Arc::new)
            .collect::<Box<[_]>>()
            .try_into()
            .unwrap_or_else(|_| unreachable!("SHARDS tables were made"));
        *self = Self::Split(shards);
    }
}

#[derive(Clone)]
pub struct IdTable<K, V> {
    layout: Layout<K, V>,
    seed: RandomState,
}

/// A row's place in the table, found by `IdTable::entry`.
pub enum Entry<'t, K, V> {
    Occupied(&'t mut V),
    Vacant(VacantEntry<'t, K, V>),
}

/// Where a new id's row goes: filling it costs no second search.
pub struct VacantEntry<'t, K, V> {
    slot: hash_table::VacantEntry<'t, Row<K, V>>,
    hash: u64,
    id: K,
}

impl<'t, K, V> VacantEntry<'t, K, V> {
    pub fn insert(self, value: V) -> &'t mut V {
        let row = Row {
            hash: self.hash,
            id: self.id,
            value,
        };
        &mut self.slot.insert(row).into_mut().value
    }
}

impl<K: Hash + Eq + Clone, V: PartialEq + Clone> PartialEq for IdTable<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .iter_unordered()
                .all(|(id, value)| other.get(id) == Some(value))
    }
}

impl<K: Hash + Eq + Clone, V: Eq + Clone> Eq for IdTable<K, V> {}

impl<K, V> Default for IdTable<K, V> {
    fn default() -> Self {
        Self {
            layout: Layout::One(HashTable::new()),
            seed: RandomState::default(),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> IdTable<K, V> {
    fn hash(&self, id: &K) -> u64 {
        self.seed.hash_one(id)
    }

    pub fn get(&self, id: &K) -> Option<&V> {
        self.find(id).1
    }

    /// The row of `id`, and where a new row for it would be filed: a command can look its id
    /// up, run, and only then file its row (`insert_absent`) without hashing the id again.
    pub fn find(&self, id: &K) -> (RowHash, Option<&V>) {
        let hash = self.hash(id);
        let row = self
            .layout
            .table(hash)
            .find(hash, |row| row.hash == hash && row.id == *id)
            .map(|row| &row.value);
        (RowHash(hash), row)
    }

    /// Files a row for an id that `find` found absent, with the hash it returned. The caller
    /// must not have inserted that id since (no equality check is made).
    pub fn insert_absent(&mut self, hash: RowHash, id: K, value: V) {
        debug_assert!(
            hash.0 == self.hash(&id) && self.get(&id).is_none(),
            "insert_absent of an id that is present, or with another id's hash"
        );
        self.layout.make_room();
        self.layout.table_mut(hash.0).insert_unique(
            hash.0,
            Row {
                hash: hash.0,
                id,
                value,
            },
            |row| row.hash,
        );
    }

    pub fn get_mut(&mut self, id: &K) -> Option<&mut V> {
        let hash = self.hash(id);
        self.layout
            .table_mut(hash)
            .find_mut(hash, |row| row.hash == hash && row.id == *id)
            .map(|row| &mut row.value)
    }

    pub fn entry(&mut self, id: K) -> Entry<'_, K, V> {
        let hash = self.hash(&id);
        self.layout.make_room();
        match self.layout.table_mut(hash).entry(
            hash,
            |row| row.hash == hash && row.id == id,
            |row| row.hash,
        ) {
            hash_table::Entry::Occupied(row) => Entry::Occupied(&mut row.into_mut().value),
            hash_table::Entry::Vacant(slot) => Entry::Vacant(VacantEntry { slot, hash, id }),
        }
    }

    pub fn insert(&mut self, id: K, value: V) -> Option<V> {
        match self.entry(id) {
            Entry::Occupied(row) => Some(std::mem::replace(row, value)),
            Entry::Vacant(slot) => {
                slot.insert(value);
                None
            }
        }
    }

    pub fn remove(&mut self, id: &K) -> Option<V> {
        let hash = self.hash(id);
        let row = self
            .layout
            .table_mut(hash)
            .find_entry(hash, |row| row.hash == hash && row.id == *id)
            .ok()?;
        Some(row.remove().0.value)
    }

    pub fn contains_key(&self, id: &K) -> bool {
        self.get(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.layout.tables().map(HashTable::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.layout.tables().all(|table| table.is_empty())
    }

    /// Rows in no particular order: for checks that visit every row, never for output.
    pub fn iter_unordered(&self) -> impl Iterator<Item = (&K, &V)> {
        self.layout
            .tables()
            .flat_map(HashTable::iter)
            .map(|row| (&row.id, &row.value))
    }

    /// Rows in id order (sorts them: for encoding and reports, not the apply path).
    pub fn sorted(&self) -> Vec<(&K, &V)>
    where
        K: Ord,
    {
        let mut rows: Vec<_> = self.iter_unordered().collect();
        rows.sort_unstable_by(|a, b| a.0.cmp(b.0));
        rows
    }
}

impl<K: fmt::Debug + Hash + Eq + Ord + Clone, V: fmt::Debug + Clone> fmt::Debug for IdTable<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

/// Encoded as a map from id to row in id order: the bytes an id-keyed `BTreeMap` gives.
impl<K: Serialize + Hash + Eq + Ord + Clone, V: Serialize + Clone> Serialize for IdTable<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (id, row) in self.sorted() {
            map.serialize_entry(id, row)?;
        }
        map.end()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> UniqueRows<K, V> for IdTable<K, V> {
    /// Moves the id in: decoding clones no id per row.
    fn insert_new(&mut self, id: K, value: V) -> Result<(), K> {
        let (hash, found) = self.find(&id);
        if found.is_some() {
            return Err(id);
        }
        self.insert_absent(hash, id, value);
        Ok(())
    }
}

impl<'de, K, V> Deserialize<'de> for IdTable<K, V>
where
    K: Deserialize<'de> + Hash + Eq + fmt::Debug + Clone,
    V: Deserialize<'de> + Clone,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_unique_rows(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ids::EventId;

    #[test]
    fn encodes_in_id_order_as_an_id_keyed_map_does() {
        let mut table: IdTable<EventId, u32> = IdTable::default();
        let mut model = BTreeMap::new();
        for n in 0..2_000u32 {
            let id = EventId::new(format!("{:08x}", n.wrapping_mul(2_654_435_761)));
            if n % 5 == 4 {
                let gone = EventId::new(format!("{:08x}", (n - 2).wrapping_mul(2_654_435_761)));
                assert_eq!(table.remove(&gone), model.remove(&gone));
            }
            table.insert(id.clone(), n);
            model.insert(id, n);
        }
        let in_order: Vec<(&EventId, &u32)> = model.iter().collect();
        assert_eq!(table.sorted(), in_order);
        let bytes = rmp_serde::to_vec(&table).expect("encodes");
        assert_eq!(bytes, rmp_serde::to_vec(&model).expect("encodes"));
        let back: IdTable<EventId, u32> = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, table);
        assert_eq!(
            rmp_serde::to_vec(&back).expect("encodes"),
            bytes,
            "a restored table (another seed, another insertion order) encodes alike"
        );
    }

    #[test]
    fn tables_filled_in_different_orders_are_equal_and_encode_alike() {
        let ids: Vec<EventId> = (0..200)
            .map(|n| EventId::new(format!("e{}", n * 37 % 200)))
            .collect();
        let mut forward: IdTable<EventId, usize> = IdTable::default();
        let mut backward: IdTable<EventId, usize> = IdTable::default();
        for (n, id) in ids.iter().enumerate() {
            forward.insert(id.clone(), n);
        }
        for (n, id) in ids.iter().enumerate().rev() {
            backward.insert(id.clone(), n);
        }
        assert_eq!(forward, backward);
        assert_eq!(
            rmp_serde::to_vec(&forward).expect("encodes"),
            rmp_serde::to_vec(&backward).expect("encodes")
        );
        backward.insert(ids[0].clone(), usize::MAX);
        assert_ne!(forward, backward, "a differing row makes the tables differ");
    }

    #[test]
    fn a_row_found_absent_is_filed_under_the_hash_found() {
        let mut table: IdTable<EventId, u32> = IdTable::default();
        for n in 0..1_000u32 {
            let id = EventId::new(format!("e{n}"));
            let (hash, row) = table.find(&id);
            assert_eq!(row, None);
            table.insert_absent(hash, id, n);
        }
        assert_eq!(table.len(), 1_000);
        for n in 0..1_000u32 {
            assert_eq!(table.find(&EventId::new(format!("e{n}"))).1, Some(&n));
        }
        assert_eq!(table.find(&EventId::new("e1000")).1, None);
    }

    #[test]
    fn a_repeated_id_is_refused() {
        let refused = rmp_serde::from_slice::<IdTable<EventId, u32>>(
            &crate::tables::id_map::tests::map_with_a_repeated_id(),
        );
        assert!(refused.is_err_and(|e| e.to_string().contains("appears twice")));
    }

    /// An id that counts how often it is hashed.
    #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
    struct CountedId(u32);

    static HASHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    impl Hash for CountedId {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            HASHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.hash(state);
        }
    }

    #[test]
    fn growing_moves_rows_by_their_stored_hash_without_reading_ids() {
        // Past the split too: the single table's rows move to the shards by their hashes.
        let rows = (SPLIT_AT_ROWS + 10_000) as u32;
        let mut table: IdTable<CountedId, u32> = IdTable::default();
        let before = HASHED.load(std::sync::atomic::Ordering::Relaxed);
        for n in 0..rows {
            table.insert(CountedId(n), n);
        }
        let hashed = HASHED.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert_eq!(
            hashed, rows as usize,
            "one hash per insert, none while the table grew or split"
        );
        assert!(matches!(table.layout, Layout::Split(_)));
        assert!((0..rows).all(|n| table.get(&CountedId(n)) == Some(&n)));
    }

    #[test]
    fn a_clone_of_a_split_table_shares_its_shards_until_one_is_written() {
        let id = |n: u32| EventId::new(format!("{:08x}", n.wrapping_mul(2_654_435_761)));
        let rows = SPLIT_AT_ROWS as u32 + 1_000;
        let mut table: IdTable<EventId, u32> = IdTable::default();
        for n in 0..rows {
            table.insert(id(n), n);
        }
        let cut = table.clone();
        let shared = |a: &IdTable<EventId, u32>, b: &IdTable<EventId, u32>| {
            let (Layout::Split(a), Layout::Split(b)) = (&a.layout, &b.layout) else {
                panic!("both split");
            };
            a.iter()
                .zip(b.iter())
                .filter(|(x, y)| Arc::ptr_eq(x, y))
                .count()
        };
        assert_eq!(shared(&table, &cut), SHARDS, "a clone copies no row");
        table.insert(id(rows), rows);
        if let Entry::Occupied(value) = table.entry(id(0)) {
            *value += 1;
        }
        assert!(
            shared(&table, &cut) >= SHARDS - 2,
            "only the shards written were copied"
        );
        assert_eq!((cut.len(), cut.get(&id(0))), (rows as usize, Some(&0)));
        assert_eq!(cut.get(&id(rows)), None, "the cut is unchanged");
        assert_eq!(table.get(&id(0)), Some(&1));
    }

    #[test]
    fn a_table_past_the_split_is_the_same_map_and_encodes_alike() {
        let id = |n: u32| EventId::new(format!("{:08x}", n.wrapping_mul(2_654_435_761)));
        // A seventh of the rows is removed again: the table still ends past the split.
        let rows = SPLIT_AT_ROWS as u32 * 5 / 4;
        let mut table: IdTable<EventId, u32> = IdTable::default();
        let mut model = BTreeMap::new();
        for n in 0..rows {
            // Every way in: insert, entry, and find then insert_absent.
            match n % 3 {
                0 => assert_eq!(table.insert(id(n), n), None),
                1 => match table.entry(id(n)) {
                    Entry::Vacant(slot) => {
                        slot.insert(n);
                    }
                    Entry::Occupied(_) => panic!("{n} is new"),
                },
                _ => {
                    let (hash, row) = table.find(&id(n));
                    assert_eq!(row, None);
                    table.insert_absent(hash, id(n), n);
                }
            }
            model.insert(id(n), n);
            if n % 7 == 6 {
                assert_eq!(table.remove(&id(n - 3)), model.remove(&id(n - 3)));
            }
            if n as usize == SPLIT_AT_ROWS - 1 {
                assert!(matches!(table.layout, Layout::One(_)), "not split yet");
            }
        }
        let Layout::Split(shards) = &table.layout else {
            panic!("a table of {} rows is split", table.len());
        };
        assert_eq!(shards.len(), SHARDS);
        assert_eq!(table.len(), model.len());
        *table.get_mut(&id(1)).expect("row 1 is kept") += 1;
        *model.get_mut(&id(1)).expect("row 1 is kept") += 1;
        assert!(model.iter().all(|(id, n)| table.get(id) == Some(n)));
        assert!(table.get(&id(rows)).is_none() && !table.contains_key(&id(rows + 1)));
        let bytes = rmp_serde::to_vec(&table).expect("encodes");
        assert_eq!(bytes, rmp_serde::to_vec(&model).expect("encodes"));
        let back: IdTable<EventId, u32> = rmp_serde::from_slice(&bytes).expect("decodes");
        assert!(
            matches!(back.layout, Layout::Split(_)),
            "decoding splits too"
        );
        assert_eq!(back, table);
        let mut small: IdTable<EventId, u32> = IdTable::default();
        small.insert(id(0), 0);
        assert_ne!(
            small, table,
            "a split table and a single one compare by rows"
        );
    }

    #[test]
    fn shards_take_bits_apart_from_the_buckets_and_tags_and_fill_evenly() {
        let mut state = 0x243f_6a88_85a3_08d3u64;
        for _ in 0..10_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let shard = shard_of(state);
            assert_eq!(
                shard,
                shard_of(state ^ 0xffff_ffff),
                "low bits pick buckets"
            );
            assert_eq!(shard, shard_of(state ^ (0x7f << 57)), "top bits are tags");
        }
        // Rows spread over every shard (with 200,000 rows, ~781 a shard, a few dozen apart).
        let mut table: IdTable<EventId, u32> = IdTable::default();
        for n in 0..200_000u32 {
            table.insert(EventId::new(format!("e{n}")), n);
        }
        let Layout::Split(shards) = &table.layout else {
            panic!("200,000 rows are split");
        };
        let mean = 200_000 / SHARDS;
        for (at, shard) in shards.iter().enumerate() {
            assert!(
                shard.len() > mean * 7 / 10 && shard.len() < mean * 13 / 10,
                "shard {at} holds {} rows, the mean is {mean}",
                shard.len()
            );
        }
    }
}
