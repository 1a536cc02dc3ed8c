//! What glibc's allocator keeps of the memory a node has freed.
//!
//! By default glibc opens up to eight heaps per core as threads contend, never reuses memory
//! freed in one heap for another, and gives memory back to the system only from the top of a
//! heap. A node's threads (Tokio workers, family actors, snapshot and store threads) spread a
//! burst of allocations over every heap and keep what it freed: three nodes restored from a
//! backup, whose first hold expiry loads every family at once, still held 5.1 GB a minute
//! later although their families had shrunk back to a few MB (docs/sizing.md, "Restore,
//! measured again").
//!
//! So a node keeps two heaps (`MALLOC_ARENA_MAX` overrides it), and a thread checks every
//! `malloc_trim_interval_ms` how much of the process's resident memory the heaps hold free
//! (RSS less the bytes in use, which `tally-node` counts as it allocates: heap_count.rs), and
//! gives it back (`malloc_trim`) once that passes a quarter of the memory budget. Not
//! below: under steady load that free memory is reused by the next snapshot, and giving it
//! back only to fault it in again costs CPU and makes RSS swing (a trim every 10 s whatever
//! was free turned a soak's RSS, flat within ±5%, into a saw within ±21%). Elsewhere than
//! glibc both do nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Heaps glibc keeps in a node process, unless `MALLOC_ARENA_MAX` says otherwise.
pub const DEFAULT_MALLOC_ARENAS: i32 = 2;

/// A trim longer than this is logged: allocations wait while their heap is trimmed.
const SLOW_TRIM: Duration = Duration::from_millis(100);

/// After a trim the next waits at least this many times as long as it took: a node spends at
/// most a 300th of its time with a heap held. A lowered retention freeing gigabytes over a
/// minute made glibc hold the heaps 205–552 ms per trim, every 10 s, and each trim of a
/// `tally-node dev` cluster under full load was followed by a leader change within 0.3 s.
const TRIM_SPACING_FACTOR: u32 = 300;

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

/// Free heap memory the process keeps resident before it is given back: the sum of each
/// node's allowance (`tally-node dev` runs several nodes in one process).
static FREE_ALLOWANCE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Adds a node's allowance of free heap memory (a quarter of its memory budget) and starts
/// the thread that checks every `interval` whether the heaps hold more than the allowances
/// free, and gives it back. One thread per process, with the first call's interval: the
/// heaps are the process's.
pub fn keep_trimmed(interval: Duration, memory_budget_bytes: u64) {
    FREE_ALLOWANCE_BYTES.fetch_add(memory_budget_bytes / 4, Ordering::Relaxed);
    static TRIMMER: OnceLock<()> = OnceLock::new();
    TRIMMER.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("malloc-trim".into())
            .spawn(move || {
                let mut gate = TrimGate::default();
                loop {
                    std::thread::sleep(interval);
                    let looked_at = Instant::now();
                    if !gate.may_look(looked_at) {
                        continue;
                    }
                    let Some(free) = resident_free_heap_bytes() else {
                        continue;
                    };
                    let looked = looked_at.elapsed();
                    gate.held(looked_at, looked);
                    if looked >= SLOW_TRIM {
                        tracing::warn!(
                            took_ms = looked.as_millis() as u64,
                            "measuring the heaps' free memory held them for over 100 ms"
                        );
                    }
                    let allowance = FREE_ALLOWANCE_BYTES.load(Ordering::Relaxed);
                    if !gate.should_trim(free, allowance) {
                        continue;
                    }
                    // What the trim gave back shows in RSS, which costs no walk of the heaps.
                    let resident_before = process_resident_bytes().unwrap_or(0);
                    let began = Instant::now();
                    let released = trim();
                    let took = began.elapsed();
                    let given_back =
                        resident_before.saturating_sub(process_resident_bytes().unwrap_or(0));
                    let after = free.saturating_sub(given_back);
                    gate.trimmed(after, began, took);
                    log_trim(free, after, took, released);
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the malloc-trim thread; free memory stays in the heaps");
        }
    });
}

/// When to look and trim again. glibc cannot give back free memory that shares a page with
/// live memory, so a trim may leave more than the allowance free; trimming again every
/// interval gave back little and held the heaps each time. So the next trim waits for free
/// memory to pass what the last one left by the allowance (what it left falls as memory is
/// reused). And the trim holds the heaps, as does a look where glibc counts (`mallinfo2` walks
/// every free chunk under each heap's lock; `tally-node` counts as it allocates instead): the
/// next look waits `TRIM_SPACING_FACTOR` times as long as the last look or trim took.
#[derive(Debug, Default)]
struct TrimGate {
    /// Free memory a trim could not give back, lowered as free memory falls below it.
    left_free_bytes: u64,
    not_before: Option<Instant>,
}

