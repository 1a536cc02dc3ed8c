//! Node-local: which families have rows out of memory (`tally_ledger::cold`), how many, and a
//! filter per family that tells an id that never moved out from one that may have, so a
//! command with a fresh event id costs no disk read (docs/sizing.md). Derived from the
//! store's rows (rebuilt when a snapshot is restored); nothing replicated depends on it.
//!
//! A family's filter is a list of Bloom filters, each for four times as many keys as the one
//! before, so a family with few rows costs little and a family with 50 million is probed nine
//! times. At 16 bits and 11 probes per key a full filter answers "maybe" for about 1 in 2,000
//! absent keys, so an absent key passes all of a family's filters well under 1% of the time
//! (the target for disk reads per fresh id). The newest filter is sized ahead of its keys:
//! from 2 bytes per row, up to 8 right after one is added. (Blocked filters, all of a key's
//! bits in one cache line, would spare the probes' cache misses, but answer "maybe" ~4 times
//! as often at 16 bits per key: 0.17–0.2% in a simulation, over 1% across nine full filters.)

use std::collections::{BTreeMap, HashMap};

use tally_ledger::{ColdKeyHash, FamilyId};

/// Bits per key, and probes per key, of every filter.
const BITS_PER_KEY: usize = 16;
const PROBES: u64 = 11;
/// The first filter's keys; each next one takes `GROWTH` times as many. With these, every
/// filter's size is a power of two (`positions` relies on it).
const FIRST_FILTER_KEYS: usize = 1_024;
const GROWTH: usize = 4;

#[derive(Default)]
pub(crate) struct ColdIndex {
    /// Hashed, not ordered: every round looks each of its families up, and a B-tree of
    /// string keys cost ~2% of a node's CPU in cache misses (perf, 6,000 commands/s).
    families: HashMap<FamilyId, ColdFamily, foldhash::fast::RandomState>,
    /// The filters' memory, summed over families.
    filter_bytes: usize,
    /// Ids looked up before a batch, and those the filters passed on to the store.
    lookups: u64,
    passed: u64,
}

/// One family's filters, borrowed for a round's lookups (`ColdIndex::family`).
pub(crate) struct FamilyFilters<'i> {
    family: &'i ColdFamily,
    lookups: &'i mut u64,
    passed: &'i mut u64,
}

impl FamilyFilters<'_> {
    /// Whether the key (within the family) that hashes to `hash` may be among the family's
    /// rows: `false` is certain.
    pub fn may_contain(&mut self, hash: ColdKeyHash) -> bool {
        let hash = hash.value();
        let maybe = (self.family.filters.iter()).any(|filter| filter.may_contain(hash));
        *self.lookups += 1;
        *self.passed += u64::from(maybe);
        maybe
    }
}

#[derive(Default)]
struct ColdFamily {
    rows: u64,
    filters: Vec<Bloom>,
}

struct Bloom {
    bits: Vec<u64>,
    keys: usize,
    capacity: usize,
}

impl Bloom {
    fn new(capacity: usize) -> Self {
        let words = (capacity * BITS_PER_KEY).div_ceil(64);
        Self {
            bits: vec![0; words],
            keys: 0,
            capacity,
        }
    }

    fn bytes(&self) -> usize {
        self.bits.len() * 8
    }

    fn insert(&mut self, hash: u64) {
        for at in positions(self.bits.len(), hash) {
            self.bits[at / 64] |= 1 << (at % 64);
        }
        self.keys += 1;
    }

    fn may_contain(&self, hash: u64) -> bool {
        positions(self.bits.len(), hash).all(|at| self.bits[at / 64] & (1 << (at % 64)) != 0)
    }
}

