//! An estimate of a family's heap footprint, from its row counts: what the router weighs
//! against the node's `memory_budget` to decide which families stay in memory. Counting
//! allocations exactly would cost the apply path; row counts are already kept.
//!
//! The per-row figures are measured by `cargo bench -p tally-ledger --bench memory` (its "by
//! table" lines: a counting allocator, each table dropped in turn from a family read back
//! after 100,000 authorize + capture + reconcile calls or 100,000 denied authorizes, named by
//! counters and by UUIDs; docs/sizing.md, "The estimate, measured by table");
//! `tests/footprint_estimate.rs` holds the whole estimate to the bytes counted. A
//! retained command costs about 1.1 KB (its event, its dedupe row with field hashes, its hold
//! and its compaction queue entries). A string id named by several rows is one allocation
//! shared by them; its bytes are counted once, in the queue entry, the last row to let it go.
//! Once compacted a command leaves memory (its rows go to the family store). The estimate is
//! node-local: nothing replicated or digested depends on it.

use crate::family::Family;

/// A retained event in the journal (419–431 B measured).
const EVENT_BYTES: usize = 430;
/// A dedupe row (retained field hashes or compacted digest, and the answer; 206–224 B).
const DEDUPE_ROW_BYTES: usize = 220;
/// A live hold (its slot and the hold; 352 B).
const LIVE_HOLD_BYTES: usize = 350;
/// Any other hold slot: a denied authorize's claim (113–136 B measured), or an archived hold
/// from a snapshot of a build that kept them in memory (not measured).
const CLAIM_BYTES: usize = 140;
/// A compaction queue entry, with the identity it retains and the shared ids (230–257 B).
const QUEUE_ENTRY_BYTES: usize = 250;
/// An account with its grant limits and counters. Not calibrated: the bench's loads have one
/// account, 1,648 B with the first node of its map, which later accounts share.
const ACCOUNT_BYTES: usize = 400;
/// A consumed nonce or an expiry entry. Not calibrated: the bench's loads have none.
const SMALL_ROW_BYTES: usize = 64;
/// The family's own fixed part: its id and empty tables.
const FAMILY_BASE_BYTES: usize = 1_024;

impl Family {
    /// About how many heap bytes this family holds (see the module docs for the figures).
    pub fn footprint_bytes(&self) -> usize {
        assert!(
            self.live_holds <= self.holds.len(),
            "live holds ({}) are a part of the hold table ({})",
            self.live_holds,
            self.holds.len()
        );
        let claims = self.holds.len() - self.live_holds;
        let small_rows = self.nonces.len() + self.expiry_index.len();
        FAMILY_BASE_BYTES
            + self.journal.len() * EVENT_BYTES
            + self.dedupe.len() * DEDUPE_ROW_BYTES
            + self.live_holds * LIVE_HOLD_BYTES
            + claims * CLAIM_BYTES
            + self.compaction_queue.len() * QUEUE_ENTRY_BYTES
            + self.accounts.len() * ACCOUNT_BYTES
            + small_rows * SMALL_ROW_BYTES
    }
}

impl Family {
    /// Drops this family one table at a time, calling `dropped` with each table's name and
    /// row count once it is gone: how the memory bench attributes a family's heap bytes to its
    /// tables (with a counting allocator) to calibrate the costs above. A string id shared by
    /// rows of several tables is freed with the last of them, the compaction queue.
    pub fn drop_by_table(mut self, mut dropped: impl FnMut(&'static str, usize)) {
        // One step per table: its rows counted, the table dropped, the caller told.
        macro_rules! drop_tables {
            ($($table:ident => $name:literal),* $(,)?) => {
                $(
                    let rows = self.$table.len();
                    drop(std::mem::take(&mut self.$table));
                    dropped($name, rows);
                )*
            };
        }
        drop_tables!(
            journal => "journal",
            dedupe => "dedupe",
            holds => "holds",
            accounts => "accounts",
            nonces => "nonces",
            expiry_index => "expiry",
            compaction_queue => "compaction queue",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::FamilyId;

    #[test]
    fn an_empty_family_costs_its_base_only() {
        assert_eq!(
            Family::new(FamilyId::from("fam")).footprint_bytes(),
            FAMILY_BASE_BYTES
        );
    }
}
