//! Bounded memory, correct forever (SPEC.md §5.5). Once cluster time passes a command's
//! `not_after_ms + retention_ms` no copy of it can apply, so its full event may leave memory:
//! the dedupe row keeps a digest and the answer, and final holds keep an archive record.
//! Items are ordered by due time, so each step pops the queue's first entry.

use crate::dedupe::{DedupeEntry, Retained};
use crate::family::{CompactionItem, Family};
use crate::hold::HoldSlot;
use crate::limits::MAX_COMPACTIONS_PER_COMMAND;

impl Family {
    /// Runs due compaction steps, at most `MAX_COMPACTIONS_PER_COMMAND`, in due order.
    /// Deterministic: it depends only on replicated state and cluster time.
    pub(crate) fn compact_due(&mut self, now_ms: u64) {
        for _ in 0..MAX_COMPACTIONS_PER_COMMAND {
            match self.compaction_queue.first_key_value() {
                Some(((due, _), _)) if *due < now_ms => {}
                _ => return,
            }
            let Some(((_, item), retained)) = self.compaction_queue.pop_first() else {
                return;
            };
            self.compact(item, retained, now_ms);
        }
    }

    fn compact(&mut self, item: CompactionItem, retained: Option<Box<Retained>>, now_ms: u64) {
        match item {
            CompactionItem::Journal(index) => {
                self.journal.remove(&index);
            }
            CompactionItem::Command(key) => {
                // The row keeps its digest; dropping `retained` drops the full identity.
                let retained = retained.unwrap_or_else(|| {
                    panic!("command {:?} queued without its identity", key.id())
                });
                if let Some(index) = retained.event {
                    let record = self.journal.remove(&index);
                    assert!(
                        record.is_some_and(|record| &record.event_id == key.id()),
                        "command {:?} lost its own event {index:?}",
                        key.id()
                    );
                }
            }
            CompactionItem::Tombstone(key) => match self.dedupe.remove(key.id()) {
                Some(DedupeEntry::Tombstoned(_)) => {}
                other => panic!("tombstone {:?} compacted, found {other:?}", key.id()),
            },
            CompactionItem::Hold(key) => {
                let Some(slot) = self.holds.get_mut(key.id()) else {
                    return;
                };
                let HoldSlot::Live(hold) = slot else { return };
                if !hold.is_final() {
                    return;
                }
                *slot = HoldSlot::Archived(Box::new(hold.archive()));
                self.live_holds -= 1;
            }
            CompactionItem::Nonce(nonce_id) => {
                if self.nonces.get(&nonce_id).is_some_and(|at| *at < now_ms) {
                    self.nonces.remove(&nonce_id);
                }
            }
        }
    }
}
