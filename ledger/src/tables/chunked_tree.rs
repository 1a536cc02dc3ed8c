//! An ordered map in chunks shared copy-on-write: what a snapshot's cut of a family clones in
//! O(chunks) and the next write copies one chunk of.
//!
//! A family is shared with a snapshot's cut and copied by the first command after it
//! (`Arc::make_mut`). A `BTreeMap` clones node by node: the compaction queue's tree of items
//! that came out of order held ~1M items in a loaded family, and cloning it (with the queue's
//! deques) was 47% of the CPU of a 3.6 s stall of a 3-node dev cluster at a snapshot
//! (docs/benchmarks.md, "Snapshots without a stall"). Here the map is a tree of chunks,
//! each a `BTreeMap` of at most `MAX_CHUNK_LEN` entries behind an `Arc`, keyed by a key no
//! larger than any of its entries and larger than every entry of the chunk before.
//!
//! Only what the compaction queue needs: insert, get, the first entry, pop the first, iterate
//! in key order.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Entries a chunk holds at most: a write after a cut copies this many at most.
const MAX_CHUNK_LEN: usize = 512;

#[derive(Clone, Debug)]
pub(crate) struct ChunkedTree<K, V> {
    /// By a key no larger than any of the chunk's entries; no chunk is empty.
    chunks: BTreeMap<K, Arc<BTreeMap<K, V>>>,
    len: usize,
}

impl<K, V> Default for ChunkedTree<K, V> {
    fn default() -> Self {
        Self {
            chunks: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Copy, V: Clone> ChunkedTree<K, V> {
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Inserts `value` under `key`; the value it replaces, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        // The chunk whose range holds `key`: the last one starting at or before it, or the
        // first, which then starts at `key`.
        let start = match self.chunks.range(..=key).next_back() {
            Some((start, _)) => *start,
            None => match self.chunks.pop_first() {
                Some((_, first)) => {
                    self.chunks.insert(key, first);
                    key
                }
                None => {
                    self.chunks.insert(key, Arc::new(BTreeMap::new()));
                    key
                }
            },
        };
        let chunk = Arc::make_mut(self.chunks.get_mut(&start).expect("the chunk was found"));
        let previous = chunk.insert(key, value);
        if previous.is_none() {
            self.len += 1;
        }
        if chunk.len() > MAX_CHUNK_LEN {
            let middle = *chunk
                .keys()
                .nth(chunk.len() / 2)
                .expect("a full chunk has a middle");
            let upper = chunk.split_off(&middle);
            self.chunks.insert(middle, Arc::new(upper));
        }
        previous
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        let (_, chunk) = self.chunks.range(..=*key).next_back()?;
        chunk.get(key)
    }

    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.chunks.first_key_value()?.1.first_key_value()
    }

    pub fn pop_first(&mut self) -> Option<(K, V)> {
        let mut first = self.chunks.first_entry()?;
        let popped = Arc::make_mut(first.get_mut()).pop_first();
        assert!(popped.is_some(), "no chunk is empty");
        if first.get().is_empty() {
            first.remove();
        }
        self.len -= 1;
        popped
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.chunks.values().flat_map(|chunk| chunk.iter())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32),
        PopFirst,
    }

    proptest! {
        /// Against a `BTreeMap`, across chunk splits and chunks emptied from the front, and
        /// a clone taken midway never sees later writes.
        #[test]
        fn behaves_as_a_btree_map(ops in prop::collection::vec(
            prop_oneof![
                5 => (0u32..5_000).prop_map(Op::Insert),
                2 => Just(Op::PopFirst),
            ],
            0..3_000,
        )) {
            let mut tree = ChunkedTree::default();
            let mut model = BTreeMap::new();
            let mut cut = None;
            for (step, op) in ops.iter().enumerate() {
                match op {
                    Op::Insert(key) => prop_assert_eq!(
                        tree.insert(*key, step),
                        model.insert(*key, step)
                    ),
                    Op::PopFirst => prop_assert_eq!(tree.pop_first(), model.pop_first()),
                }
                prop_assert_eq!(tree.len(), model.len());
                prop_assert_eq!(tree.first_key_value(), model.first_key_value());
                if step == ops.len() / 2 {
                    cut = Some((tree.clone(), model.clone()));
                }
            }
            prop_assert!(tree.iter().eq(model.iter()));
            for key in 0..5_000 {
                prop_assert_eq!(tree.get(&key), model.get(&key));
            }
            let well_formed = tree
                .chunks
                .values()
                .all(|chunk| !chunk.is_empty() && chunk.len() <= MAX_CHUNK_LEN);
            prop_assert!(well_formed, "no chunk empty or over the limit");
            if let Some((cut, then)) = cut {
                prop_assert!(cut.iter().eq(then.iter()), "the clone kept its state");
            }
        }
    }

    #[test]
    fn a_clone_shares_every_chunk_until_one_is_written() {
        let mut tree = ChunkedTree::default();
        for key in 0..20 * MAX_CHUNK_LEN as u64 {
            tree.insert(key * 2, key);
        }
        let cut = tree.clone();
        let shared = |a: &ChunkedTree<u64, u64>, b: &ChunkedTree<u64, u64>| {
            a.chunks
                .values()
                .zip(b.chunks.values())
                .filter(|(x, y)| Arc::ptr_eq(x, y))
                .count()
        };
        let chunks = tree.chunks.len();
        assert!(chunks >= 20, "{chunks} chunks");
        assert_eq!(shared(&tree, &cut), chunks, "a clone copies no entry");
        tree.insert(1001, 0);
        tree.pop_first();
        assert!(
            shared(&tree, &cut) >= chunks - 2,
            "only the chunks written were copied"
        );
        assert_eq!(cut.get(&1001), None);
        assert_eq!(cut.first_key_value(), Some((&0, &0)));
    }
}
