//! The tail of the log in memory, decoded.
//!
//! Right after an append, openraft reads the same entries back twice: the replication tasks
//! send them to followers, and the state machine worker applies them once committed. From the
//! file, each read is a redb lookup and an rmp decode of every command of the entry, a large
//! share of a loaded leader's CPU when done twice per entry. So `append` keeps the entries
//! it has just made durable here, and readers take a range from here when it starts inside
//! the cached tail.
//!
//! The cache is always a contiguous suffix of the log as openraft has issued it: `append` extends
//! it before its entries are written (openraft requires them to be readable when `append`
//! returns, and only reports them durable through the callback, see `writer.rs`),
//! `truncate_after` and `purge` cut it before they change the file, and when it grows past its
//! limits the oldest *durable* entries leave first. Entries not yet written never leave, so a
//! reader finds every entry openraft has issued either here or in the file, and an entry read
//! from either place is the entry at that index.

use std::collections::VecDeque;

/// Limits of the cache: whichever is reached first evicts the oldest entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    pub max_entries: usize,
    /// Sum of the entries' encoded sizes (the decoded size is of the same order).
    pub max_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            max_entries: 4_096,
            max_bytes: 64 << 20,
        }
    }
}

pub(crate) struct EntryCache<E> {
    limits: CacheLimits,
    /// Index of `entries[0]`.
    first_index: u64,
    /// Each entry with its encoded size.
    entries: VecDeque<(E, usize)>,
    bytes: usize,
    /// One past the last entry known to be in the file; entries from here on are only here.
    durable_end: u64,
    /// Raised whenever cached entries are dropped from the tail, so the completion of a write
    /// issued before that cannot mark the entries that replaced them as durable.
    generation: u64,
}

impl<E: Clone> EntryCache<E> {
    pub fn new(limits: CacheLimits) -> Self {
        Self {
            limits,
            first_index: 0,
            entries: VecDeque::new(),
            bytes: 0,
            durable_end: 0,
            generation: 0,
        }
    }

    /// The current generation, to hand back to [`EntryCache::mark_durable`].
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The entries before `end` are in the file, as of `generation`: they may now be evicted.
    pub fn mark_durable(&mut self, end: u64, generation: u64) {
        if generation == self.generation {
            self.durable_end = self.durable_end.max(end.min(self.end_index()));
            self.evict();
        }
    }

    /// One past the last cached index (meaningless when empty).
    fn end_index(&self) -> u64 {
        self.first_index + self.entries.len() as u64
    }

    /// Adds entries issued to the file but not yet written, starting at `first_index`. A batch
    /// that does not continue the cached tail replaces it (the store appends contiguously, so
    /// this happens only after the cache was emptied).
    pub fn extend(&mut self, first_index: u64, batch: Vec<(E, usize)>) {
        if batch.is_empty() {
            return;
        }
        if self.entries.is_empty() || first_index != self.end_index() {
            self.clear();
            self.first_index = first_index;
            self.durable_end = first_index;
        }
        for (entry, size) in batch {
            self.bytes += size;
            self.entries.push_back((entry, size));
        }
        self.evict();
    }