/// The bit positions of `hash` in a filter of `words` 64-bit words (double hashing over two
/// 32-bit halves; the step is odd and the size a power of two, so the probes are distinct
/// and a mask replaces eleven divisions). Borrows nothing, so inserting costs no list of
/// positions.
fn positions(words: usize, hash: u64) -> impl Iterator<Item = usize> {
    let bits = (words * 64) as u64;
    assert!(bits.is_power_of_two(), "a filter of {bits} bits");
    let (low, step) = (hash & 0xffff_ffff, (hash >> 32) | 1);
    (0..PROBES).map(move |i| (low.wrapping_add(i.wrapping_mul(step)) & (bits - 1)) as usize)
}

impl ColdIndex {
    /// Rows `family_id` has out of memory.
    pub fn rows(&self, family_id: &FamilyId) -> u64 {
        self.families.get(family_id).map_or(0, |family| family.rows)
    }

    /// The filters of `family_id`, if it has rows out of memory (one map lookup for all of
    /// a round's ids of the family).
    pub fn family(&mut self, family_id: &FamilyId) -> Option<FamilyFilters<'_>> {
        let Self {
            families,
            lookups,
            passed,
            ..
        } = self;
        Some(FamilyFilters {
            family: families.get(family_id)?,
            lookups,
            passed,
        })
    }

    /// Counts a row the family moved out (and the store now holds) in.
    pub fn add(&mut self, family_id: &FamilyId, key: &[u8]) {
        let family = match self.families.get_mut(family_id) {
            Some(family) => family,
            None => self.families.entry(family_id.clone()).or_default(),
        };
        let full = family
            .filters
            .last()
            .is_none_or(|filter| filter.keys >= filter.capacity);
        if full {
            let capacity =
                (family.filters.last()).map_or(FIRST_FILTER_KEYS, |last| last.capacity * GROWTH);
            let filter = Bloom::new(capacity);
            self.filter_bytes += filter.bytes();
            family.filters.push(filter);
        }
        family
            .filters
            .last_mut()
            .expect("a filter with room was just ensured")
            .insert(ColdKeyHash::of_bytes(key).value());
        family.rows += 1;
    }

    /// The families with rows out of memory and their counts, in family-id order.
    pub fn counts(&self) -> BTreeMap<FamilyId, u64> {
        (self.families.iter())
            .map(|(family_id, family)| (family_id.clone(), family.rows))
            .collect()
    }

    /// Rows out of memory, over all families.
    pub fn total_rows(&self) -> u64 {
        self.families.values().map(|family| family.rows).sum()
    }

    /// The filters' memory, counted against the node's memory budget.
    pub fn filter_bytes(&self) -> usize {
        self.filter_bytes
    }

    /// `(ids looked up, ids the filters sent to the store)` so far.
    pub fn lookups(&self) -> (u64, u64) {
        (self.lookups, self.passed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key added is found; keys never added are almost all told apart, across the
    /// growth from one filter to many.
    #[test]
    fn added_keys_are_always_found_and_absent_ones_rarely_pass() {
        let mut index = ColdIndex::default();
        let fam = FamilyId::from("fam");
        let keys = 20_000;
        for n in 0..keys {
            index.add(&fam, format!("event-{n}").as_bytes());
        }
        assert_eq!(index.rows(&fam), keys);
        assert!(index.families[&fam].filters.len() >= 3, "the filters grew");
        let hash = |key: String| ColdKeyHash::of_bytes(key.as_bytes());
        let mut filters = index.family(&fam).expect("the family has rows");
        for n in 0..keys {
            assert!(filters.may_contain(hash(format!("event-{n}"))));
        }
        let passed = (0..100_000)
            .filter(|n| filters.may_contain(hash(format!("fresh-{n}"))))
            .count();
        assert!(
            passed < 300,
            "{passed} of 100,000 fresh ids passed the filters"
        );
        assert_eq!(index.lookups(), (120_000, 20_000 + passed as u64));
        assert!(index.family(&FamilyId::from("other")).is_none());
        assert_eq!(index.counts(), BTreeMap::from([(fam, keys)]));
        assert!(index.filter_bytes() >= keys as usize * BITS_PER_KEY / 8);
    }
}
