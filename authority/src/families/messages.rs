//! The messages the router sends to a family actor. Only the router sends them, one batch per
//! family per round, so the actor's FIFO mailbox is the family's log order.

use std::sync::Arc;

use tally_ledger::{ApplyCtx, ColdFetch, Command, Decision, Family, LedgerError, MovedRow};
use tokio::sync::oneshot;

/// A read (or a state capture) run against the family between two applies. It sends its own
/// answer, so one message type serves every read.
pub(crate) type FamilyRead = Box<dyn FnOnce(&Family) + Send>;

pub(crate) enum FamilyMsg {
    /// One family's commands of one round, in log order.
    Apply {
        commands: Vec<(ApplyCtx, Command)>,
        /// The answers for every id the commands name among the family's rows out of
        /// memory (empty when it has none).
        cold: ColdFetch,
        reply: oneshot::Sender<ApplyReply>,
    },
    Read(FamilyRead),
    /// A snapshot cut: the family itself, shared. The actor's next apply copies the family
    /// first if the cut still holds it (copy on write), so the cut costs the apply path a
    /// reference count, not an encoding of the whole family.
    Share(oneshot::Sender<Arc<Family>>),
}

/// `Err(reason)`: the family panicked (or its state was undecodable); the actor is gone.
pub(crate) type ApplyReply = Result<AppliedBatch, String>;

pub(crate) struct AppliedBatch {
    /// One per command, in the order sent.
    pub results: Vec<Result<Decision, LedgerError>>,
    /// The earliest of the family's next hold expiry and next compaction.
    pub maintenance_due_ms: Option<u64>,
    /// The family holds no state at all (every command was refused), so the router may
    /// forget it rather than keep an empty family in every snapshot.
    pub pristine: bool,
    /// The family holds live holds after the batch (for the router's `HoldIndex`).
    pub has_live_holds: bool,
    /// The family's estimated heap bytes after the batch (`Family::footprint_bytes`).
    pub footprint_bytes: usize,
    /// The rows the batch moved out of memory, for the router to store.
    pub moved: Vec<MovedRow>,
    /// The family's count of rows out of memory after the batch (`ColdMeta::rows`).
    pub cold_rows: u64,
}
