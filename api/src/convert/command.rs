//! Commands (docs/spec.md §4): each per-command request and the `Command` oneof ↔ the ledger's
//! `ClientCommand`/`Command`. The per-command rpcs and `Batch` meet in the same domain type,
//! so the authority has one path from the wire to the log.

use tally_ledger::{AncestorAccount, ClientCommand, Command, CommandHeader, Operation};

use super::{repeated_into, required};
use crate::error::WireError;
use crate::pb;
use crate::pb::command::Command as Op;

impl From<&CommandHeader> for pb::CommandHeader {
    fn from(header: &CommandHeader) -> Self {
        Self {
            family_id: header.family_id.to_string(),
            capability_id: header.capability_id.to_string(),
            grant_index: header.grant_index,
            event_id: header.event_id.to_string(),
            not_after_ms: header.not_after_ms,
        }
    }
}

impl From<pb::CommandHeader> for CommandHeader {
    fn from(header: pb::CommandHeader) -> Self {
        Self {
            family_id: header.family_id.into(),
            capability_id: header.capability_id.into(),
            grant_index: header.grant_index,
            event_id: header.event_id.into(),
            not_after_ms: header.not_after_ms,
        }
    }
}

impl From<&AncestorAccount> for pb::AncestorAccount {
    fn from(ancestor: &AncestorAccount) -> Self {
        Self {
            account: Some((&ancestor.account).into()),
            limits: Some((&ancestor.limits).into()),
        }
    }
}

impl TryFrom<pb::AncestorAccount> for AncestorAccount {
    type Error = WireError;

    fn try_from(ancestor: pb::AncestorAccount) -> Result<Self, WireError> {
        Ok(Self {
            account: required(ancestor.account, "account")?.into(),
            limits: required(ancestor.limits, "limits")?.into(),
        })
    }
}

fn command(header: Option<pb::CommandHeader>, op: Operation) -> Result<ClientCommand, WireError> {
    Ok(ClientCommand {
        header: required(header, "header")?.into(),
        op,
    })
}

/// Implements `TryFrom<$request> for ClientCommand` from a closure building the operation.
macro_rules! request_into_command {
    ($request:ty, |$r:ident| $op:expr) => {
        impl TryFrom<$request> for ClientCommand {
            type Error = WireError;

            fn try_from($r: $request) -> Result<Self, WireError> {
                let op = $op;
                command($r.header, op)
            }
        }
    };
}

request_into_command!(pb::AuthorizeHoldRequest, |r| Operation::AuthorizeHold {
    hold_id: r.hold_id.into(),
    requested_exposure_units: r.requested_exposure_units,
    limits: required(r.limits, "limits")?.into(),
    ancestors: repeated_into(r.ancestors, "ancestors")?,
    hold_timeout_ms: r.hold_timeout_ms,
});
request_into_command!(pb::CaptureInvocationRequest, |r| {
    Operation::CaptureInvocation {
        hold_id: r.hold_id.into(),
        attempt_id: r.attempt_id.into(),
    }
});
request_into_command!(pb::CancelCapturedBeforeDispatchRequest, |r| {
    Operation::CancelCapturedBeforeDispatch {
        hold_id: r.hold_id.into(),
    }
});
request_into_command!(pb::ReverseHoldRequest, |r| Operation::ReverseHold {
    hold_id: r.hold_id.into(),
    exposure_units: r.exposure_units,
});
request_into_command!(pb::ReleaseHoldRequest, |r| Operation::ReleaseHold {
    hold_id: r.hold_id.into(),
    released_exposure_units: r.released_exposure_units,
});
request_into_command!(pb::ReconcileHoldRequest, |r| Operation::ReconcileHold {
    hold_id: r.hold_id.into(),
    exposed_cost_units: r.exposed_cost_units,
    realized_spend_units: r.realized_spend_units,
});
request_into_command!(pb::TryIncrementRequest, |r| Operation::TryIncrement {
    limits: required(r.limits, "limits")?.into(),
});
request_into_command!(pb::TryChargeCostRequest, |r| Operation::TryChargeCost {
    cost_units: r.cost_units,
    limits: required(r.limits, "limits")?.into(),
});
request_into_command!(pb::ReverseChargeCostRequest, |r| {
    Operation::ReverseChargeCost {
        cost_units: r.cost_units,
    }
});
request_into_command!(pb::ReduceChargeCostRequest, |r| {
    Operation::ReduceChargeCost {
        cost_units: r.cost_units,
    }
});
request_into_command!(pb::SettleChargeCostRequest, |r| {
    Operation::SettleChargeCost {
        exposed_cost_units: r.exposed_cost_units,
        realized_spend_units: r.realized_spend_units,
    }
});
request_into_command!(pb::ConsumeNonceRequest, |r| Operation::ConsumeNonce {
    nonce_id: r.nonce_id.into(),
    expires_at_ms: r.expires_at_ms,
});

