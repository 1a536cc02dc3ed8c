//! A deque stored as a queue of fixed-size chunks: the journal's records, the dedupe rows and
//! the compaction queue's lanes.
//!
//! A `VecDeque` grows by doubling: every growth copies all its elements (for the journal,
//! hundreds of megabytes under a long retention) into fresh memory the kernel must fault in,
//! and between growths up to half its capacity is spare. Here growth allocates one chunk of
//! about `CHUNK_BYTES`, nothing moves once its chunk is full-size, and at most one chunk at
//! each end is partly empty (plus one emptied chunk kept to take the next pushes). A lone
//! chunk starts small and doubles up to full size, so a deque of a few elements (a quiet
//! family's queue lane) costs a few elements, not 32 KiB. Popping from the front
//! releases chunks as they empty, so a drained burst gives its memory back by itself.
//!
//! Chunks are shared copy-on-write: a clone (a snapshot's cut of the family) costs a
//! reference count per chunk, and a write then copies only the chunk it touches (the last for
//! a push, the first for a pop), never the whole journal on the apply path.

use std::collections::VecDeque;
use std::sync::Arc;

/// Bytes per chunk: big enough that the chunk index is small and a chunk is one allocation
/// of the allocator's main heap, small enough that a family's spare memory stays small.
const CHUNK_BYTES: usize = 32 * 1024;

/// Elements a lone chunk starts with room for.
const FIRST_CHUNK_LEN: usize = 8;

/// Elements per chunk of `T`.
const fn chunk_len<T>() -> usize {
    let fit = match CHUNK_BYTES.checked_div(std::mem::size_of::<T>()) {
        Some(fit) => fit,
        None => CHUNK_BYTES,
    };
    if fit < 16 {
        16
    } else {
        fit
    }
}

pub(crate) struct ChunkedDeque<T> {
    /// Every chunk but the first and the last is full; pushes go to the last, pops come from
    /// the first, so element `i` is found by arithmetic (see `locate`).
    chunks: VecDeque<Arc<VecDeque<T>>>,
    len: usize,
    /// One emptied chunk, kept so a steady push/pop stream does not allocate.
    spare: Option<VecDeque<T>>,
}

impl<T> Default for ChunkedDeque<T> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
            len: 0,
            spare: None,
        }
    }
}

impl<T: Clone> Clone for ChunkedDeque<T> {
    fn clone(&self) -> Self {
        Self {
            chunks: self.chunks.clone(),
            len: self.len,
            spare: None,
        }
    }
}

impl<T: Clone> ChunkedDeque<T> {
    const CHUNK: usize = chunk_len::<T>();

    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn push_back(&mut self, value: T) {
        if self
            .chunks
            .back()
            .is_none_or(|last| last.len() >= Self::CHUNK)
        {
            let chunk = match self.spare.take() {
                Some(spare) => spare,
                None if self.chunks.is_empty() => {
                    VecDeque::with_capacity(FIRST_CHUNK_LEN.min(Self::CHUNK))
                }
                None => VecDeque::with_capacity(Self::CHUNK),
            };
            self.chunks.push_back(Arc::new(chunk));
        }
        let last = Arc::make_mut(self.chunks.back_mut().expect("a chunk was just ensured"));
        if last.len() == last.capacity() {
            // A small first chunk doubles, never past a full chunk.
            let target = (last.capacity() * 2).clamp(1, Self::CHUNK);
            last.reserve_exact(target - last.len());
        }
        last.push_back(value);
        self.len += 1;
    }

    /// Drops the first element where it lies (a large element is not copied out to be
    /// dropped); whether there was one.
    pub fn discard_front(&mut self) -> bool {
        let Some(first) = self.chunks.front_mut() else {
            return false;
        };
        drop(Arc::make_mut(first).drain(..1));
        self.front_removed();
        true
    }

    pub fn pop_front(&mut self) -> Option<T> {
        let value = Arc::make_mut(self.chunks.front_mut()?).pop_front()?;
        self.front_removed();
        Some(value)
    }

    pub fn pop_back(&mut self) -> Option<T> {
        let last = Arc::make_mut(self.chunks.back_mut()?);
        let value = last.pop_back()?;
        self.len -= 1;
        if last.is_empty() {
            let emptied = self.chunks.pop_back().expect("the last chunk exists");
            self.keep_spare(emptied);
        }
        Some(value)
    }

