//! The tail of the log in memory, decoded.
//!
//! Right after an append, openraft reads the same entries back twice: the replication tasks
//! send them to followers, and the state machine worker applies them once committed. From the
//! file, each read is a redb lookup and an rmp decode of every command of the entry, a large
//! share of a loaded leader's CPU when done twice per entry. So `append` keeps the entries
//! it has just made durable here, and readers take a range from here when it starts inside
//! the cached tail.
//!
//! The cache is always a contiguous suffix of the log: appends extend it (entries become
//! visible here only after their fsync, as in the file), `truncate_after` and `purge` cut it
//! before they change the file, and when it grows past its limits the oldest entries leave
//! first. So an entry read from here is exactly the entry the file holds at that index.

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
}

impl<E: Clone> EntryCache<E> {
    pub fn new(limits: CacheLimits) -> Self {
        Self {
            limits,
            first_index: 0,
            entries: VecDeque::new(),
            bytes: 0,
        }
    }

    /// One past the last cached index (meaningless when empty).
    fn end_index(&self) -> u64 {
        self.first_index + self.entries.len() as u64
    }

    /// Adds entries just made durable, starting at `first_index`. A batch that does not
    /// continue the cached tail replaces it (the store appends contiguously, so this happens
    /// only after the cache was emptied).
    pub fn extend(&mut self, first_index: u64, batch: Vec<(E, usize)>) {
        if batch.is_empty() {
            return;
        }
        if self.entries.is_empty() || first_index != self.end_index() {
            self.clear();
            self.first_index = first_index;
        }
        for (entry, size) in batch {
            self.bytes += size;
            self.entries.push_back((entry, size));
        }
        while self.entries.len() > self.limits.max_entries || self.bytes > self.limits.max_bytes {
            let Some((_, size)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= size;
            self.first_index += 1;
        }
    }

    /// Forgets entries at `from` and after.
    pub fn truncate_from(&mut self, from: u64) {
        if self.entries.is_empty() || from >= self.end_index() {
            return;
        }
        if from <= self.first_index {
            self.clear();
            return;
        }
        let keep = (from - self.first_index) as usize;
        for (_, size) in self.entries.drain(keep..) {
            self.bytes -= size;
        }
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

    #[test]
    fn limits_evict_the_oldest() {
        let mut c = cache(4, 1_000);
        c.extend(1, batch(1..7));
        assert_eq!(c.indices(), 3..7);
        let mut c = cache(100, 25);
        c.extend(1, batch(1..4));
        assert_eq!(c.indices(), 2..4, "30 bytes > 25: the oldest goes");
        assert_eq!(c.bytes, 20);
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