    /// Drops the oldest durable entries while the cache is over its limits.
    fn evict(&mut self) {
        while (self.entries.len() > self.limits.max_entries || self.bytes > self.limits.max_bytes)
            && self.first_index < self.durable_end
        {
            let Some((_, size)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= size;
            self.first_index += 1;
        }
    }

    /// The last cached entry, if any.
    pub fn last(&self) -> Option<E> {
        self.entries.back().map(|(entry, _)| entry.clone())
    }

    /// Index of the first cached entry, if any.
    pub fn first_cached(&self) -> Option<u64> {
        (!self.entries.is_empty()).then_some(self.first_index)
    }

    /// Forgets entries at `from` and after.
    pub fn truncate_from(&mut self, from: u64) {
        if self.entries.is_empty() || from >= self.end_index() {
            return;
        }
        self.generation += 1;
        if from <= self.first_index {
            self.clear();
            return;
        }
        let keep = (from - self.first_index) as usize;
        for (_, size) in self.entries.drain(keep..) {
            self.bytes -= size;
        }
        self.durable_end = self.durable_end.min(from);
    }

    /// Forgets entries up to and including `upto`.
    pub fn purge_upto(&mut self, upto: u64) {
        while !self.entries.is_empty() && self.first_index <= upto {
            let (_, size) = self.entries.pop_front().expect("not empty");
            self.bytes -= size;
            self.first_index += 1;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.generation += 1;
    }

    /// The entries of `start..end` (`end` exclusive, `None` = to the end), if `start` lies in
    /// the cached tail; `None` when the file must answer.
    pub fn range(&self, start: u64, end: Option<u64>) -> Option<Vec<E>> {
        if self.entries.is_empty() || start < self.first_index || start > self.end_index() {
            return None;
        }
        let end = end.map_or(self.end_index(), |end| end.min(self.end_index()));
        let from = (start - self.first_index) as usize;
        let to = (end.max(start) - self.first_index) as usize;
        Some(
            self.entries
                .range(from..to)
                .map(|(entry, _)| entry.clone())
                .collect(),
        )
    }

    #[cfg(test)]
    fn indices(&self) -> std::ops::Range<u64> {
        self.first_index..self.end_index()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(max_entries: usize, max_bytes: usize) -> EntryCache<u64> {
        EntryCache::new(CacheLimits {
            max_entries,
            max_bytes,
        })
    }

    fn batch(indices: std::ops::Range<u64>) -> Vec<(u64, usize)> {
        indices.map(|i| (i, 10)).collect()
    }

    #[test]
    fn serves_ranges_inside_the_tail_only() {
        let mut c = cache(100, 1_000);
        c.extend(5, batch(5..10));
        assert_eq!(c.range(5, None), Some(vec![5, 6, 7, 8, 9]));
        assert_eq!(c.range(7, Some(9)), Some(vec![7, 8]));
        assert_eq!(
            c.range(7, Some(50)),
            Some(vec![7, 8, 9]),
            "as far as the log goes"
        );
        assert_eq!(
            c.range(10, None),
            Some(vec![]),
            "nothing after the last entry"
        );
        assert_eq!(c.range(4, None), None, "older entries come from the file");
        assert_eq!(c.range(11, None), None);
    }

    /// Extends and marks the batch written, as the writer thread does after its commit.
    fn extend_durable(c: &mut EntryCache<u64>, indices: std::ops::Range<u64>) {
        let end = indices.end;
        c.extend(indices.start, batch(indices));
        let generation = c.generation();
        c.mark_durable(end, generation);
    }

    #[test]
    fn limits_evict_the_oldest() {
        let mut c = cache(4, 1_000);
        extend_durable(&mut c, 1..7);
        assert_eq!(c.indices(), 3..7);
        let mut c = cache(100, 25);
        extend_durable(&mut c, 1..4);
        assert_eq!(c.indices(), 2..4, "30 bytes > 25: the oldest goes");
        assert_eq!(c.bytes, 20);
    }

    #[test]
    fn entries_not_yet_written_are_never_evicted() {
        let mut c = cache(4, 1_000);
        c.extend(1, batch(1..7));
        let generation = c.generation();
        assert_eq!(
            c.indices(),
            1..7,
            "over the limit, but nothing is in the file yet"
        );
        c.mark_durable(3, generation);
        assert_eq!(c.indices(), 3..7, "only what is written may go");
        c.mark_durable(7, generation);
        assert_eq!(c.indices(), 3..7);
    }

    #[test]
    fn a_write_issued_before_a_truncate_marks_nothing_after_it() {
        let mut c = cache(2, 1_000);
        c.extend(1, batch(1..6));
        let before = c.generation();
        c.truncate_from(3);
        c.extend(3, batch(3..6));
        c.mark_durable(6, before);
        assert_eq!(
            c.indices(),
            1..6,
            "the old batch's completion says nothing of the entries that replaced it"
        );
        c.mark_durable(6, c.generation());
        assert_eq!(c.indices(), 4..6);
    }

    #[test]
    fn truncate_and_purge_cut_the_tail_and_the_head() {
        let mut c = cache(100, 1_000);
        c.extend(1, batch(1..10));
        c.truncate_from(7);
        assert_eq!(c.indices(), 1..7);
        c.purge_upto(3);
        assert_eq!(c.indices(), 4..7);
        assert_eq!(c.bytes, 30);
        c.extend(7, batch(7..9));
        assert_eq!(c.range(4, None), Some(vec![4, 5, 6, 7, 8]));
        c.truncate_from(2);
        assert_eq!(c.range(4, None), None, "all cut");
        c.extend(2, batch(2..3));
        assert_eq!(c.indices(), 2..3);
    }

    #[test]
    fn a_batch_that_does_not_continue_the_tail_replaces_it() {
        let mut c = cache(100, 1_000);
        c.extend(1, batch(1..4));
        c.extend(9, batch(9..11));
        assert_eq!(c.indices(), 9..11);
        assert_eq!(c.bytes, 20);
    }
}
