//! The compaction queue: work that becomes due once cluster time passes a command's
//! `not_after_ms + retention_ms` (SPEC.md §5.5), in due order.
//!
//! Keys are two integers, the due time and a sequence number the family hands out, so ties
//! (many items fall due in the same millisecond) keep their insertion order and every key
//! comparison is two integer compares, never a string compare. The sequence number is
//! replicated state: every replica hands out the same numbers in the same order, so every
//! replica compacts alike.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::commit_index::BudgetCommitIndex;
use crate::dedupe::Retained;
use crate::ids::{EventId, HoldId, NonceId};
use crate::spare_capacity::release_spare;

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

/// Where an item waits: `(due_ms, seq)`, ordered by due time, then by insertion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct QueueKey {
    pub due_ms: u64,
    pub seq: u64,
}

/// An item and, for a command or a tombstone, the field hashes it keeps until it is due.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Queued {
    pub item: CompactionItem,
    pub retained: Option<Retained>,
}

/// Items in `(due_ms, seq)` order. Nearly every item falls due after the one queued before
/// it (due times are a command's deadline plus a fixed retention, and deadlines follow
/// cluster time), so such items are appended to a deque sorted by construction: a push and a
/// pop cost no tree search and no allocation. An item due before the deque's last one (a
/// command with a shorter deadline than its predecessor) waits in a tree instead. A pop
/// takes the smaller of the two fronts, so the order is exactly the key order either way.
///
/// Encoded, compared and restored as one map in key order: how items are split between the
/// deque and the tree depends on the order they were pushed in, never on the state.
/// Where an item waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    InOrder,
    OutOfOrder,
}

/// How much later than a new item the deque's last item may fall due before it moves to the
/// tree. Deadlines of ordinary commands differ by seconds; this keeps them all in the deque.
const MAX_IN_ORDER_GAP_MS: u64 = 60_000;

#[derive(Clone, Default)]
pub(crate) struct CompactionQueue {
    /// Strictly increasing keys.
    in_order: VecDeque<(QueueKey, Queued)>,
    out_of_order: BTreeMap<QueueKey, Queued>,
    /// The sequence number of the next item pushed.
    next_seq: u64,
}

impl CompactionQueue {
    /// Queues `item` (and what it retains) until cluster time passes `due_ms`.
    pub fn push(
        &mut self,
        due_ms: u64,
        item: CompactionItem,
        retained: Option<Retained>,
    ) -> QueueKey {
        let key = QueueKey {
            due_ms,
            seq: self.next_seq,
        };
        self.next_seq = self
            .next_seq
            .checked_add(1)
            .expect("compaction sequence numbers are 64-bit and never run out");
        let queued = Queued { item, retained };
        // An item due far later than this one (a command with a deadline hours away) leaves
        // the deque for the tree: kept at the back, it would send every item after it to the
        // tree until it falls due. Each item moves at most once.
        while let Some((last, _)) = self.in_order.back() {
            if last.due_ms <= due_ms.saturating_add(MAX_IN_ORDER_GAP_MS) {
                break;
            }
            let (last, outlier) = self.in_order.pop_back().expect("the deque has a back");
            self.out_of_order.insert(last, outlier);
        }
        // `seq` only grows, so a key due no earlier than the deque's last is above it.
        if self
            .in_order
            .back()
            .is_none_or(|(last, _)| last.due_ms <= due_ms)
        {
            self.in_order.push_back((key, queued));
        } else {
            let previous = self.out_of_order.insert(key, queued);
            assert!(previous.is_none(), "compaction key {key:?} used twice");
        }
        key
    }

    pub fn get(&self, key: &QueueKey) -> Option<&Queued> {
        match self.in_order.binary_search_by(|(k, _)| k.cmp(key)) {
            Ok(at) => Some(&self.in_order[at].1),
            Err(_) => self.out_of_order.get(key),
        }
    }

