//! The compaction queue: work that becomes due once cluster time passes a command's
//! `not_after_ms + retention_ms` (docs/spec.md §5.5), in due order.
//!
//! Keys are two integers, the due time (from rules version 3, the due time under the fixed
//! retention `ClusterParams::compaction_key` counts in: the same order as the due times under
//! any retention, so a retention change moves every due time and no key) and a sequence
//! number the family hands out, so ties
//! (many items fall due in the same millisecond) keep their insertion order and every key
//! comparison is two integer compares, never a string compare. The sequence number is
//! replicated state: every replica hands out the same numbers in the same order, so every
//! replica compacts alike.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::commit_index::BudgetCommitIndex;
use crate::ids::{EventId, HoldId, NonceId};
use crate::limits::MAX_QUEUE_MOVES_PER_PUSH;
use crate::tables::chunked_deque::ChunkedDeque;
use crate::tables::chunked_tree::ChunkedTree;
use crate::tables::identity_fields::FieldHashes;

/// What a retained command keeps until it is compacted: its identity's field hashes, to name
/// the fields of a conflict, and its own event, which leaves the journal with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Retained {
    pub fields: FieldHashes,
    pub event: Option<BudgetCommitIndex>,
}

/// One piece of compaction work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum CompactionItem {
    /// Drop a cluster event (an expiry) from the journal.
    Journal(BudgetCommitIndex),
    /// Drop an applied command's field hashes and its own event; its row keeps the digest.
    /// The queue entry holds them (a `Retained`).
    Command(EventId),
    /// Forget a tombstone. The queue entry holds its field hashes until then.
    Tombstone(EventId),
    /// Replace a terminal hold by its archive record.
    Hold(HoldId),
    /// Forget a nonce whose expiry has passed.
    Nonce(NonceId),
}

/// Where an item waits: `(key_ms, seq)`, ordered by due time, then by insertion. `key_ms` is
/// the due time, or from rules version 3 `ClusterParams::compaction_key`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct QueueKey {
    pub key_ms: u64,
    pub seq: u64,
}

/// An item and, for a command or a tombstone, the field hashes it keeps until it is due.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Queued {
    pub item: CompactionItem,
    pub retained: Option<Retained>,
}

/// Where an item waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Lane(usize),
    OutOfOrder,
}

/// How much later than a new item a lane's last item may fall due before it moves to the
/// tree. Deadlines of ordinary commands differ by seconds; this keeps them all in lanes.
const MAX_IN_ORDER_GAP_MS: u64 = 60_000;

/// Open lanes (ones that take pushes) at most: each pop compares every lane's front.
const MAX_LANES: usize = 4;

/// Sealed lanes at most: runs closed to pushes (see `CompactionQueue::make_room`).
const MAX_SEALED_LANES: usize = 4;

/// A sorted run of items: the keys, the items and what they retain in three deques, so
/// finding the smallest front reads a dense array of keys, and popping an item leaves its
/// retained field hashes (most of its bytes, never read again) to be dropped where they lie.
#[derive(Clone, Default)]
struct Lane {
    /// Strictly increasing. All three deques are in chunks shared copy-on-write, so a
    /// snapshot's cut of the family copies none of them (`chunked_deque.rs`).
    keys: ChunkedDeque<QueueKey>,
    items: ChunkedDeque<CompactionItem>,
    /// The bulk of a lane's bytes, in chunks that never move (see `chunked_deque.rs`).
    retained: ChunkedDeque<Option<Retained>>,
    /// Closed to pushes: only popped from until it is empty.
    sealed: bool,
}

impl Lane {
    fn push_back(&mut self, key: QueueKey, queued: Queued) {
        self.keys.push_back(key);
        self.items.push_back(queued.item);
        self.retained.push_back(queued.retained);
    }

    fn pop_back(&mut self) -> Option<(QueueKey, Queued)> {
        let key = self.keys.pop_back()?;
        let item = self.items.pop_back()?;
        let retained = self.retained.pop_back()?;
        Some((key, Queued { item, retained }))
    }

