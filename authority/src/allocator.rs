//! What glibc's allocator keeps of the memory a node has freed.
//!
//! By default glibc opens up to eight heaps per core as threads contend, never reuses memory
//! freed in one heap for another, and gives memory back to the system only from the top of a
//! heap. A node's threads (Tokio workers, family actors, snapshot and store threads) spread a
//! burst of allocations over every heap and keep what it freed: three nodes restored from a
//! backup, whose first hold expiry loads every family at once, held 5.1 GB an hour later
//! although their families had shrunk back to a few MB (docs/sizing.md, "Restore").
//!
//! So a node keeps two heaps (`MALLOC_ARENA_MAX` overrides it), and a thread gives the
//! free memory inside them back every `malloc_trim_interval_ms` (`malloc_trim`). Elsewhere
//! than glibc both do nothing.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Heaps glibc keeps in a node process, unless `MALLOC_ARENA_MAX` says otherwise.
pub const DEFAULT_MALLOC_ARENAS: i32 = 2;

/// A trim longer than this is logged: allocations wait while their heap is trimmed.
const SLOW_TRIM: Duration = Duration::from_millis(100);

/// Sets glibc's heap count to [`DEFAULT_MALLOC_ARENAS`] unless the operator set
/// `MALLOC_ARENA_MAX` (glibc reads it itself). Call before any thread is started: heaps
/// already opened stay.
pub fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt changes a setting of the allocator and is called before this
        // process starts a second thread.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, DEFAULT_MALLOC_ARENAS) };
        assert!(
            set == 1,
            "glibc refused M_ARENA_MAX {DEFAULT_MALLOC_ARENAS}"
        );
    }
}

/// Starts the thread that gives free heap memory back every `interval`; one per process
/// (`tally-node dev` runs several nodes in one process, and the heaps are the process's): a
/// second call does nothing.
pub fn keep_trimmed(interval: Duration) {
    static TRIMMER: OnceLock<()> = OnceLock::new();
    TRIMMER.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(move || loop {
                std::thread::sleep(interval);
                let began = Instant::now();
                let released = trim();
                let took = began.elapsed();
                if took >= SLOW_TRIM {
                    tracing::info!(took_ms = took.as_millis() as u64, released, "slow malloc_trim");
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the malloc-trim thread; free memory stays in the heaps");
        }
    });
}

/// Gives the free memory of every heap back to the system; whether any was.
fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes each heap's lock itself; it only releases free pages.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory freed in the middle of a heap (below live memory, where glibc's own trimming of
    /// the top never reaches) goes back to the system.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_trim_gives_back_memory_freed_below_live_memory() {
        fn rss_bytes() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").expect("status");
            let line = status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .expect("VmRSS");
            line.split_whitespace()
                .nth(1)
                .expect("kB")
                .parse::<u64>()
                .expect("number")
                * 1024
        }
        // 256 MiB in 64 KiB blocks (below the mmap threshold, so on the heap), then one block
        // kept live above them, so freeing them leaves a hole the heap's top trim cannot
        // give back.
        let mut blocks: Vec<Vec<u8>> = (0..4_096).map(|_| vec![1u8; 64 << 10]).collect();
        let pinned = vec![2u8; 64 << 10];
        let filled = rss_bytes();
        blocks.clear();
        blocks.shrink_to_fit();
        let freed = rss_bytes();
        assert!(trim(), "free memory was there to give back");
        let trimmed = rss_bytes();
        assert!(
            trimmed + (128 << 20) < freed,
            "RSS {} MB filled, {} MB freed, {} MB trimmed",
            filled >> 20,
            freed >> 20,
            trimmed >> 20
        );
        assert_eq!(pinned[0], 2);
    }
}
