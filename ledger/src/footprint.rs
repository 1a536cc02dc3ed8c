//! An estimate of a family's heap footprint, from its row counts: what the router weighs
//! against the node's `memory_budget` to decide which families stay in memory. Counting
//! allocations exactly would cost the apply path; row counts are already kept.
//!
//! The per-row figures are calibrated on `cargo bench -p tally-ledger --bench memory` (a
//! counting allocator over 100,000 authorize + capture + reconcile calls, docs/sizing.md): a
//! retained command costs about 1.1 KB (its event, its dedupe row with field hashes, its hold
//! and two queue entries) and a compacted one about 0.4 KB (the dedupe row and the archived
//! hold). The estimate is node-local: nothing replicated or digested depends on it.

use crate::family::Family;

/// A retained event in the journal.
const EVENT_BYTES: usize = 600;
/// A dedupe row (retained field hashes or compacted digest, and the answer).
const DEDUPE_ROW_BYTES: usize = 200;
/// A hold slot, live or archived.
const HOLD_BYTES: usize = 200;
/// An account with its grant limits and counters.
const ACCOUNT_BYTES: usize = 400;
/// A consumed nonce, an expiry entry or a compaction queue entry.
const SMALL_ROW_BYTES: usize = 64;
/// The family's own fixed part: its id and empty tables.
const FAMILY_BASE_BYTES: usize = 1_024;

impl Family {
    /// About how many heap bytes this family holds (see the module docs for the figures).
    pub fn footprint_bytes(&self) -> usize {
        let small_rows = self.nonces.len() + self.expiry_index.len() + self.compaction_queue.len();
        FAMILY_BASE_BYTES
            + self.journal.len() * EVENT_BYTES
            + self.dedupe.len() * DEDUPE_ROW_BYTES
            + self.holds.len() * HOLD_BYTES
            + self.accounts.len() * ACCOUNT_BYTES
            + small_rows * SMALL_ROW_BYTES
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