/// `ResolveEvent{original}` (docs/spec.md §5.4). The original must be a plain command: resolving
/// a resolve has no meaning.
impl TryFrom<pb::ResolveEventRequest> for Command {
    type Error = WireError;

    fn try_from(request: pb::ResolveEventRequest) -> Result<Self, WireError> {
        let original = *required(request.original, "original")?;
        let original = ClientCommand::try_from(original).map_err(|e| e.at("original"))?;
        Ok(Command::Resolve(original))
    }
}

/// A plain command; a `resolve_event` is refused because it is not a `ClientCommand`
/// (convert it to `Command` instead).
impl TryFrom<pb::Command> for ClientCommand {
    type Error = WireError;

    fn try_from(command: pb::Command) -> Result<Self, WireError> {
        let op = required(command.command, "command")?;
        let name = op_name(&op);
        let converted: Result<ClientCommand, WireError> = match op {
            Op::AuthorizeHold(r) => r.try_into(),
            Op::CaptureInvocation(r) => r.try_into(),
            Op::CancelCapturedBeforeDispatch(r) => r.try_into(),
            Op::ReverseHold(r) => r.try_into(),
            Op::ReleaseHold(r) => r.try_into(),
            Op::ReconcileHold(r) => r.try_into(),
            Op::TryIncrement(r) => r.try_into(),
            Op::TryChargeCost(r) => r.try_into(),
            Op::ReverseChargeCost(r) => r.try_into(),
            Op::ReduceChargeCost(r) => r.try_into(),
            Op::SettleChargeCost(r) => r.try_into(),
            Op::ConsumeNonce(r) => r.try_into(),
            Op::ResolveEvent(_) => {
                return Err(WireError::invalid(
                    name,
                    "a ResolveEvent cannot be the command it resolves",
                ))
            }
        };
        converted.map_err(|e| e.at(name))
    }
}

/// What a `Batch` entry or a forwarded write applies: a plain command or a resolve.
impl TryFrom<pb::Command> for Command {
    type Error = WireError;

    fn try_from(command: pb::Command) -> Result<Self, WireError> {
        match command.command {
            Some(Op::ResolveEvent(request)) => {
                Command::try_from(*request).map_err(|e| e.at("resolve_event"))
            }
            other => ClientCommand::try_from(pb::Command { command: other }).map(Command::Apply),
        }
    }
}

/// The oneof field name, which is also the snake_case rpc name.
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::AuthorizeHold(_) => "authorize_hold",
        Op::CaptureInvocation(_) => "capture_invocation",
        Op::CancelCapturedBeforeDispatch(_) => "cancel_captured_before_dispatch",
        Op::ReverseHold(_) => "reverse_hold",
        Op::ReleaseHold(_) => "release_hold",
        Op::ReconcileHold(_) => "reconcile_hold",
        Op::TryIncrement(_) => "try_increment",
        Op::TryChargeCost(_) => "try_charge_cost",
        Op::ReverseChargeCost(_) => "reverse_charge_cost",
        Op::ReduceChargeCost(_) => "reduce_charge_cost",
        Op::SettleChargeCost(_) => "settle_charge_cost",
        Op::ConsumeNonce(_) => "consume_nonce",
        Op::ResolveEvent(_) => "resolve_event",
    }
}