impl TrimGate {
    fn may_look(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|at| now >= at)
    }

    /// The heaps were held from `began` for `took` (a look or a trim).
    fn held(&mut self, began: Instant, took: Duration) {
        self.not_before = Some(began + took * TRIM_SPACING_FACTOR);
    }

    fn should_trim(&mut self, free_bytes: u64, allowance_bytes: u64) -> bool {
        self.left_free_bytes = self.left_free_bytes.min(free_bytes);
        free_bytes > self.left_free_bytes.saturating_add(allowance_bytes)
    }

    fn trimmed(&mut self, left_free_bytes: u64, began: Instant, took: Duration) {
        self.left_free_bytes = left_free_bytes;
        self.held(began, took);
    }
}

fn log_trim(free: u64, after: u64, took: Duration, released: bool) {
    let took_ms = took.as_millis() as u64;
    tracing::info!(
        free_before_mb = free >> 20,
        free_after_mb = after >> 20,
        took_ms,
        released,
        "gave free heap memory back"
    );
    if took >= SLOW_TRIM {
        tracing::warn!(
            took_ms,
            next_in_s = (took * TRIM_SPACING_FACTOR).as_secs(),
            "malloc_trim held the heaps for over 100 ms; the next waits"
        );
    }
}

/// The process's resident memory (RSS), where the system tells it.
pub fn process_resident_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf reads a constant.
        let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(resident_pages * u64::try_from(page_bytes).ok()?)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Resident memory the heaps do not use: the process's RSS less what is allocated (in the
/// heaps and in mapped blocks). Counts the code and the stacks too, a few tens of MB. What is
/// allocated comes from the counting allocator where the process has it (`tally-node` does:
/// heap_count.rs says why), else from glibc's own walk of its heaps.
fn resident_free_heap_bytes() -> Option<u64> {
    let resident = process_resident_bytes()?;
    let in_use = crate::heap_count::heap_in_use_bytes().or_else(walked_heap_in_use_bytes)?;
    Some(resident.saturating_sub(in_use))
}

/// glibc's count of the bytes its heaps have in use, which walks every free chunk under each
/// heap's lock.
fn walked_heap_in_use_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        Some((info.uordblks + info.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
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

    /// The first trim comes once free memory passes the allowance; the next only once it
    /// passes what that trim left by the allowance again, and not before 300 times the trim's
    /// length; memory reused in between lowers the mark.
    #[test]
    fn a_trim_is_not_repeated_for_what_it_could_not_give_back() {
        const MB: u64 = 1 << 20;
        let start = Instant::now();
        let mut gate = TrimGate::default();
        assert!(gate.may_look(start));
        assert!(!gate.should_trim(256 * MB, 256 * MB));
        assert!(gate.should_trim(1_331 * MB, 256 * MB));
        gate.trimmed(879 * MB, start, Duration::from_millis(200));
        assert!(
            !gate.may_look(start + Duration::from_secs(59)),
            "within 300 times the trim's 200 ms"
        );
        let spaced = start + Duration::from_secs(60);
        assert!(gate.may_look(spaced));
        assert!(
            !gate.should_trim(1_100 * MB, 256 * MB),
            "what it left, plus little"
        );
        assert!(gate.should_trim(1_200 * MB, 256 * MB));
        gate.trimmed(900 * MB, spaced, Duration::from_millis(10));
        let later = spaced + Duration::from_secs(10);
        assert!(gate.may_look(later));
        assert!(!gate.should_trim(100 * MB, 256 * MB), "memory was reused");
        assert!(
            gate.should_trim(400 * MB, 256 * MB),
            "the mark fell with it"
        );
        // A look that held the heaps 50 ms waits 15 s for the next.
        gate.held(later, Duration::from_millis(50));
        assert!(!gate.may_look(later + Duration::from_secs(14)));
        assert!(gate.may_look(later + Duration::from_secs(15)));
    }

    /// Memory freed in the middle of a heap (below live memory, where glibc's own trimming of
    /// the top never reaches) goes back to the system.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_trim_gives_back_memory_freed_below_live_memory() {
        fn rss_bytes() -> u64 {
            process_resident_bytes().expect("Linux tells a process its resident memory")
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
        let free = resident_free_heap_bytes().expect("glibc");
        assert!(free > 200 << 20, "{} MB free in the heaps", free >> 20);
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
