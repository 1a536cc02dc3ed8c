//! Bounded memory, correct forever (docs/spec.md §5.5). Once cluster time passes a command's
//! `not_after_ms + retention_ms` no copy of it can apply, so its full event may leave memory:
//! the dedupe row keeps a digest and the answer, and final holds keep an archive record, both
//! moved out of memory to the node's store (`cold.rs`).
//! Items are ordered by due time, so each step pops the queue's first entry.

use crate::cluster_time::ClusterParams;
use crate::family::Family;
use crate::hold::HoldSlot;
use crate::ids::{EventId, HoldId};
use crate::tables::compaction_queue::{CompactionItem, CompactionWork, DueItem};

impl Family {
    /// Runs due compaction steps, at most `max_steps` (`ClusterParams::max_compactions`), in
    /// due order. Deterministic: it depends only on replicated state and cluster time.
    pub(crate) fn compact_due(&mut self, now_ms: u64, max_steps: usize, params: &ClusterParams) {
        let Some(horizon) = params.compaction_horizon(now_ms) else {
            return;
        };
        for _ in 0..max_steps {
            let Some(due) = self.compaction_queue.pop_due(horizon) else {
                return;
            };
            self.compact(due, now_ms, params);
        }
    }

    /// What compaction has done on this node since the family was created or restored
    /// (node-local, never replicated): each command adds at most `MAX_COMPACTIONS_PER_COMMAND`
    /// compactions and, per item it queues, at most `MAX_QUEUE_MOVES_PER_PUSH` moves.
    pub fn compaction_work(&self) -> CompactionWork {
        self.compaction_queue.work()
    }

    fn compact(&mut self, due: DueItem, now_ms: u64, params: &ClusterParams) {
        match due.item {
            CompactionItem::Journal(index) => {
                self.journal.discard(index, |_| true);
            }
            CompactionItem::Command(event_id) => {
                // The row keeps its digest; the queue dropped the field hashes.
                assert!(
                    due.retained,
                    "command {event_id:?} queued without its identity"
                );
                if let Some(index) = due.own_event {
                    // The record is seen once, as it is dropped: a denied one names the
                    // hold id its command may have claimed.
                    let mut denied_hold = None;
                    assert!(
                        self.journal.discard(index, |record| {
                            if !record.allowed {
                                denied_hold.clone_from(&record.hold_id);
                            }
                            record.event_id == event_id
                        }),
                        "command {event_id:?} lost its own event {index:?}"
                    );
                    if let Some(hold_id) = denied_hold {
                        if params.denied_claims_leave_memory() {
                            self.move_denied_claim(hold_id, &event_id);
                        }
                    }
                }
                // The row is compact now: it leaves memory (`cold.rs`).
                let row = self.dedupe.take_applied(&event_id);
                self.cold_rows.move_event(&mut self.cold, event_id, row);
            }
            CompactionItem::Tombstone(event_id) => {
                assert!(
                    self.dedupe.remove_tombstone(&event_id).is_some(),
                    "tombstone {event_id:?} compacted, found no tombstone"
                );
            }
            CompactionItem::Hold(hold_id) => {
                let archive = match self.holds.get(&hold_id) {
                    Some(HoldSlot::Live(hold)) if hold.is_final() => hold.archive(),
                    _ => return,
                };
                // Archived, it leaves memory (`cold.rs`).
                self.holds.remove(&hold_id);
                self.live_holds -= 1;
                self.cold_rows.move_hold(&mut self.cold, hold_id, archive);
            }
            CompactionItem::Nonce(nonce_id) => match self.nonces.get(&nonce_id) {
                Some(at) if *at < now_ms => {
                    self.nonces.remove(&nonce_id);
                }
                // Popped before its expiry: the retention was lowered since it was queued
                // (rules version 3), and a nonce is kept until it expires, whatever the
                // retention. Queued again, due exactly then.
                Some(at) => {
                    let key = params.compaction_key_at(*at);
                    self.compaction_queue
                        .push(key, CompactionItem::Nonce(nonce_id), None);
                }
                None => {}
            },
        }
    }

    /// Rules version 2: a denied authorize claims its `hold_id` for ever (a later authorize
    /// naming it is a conflict) but opens no hold, so its claim is as done as its command's
    /// row and leaves memory with it, read back on a miss like an archived hold. Under the
    /// legacy rules it stayed in memory for ever: 224–272 bytes a denial (the ledger's memory
    /// bench), which an agent retrying against an exhausted budget grows without end.
    fn move_denied_claim(&mut self, hold_id: HoldId, event_id: &EventId) {
        match self.holds.get(&hold_id) {
            Some(HoldSlot::Denied { event_id: claimed }) if claimed == event_id => {}
            // Only the authorize that claimed the id moves its claim.
            _ => return,
        }
        self.holds.remove(&hold_id);
        self.cold_rows
            .move_denied_hold(&mut self.cold, hold_id, event_id.clone());
    }
}