    /// The first item whose due time is before `now_ms`, taken out of the queue.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<Queued> {
        let (first, side) = self.first()?;
        if first.due_ms >= now_ms {
            return None;
        }
        match side {
            Side::InOrder => {
                let popped = self.in_order.pop_front().map(|(_, queued)| queued);
                release_spare(&mut self.in_order);
                popped
            }
            Side::OutOfOrder => self.out_of_order.pop_first().map(|(_, queued)| queued),
        }
    }

    /// The earliest due time, if any item waits.
    pub fn first_due_ms(&self) -> Option<u64> {
        self.first().map(|(key, _)| key.due_ms)
    }

    /// The smallest key, and which side holds it: the smaller of the two fronts.
    fn first(&self) -> Option<(QueueKey, Side)> {
        let in_order = self.in_order.front().map(|(key, _)| (*key, Side::InOrder));
        let out_of_order = self
            .out_of_order
            .first_key_value()
            .map(|(key, _)| (*key, Side::OutOfOrder));
        match (in_order, out_of_order) {
            (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    pub fn len(&self) -> usize {
        self.in_order.len() + self.out_of_order.len()
    }

    /// Every item in key order (a merge of the deque and the tree).
    fn iter(&self) -> impl Iterator<Item = (&QueueKey, &Queued)> {
        let mut deque = self
            .in_order
            .iter()
            .map(|(key, queued)| (key, queued))
            .peekable();
        let mut tree = self.out_of_order.iter().peekable();
        std::iter::from_fn(move || match (deque.peek(), tree.peek()) {
            (Some((d, _)), Some((t, _))) if d < t => deque.next(),
            (Some(_), None) => deque.next(),
            _ => tree.next(),
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
        // A map's keys are strictly increasing: all of them form the sorted deque.
        Ok(Self {
            in_order: encoded.items.into_iter().collect(),
            out_of_order: BTreeMap::new(),
            next_seq: encoded.next_seq,
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
        assert_eq!(queue.get(&first).map(|q| &q.item), Some(&nonce("a")));
        assert_eq!(queue.first_due_ms(), Some(10));
        assert!(queue.pop_due(10).is_none(), "due at 10 is not before 10");
        let popped: Vec<_> = std::iter::from_fn(|| queue.pop_due(21))
            .map(|q| q.item)
            .collect();
        assert_eq!(popped, [nonce("a"), nonce("b"), nonce("late")]);
        assert_eq!(queue.first_due_ms(), None);
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
            for (n, (due_ms, pop, now_ms)) in steps.into_iter().enumerate() {
                if pop {
                    let expected = model
                        .first_key_value()
                        .filter(|(key, _)| key.due_ms < now_ms)
                        .map(|(key, _)| *key);
                    if let Some(key) = expected {
                        model.remove(&key);
                    }
                    let popped = queue.pop_due(now_ms).map(|q| q.item);
                    proptest::prop_assert_eq!(popped.is_some(), expected.is_some());
                } else {
                    let item = nonce(&format!("n{n}"));
                    let key = queue.push(due_ms, item.clone(), None);
                    model.insert(key, item);
                    keys.push(key);
                }
                proptest::prop_assert_eq!(queue.len(), model.len());
                proptest::prop_assert_eq!(
                    queue.first_due_ms(),
                    model.first_key_value().map(|(key, _)| key.due_ms)
                );
                for key in &keys {
                    proptest::prop_assert_eq!(queue.get(key).map(|q| &q.item), model.get(key));
                }
            }
            let in_key_order: Vec<_> = queue.iter().map(|(key, q)| (*key, q.item.clone())).collect();
            let model_order: Vec<_> = model.iter().map(|(key, item)| (*key, item.clone())).collect();
            proptest::prop_assert_eq!(in_key_order, model_order);
            // Restored, every item sits in the deque; state, equality and bytes are unchanged.
            let bytes = rmp_serde::to_vec(&queue).expect("encodes");
            let back: CompactionQueue = rmp_serde::from_slice(&bytes).expect("decodes");
            proptest::prop_assert!(back.out_of_order.is_empty());
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
        for (due_ms, name) in [(30, "a"), (10, "b"), (30, "c"), (20, "d")] {
            let key = queue.push(due_ms, nonce(name), None);
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
            !queue.out_of_order.is_empty(),
            "the test pushes out of order"
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
    fn an_item_due_much_later_leaves_the_deque_for_the_tree() {
        let mut queue = CompactionQueue::default();
        queue.push(10, nonce("a"), None);
        let far = queue.push(10 + 24 * 3_600_000, nonce("far"), None);
        for (n, due_ms) in [20, 30, 40].into_iter().enumerate() {
            queue.push(due_ms, nonce(&format!("n{n}")), None);
        }
        assert_eq!(
            queue.in_order.len(),
            4,
            "the ordinary items stay in the deque"
        );
        assert_eq!(queue.out_of_order.len(), 1);
        assert_eq!(queue.get(&far).map(|q| &q.item), Some(&nonce("far")));
        let popped: Vec<_> = std::iter::from_fn(|| queue.pop_due(u64::MAX))
            .map(|q| q.item)
            .collect();
        assert_eq!(
            popped,
            [
                nonce("a"),
                nonce("n0"),
                nonce("n1"),
                nonce("n2"),
                nonce("far")
            ]
        );
    }
}
