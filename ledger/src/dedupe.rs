//! The dedupe rules of a family (docs/spec.md §5): whether a command seen again is the one stored
//! under its `event_id`, and which fields differ when it is not. A row (`tables/dedupe_table.rs`)
//! keeps only its command's identity digest; the per-field hashes that name the differing
//! fields of a conflict while the command is retained wait in the compaction queue
//! (`tables/compaction_queue.rs`), so compacting a command is popping that queue item, with no
//! lookup here.

use crate::command::ClientCommand;
use crate::commit_index::BudgetCommitIndex;
use crate::error::LedgerError;
use crate::family::Family;
use crate::identity::{digest_of, identity_hashes};
use crate::ids::EventId;
use crate::tables::compaction_queue::{CompactionItem, Retained};
use crate::tables::dedupe_table::RowIdentity;

impl Family {
    /// `Ok` when `candidate` is the command stored as `stored` under its id, else a conflict
    /// naming every differing field while the command is retained, `identity` after.
    /// `item` makes the queue item (`Command` or `Tombstone`) that retains it.
    pub(crate) fn same_command(
        &self,
        stored: &RowIdentity,
        item: fn(EventId) -> CompactionItem,
        candidate: &ClientCommand,
    ) -> Result<(), LedgerError> {
        if stored.digest == digest_of(candidate) {
            return Ok(());
        }
        let expected = item(candidate.header.event_id.clone());
        let mut differing = match self.compaction_queue.get(&stored.retained) {
            Some((item, Some(retained))) if *item == expected => {
                retained.fields.differing(&identity_hashes(candidate).1)
            }
            _ => Vec::new(),
        };
        if differing.is_empty() {
            differing.push("identity".to_owned());
        }
        Err(LedgerError::conflict_fields(differing))
    }

    /// Queues the field hashes of `candidate`'s identity (and its own event) until
    /// `retained_due` and returns what its row keeps: the digest, and where the rest waits.
    pub(crate) fn retain(
        &mut self,
        candidate: &ClientCommand,
        retained_due: u64,
        item: fn(EventId) -> CompactionItem,
        event: Option<BudgetCommitIndex>,
    ) -> RowIdentity {
        let (digest, fields) = identity_hashes(candidate);
        let key = self.compaction_queue.push(
            retained_due,
            item(candidate.header.event_id.clone()),
            Some(Retained { fields, event }),
        );
        RowIdentity {
            digest,
            retained: key,
        }
    }
}
