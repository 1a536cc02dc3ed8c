//! Decisions (docs/spec.md §4–6): every ledger `Outcome` ↔ the `Outcome` oneof, plus the log id and
//! the authority's cluster stamp. The client needs the way back to act on typed outcomes.

use tally_ledger::{
    BudgetCommitIndex, Decision, DenyReason, DenyRule, LogPosition, Outcome, Resolution,
};

use super::{enum_field, required};
use crate::error::WireError;
use crate::pb;
use crate::pb::outcome::Outcome as Wire;
use crate::GUARANTEE_LEVEL;

impl From<DenyRule> for pb::DenyRule {
    fn from(rule: DenyRule) -> Self {
        match rule {
            DenyRule::InvocationLimit => Self::InvocationLimit,
            DenyRule::PerInvocationCostLimit => Self::PerInvocationCostLimit,
            DenyRule::TotalCostLimit => Self::TotalCostLimit,
        }
    }
}

impl TryFrom<pb::DenyRule> for DenyRule {
    type Error = WireError;

    fn try_from(rule: pb::DenyRule) -> Result<Self, WireError> {
        match rule {
            pb::DenyRule::InvocationLimit => Ok(Self::InvocationLimit),
            pb::DenyRule::PerInvocationCostLimit => Ok(Self::PerInvocationCostLimit),
            pb::DenyRule::TotalCostLimit => Ok(Self::TotalCostLimit),
            pb::DenyRule::Unspecified => Err(WireError::missing("")),
        }
    }
}

impl From<&DenyReason> for pb::DenyReason {
    fn from(reason: &DenyReason) -> Self {
        Self {
            rule: pb::DenyRule::from(reason.rule).into(),
            account: Some((&reason.account).into()),
        }
    }
}

impl TryFrom<pb::DenyReason> for DenyReason {
    type Error = WireError;

    fn try_from(reason: pb::DenyReason) -> Result<Self, WireError> {
        let rule: pb::DenyRule = enum_field(reason.rule, "rule")?;
        Ok(Self {
            rule: DenyRule::try_from(rule).map_err(|e| e.at("rule"))?,
            account: required(reason.account, "account")?.into(),
        })
    }
}

impl From<LogPosition> for pb::LogId {
    fn from(position: LogPosition) -> Self {
        Self {
            term: position.term,
            index: position.index,
        }
    }
}

impl From<pb::LogId> for LogPosition {
    fn from(id: pb::LogId) -> Self {
        Self {
            term: id.term,
            index: id.index,
        }
    }
}

impl pb::ClusterStamp {
    /// The stamp every decision carries (docs/spec.md §6): the cluster and the Raft entry that
    /// answered the request.
    pub fn raft_linearizable(cluster_id: impl Into<String>, term: u64, log_index: u64) -> Self {
        Self {
            cluster_id: cluster_id.into(),
            term,
            log_index,
            guarantee_level: GUARANTEE_LEVEL.to_owned(),
        }
    }
}