    fn pop_front(&mut self) -> Option<DueItem> {
        self.keys.pop_front()?;
        let item = self.items.pop_front()?;
        let due = DueItem::new(item, self.retained.front()?.as_ref());
        // Dropped in place: moving the field hashes out only to drop them costs a copy.
        assert!(
            self.retained.discard_front(),
            "a lane's deques have one length"
        );
        Some(due)
    }

    fn get(&self, at: usize) -> (&CompactionItem, Option<&Retained>) {
        let retained = self
            .retained
            .get(at)
            .expect("a lane's deques have one length");
        let item = self.items.get(at).expect("a lane's deques have one length");
        (item, retained.as_ref())
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    /// How many items at the back fall due after `limit_ms` (a binary search).
    fn far_tail(&self, limit_ms: u64) -> usize {
        self.len() - self.keys.partition_point(|key| key.key_ms <= limit_ms)
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = (&QueueKey, (&CompactionItem, Option<&Retained>))> {
        self.keys.iter().zip(
            self.items
                .iter()
                .zip(self.retained.iter().map(Option::as_ref)),
        )
    }
}

/// An item taken from the queue because it fell due.
pub(crate) struct DueItem {
    pub item: CompactionItem,
    /// Whether it retained an identity's field hashes (a command or a tombstone does).
    pub retained: bool,
    /// The command's own event, which leaves the journal with it.
    pub own_event: Option<BudgetCommitIndex>,
}

impl DueItem {
    fn new(item: CompactionItem, retained: Option<&Retained>) -> Self {
        Self {
            item,
            retained: retained.is_some(),
            own_event: retained.and_then(|retained| retained.event),
        }
    }
}

/// Items in `(key_ms, seq)` order. Items come in a few streams whose due times each rise
/// with cluster time: commands (`not_after_ms + retention`), holds that just ended (`now +
/// retention`), expiry events. Each stream is appended to a lane, a deque sorted by
/// construction, so a push and a pop cost no tree search and no allocation. A push goes to
/// the lane whose last item is due latest but not after it (patience sorting); an item that
/// fits no lane opens a new one, up to `MAX_LANES`, and past that waits in a tree (see
/// `make_room`). A pop takes the smallest of the fronts, so the order is exactly the key order
/// either way.
///
/// Every push and pop does bounded work, whatever the queue holds: a push moves at most
/// `MAX_QUEUE_MOVES_PER_PUSH` items and otherwise does a few binary searches, and a pop
/// compares at most `MAX_LANES + MAX_SEALED_LANES` fronts and the tree's first key.
///
/// Encoded, compared and restored as one map in key order: how items are split between the
/// lanes and the tree depends on the order they were pushed in, never on the state.
#[derive(Clone, Default)]
pub(crate) struct CompactionQueue {
    /// No lane is empty. At most `MAX_LANES` open and `MAX_SEALED_LANES` sealed ones.
    lanes: Vec<Lane>,
    /// In chunks shared copy-on-write (`chunked_tree.rs`), like the lanes.
    out_of_order: ChunkedTree<QueueKey, Queued>,
    /// The sequence number of the next item pushed.
    next_seq: u64,
    /// Node-local counters, not replicated state: left out of equality and the encoding.
    work: CompactionWork,
}

/// What compaction has done on this node since the family was loaded: not replicated state
/// (a restored family starts from zero), so it is never encoded or compared. It lets tests and
/// metrics check that no single command does unbounded work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionWork {
    /// Items taken from the queue because they fell due (one compaction step each).
    pub compacted: u64,
    /// Items moved from a lane to the tree to make room for a push.
    pub moved: u64,
}

impl CompactionQueue {
    /// Queues `item` (and what it retains) until cluster time passes `key_ms`.
    pub fn push(
        &mut self,
        key_ms: u64,
        item: CompactionItem,
        retained: Option<Retained>,
    ) -> QueueKey {
        let key = QueueKey {
            key_ms,
            seq: self.next_seq,
        };
        self.next_seq = self
            .next_seq
            .checked_add(1)
            .expect("compaction sequence numbers are 64-bit and never run out");
        let queued = Queued { item, retained };
        // `seq` only grows, so a key due no earlier than a lane's last is above it.
        let lane = self.lane_for(key_ms).or_else(|| self.make_room(key_ms));
        match lane {
            Some(at) => self.lanes[at].push_back(key, queued),
            None => {
                let previous = self.out_of_order.insert(key, queued);
                assert!(previous.is_none(), "compaction key {key:?} used twice");
            }
        }
        assert!(
            self.open_lanes() <= MAX_LANES && self.lanes.len() <= MAX_LANES + MAX_SEALED_LANES,
            "compaction queue grew to {} lanes, {} open",
            self.lanes.len(),
            self.open_lanes()
        );
        key
    }