impl From<&ClientCommand> for pb::Command {
    fn from(command: &ClientCommand) -> Self {
        let header = Some(pb::CommandHeader::from(&command.header));
        let op = match &command.op {
            Operation::AuthorizeHold {
                hold_id,
                requested_exposure_units,
                limits,
                ancestors,
                hold_timeout_ms,
            } => Op::AuthorizeHold(pb::AuthorizeHoldRequest {
                header,
                hold_id: hold_id.to_string(),
                requested_exposure_units: *requested_exposure_units,
                limits: Some(limits.into()),
                ancestors: ancestors.iter().map(Into::into).collect(),
                hold_timeout_ms: *hold_timeout_ms,
            }),
            Operation::CaptureInvocation {
                hold_id,
                attempt_id,
            } => Op::CaptureInvocation(pb::CaptureInvocationRequest {
                header,
                hold_id: hold_id.to_string(),
                attempt_id: attempt_id.to_string(),
            }),
            Operation::CancelCapturedBeforeDispatch { hold_id } => {
                Op::CancelCapturedBeforeDispatch(pb::CancelCapturedBeforeDispatchRequest {
                    header,
                    hold_id: hold_id.to_string(),
                })
            }
            Operation::ReverseHold {
                hold_id,
                exposure_units,
            } => Op::ReverseHold(pb::ReverseHoldRequest {
                header,
                hold_id: hold_id.to_string(),
                exposure_units: *exposure_units,
            }),
            Operation::ReleaseHold {
                hold_id,
                released_exposure_units,
            } => Op::ReleaseHold(pb::ReleaseHoldRequest {
                header,
                hold_id: hold_id.to_string(),
                released_exposure_units: *released_exposure_units,
            }),
            Operation::ReconcileHold {
                hold_id,
                exposed_cost_units,
                realized_spend_units,
            } => Op::ReconcileHold(pb::ReconcileHoldRequest {
                header,
                hold_id: hold_id.to_string(),
                exposed_cost_units: *exposed_cost_units,
                realized_spend_units: *realized_spend_units,
            }),
            Operation::TryIncrement { limits } => Op::TryIncrement(pb::TryIncrementRequest {
                header,
                limits: Some(limits.into()),
            }),
            Operation::TryChargeCost { cost_units, limits } => {
                Op::TryChargeCost(pb::TryChargeCostRequest {
                    header,
                    cost_units: *cost_units,
                    limits: Some(limits.into()),
                })
            }
            Operation::ReverseChargeCost { cost_units } => {
                Op::ReverseChargeCost(pb::ReverseChargeCostRequest {
                    header,
                    cost_units: *cost_units,
                })
            }
            Operation::ReduceChargeCost { cost_units } => {
                Op::ReduceChargeCost(pb::ReduceChargeCostRequest {
                    header,
                    cost_units: *cost_units,
                })
            }
            Operation::SettleChargeCost {
                exposed_cost_units,
                realized_spend_units,
            } => Op::SettleChargeCost(pb::SettleChargeCostRequest {
                header,
                exposed_cost_units: *exposed_cost_units,
                realized_spend_units: *realized_spend_units,
            }),
            Operation::ConsumeNonce {
                nonce_id,
                expires_at_ms,
            } => Op::ConsumeNonce(pb::ConsumeNonceRequest {
                header,
                nonce_id: nonce_id.to_string(),
                expires_at_ms: *expires_at_ms,
            }),
        };
        Self { command: Some(op) }
    }
}

impl From<ClientCommand> for pb::Command {
    fn from(command: ClientCommand) -> Self {
        Self::from(&command)
    }
}

impl From<&ClientCommand> for pb::ResolveEventRequest {
    fn from(original: &ClientCommand) -> Self {
        Self {
            original: Some(Box::new(original.into())),
        }
    }
}

/// `ExpireHolds` is internal (proposed only by the leader, refused from clients), so it has
/// no client wire form and is refused here.
impl TryFrom<&Command> for pb::Command {
    type Error = WireError;

    fn try_from(command: &Command) -> Result<Self, WireError> {
        match command {
            Command::Apply(command) => Ok(command.into()),
            Command::Resolve(original) => Ok(Self {
                command: Some(Op::ResolveEvent(Box::new(original.into()))),
            }),
            Command::ExpireHolds { .. } => Err(WireError::invalid(
                "command",
                "expire_holds is internal to the cluster and has no client wire form",
            )),
        }
    }
}

impl pb::Command {
    /// The header of the command (of the original, for a resolve), for routing and logging
    /// before the full conversion.
    pub fn header(&self) -> Option<&pb::CommandHeader> {
        match self.command.as_ref()? {
            Op::AuthorizeHold(r) => r.header.as_ref(),
            Op::CaptureInvocation(r) => r.header.as_ref(),
            Op::CancelCapturedBeforeDispatch(r) => r.header.as_ref(),
            Op::ReverseHold(r) => r.header.as_ref(),
            Op::ReleaseHold(r) => r.header.as_ref(),
            Op::ReconcileHold(r) => r.header.as_ref(),
            Op::TryIncrement(r) => r.header.as_ref(),
            Op::TryChargeCost(r) => r.header.as_ref(),
            Op::ReverseChargeCost(r) => r.header.as_ref(),
            Op::ReduceChargeCost(r) => r.header.as_ref(),
            Op::SettleChargeCost(r) => r.header.as_ref(),
            Op::ConsumeNonce(r) => r.header.as_ref(),
            Op::ResolveEvent(r) => r.original.as_deref()?.header(),
        }
    }

    /// The snake_case command name (`"authorize_hold"`, `"resolve_event"`, ...), if set.
    pub fn name(&self) -> Option<&'static str> {
        self.command.as_ref().map(op_name)
    }
}

impl pb::BatchRequest {
    /// Converts every command, keeping a malformed one as its own error so the rest of the
    /// batch still applies; errors name `commands[i]`.
    pub fn into_commands(self) -> Vec<Result<Command, WireError>> {
        self.commands
            .into_iter()
            .enumerate()
            .map(|(i, command)| {
                Command::try_from(command).map_err(|e| e.at(&format!("commands[{i}]")))
            })
            .collect()
    }
}
