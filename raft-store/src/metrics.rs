//! Counters for the group commit: how many entries each fsync carried.
//!
//! openraft hands `append` every entry that queued up while the previous fsync ran, so entries
//! per fsync is the figure that shows whether group commit works under load. The counters are
//! atomics behind an `Arc` so the node can export them (Prometheus) while openraft owns the
//! store.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, shared between the store and whoever exports them.
#[derive(Debug, Default)]
pub struct StoreMetrics {
    appends: AtomicU64,
    entries: AtomicU64,
    entry_bytes: AtomicU64,
    other_commits: AtomicU64,
    cache_reads: AtomicU64,
    file_reads: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Committed `append` transactions; each is exactly one fsync.
    pub appends: u64,
    /// Log entries written by those transactions.
    pub entries: u64,
    /// Encoded bytes of those entries.
    pub entry_bytes: u64,
    /// Committed (fsynced) transactions other than appends: vote, committed id, truncate, purge.
    pub other_commits: u64,
    /// Entry reads (replication, apply) answered from the in-memory tail.
    pub cache_reads: u64,
    /// Entry reads that went to the file.
    pub file_reads: u64,
}

impl MetricsSnapshot {
    /// Mean entries per append fsync; 0.0 before the first append.
    pub fn entries_per_fsync(&self) -> f64 {
        if self.appends == 0 {
            0.0
        } else {
            self.entries as f64 / self.appends as f64
        }
    }

    /// Every fsync the store has issued.
    pub fn fsyncs(&self) -> u64 {
        self.appends + self.other_commits
    }
}

impl StoreMetrics {
    /// Records one committed append of `entries` entries and `bytes` encoded bytes.
    pub(crate) fn record_append(&self, entries: u64, bytes: u64) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.entries.fetch_add(entries, Ordering::Relaxed);
        self.entry_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records one committed non-append transaction.
    pub(crate) fn record_other_commit(&self) {
        self.other_commits.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one entry read, from the cache or from the file.
    pub(crate) fn record_read(&self, from_cache: bool) {
        let counter = if from_cache {
            &self.cache_reads
        } else {
            &self.file_reads
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads the counters. Each is read atomically; the set is not one atomic cut, which is
    /// fine for monitoring.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            appends: self.appends.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            entry_bytes: self.entry_bytes.load(Ordering::Relaxed),
            other_commits: self.other_commits.load(Ordering::Relaxed),
            cache_reads: self.cache_reads.load(Ordering::Relaxed),
            file_reads: self.file_reads.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_per_fsync_is_entries_over_appends() {
        let m = StoreMetrics::default();
        assert_eq!(m.snapshot().entries_per_fsync(), 0.0);
        m.record_append(10, 100);
        m.record_append(20, 200);
        m.record_other_commit();
        let s = m.snapshot();
        assert_eq!(s.appends, 2);
        assert_eq!(s.entries, 30);
        assert_eq!(s.entry_bytes, 300);
        assert_eq!(s.fsyncs(), 3);
        assert_eq!(s.entries_per_fsync(), 15.0);
    }
}