fn outcome_to_wire(outcome: &Outcome) -> Wire {
    match outcome {
        Outcome::Authorized {
            hold_id,
            exposure_units,
        } => Wire::Authorized(pb::Authorized {
            hold_id: hold_id.to_string(),
            exposure_units: *exposure_units,
        }),
        Outcome::Denied { reason } => Wire::Denied(pb::Denied {
            reason: Some(reason.into()),
        }),
        Outcome::Captured {
            hold_id,
            attempt_id,
        } => Wire::Captured(pb::Captured {
            hold_id: hold_id.to_string(),
            attempt_id: attempt_id.to_string(),
        }),
        Outcome::AlreadyCaptured {
            hold_id,
            owner_attempt_id,
            capture_event_id,
            capture_commit_index,
        } => Wire::AlreadyCaptured(pb::AlreadyCaptured {
            hold_id: hold_id.to_string(),
            owner_attempt_id: owner_attempt_id.to_string(),
            capture_event_id: capture_event_id.to_string(),
            capture_commit_index: capture_commit_index.0,
        }),
        Outcome::Cancelled {
            hold_id,
            exposure_units,
        } => Wire::Cancelled(pb::Cancelled {
            hold_id: hold_id.to_string(),
            exposure_units: *exposure_units,
        }),
        Outcome::Reversed {
            hold_id,
            exposure_units,
        } => Wire::Reversed(pb::Reversed {
            hold_id: hold_id.to_string(),
            exposure_units: *exposure_units,
        }),
        Outcome::AlreadyReversed {
            hold_id,
            by_event_id,
        } => Wire::AlreadyReversed(pb::AlreadyReversed {
            hold_id: hold_id.to_string(),
            by_event_id: by_event_id.to_string(),
        }),
        Outcome::Released {
            hold_id,
            released_units,
            remaining_units,
        } => Wire::Released(pb::Released {
            hold_id: hold_id.to_string(),
            released_units: *released_units,
            remaining_units: *remaining_units,
        }),
        Outcome::Reconciled {
            hold_id,
            realized_units,
            unspent_units,
        } => Wire::Reconciled(pb::Reconciled {
            hold_id: hold_id.to_string(),
            realized_units: *realized_units,
            unspent_units: *unspent_units,
        }),
        Outcome::Incremented => Wire::Incremented(pb::Incremented {}),
        Outcome::Charged { cost_units } => Wire::Charged(pb::Charged {
            cost_units: *cost_units,
        }),
        Outcome::ChargeReversed { cost_units } => Wire::ChargeReversed(pb::ChargeReversed {
            cost_units: *cost_units,
        }),
        Outcome::ChargeReduced { cost_units } => Wire::ChargeReduced(pb::ChargeReduced {
            cost_units: *cost_units,
        }),
        Outcome::ChargeSettled {
            exposed_cost_units,
            realized_spend_units,
        } => Wire::ChargeSettled(pb::ChargeSettled {
            exposed_cost_units: *exposed_cost_units,
            realized_spend_units: *realized_spend_units,
        }),
        Outcome::NonceConsumed { nonce_id } => Wire::NonceConsumed(pb::NonceConsumed {
            nonce_id: nonce_id.to_string(),
        }),
        Outcome::Resolved(resolution) => {
            let resolution = match resolution {
                Resolution::Applied(decision) => {
                    pb::resolved::Resolution::Applied(Box::new((&**decision).into()))
                }
                Resolution::NotApplied => pb::resolved::Resolution::NotApplied(pb::NotApplied {}),
            };
            Wire::Resolved(Box::new(pb::Resolved {
                resolution: Some(resolution),
            }))
        }
        Outcome::HoldsExpired { hold_ids, more_due } => Wire::HoldsExpired(pb::HoldsExpired {
            hold_ids: hold_ids.iter().map(ToString::to_string).collect(),
            more_due: *more_due,
        }),
    }
}