    /// No open lane takes an item due at `key_ms`: finds or makes one, or `None` (the item
    /// waits in the tree). Bounded work: at most `MAX_QUEUE_MOVES_PER_PUSH` items move.
    ///
    /// A lane blocks an item when its back is due later. A few items due far later (commands
    /// with deadlines hours away) leave their lane for the tree: kept at the back, they would
    /// send every item of their stream to the tree until they fall due. A long run due far
    /// later (everything queued under a longer retention, once the retention is lowered) is
    /// not moved: that would cost one tree insert per item in this one push (900,000 items
    /// of a loaded family took 2.8 s, and a node missed heartbeats). Its lane is sealed
    /// instead, whole and in order, and drains by pops like any other; a new lane takes the
    /// stream.
    fn make_room(&mut self, key_ms: u64) -> Option<usize> {
        if self.open_lanes() < MAX_LANES {
            self.lanes.push(Lane::default());
            return Some(self.lanes.len() - 1);
        }
        let limit = key_ms.saturating_add(MAX_IN_ORDER_GAP_MS);
        let mut budget = MAX_QUEUE_MOVES_PER_PUSH;
        for at in 0..self.lanes.len() {
            let lane = &self.lanes[at];
            let far = lane.far_tail(limit);
            if !lane.sealed && far > 0 && far < lane.len() && far <= budget {
                self.move_back_to_tree(at, far);
                budget -= far;
            }
        }
        if let Some(at) = self.lane_for(key_ms) {
            return Some(at);
        }
        if self.lanes.len() - self.open_lanes() < MAX_SEALED_LANES {
            // The open lane whose back is due latest: the one least likely to take a push.
            let blocked = self
                .lanes
                .iter()
                .enumerate()
                .filter(|(_, lane)| !lane.sealed && lane.far_tail(limit) > 0)
                .max_by_key(|(_, lane)| lane.keys.back().copied())
                .map(|(at, _)| at);
            if let Some(at) = blocked {
                self.lanes[at].sealed = true;
                self.lanes.push(Lane::default());
                return Some(self.lanes.len() - 1);
            }
        }
        // Every sealed slot is taken: far tails leave for the tree a budget at a time, so a
        // stream that keeps missing frees its lane over later pushes.
        for at in 0..self.lanes.len() {
            let lane = &self.lanes[at];
            if lane.sealed || budget == 0 {
                continue;
            }
            let far = lane.far_tail(limit).min(lane.len() - 1).min(budget);
            self.move_back_to_tree(at, far);
            budget -= far;
        }
        self.lane_for(key_ms)
    }

    /// Moves the last `count` items of lane `at` to the tree; the lane keeps at least one.
    fn move_back_to_tree(&mut self, at: usize, count: usize) {
        let lane = &mut self.lanes[at];
        assert!(count < lane.len(), "a lane keeps at least one item");
        for _ in 0..count {
            let (key, queued) = lane.pop_back().expect("the lane has a back");
            let previous = self.out_of_order.insert(key, queued);
            assert!(previous.is_none(), "compaction key {key:?} used twice");
        }
        self.work.moved += count as u64;
    }

    fn open_lanes(&self) -> usize {
        self.lanes.iter().filter(|lane| !lane.sealed).count()
    }

    /// The open lane whose last item is due latest but no later than `key_ms`.
    fn lane_for(&self, key_ms: u64) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (at, lane) in self.lanes.iter().enumerate() {
            let Some(last) = lane.keys.back().filter(|_| !lane.sealed) else {
                continue;
            };
            if last.key_ms <= key_ms
                && best.is_none_or(|(best_key_ms, _)| last.key_ms > best_key_ms)
            {
                best = Some((last.key_ms, at));
            }
        }
        best.map(|(_, at)| at)
    }

