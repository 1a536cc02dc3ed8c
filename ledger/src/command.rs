//! The commands of docs/spec.md §4. Every mutating command names its family, account, `event_id`
//! (the dedupe key) and `not_after_ms` (the cluster time after which it must not apply).

use serde::{Deserialize, Serialize};

use crate::account::{validate_grant_index, AccountKey, GrantLimits};
use crate::error::LedgerError;
use crate::ids::{AttemptId, CapabilityId, EventId, FamilyId, HoldId, NonceId};
use crate::limits::{MAX_ANCESTORS, MAX_HOLD_TIMEOUT_MS};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandHeader {
    pub family_id: FamilyId,
    pub capability_id: CapabilityId,
    pub grant_index: u32,
    pub event_id: EventId,
    pub not_after_ms: u64,
}

impl CommandHeader {
    pub fn account(&self) -> AccountKey {
        AccountKey {
            capability_id: self.capability_id.clone(),
            grant_index: self.grant_index,
        }
    }
}

/// An ancestor grant account a delegated hold also reserves on (docs/spec.md §8).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AncestorAccount {
    pub account: AccountKey,
    pub limits: GrantLimits,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    AuthorizeHold {
        hold_id: HoldId,
        requested_exposure_units: u64,
        limits: GrantLimits,
        ancestors: Vec<AncestorAccount>,
        hold_timeout_ms: Option<u64>,
    },
    CaptureInvocation {
        hold_id: HoldId,
        attempt_id: AttemptId,
    },
    CancelCapturedBeforeDispatch {
        hold_id: HoldId,
    },
    ReverseHold {
        hold_id: HoldId,
        exposure_units: u64,
    },
    ReleaseHold {
        hold_id: HoldId,
        released_exposure_units: u64,
    },
    ReconcileHold {
        hold_id: HoldId,
        exposed_cost_units: u64,
        realized_spend_units: u64,
    },
    TryIncrement {
        limits: GrantLimits,
    },
    TryChargeCost {
        cost_units: u64,
        limits: GrantLimits,
    },
    ReverseChargeCost {
        cost_units: u64,
    },
    ReduceChargeCost {
        cost_units: u64,
    },
    SettleChargeCost {
        exposed_cost_units: u64,
        realized_spend_units: u64,
    },
    ConsumeNonce {
        nonce_id: NonceId,
        expires_at_ms: u64,
    },
}

impl Operation {
    /// The snake_case name used in identities, logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::AuthorizeHold { .. } => "authorize_hold",
            Self::CaptureInvocation { .. } => "capture_invocation",
            Self::CancelCapturedBeforeDispatch { .. } => "cancel_captured_before_dispatch",
            Self::ReverseHold { .. } => "reverse_hold",
            Self::ReleaseHold { .. } => "release_hold",
            Self::ReconcileHold { .. } => "reconcile_hold",
            Self::TryIncrement { .. } => "try_increment",
            Self::TryChargeCost { .. } => "try_charge_cost",
            Self::ReverseChargeCost { .. } => "reverse_charge_cost",
            Self::ReduceChargeCost { .. } => "reduce_charge_cost",
            Self::SettleChargeCost { .. } => "settle_charge_cost",
            Self::ConsumeNonce { .. } => "consume_nonce",
        }
    }

    /// Whether the command opens new exposure, and so is refused while the `NoSpace` alarm is
    /// raised (docs/spec.md §5.6). Everything else works on holds and charges that already
    /// exist, and must still apply so that a short disk never strands reserved funds.
    pub fn opens_exposure(&self) -> bool {
        match self {
            Self::AuthorizeHold { .. }
            | Self::TryIncrement { .. }
            | Self::TryChargeCost { .. }
            | Self::ConsumeNonce { .. } => true,
            Self::CaptureInvocation { .. }
            | Self::CancelCapturedBeforeDispatch { .. }
            | Self::ReverseHold { .. }
            | Self::ReleaseHold { .. }
            | Self::ReconcileHold { .. }
            | Self::ReverseChargeCost { .. }
            | Self::ReduceChargeCost { .. }
            | Self::SettleChargeCost { .. } => false,
        }
    }

    pub fn hold_id(&self) -> Option<&HoldId> {
        match self {
            Self::AuthorizeHold { hold_id, .. }
            | Self::CaptureInvocation { hold_id, .. }
            | Self::CancelCapturedBeforeDispatch { hold_id }
            | Self::ReverseHold { hold_id, .. }
            | Self::ReleaseHold { hold_id, .. }
            | Self::ReconcileHold { hold_id, .. } => Some(hold_id),
            _ => None,
        }
    }
}

/// A command a client (kernel) sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientCommand {
    pub header: CommandHeader,
    pub op: Operation,
}

