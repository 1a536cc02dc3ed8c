//! `tally hold ...` / `tally resolve ...` arguments, turned into ledger commands.

use clap::{Args, Subcommand};
use tally_ledger::{ClientCommand, CommandHeader, GrantLimits, Operation};

#[derive(Clone, Debug, Args)]
pub struct Target {
    #[arg(long)]
    pub family: String,
    #[arg(long)]
    pub capability: String,
    #[arg(long, default_value_t = 0)]
    pub grant: u32,
    #[arg(long)]
    pub hold: String,
    /// Defaults to `<hold>:<verb>` (for example `h1:authorize`); pass the kernel's id to
    /// replay or resolve one of its commands.
    #[arg(long)]
    pub event_id: Option<String>,
    /// Cluster time (ms since the epoch) after which the command must not apply; default now
    /// + 60 s. A retry of a lost command must reuse the original value.
    #[arg(long)]
    pub not_after_ms: Option<u64>,
}

#[derive(Clone, Debug, Subcommand)]
pub enum HoldCommand {
    /// Reserve a call slot and exposure on the grant's account.
    Authorize {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        units: u64,
        #[arg(long)]
        max_invocations: Option<u32>,
        #[arg(long)]
        max_cost_per_invocation: Option<u64>,
        #[arg(long)]
        max_total_cost: Option<u64>,
        #[arg(long)]
        currency: Option<String>,
        #[arg(long)]
        hold_timeout_ms: Option<u64>,
    },
    /// Cross the dispatch fence; the attempt id tells this capture from a twin's.
    Capture {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        attempt: String,
    },
    /// Give a captured hold back, only if the tool was never entered.
    Cancel {
        #[command(flatten)]
        target: Target,
    },
    /// Give an authorized hold back (its exact remaining exposure).
    Reverse {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        units: u64,
    },
    /// Release part of an authorized hold's exposure.
    Release {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        units: u64,
    },
    /// Make a captured hold's spend final.
    Reconcile {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        exposed: u64,
        #[arg(long)]
        realized: u64,
    },
}

impl HoldCommand {
    pub fn into_command(self) -> anyhow::Result<ClientCommand> {
        let (target, verb, op) = match self {
            HoldCommand::Authorize {
                target,
                units,
                max_invocations,
                max_cost_per_invocation,
                max_total_cost,
                currency,
                hold_timeout_ms,
            } => {
                let limits = GrantLimits {
                    max_invocations,
                    max_cost_per_invocation_units: max_cost_per_invocation,
                    max_total_cost_units: max_total_cost,
                    currency: currency.map(Into::into),
                };
                let op = Operation::AuthorizeHold {
                    hold_id: target.hold.as_str().into(),
                    requested_exposure_units: units,
                    limits,
                    ancestors: vec![],
                    hold_timeout_ms,
                };
                (target, "authorize", op)
            }
            HoldCommand::Capture { target, attempt } => {
                let op = Operation::CaptureInvocation {
                    hold_id: target.hold.as_str().into(),
                    attempt_id: attempt.into(),
                };
                (target, "capture", op)
            }
            HoldCommand::Cancel { target } => {
                let op = Operation::CancelCapturedBeforeDispatch {
                    hold_id: target.hold.as_str().into(),
                };
                (target, "cancel", op)
            }
            HoldCommand::Reverse { target, units } => {
                let op = Operation::ReverseHold {
                    hold_id: target.hold.as_str().into(),
                    exposure_units: units,
                };
                (target, "reverse", op)
            }
            HoldCommand::Release { target, units } => {
                let op = Operation::ReleaseHold {
                    hold_id: target.hold.as_str().into(),
                    released_exposure_units: units,
                };
                (target, "release", op)
            }
            HoldCommand::Reconcile {
                target,
                exposed,
                realized,
            } => {
                let op = Operation::ReconcileHold {
                    hold_id: target.hold.as_str().into(),
                    exposed_cost_units: exposed,
                    realized_spend_units: realized,
                };
                (target, "reconcile", op)
            }
        };
        let event_id = target
            .event_id
            .unwrap_or_else(|| format!("{}:{verb}", target.hold));
        let now_ms = crate::wall_clock_ms();
        let command = ClientCommand {
            header: CommandHeader {
                family_id: target.family.into(),
                capability_id: target.capability.into(),
                grant_index: target.grant,
                event_id: event_id.into(),
                not_after_ms: target.not_after_ms.unwrap_or(now_ms + 60_000),
            },
            op,
        };
        command.validate()?;
        Ok(command)
    }
}
