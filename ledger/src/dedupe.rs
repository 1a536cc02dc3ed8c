//! The dedupe table's rows (docs/spec.md §5): an applied command's stored answer, or a tombstone,
//! under its `event_id`. A row keeps only its command's identity digest. The per-field hashes
//! that name the differing fields of a conflict while the command is retained wait in the
//! compaction queue: compacting a command is popping that queue item, with no lookup here.

use serde::{Deserialize, Serialize};

use crate::command::ClientCommand;
use crate::commit_index::{BudgetCommitIndex, LogPosition};
use crate::decision::{Decision, Outcome};
use crate::error::LedgerError;
use crate::family::Family;
use crate::identity::{digest_of, identity_hashes};
use crate::ids::EventId;
use crate::tables::compaction_queue::{CompactionItem, QueueKey};
use crate::tables::identity_fields::FieldHashes;

/// What a row keeps of its command's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RowIdentity {
    #[serde(with = "crate::identity::serde_bytes_array")]
    pub digest: [u8; 32],
    /// The queue item that holds the field hashes until it falls due.
    pub retained: QueueKey,
}

/// An applied command's stored answer (its `Decision` less the id, which is the row's key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppliedRow {
    pub identity: RowIdentity,
    pub outcome: Outcome,
    pub commit_index: Option<BudgetCommitIndex>,
    pub log_id: Option<LogPosition>,
}

impl AppliedRow {
    /// The answer as it was first given.
    pub fn decision(&self, event_id: &EventId) -> Decision {
        Decision {
            event_id: event_id.clone(),
            outcome: self.outcome.clone(),
            commit_index: self.commit_index,
            log_id: self.log_id,
            replayed: false,
        }
    }
}

/// What a retained command keeps until it is compacted: its identity's field hashes, to name
/// the fields of a conflict, and its own event, which leaves the journal with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Retained {
    pub fields: FieldHashes,
    pub event: Option<BudgetCommitIndex>,
}

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
