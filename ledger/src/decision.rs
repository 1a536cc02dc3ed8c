//! What a command answers. Denials are decisions (journaled, with a commit index); errors are
//! not (see `error.rs`).

use serde::{Deserialize, Serialize};

use crate::account::AccountKey;
use crate::commit_index::{BudgetCommitIndex, LogPosition};
use crate::ids::{AttemptId, EventId, HoldId, NonceId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DenyRule {
    InvocationLimit,
    PerInvocationCostLimit,
    TotalCostLimit,
}

impl DenyRule {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvocationLimit => "invocation_limit",
            Self::PerInvocationCostLimit => "per_invocation_cost_limit",
            Self::TotalCostLimit => "total_cost_limit",
        }
    }
}

/// Which rule denied, on which account (the grant's own or an ancestor's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyReason {
    pub rule: DenyRule,
    pub account: AccountKey,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Authorized {
        hold_id: HoldId,
        exposure_units: u64,
    },
    Denied {
        reason: DenyReason,
    },
    Captured {
        hold_id: HoldId,
        attempt_id: AttemptId,
    },
    /// The hold was captured already: the caller proceeds only if the owner is its attempt.
    AlreadyCaptured {
        hold_id: HoldId,
        owner_attempt_id: AttemptId,
        capture_event_id: EventId,
        capture_commit_index: BudgetCommitIndex,
    },
    Cancelled {
        hold_id: HoldId,
        exposure_units: u64,
    },
    Reversed {
        hold_id: HoldId,
        exposure_units: u64,
    },
    /// Cleanup confirmed: the hold was reversed already (by expiry, cancel or another reverse).
    AlreadyReversed {
        hold_id: HoldId,
        by_event_id: EventId,
    },
    Released {
        hold_id: HoldId,
        released_units: u64,
        remaining_units: u64,
    },
    Reconciled {
        hold_id: HoldId,
        realized_units: u64,
        unspent_units: u64,
    },
    Incremented,
    Charged {
        cost_units: u64,
    },
    ChargeReversed {
        cost_units: u64,
    },
    ChargeReduced {
        cost_units: u64,
    },
    ChargeSettled {
        exposed_cost_units: u64,
        realized_spend_units: u64,
    },
    NonceConsumed {
        nonce_id: NonceId,
    },
    Resolved(Resolution),
    HoldsExpired {
        hold_ids: Vec<HoldId>,
        more_due: bool,
    },
}

impl Outcome {
    pub fn is_denied(&self) -> bool {
        matches!(self, Self::Denied { .. })
    }
}

/// `ResolveEvent`'s answer: the committed decision, or a final "not applied".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resolution {
    Applied(Box<Decision>),
    /// Tombstoned: that command can never apply.
    NotApplied,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub event_id: EventId,
    pub outcome: Outcome,
    /// The event this decision refers to: appended now, or the original one on replay.
    pub commit_index: Option<BudgetCommitIndex>,
    pub log_id: Option<LogPosition>,
    /// Answered from the stored outcome: nothing was appended or re-checked.
    pub replayed: bool,
}

impl Decision {
    pub(crate) fn replay_of(&self) -> Self {
        Self {
            replayed: true,
            ..self.clone()
        }
    }
}
