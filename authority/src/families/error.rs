//! The router's errors. Ledger refusals are not errors here (they are per-command results);
//! these are node faults. The fatal ones mean the node must stop rather than serve a state that
//! may differ from its peers'.

use tally_ledger::{FamilyId, LogPosition};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// A family actor panicked, could not decode its state, or stopped without answering.
    #[error("family {family_id} failed: {reason}")]
    FamilyFailed { family_id: FamilyId, reason: String },
    /// Entries must come in strictly increasing log order.
    #[error("log order broken: entry {got:?} after {last:?}")]
    LogOrder { last: LogPosition, got: LogPosition },
    #[error("could not spawn the actor of family {family_id}: {reason}")]
    Spawn { family_id: FamilyId, reason: String },
    /// A router snapshot that cannot be encoded, decoded or trusted.
    #[error("router snapshot: {0}")]
    Snapshot(String),
    /// A fatal error happened earlier; the router refuses all further work.
    #[error("the router halted after a fatal error: {0}")]
    Halted(String),
    /// The family store (the spill file of passivated families) failed: the node cannot
    /// reach part of its state, so it stops.
    #[error("family store: {0}")]
    Store(String),
    /// An entry raises the rules to a version this release does not know: applying on under
    /// older rules would leave this node's state apart from its peers'.
    #[error(
        "entry {at:?} raises the rules to version {version}; this release applies up to \
         {supported}: upgrade this node"
    )]
    RulesUnknown {
        at: LogPosition,
        version: u32,
        supported: u32,
    },
    #[error("invalid router config: {0}")]
    Config(String),
    /// A family actor stopped before answering a read queued to it: the router was replaced
    /// (a snapshot install) or shut down, or the family failed. `families::read` starts the
    /// read again once; this is never a partial answer.
    #[error("a read of family {family_id} was interrupted: its actor stopped before answering")]
    ReadInterrupted { family_id: FamilyId },
}

impl RouterError {
    /// Whether the node must stop: its state may no longer match its peers'.
    /// `Snapshot` and `Config` are not: they refuse to build a router and change nothing;
    /// nor is `ReadInterrupted`: a read changes nothing.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            Self::Config(_) | Self::Snapshot(_) | Self::ReadInterrupted { .. }
        )
    }
}

/// A store failure: what could not be done, and why.
pub(super) fn store_error(what: &str, error: impl std::fmt::Display) -> RouterError {
    RouterError::Store(format!("could not {what}: {error}"))
}
