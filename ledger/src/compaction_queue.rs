//! The compaction queue: work that becomes due once cluster time passes a command's
//! `not_after_ms + retention_ms` (SPEC.md §5.5), in due order.
//!
//! Keys are two integers, the due time and a sequence number the family hands out, so ties
//! (many items fall due in the same millisecond) keep their insertion order and every key
//! comparison is two integer compares, never a string compare. The sequence number is
//! replicated state: every replica hands out the same numbers in the same order, so every
//! replica compacts alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::commit_index::BudgetCommitIndex;
use crate::dedupe::Retained;
use crate::ids::{EventId, HoldId, NonceId};

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
    /// Boxed, so the queue's tree nodes stay small.
    pub retained: Option<Box<Retained>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CompactionQueue {
    items: BTreeMap<QueueKey, Queued>,
    /// The sequence number of the next item pushed.
    next_seq: u64,
}

impl CompactionQueue {
    /// Queues `item` (and what it retains) until cluster time passes `due_ms`.
    pub fn push(
        &mut self,
        due_ms: u64,
        item: CompactionItem,
        retained: Option<Box<Retained>>,
    ) -> QueueKey {
        let key = QueueKey {
            due_ms,
            seq: self.next_seq,
        };
        self.next_seq = self
            .next_seq
            .checked_add(1)
            .expect("compaction sequence numbers are 64-bit and never run out");
        let previous = self.items.insert(key, Queued { item, retained });
        assert!(previous.is_none(), "compaction key {key:?} used twice");
        key
    }

    pub fn get(&self, key: &QueueKey) -> Option<&Queued> {
        self.items.get(key)
    }

    /// The first item whose due time is before `now_ms`, taken out of the queue.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<Queued> {
        let entry = self.items.first_entry()?;
        if entry.key().due_ms >= now_ms {
            return None;
        }
        Some(entry.remove())
    }

    /// The earliest due time, if any item waits.
    pub fn first_due_ms(&self) -> Option<u64> {
        self.items.first_key_value().map(|(key, _)| key.due_ms)
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
}