    /// The item queued under `key`, and what it retains.
    pub fn get(&self, key: &QueueKey) -> Option<(&CompactionItem, Option<&Retained>)> {
        self.lanes
            .iter()
            .find_map(|lane| {
                let at = lane.keys.partition_point(|queued| queued < key);
                (lane.keys.get(at) == Some(key)).then(|| lane.get(at))
            })
            .or_else(|| {
                self.out_of_order
                    .get(key)
                    .map(|queued| (&queued.item, queued.retained.as_ref()))
            })
    }

    /// The first item whose key is below `horizon` (`ClusterParams::compaction_horizon`: due
    /// before cluster time), taken out of the queue.
    pub fn pop_due(&mut self, horizon: u64) -> Option<DueItem> {
        let (first, side) = self.first()?;
        if first.key_ms >= horizon {
            return None;
        }
        self.work.compacted += 1;
        match side {
            Side::Lane(at) => {
                let lane = &mut self.lanes[at];
                let popped = lane.pop_front();
                if lane.is_empty() {
                    self.lanes.swap_remove(at);
                }
                popped
            }
            Side::OutOfOrder => self
                .out_of_order
                .pop_first()
                .map(|(_, queued)| DueItem::new(queued.item, queued.retained.as_ref())),
        }
    }

    /// The smallest key (the earliest due time), if any item waits.
    pub fn first_key(&self) -> Option<u64> {
        self.first().map(|(key, _)| key.key_ms)
    }

    /// The smallest key, and which side holds it: the smallest of the fronts.
    fn first(&self) -> Option<(QueueKey, Side)> {
        let mut first = self
            .out_of_order
            .first_key_value()
            .map(|(key, _)| (*key, Side::OutOfOrder));
        for (at, lane) in self.lanes.iter().enumerate() {
            if let Some(front) = lane.keys.front() {
                if first.is_none_or(|(smallest, _)| *front < smallest) {
                    first = Some((*front, Side::Lane(at)));
                }
            }
        }
        first
    }

    pub fn len(&self) -> usize {
        self.lanes.iter().map(Lane::len).sum::<usize>() + self.out_of_order.len()
    }

    pub fn work(&self) -> CompactionWork {
        self.work
    }

    /// Every item in key order (a merge of the lanes and the tree).
    fn iter(&self) -> impl Iterator<Item = (&QueueKey, (&CompactionItem, Option<&Retained>))> {
        type Source<'q> = Box<
            dyn Iterator<Item = (&'q QueueKey, (&'q CompactionItem, Option<&'q Retained>))> + 'q,
        >;
        let mut sources: Vec<Source<'_>> = self
            .lanes
            .iter()
            .map(|lane| Box::new(lane.iter()) as Source<'_>)
            .collect();
        sources.push(Box::new(self.out_of_order.iter().map(|(key, queued)| {
            (key, (&queued.item, queued.retained.as_ref()))
        })));
        let mut sources: Vec<_> = sources.into_iter().map(Iterator::peekable).collect();
        std::iter::from_fn(move || {
            let next = sources
                .iter_mut()
                .enumerate()
                .filter_map(|(at, source)| source.peek().map(|(key, _)| (**key, at)))
                .min()?
                .1;
            sources[next].next()
        })
    }
}

impl PartialEq for CompactionQueue {
    fn eq(&self, other: &Self) -> bool {
        self.next_seq == other.next_seq && self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for CompactionQueue {}

impl fmt::Debug for CompactionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactionQueue")
            .field("items", &DebugItems(self))
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

struct DebugItems<'q>(&'q CompactionQueue);

impl fmt::Debug for DebugItems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.iter()).finish()
    }
}

/// The encoded form: the items as one map in key order, then the next sequence number (the
/// layout of a struct of a `BTreeMap` and a `u64`).
#[derive(Serialize)]
struct EncodedRef<'q> {
    items: ItemsRef<'q>,
    next_seq: u64,
}

struct ItemsRef<'q>(&'q CompactionQueue);

