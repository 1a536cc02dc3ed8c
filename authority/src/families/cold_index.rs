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
//! from 2 bytes per row, up to 8 right after one is added.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher;

use tally_ledger::FamilyId;

/// Bits per key, and probes per key, of every filter.
const BITS_PER_KEY: usize = 16;
const PROBES: u64 = 11;
/// The first filter's keys; each next one takes `GROWTH` times as many.
const FIRST_FILTER_KEYS: usize = 1_024;
const GROWTH: usize = 4;

#[derive(Default)]
pub(crate) struct ColdIndex {
    /// Hashed, not ordered: every round looks each of its families up, and a B-tree of
    /// string keys cost ~2% of a node's CPU in cache misses (perf, 6,000 commands/s).
    families: HashMap<FamilyId, ColdFamily>,
    /// The filters' memory, summed over families.
    filter_bytes: usize,
    /// Ids looked up before a batch, and those the filters passed on to the store.
    lookups: u64,
    passed: u64,
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
/// 32-bit halves). Borrows nothing, so inserting costs no list of positions.
fn positions(words: usize, hash: u64) -> impl Iterator<Item = usize> {
    let bits = (words * 64) as u64;
    let (low, high) = (hash & 0xffff_ffff, (hash >> 32) | 1);
    (0..PROBES).map(move |i| (low.wrapping_add(i.wrapping_mul(high)) % bits) as usize)
}

fn hash_of(key: &[u8]) -> u64 {
    // Fixed keys: the same id hashes alike on every run (the filters are rebuilt anyway).
    let mut hasher = DefaultHasher::new();
    hasher.write(key);
    hasher.finish()
}

impl ColdIndex {
    /// Rows `family_id` has out of memory.
    pub fn rows(&self, family_id: &FamilyId) -> u64 {
        self.families.get(family_id).map_or(0, |family| family.rows)
    }

    /// Whether `key` (within the family) may be among the family's rows: `false` is certain.
    pub fn may_contain(&mut self, family_id: &FamilyId, key: &[u8]) -> bool {
        let Some(family) = self.families.get(family_id) else {
            return false;
        };
        self.lookups += 1;
        let hash = hash_of(key);
        let maybe = family.filters.iter().any(|filter| filter.may_contain(hash));
        self.passed += u64::from(maybe);
        maybe
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
            .insert(hash_of(key));
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
        for n in 0..keys {
            assert!(index.may_contain(&fam, format!("event-{n}").as_bytes()));
        }
        let passed = (0..100_000)
            .filter(|n| index.may_contain(&fam, format!("fresh-{n}").as_bytes()))
            .count();
        assert!(
            passed < 300,
            "{passed} of 100,000 fresh ids passed the filters"
        );
        assert!(!index.may_contain(&FamilyId::from("other"), b"event-1"));
        assert_eq!(index.counts(), BTreeMap::from([(fam, keys)]));
        assert!(index.filter_bytes() >= keys as usize * BITS_PER_KEY / 8);
    }
}