fn outcome_from_wire(outcome: Wire) -> Result<Outcome, WireError> {
    Ok(match outcome {
        Wire::Authorized(o) => Outcome::Authorized {
            hold_id: o.hold_id.into(),
            exposure_units: o.exposure_units,
        },
        Wire::Denied(o) => Outcome::Denied {
            reason: DenyReason::try_from(required(o.reason, "denied.reason")?)
                .map_err(|e| e.at("denied.reason"))?,
        },
        Wire::Captured(o) => Outcome::Captured {
            hold_id: o.hold_id.into(),
            attempt_id: o.attempt_id.into(),
        },
        Wire::AlreadyCaptured(o) => Outcome::AlreadyCaptured {
            hold_id: o.hold_id.into(),
            owner_attempt_id: o.owner_attempt_id.into(),
            capture_event_id: o.capture_event_id.into(),
            capture_commit_index: BudgetCommitIndex(o.capture_commit_index),
        },
        Wire::Cancelled(o) => Outcome::Cancelled {
            hold_id: o.hold_id.into(),
            exposure_units: o.exposure_units,
        },
        Wire::Reversed(o) => Outcome::Reversed {
            hold_id: o.hold_id.into(),
            exposure_units: o.exposure_units,
        },
        Wire::AlreadyReversed(o) => Outcome::AlreadyReversed {
            hold_id: o.hold_id.into(),
            by_event_id: o.by_event_id.into(),
        },
        Wire::Released(o) => Outcome::Released {
            hold_id: o.hold_id.into(),
            released_units: o.released_units,
            remaining_units: o.remaining_units,
        },
        Wire::Reconciled(o) => Outcome::Reconciled {
            hold_id: o.hold_id.into(),
            realized_units: o.realized_units,
            unspent_units: o.unspent_units,
        },
        Wire::Incremented(pb::Incremented {}) => Outcome::Incremented,
        Wire::Charged(o) => Outcome::Charged {
            cost_units: o.cost_units,
        },
        Wire::ChargeReversed(o) => Outcome::ChargeReversed {
            cost_units: o.cost_units,
        },
        Wire::ChargeReduced(o) => Outcome::ChargeReduced {
            cost_units: o.cost_units,
        },
        Wire::ChargeSettled(o) => Outcome::ChargeSettled {
            exposed_cost_units: o.exposed_cost_units,
            realized_spend_units: o.realized_spend_units,
        },
        Wire::NonceConsumed(o) => Outcome::NonceConsumed {
            nonce_id: o.nonce_id.into(),
        },
        Wire::Resolved(o) => {
            let resolution = match required(o.resolution, "resolved.resolution")? {
                pb::resolved::Resolution::Applied(decision) => Resolution::Applied(Box::new(
                    Decision::try_from(*decision).map_err(|e| e.at("resolved.applied"))?,
                )),
                pb::resolved::Resolution::NotApplied(pb::NotApplied {}) => Resolution::NotApplied,
            };
            Outcome::Resolved(resolution)
        }
        Wire::HoldsExpired(o) => Outcome::HoldsExpired {
            hold_ids: o.hold_ids.into_iter().map(Into::into).collect(),
            more_due: o.more_due,
        },
    })
}

impl From<&Outcome> for pb::Outcome {
    fn from(outcome: &Outcome) -> Self {
        Self {
            outcome: Some(outcome_to_wire(outcome)),
        }
    }
}

impl TryFrom<pb::Outcome> for Outcome {
    type Error = WireError;

    fn try_from(outcome: pb::Outcome) -> Result<Self, WireError> {
        outcome_from_wire(required(outcome.outcome, "outcome")?)
    }
}

/// The ledger's answer; `cluster` is left empty for the authority to stamp.
impl From<&Decision> for pb::Decision {
    fn from(decision: &Decision) -> Self {
        Self {
            event_id: decision.event_id.to_string(),
            outcome: Some(Box::new((&decision.outcome).into())),
            budget_commit_index: decision.commit_index.map(|index| index.0),
            log_id: decision.log_id.map(Into::into),
            replayed: decision.replayed,
            cluster: None,
        }
    }
}

impl From<Decision> for pb::Decision {
    fn from(decision: Decision) -> Self {
        Self::from(&decision)
    }
}

/// Drops the cluster stamp: the ledger's decision is the same on every replica, the stamp
/// is not.
impl TryFrom<pb::Decision> for Decision {
    type Error = WireError;

    fn try_from(decision: pb::Decision) -> Result<Self, WireError> {
        let outcome = *required(decision.outcome, "outcome")?;
        Ok(Self {
            event_id: decision.event_id.into(),
            outcome: Outcome::try_from(outcome).map_err(|e| e.at("outcome"))?,
            commit_index: decision.budget_commit_index.map(BudgetCommitIndex),
            log_id: decision.log_id.map(Into::into),
            replayed: decision.replayed,
        })
    }
}
