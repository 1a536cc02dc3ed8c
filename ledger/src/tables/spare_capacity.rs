//! Giving memory back after a burst. The journal's commit indices and the compaction queue's
//! lanes are deques that grow with a family's in-flight commands; a deque never shrinks by
//! itself, so a family that once held a burst would keep its peak allocation for as long as it
//! stays live. (The journal's records, the bulk of it, sit in chunks that are freed as they
//! empty: `chunked_deque.rs`.)

use std::collections::VecDeque;

/// Below this capacity a deque is left alone: shrinking small buffers saves nothing.
const MIN_SHRINK_CAPACITY: usize = 4096;

/// Halves `deque`'s capacity (keeping room for twice its length) once it is a quarter full
/// or less. Called after removals; amortized O(1), and never on a small deque.
/// Inlined: it runs after every removal and almost always only compares.
#[inline]
pub(crate) fn release_spare<T>(deque: &mut VecDeque<T>) {
    let capacity = deque.capacity();
    if capacity > MIN_SHRINK_CAPACITY && deque.len() <= capacity / 4 {
        shrink(deque);
    }
}

#[cold]
fn shrink<T>(deque: &mut VecDeque<T>) {
    deque.shrink_to((deque.len() * 2).max(MIN_SHRINK_CAPACITY / 2));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_burst_gives_its_memory_back() {
        let mut deque: VecDeque<u64> = (0..100_000).collect();
        let peak = deque.capacity();
        while deque.len() > 10 {
            deque.pop_front();
            release_spare(&mut deque);
        }
        assert!(
            deque.capacity() <= MIN_SHRINK_CAPACITY,
            "capacity {} after draining from {peak}",
            deque.capacity()
        );
        assert_eq!(
            deque.iter().copied().collect::<Vec<_>>(),
            (99_990..100_000).collect::<Vec<_>>()
        );
        let mut small: VecDeque<u64> = (0..100).collect();
        let small_capacity = small.capacity();
        small.clear();
        release_spare(&mut small);
        assert_eq!(
            small.capacity(),
            small_capacity,
            "small deques are left alone"
        );
    }
}