impl Serialize for ItemsRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter())
    }
}

#[derive(Deserialize)]
struct Encoded {
    items: BTreeMap<QueueKey, Queued>,
    next_seq: u64,
}

impl Serialize for CompactionQueue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        EncodedRef {
            items: ItemsRef(self),
            next_seq: self.next_seq,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for CompactionQueue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let encoded = Encoded::deserialize(deserializer)?;
        if let Some(highest) = encoded.items.keys().map(|key| key.seq).max() {
            if highest >= encoded.next_seq {
                return Err(serde::de::Error::custom(format!(
                    "a compaction item is numbered {highest}, at or above the next number {}",
                    encoded.next_seq
                )));
            }
        }
        // A map's keys are strictly increasing: all of them form one sorted lane.
        let mut lane = Lane::default();
        for (key, queued) in encoded.items {
            lane.push_back(key, queued);
        }
        Ok(Self {
            lanes: if lane.is_empty() {
                Vec::new()
            } else {
                vec![lane]
            },
            out_of_order: ChunkedTree::default(),
            next_seq: encoded.next_seq,
            work: CompactionWork::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nonce(name: &str) -> CompactionItem {
        CompactionItem::Nonce(name.into())
    }

    #[test]
    fn due_order_then_insertion_order() {
        let mut queue = CompactionQueue::default();
        queue.push(20, nonce("late"), None);
        let first = queue.push(10, nonce("a"), None);
        queue.push(10, nonce("b"), None);
        assert_eq!(queue.get(&first).map(|q| q.0), Some(&nonce("a")));
        assert_eq!(queue.first_key(), Some(10));
        assert!(queue.pop_due(10).is_none(), "due at 10 is not before 10");
        let popped: Vec<_> = std::iter::from_fn(|| queue.pop_due(21))
            .map(|q| q.item)
            .collect();
        assert_eq!(popped, [nonce("a"), nonce("b"), nonce("late")]);
        assert_eq!(queue.first_key(), None);
    }

    #[test]
    fn sequence_numbers_survive_a_snapshot() {
        let mut queue = CompactionQueue::default();
        queue.push(10, nonce("a"), None);
        queue.pop_due(11);
        let bytes = rmp_serde::to_vec(&queue).expect("encodes");
        let mut back: CompactionQueue = rmp_serde::from_slice(&bytes).expect("decodes");
        let key = back.push(10, nonce("b"), None);
        assert_eq!(key.seq, 1, "numbers are never reused after a restore");
    }

    proptest::proptest! {
        /// Against a plain ordered map: every pop, lookup and first due time agrees, whatever
        /// mix of in-order and out-of-order pushes came before; the encoding is the map's.
        #[test]
        fn agrees_with_an_ordered_map(
            steps in proptest::collection::vec(
                (
                    proptest::prop_oneof![0u64..50, 70_000u64..70_050, 200_000u64..200_010],
                    proptest::bool::ANY,
                    proptest::prop_oneof![0u64..60, 69_990u64..70_060, 199_990u64..200_020],
                ),
                1..200,
            )
        ) {
            let mut queue = CompactionQueue::default();
            let mut model: BTreeMap<QueueKey, CompactionItem> = BTreeMap::new();
            let mut keys = Vec::new();
            for (n, (key_ms, pop, now_ms)) in steps.into_iter().enumerate() {
                if pop {
                    let expected = model
                        .first_key_value()
                        .filter(|(key, _)| key.key_ms < now_ms)
                        .map(|(key, _)| *key);
                    if let Some(key) = expected {
                        model.remove(&key);
                    }
                    let popped = queue.pop_due(now_ms).map(|q| q.item);
                    proptest::prop_assert_eq!(popped.is_some(), expected.is_some());
                } else {
                    let item = nonce(&format!("n{n}"));
                    let moved = queue.work().moved;
                    let key = queue.push(key_ms, item.clone(), None);
                    proptest::prop_assert!(
                        queue.work().moved - moved <= MAX_QUEUE_MOVES_PER_PUSH as u64
                    );
                    model.insert(key, item);
                    keys.push(key);
                }
                proptest::prop_assert_eq!(queue.len(), model.len());
                proptest::prop_assert!(queue.open_lanes() <= MAX_LANES);
                proptest::prop_assert!(queue.lanes.len() <= MAX_LANES + MAX_SEALED_LANES);
                proptest::prop_assert!(queue.lanes.iter().all(|lane| !lane.is_empty()));
                proptest::prop_assert_eq!(
                    queue.first_key(),
                    model.first_key_value().map(|(key, _)| key.key_ms)
                );
                for key in &keys {
                    proptest::prop_assert_eq!(queue.get(key).map(|q| q.0), model.get(key));
                }
            }
            let in_key_order: Vec<_> = queue.iter().map(|(key, q)| (*key, q.0.clone())).collect();
            let model_order: Vec<_> = model.iter().map(|(key, item)| (*key, item.clone())).collect();
            proptest::prop_assert_eq!(in_key_order, model_order);
            // Restored, every item sits in the deque; state, equality and bytes are unchanged.
            let bytes = rmp_serde::to_vec(&queue).expect("encodes");
            let back: CompactionQueue = rmp_serde::from_slice(&bytes).expect("decodes");
            proptest::prop_assert!(back.out_of_order.is_empty() && back.lanes.len() <= 1);
            proptest::prop_assert_eq!(&back, &queue);
            proptest::prop_assert_eq!(rmp_serde::to_vec(&back).expect("encodes"), bytes);
        }
    }

    #[test]
    fn encodes_like_the_map_it_replaced() {
        #[derive(Serialize)]
        struct Before {
            items: BTreeMap<QueueKey, Queued>,
            next_seq: u64,
        }
        let mut queue = CompactionQueue::default();
        let mut before = Before {
            items: BTreeMap::new(),
            next_seq: 0,
        };
        let pushes = [
            (30, "a"),
            (10, "b"),
            (30, "c"),
            (20, "d"),
            (5, "e"),
            (3, "f"),
            (1, "g"),
        ];
        for (key_ms, name) in pushes {
            let key = queue.push(key_ms, nonce(name), None);
            before.items.insert(
                key,
                Queued {
                    item: nonce(name),
                    retained: None,
                },
            );
            before.next_seq += 1;
        }
        assert!(
            queue.lanes.len() > 1 && !queue.out_of_order.is_empty(),
            "the test spreads items over lanes and the tree"
        );
        assert_eq!(
            rmp_serde::to_vec(&queue).expect("encodes"),
            rmp_serde::to_vec(&before).expect("encodes")
        );
    }

    #[test]
    fn a_restored_queue_numbered_past_its_counter_is_refused() {
        let mut queue = CompactionQueue::default();
        queue.push(10, nonce("a"), None);
        queue.next_seq = 0;
        let bytes = rmp_serde::to_vec(&queue).expect("encodes");
        let error = rmp_serde::from_slice::<CompactionQueue>(&bytes).expect_err("refused");
        assert!(
            error.to_string().contains("at or above the next number"),
            "{error}"
        );
    }

    #[test]
    fn interleaved_streams_each_keep_a_lane_and_no_tree() {
        // Per call: a command due at its deadline plus retention, and the hold it ends due
        // at cluster time plus retention, a second earlier.
        let mut queue = CompactionQueue::default();
        for now_ms in 0..1_000u64 {
            queue.push(now_ms + 2_000, nonce("command"), None);
            queue.push(now_ms + 1_000, nonce("hold"), None);
            if now_ms % 3 == 0 {
                queue.pop_due(now_ms);
            }
        }
        assert_eq!(queue.lanes.len(), 2, "one lane per stream");
        assert!(queue.out_of_order.is_empty(), "no item waits in the tree");
        let mut last = None;
        while let Some(popped) = queue.pop_due(u64::MAX) {
            let _ = popped;
            let first = queue.first();
            assert!(first.map(|f| f.0) > last || first.is_none());
            last = first.map(|f| f.0);
        }
        assert!(queue.lanes.is_empty(), "drained lanes are dropped");
    }

    #[test]
    fn an_item_due_much_later_leaves_its_lane_when_no_lane_fits() {
        let mut queue = CompactionQueue::default();
        queue.push(10, nonce("a"), None);
        queue.push(10 + 24 * 3_600_000, nonce("far"), None);
        // Each due before every lane's last: one new lane each, until the lanes run out.
        for (name, key_ms) in [("n9", 9), ("n8", 8), ("n7", 7)] {
            queue.push(key_ms, nonce(name), None);
        }
        assert_eq!(queue.lanes.len(), MAX_LANES);
        assert!(queue.out_of_order.is_empty());
        // Fits no lane: the far item leaves its lane, and this one waits in the tree.
        queue.push(5, nonce("n5"), None);
        assert_eq!(queue.out_of_order.len(), 2, "the far item and n5");
        for (n, key_ms) in [20, 30, 40].into_iter().enumerate() {
            queue.push(key_ms, nonce(&format!("m{n}")), None);
        }
        assert_eq!(queue.out_of_order.len(), 2, "ordinary items fit a lane");
        let popped: Vec<_> = std::iter::from_fn(|| queue.pop_due(u64::MAX))
            .map(|q| q.item)
            .collect();
        let names = ["n5", "n7", "n8", "n9", "a", "m0", "m1", "m2", "far"];
        assert_eq!(popped, names.map(nonce));
    }

    /// Pushes `count` items from two interleaved streams, as a loaded family queues them:
    /// commands due at `now + 60 s + retention` (their deadline out of order by up to 5 s) and
    /// holds due at `now + retention`. Each push may move at most the budget.
    fn load(queue: &mut CompactionQueue, start_ms: u64, retention_ms: u64, count: u64) {
        for n in 0..count {
            let now_ms = start_ms + n;
            let jitter = (n * 7_919) % 5_000;
            for key_ms in [
                now_ms + 60_000 + retention_ms - jitter,
                now_ms + retention_ms,
            ] {
                let moved = queue.work().moved;
                queue.push(key_ms, nonce(&format!("{start_ms}:{n}")), None);
                let moved = queue.work().moved - moved;
                assert!(
                    moved <= MAX_QUEUE_MOVES_PER_PUSH as u64,
                    "{moved} items moved by one push"
                );
            }
        }
    }

    fn drain_in_key_order(queue: &mut CompactionQueue) {
        let mut last = None;
        while let Some((key, _)) = queue.first() {
            assert!(queue.pop_due(u64::MAX).is_some());
            assert!(last < Some(key), "{key:?} popped after {last:?}");
            last = Some(key);
        }
        assert_eq!(queue.len(), 0);
    }

    #[test]
    fn a_lowered_retention_seals_the_long_runs_and_moves_nothing() {
        let mut queue = CompactionQueue::default();
        load(&mut queue, 0, 24 * 3_600_000, 20_000);
        assert_eq!(
            queue.open_lanes(),
            MAX_LANES,
            "jittered streams fill the lanes"
        );
        let moved = queue.work().moved;
        load(&mut queue, 20_000, 10_000, 20_000);
        assert_eq!(queue.work().moved, moved, "no item moved to the tree");
        assert!(queue.lanes.len() > queue.open_lanes(), "a run was sealed");
        drain_in_key_order(&mut queue);
        assert!(queue.lanes.is_empty(), "drained sealed lanes are dropped");
    }

    #[test]
    fn once_every_sealed_slot_is_taken_far_tails_move_a_budget_at_a_time() {
        // Every phase lowers the retention again: each leaves long runs due far later than
        // the next phase's items, more than the sealed slots can hold.
        let mut queue = CompactionQueue::default();
        let mut retention_ms = 24 * 3_600_000;
        for phase in 0..8 {
            load(&mut queue, phase * 3_000, retention_ms, 3_000);
            retention_ms /= 4;
            assert!(queue.open_lanes() <= MAX_LANES);
            assert!(queue.lanes.len() <= MAX_LANES + MAX_SEALED_LANES);
        }
        assert_eq!(queue.lanes.len(), MAX_LANES + MAX_SEALED_LANES);
        assert!(
            queue.work().moved > 0,
            "far tails moved once no slot was left"
        );
        assert_eq!(queue.len(), 8 * 3_000 * 2);
        drain_in_key_order(&mut queue);
    }
}
