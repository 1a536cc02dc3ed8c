//! The heap bytes a node has in use, counted as it allocates: what the trimmer (allocator.rs)
//! weighs against RSS to know how much free memory the heaps keep.
//!
//! glibc can say it too (`mallinfo2`), but only by walking every free chunk under each heap's
//! lock. Once a lowered retention had freed gigabytes, that walk held the heaps 439–577 ms, and
//! a count followed by the trim it called for stalled a loaded `tally-node dev` cluster for
//! over a second (docs/sizing.md, "Setting the retention"). Counting costs one uncontended
//! atomic add per allocation and per free instead, and reading the count costs nothing.
//!
//! `tally-node` installs [`CountingAllocator`] as its global allocator; a process that does not
//! (a test, a tool linking the library) reads `None` from [`heap_in_use_bytes`] and the trimmer
//! falls back to `mallinfo2`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

/// Counters, one per group of threads, so threads on different cores do not write one cache
/// line. More than a node's busy threads (Tokio workers, store and snapshot threads).
const SHARDS: usize = 16;

/// glibc's smallest chunk and its chunk alignment on 64-bit targets: a block of `size` bytes
/// takes `max(32, size + 8)` rounded up to 16. Counting chunks rather than requested bytes
/// keeps millions of small rows' headers out of what the trimmer takes for free memory.
const MIN_CHUNK_BYTES: usize = 32;
const CHUNK_HEADER_BYTES: usize = 8;
const CHUNK_ALIGN_BYTES: usize = 16;

/// One counter on its own cache line (two lines: adjacent-line prefetch pairs them).
#[repr(align(128))]
struct Shard(AtomicI64);

static IN_USE: [Shard; SHARDS] = [const { Shard(AtomicI64::new(0)) }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's counter; `SHARDS` until its first allocation picks one. A const
    /// initialiser with no destructor: reading it never allocates, even while the thread exits.
    static SHARD: Cell<usize> = const { Cell::new(SHARDS) };
}

/// The system allocator, counting the chunk bytes in use as it goes.
pub struct CountingAllocator;

/// The heap bytes a block of `size` bytes takes in glibc (what `mallinfo2` counts as in use).
fn chunk_bytes(size: usize) -> i64 {
    let chunk = (size.saturating_add(CHUNK_HEADER_BYTES + CHUNK_ALIGN_BYTES - 1)
        & !(CHUNK_ALIGN_BYTES - 1))
        .max(MIN_CHUNK_BYTES);
    i64::try_from(chunk).unwrap_or(i64::MAX)
}

fn count(delta: i64) {
    let shard = SHARD
        .try_with(|shard| {
            if shard.get() == SHARDS {
                shard.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
            }
            shard.get()
        })
        // A thread's locals are gone while it is torn down; its last frees still count.
        .unwrap_or(0);
    IN_USE[shard].0.fetch_add(delta, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; the counters only observe.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout goes to the system allocator unchanged.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            count(chunk_bytes(layout.size()));
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`; `System` zeroes (calloc) without touching pages mmap gave zeroed.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            count(chunk_bytes(layout.size()));
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: `block` came from this allocator with `layout`.
        unsafe { System.dealloc(block, layout) };
        count(-chunk_bytes(layout.size()));
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `block` came from this allocator with `layout`; the caller upholds the rest.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            count(chunk_bytes(new_size) - chunk_bytes(layout.size()));
        }
        moved
    }
}

/// The heap bytes in use now, if this process counts them (its global allocator is
/// [`CountingAllocator`]). Frees on one thread of what another allocated make single counters
/// negative; only their sum means anything.
pub fn heap_in_use_bytes() -> Option<u64> {
    let sum: i64 = IN_USE
        .iter()
        .map(|shard| shard.0.load(Ordering::Relaxed))
        .sum();
    // A counting process has allocated before anyone asks; a sum of 0 means nothing counts.
    (sum > 0).then(|| sum.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lib's unit tests run with the counter installed, as `tally-node` does.
    #[global_allocator]
    static COUNTED: CountingAllocator = CountingAllocator;

    #[test]
    fn a_block_counts_as_glibc_s_chunk() {
        assert_eq!(chunk_bytes(0), 32);
        assert_eq!(chunk_bytes(24), 32);
        assert_eq!(chunk_bytes(25), 48);
        assert_eq!(chunk_bytes(1_000), 1_008);
        assert_eq!(chunk_bytes(usize::MAX), i64::MAX);
    }

    /// What is allocated counts until it is freed, on whichever thread frees it; growing a
    /// block counts the growth.
    #[test]
    fn the_count_follows_allocations_across_threads() {
        const MB: u64 = 1 << 20;
        let before = heap_in_use_bytes().expect("this test binary counts");
        let mut block = vec![7u8; 64 << 20];
        let filled = heap_in_use_bytes().expect("counts");
        assert!(
            filled >= before + 63 * MB && filled <= before + 65 * MB,
            "{} MB → {} MB after 64 MB",
            before / MB,
            filled / MB
        );
        block.reserve_exact(64 << 20);
        let grown = heap_in_use_bytes().expect("counts");
        assert!(
            grown >= filled + 63 * MB,
            "{} MB → {} MB after growing by 64 MB",
            filled / MB,
            grown / MB
        );
        std::thread::spawn(move || drop(block))
            .join()
            .expect("the freeing thread ends");
        let freed = heap_in_use_bytes().expect("counts");
        assert!(
            freed + 120 * MB <= grown,
            "{} MB → {} MB once another thread freed 128 MB",
            grown / MB,
            freed / MB
        );
    }
}
