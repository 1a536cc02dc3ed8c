//! What a command came to, as far as the client can know. Only `Decided` and the definite
//! refusals say anything about funds; `Unknown` must never be read as a no.

use tally_ledger::{Decision, EventId, LedgerError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed and applied: the ledger's decision (denials included).
    Decided(Decision),
    /// The ledger refused it (validation, conflict, precondition, overflow, or `NoSpace`
    /// while that alarm is raised: retry the same event id once it is cleared): not applied.
    Refused(LedgerError),
    /// No node would take it before the deadline and it was never proposed: not applied.
    Unavailable { reason: String },
    /// `ResolveEvent` tombstoned it: it did not apply and never will.
    NotApplied { event_id: EventId },
    /// No quorum answered in time: it may still apply. Keep the event id and resolve later.
    Unknown { event_id: EventId, reason: String },
}

impl Outcome {
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Self::Decided(decision) => Some(decision),
            _ => None,
        }
    }
}