    /// After one element left the first chunk (a chunk in the queue is never empty: the one
    /// that empties is retired at once).
    fn front_removed(&mut self) {
        self.len -= 1;
        if self.chunks.front().is_some_and(|first| first.is_empty()) {
            let emptied = self.chunks.pop_front().expect("the first chunk exists");
            self.keep_spare(emptied);
        }
    }

    /// Keeps an emptied chunk for the next pushes, unless a clone still shares it.
    fn keep_spare(&mut self, emptied: Arc<VecDeque<T>>) {
        assert!(emptied.is_empty(), "only an emptied chunk is kept as spare");
        let Ok(emptied) = Arc::try_unwrap(emptied) else {
            return;
        };
        if self.spare.is_none() && emptied.capacity() >= Self::CHUNK {
            self.spare = Some(emptied);
        }
    }

    pub fn front(&self) -> Option<&T> {
        self.chunks.front()?.front()
    }

    pub fn back(&self) -> Option<&T> {
        self.chunks.back()?.back()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of elements for which `below` holds, when it holds for a prefix of the
    /// deque and not after (`slice::partition_point`): a binary search, each probe found by
    /// arithmetic.
    pub fn partition_point(&self, mut below: impl FnMut(&T) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len);
        while low < high {
            let mid = low + (high - low) / 2;
            if below(self.get(mid).expect("mid is below len")) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// The chunk and offset of element `at`; `None` past the end.
    fn locate(&self, at: usize) -> Option<(usize, usize)> {
        if at >= self.len {
            return None;
        }
        let first = self.chunks[0].len();
        if at < first {
            return Some((0, at));
        }
        let rest = at - first;
        Some((1 + rest / Self::CHUNK, rest % Self::CHUNK))
    }

    pub fn get(&self, at: usize) -> Option<&T> {
        let (chunk, offset) = self.locate(at)?;
        self.chunks[chunk].get(offset)
    }

    pub fn get_mut(&mut self, at: usize) -> Option<&mut T> {
        let (chunk, offset) = self.locate(at)?;
        Arc::make_mut(&mut self.chunks[chunk]).get_mut(offset)
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }

    /// Elements from position `start` on (none when `start >= len`).
    pub fn iter_from(&self, start: usize) -> impl Iterator<Item = &T> {
        let (first_chunk, offset) = self.locate(start).unwrap_or((self.chunks.len(), 0));
        self.chunks
            .range(first_chunk..)
            .enumerate()
            .flat_map(move |(k, chunk)| chunk.range(if k == 0 { offset } else { 0 }..))
    }

    /// Chunks allocated, the spare included: memory is bounded by this times the chunk size.
    #[cfg(test)]
    fn allocated_chunks(&self) -> usize {
        self.chunks.len() + usize::from(self.spare.is_some())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Push,
        PopBack,
        PopFront,
        DiscardFront,
    }

    /// 2 KiB elements, 16 to a chunk, so a few hundred operations cross many chunk
    /// boundaries.
    #[derive(Clone, Debug, PartialEq)]
    struct Wide(u64, [u8; 2040]);

    fn wide(value: u64) -> Wide {
        Wide(value, [0; 2040])
    }

    proptest! {
        /// Against a `VecDeque`: same elements, same positions, same ranges, after any mix of
        /// pushes and pops crossing chunk boundaries.
        #[test]
        fn behaves_as_a_vec_deque(ops in prop::collection::vec(
            prop_oneof![
                6 => Just(Op::Push),
                1 => Just(Op::PopBack),
                2 => Just(Op::PopFront),
                2 => Just(Op::DiscardFront),
            ],
            0..600,
        )) {
            assert_eq!(ChunkedDeque::<Wide>::CHUNK, 16);
            let mut chunked = ChunkedDeque::<Wide>::default();
            let mut model = VecDeque::new();
            let mut next = 0;
            for op in ops {
                match op {
                    Op::Push => {
                        chunked.push_back(wide(next));
                        model.push_back(wide(next));
                        next += 1;
                    }
                    Op::PopBack => prop_assert_eq!(chunked.pop_back(), model.pop_back()),
                    Op::PopFront => prop_assert_eq!(chunked.pop_front(), model.pop_front()),
                    Op::DiscardFront => {
                        prop_assert_eq!(chunked.discard_front(), model.pop_front().is_some())
                    }
                }
                prop_assert_eq!(chunked.len(), model.len());
                prop_assert_eq!(chunked.front(), model.front());
                prop_assert_eq!(chunked.back(), model.back());
                prop_assert_eq!(chunked.is_empty(), model.is_empty());
                prop_assert!(
                    chunked.allocated_chunks() <= model.len().div_ceil(16) + 2,
                    "{} chunks for {} elements", chunked.allocated_chunks(), model.len()
                );
            }
            prop_assert!(chunked.iter().eq(model.iter()));
            // The values rise with position, so every threshold splits a prefix from the rest.
            for threshold in model.iter().map(|v| v.0).chain([0, next]) {
                prop_assert_eq!(
                    chunked.partition_point(|v| v.0 < threshold),
                    model.partition_point(|v| v.0 < threshold)
                );
            }
            let copy = chunked.clone();
            prop_assert!(copy.iter().eq(model.iter()));
            for at in 0..=model.len() {
                prop_assert_eq!(chunked.get(at), model.get(at));
                prop_assert!(chunked.iter_from(at).eq(model.range(at..)));
            }
            for at in 0..model.len() {
                chunked.get_mut(at).expect("in range").0 += 1_000_000;
            }
            prop_assert!(chunked.iter().map(|v| v.0 - 1_000_000).eq(model.iter().map(|v| v.0)));
            prop_assert!(copy.iter().eq(model.iter()), "a clone never sees the original's writes");
        }
    }

    #[test]
    fn a_clone_shares_every_chunk_until_one_is_written() {
        let chunk = ChunkedDeque::<u64>::CHUNK;
        let mut deque = ChunkedDeque::<u64>::default();
        for value in 0..(4 * chunk as u64) {
            deque.push_back(value);
        }
        let cut = deque.clone();
        let shared = |a: &ChunkedDeque<u64>, b: &ChunkedDeque<u64>| {
            a.chunks
                .iter()
                .zip(&b.chunks)
                .filter(|(x, y)| Arc::ptr_eq(x, y))
                .count()
        };
        assert_eq!(shared(&deque, &cut), 4, "a clone copies no element");
        deque.push_back(7);
        deque.discard_front();
        *deque.get_mut(chunk + 1).expect("in range") += 1;
        assert_eq!(
            shared(&deque, &cut),
            2,
            "the first and the second chunk were written (the push opened a fifth): only those \
             were copied"
        );
        assert!(
            cut.iter().copied().eq(0..(4 * chunk as u64)),
            "the cut is unchanged"
        );
    }

    #[test]
    fn memory_follows_the_length_and_nothing_moves() {
        let chunk = ChunkedDeque::<u64>::CHUNK;
        let mut deque = ChunkedDeque::<u64>::default();
        for value in 0..(10 * chunk as u64) {
            deque.push_back(value);
        }
        assert_eq!(deque.allocated_chunks(), 10);
        let first = deque.get(0).expect("first") as *const u64;
        for value in 0..(5 * chunk as u64) {
            deque.push_back(value);
        }
        assert_eq!(
            deque.get(0).expect("first") as *const u64,
            first,
            "growing never moves an element"
        );
        while deque.len() > 3 {
            deque.discard_front();
        }
        assert!(
            deque.allocated_chunks() <= 2,
            "a drained deque keeps its last chunk and one spare, has {}",
            deque.allocated_chunks()
        );
        let large = ChunkedDeque::<[u8; 4096]>::CHUNK;
        assert_eq!(large, 16, "large elements still come 16 to a chunk");
        let mut few = ChunkedDeque::<u64>::default();
        for value in 0..3 {
            few.push_back(value);
        }
        assert!(
            few.chunks[0].capacity() < chunk / 8,
            "three elements take room for {}, not a whole chunk of {chunk}",
            few.chunks[0].capacity()
        );
        for value in 3..(2 * chunk as u64) {
            few.push_back(value);
        }
        assert!(
            few.chunks.iter().all(|c| c.capacity() <= 2 * chunk),
            "a growing first chunk stops at about a chunk"
        );
    }
}
