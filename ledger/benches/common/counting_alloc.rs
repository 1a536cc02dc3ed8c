//! A global allocator that counts the process's live heap bytes and blocks: the memory bench
//! and the footprint estimate's test measure what a family holds with it. Bytes are those
//! requested (glibc's per-block overhead is not counted). Process-wide, so a measurement is
//! taken where one thread allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tally_ledger::Family;

/// Forwards to the system allocator, counting as it goes.
pub struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwards the caller's layout to the system allocator unchanged.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: `block` came from `alloc` or `realloc` above with this layout.
        unsafe { System.dealloc(block, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `block` came from this allocator with `layout`; the caller upholds the rest.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        moved
    }
}

/// Live heap bytes and blocks of the whole process, now.
pub fn live() -> (usize, usize) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_BLOCKS.load(Ordering::Relaxed),
    )
}

/// Drops `family` table by table (`Family::drop_by_table`) and gives each table's name, rows
/// and the heap bytes dropping it freed: what the estimate's costs per row are calibrated on
/// (`ledger/src/footprint.rs`).
pub fn freed_by_table(family: Family) -> Vec<(&'static str, usize, usize)> {
    // Sized before counting starts: a push that grew it would be counted against a table.
    let mut tables = Vec::with_capacity(16);
    let (mut before, _) = live();
    family.drop_by_table(|table, rows| {
        let (after, _) = live();
        tables.push((table, rows, before - after));
        before = after;
    });
    tables
}