impl ClientCommand {
    /// Everything checkable without state (docs/spec.md §4 "ids and limits valid"). A command
    /// that fails here is refused before it is proposed.
    pub fn validate(&self) -> Result<(), LedgerError> {
        let h = &self.header;
        h.family_id.validate()?;
        h.capability_id.validate()?;
        validate_grant_index(h.grant_index)?;
        h.event_id.validate_client()?;
        if let Some(hold_id) = self.op.hold_id() {
            hold_id.validate()?;
        }
        match &self.op {
            Operation::AuthorizeHold {
                requested_exposure_units,
                limits,
                ancestors,
                hold_timeout_ms,
                ..
            } => {
                limits.validate("limits")?;
                if *requested_exposure_units > 0 && limits.currency.is_none() {
                    return Err(LedgerError::invalid(
                        "requested_exposure_units",
                        "exposure needs a grant currency",
                    ));
                }
                if !ancestors.is_empty() {
                    validate_ancestors(&h.account(), limits, ancestors)?;
                }
                if let Some(timeout) = hold_timeout_ms {
                    if *timeout == 0 || *timeout > MAX_HOLD_TIMEOUT_MS {
                        return Err(LedgerError::invalid(
                            "hold_timeout_ms",
                            format!("must be 1..={MAX_HOLD_TIMEOUT_MS}"),
                        ));
                    }
                }
            }
            Operation::CaptureInvocation { attempt_id, .. } => attempt_id.validate()?,
            Operation::ReleaseHold {
                released_exposure_units,
                ..
            } => require_positive("released_exposure_units", *released_exposure_units)?,
            Operation::ReconcileHold {
                exposed_cost_units,
                realized_spend_units,
                ..
            }
            | Operation::SettleChargeCost {
                exposed_cost_units,
                realized_spend_units,
            } => {
                require_positive("exposed_cost_units", *exposed_cost_units)?;
                if realized_spend_units > exposed_cost_units {
                    return Err(LedgerError::invalid(
                        "realized_spend_units",
                        "must not exceed exposed_cost_units",
                    ));
                }
            }
            Operation::TryIncrement { limits } => limits.validate("limits")?,
            Operation::TryChargeCost { cost_units, limits } => {
                limits.validate("limits")?;
                if *cost_units > 0 && limits.currency.is_none() {
                    return Err(LedgerError::invalid(
                        "cost_units",
                        "cost needs a grant currency",
                    ));
                }
            }
            Operation::ReduceChargeCost { cost_units } => {
                require_positive("cost_units", *cost_units)?
            }
            Operation::ConsumeNonce { nonce_id, .. } => nonce_id.validate()?,
            Operation::CancelCapturedBeforeDispatch { .. }
            | Operation::ReverseHold { .. }
            | Operation::ReverseChargeCost { .. } => {}
        }
        Ok(())
    }
}

fn require_positive(field: &str, value: u64) -> Result<(), LedgerError> {
    if value == 0 {
        return Err(LedgerError::invalid(field, "must be greater than zero"));
    }
    Ok(())
}

fn validate_ancestors(
    grant: &AccountKey,
    grant_limits: &GrantLimits,
    ancestors: &[AncestorAccount],
) -> Result<(), LedgerError> {
    if ancestors.len() > MAX_ANCESTORS {
        return Err(LedgerError::invalid(
            "ancestors",
            format!("{} given, at most {MAX_ANCESTORS} allowed", ancestors.len()),
        ));
    }
    for (position, ancestor) in ancestors.iter().enumerate() {
        ancestor.account.validate()?;
        ancestor.limits.validate("ancestors.limits")?;
        // The accounts seen so far, the grant's and the ancestors' before this one; at most
        // 8, so a scan beats building a set (and allocates nothing).
        let mut seen_before = std::iter::once(grant)
            .chain(ancestors[..position].iter().map(|earlier| &earlier.account));
        if seen_before.any(|seen| seen == &ancestor.account) {
            return Err(LedgerError::invalid(
                "ancestors",
                format!("account {:?} appears twice in the hold", ancestor.account),
            ));
        }
        if ancestor.limits.currency.is_some()
            && grant_limits.currency.is_some()
            && ancestor.limits.currency != grant_limits.currency
        {
            return Err(LedgerError::invalid(
                "ancestors",
                "an ancestor grant has another currency",
            ));
        }
    }
    Ok(())
}

/// What the state machine applies for one family.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Apply(ClientCommand),
    /// `ResolveEvent{original}` (docs/spec.md §5.4): routed like the original.
    Resolve(ClientCommand),
    /// Internal: proposed only by the leader, refused from clients.
    ExpireHolds {
        family_id: FamilyId,
        up_to_ms: u64,
    },
}

impl Command {
    pub fn family_id(&self) -> &FamilyId {
        match self {
            Self::Apply(cmd) | Self::Resolve(cmd) => &cmd.header.family_id,
            Self::ExpireHolds { family_id, .. } => family_id,
        }
    }

    /// The command's own event id, when it has one.
    pub fn event_id(&self) -> Option<&EventId> {
        match self {
            Self::Apply(cmd) | Self::Resolve(cmd) => Some(&cmd.header.event_id),
            Self::ExpireHolds { .. } => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Apply(cmd) => cmd.op.name(),
            Self::Resolve(_) => "resolve_event",
            Self::ExpireHolds { .. } => "expire_holds",
        }
    }

    pub fn validate(&self) -> Result<(), LedgerError> {
        match self {
            Self::Apply(cmd) | Self::Resolve(cmd) => cmd.validate(),
            Self::ExpireHolds { family_id, .. } => family_id.validate(),
        }
    }
}
