//! Step 1 of docs/spec.md §9: authorize a hold on the first matching grant that admits the call.
//! A `Denied` grant falls through to the next; anything else stops here. In particular an
//! `AlreadyCaptured` replay never falls through: that request was already run on an earlier
//! grant, and a later (say unlimited) grant must not run it again.

use tally_client::{ids, Outcome};
use tally_ledger::{
    ClientCommand, CommandHeader, HoldId, Operation, Outcome as LedgerOutcome, PreconditionCode,
};

use super::evaluation::{deny, unexpected, Evaluation, Held, Step, Stop};
use super::reasons;
use crate::receipt::{BudgetAuthorityMetadata, BudgetStep};
use crate::token::VerifiedCapability;

impl Evaluation<'_> {
    /// `preflight`: the nonce preflight's hold, under its own id so it never blocks the call.
    pub(super) async fn authorize(
        &mut self,
        capability: &VerifiedCapability,
        grants: &[u32],
        preflight: bool,
    ) -> Step<Held> {
        let mut last_denial = None;
        for &grant_index in grants {
            let (Some(limits), Some(ancestors)) = (
                capability.grant_limits(grant_index),
                capability.ancestor_accounts(grant_index),
            ) else {
                return deny(format!("grant {grant_index} cannot be resolved"));
            };
            let exposure = if limits.currency.is_some() {
                limits
                    .max_cost_per_invocation_units
                    .or(limits.max_total_cost_units)
                    .unwrap_or(0)
            } else {
                0
            };
            let hold_id = if preflight {
                HoldId::new(format!(
                    "nonce-preflight-budget-hold:{}:{}:{grant_index}",
                    self.request.request_id,
                    capability.capability_id()
                ))
            } else {
                match ids::hold_id(
                    &self.request.request_id,
                    capability.capability_id(),
                    grant_index,
                ) {
                    Ok(hold_id) => hold_id,
                    Err(error) => return deny(error.to_string()),
                }
            };
            let header = CommandHeader {
                family_id: capability.family_id().clone(),
                capability_id: capability.capability_id().clone(),
                grant_index,
                event_id: ids::authorize_event(&hold_id),
                not_after_ms: self.not_after_ms(),
            };
            let timeout = if preflight {
                self.kernel.config.preflight_hold_timeout_ms
            } else {
                self.kernel.config.hold_timeout_ms
            };
            let command = ClientCommand {
                header: header.clone(),
                op: Operation::AuthorizeHold {
                    hold_id: hold_id.clone(),
                    requested_exposure_units: exposure,
                    limits: limits.clone(),
                    ancestors,
                    hold_timeout_ms: Some(timeout),
                },
            };
            let mut budget = BudgetAuthorityMetadata::new(hold_id.clone());
            budget.grant_index(grant_index);
            let outcome = self.kernel.ledger.submit(command).await;
            match outcome {
                Outcome::Decided(decision) => {
                    if let Some(index) = decision.commit_index {
                        budget.committed(BudgetStep::Authorize, decision.event_id.clone(), index);
                    }
                    if let (Some(cluster_id), Some(log_id)) =
                        (self.kernel.ledger.cluster_id(), decision.log_id)
                    {
                        budget.cluster(&cluster_id, log_id.term, tally_api::GUARANTEE_LEVEL);
                    }
                    match decision.outcome {
                        LedgerOutcome::Authorized { exposure_units, .. } => {
                            let Some(authorize_index) = decision.commit_index else {
                                self.budget = Some(budget);
                                return deny("budget authority answered without a commit index");
                            };
                            self.budget = Some(budget);
                            return Ok(Held {
                                hold_id,
                                header,
                                authorize_index,
                                exposure: exposure_units,
                                limits,
                            });
                        }
                        LedgerOutcome::Denied { reason } => {
                            budget.denied(BudgetStep::Authorize, reason.rule.as_str());
                            self.budget = Some(budget);
                            last_denial = Some(format!(
                                "budget denied: {} on account {}:{}",
                                reason.rule.as_str(),
                                reason.account.capability_id,
                                reason.account.grant_index
                            ));
                        }
                        LedgerOutcome::AlreadyCaptured {
                            owner_attempt_id,
                            capture_event_id,
                            capture_commit_index,
                            ..
                        } => {
                            budget
                                .committed(
                                    BudgetStep::InvocationCapture,
                                    capture_event_id,
                                    capture_commit_index,
                                )
                                .attempt(BudgetStep::InvocationCapture, owner_attempt_id);
                            self.budget = Some(budget);
                            return deny(reasons::ALREADY_CAPTURED);
                        }
                        other => {
                            self.budget = Some(budget);
                            return Err(unexpected("authorize", &other));
                        }
                    }
                }
                Outcome::Refused(error) => {
                    self.budget = Some(budget);
                    if error.precondition_code() == Some(PreconditionCode::TerminallyReversed) {
                        return deny(reasons::TERMINALLY_REVERSED);
                    }
                    return deny(format!("budget authority refused the hold: {error}"));
                }
                Outcome::Unavailable { reason } => {
                    self.budget = Some(budget);
                    return deny(format!("{}: {reason}", reasons::BUDGET_UNAVAILABLE));
                }
                Outcome::NotApplied { .. } => {
                    self.budget = Some(budget);
                    return deny(reasons::BUDGET_UNAVAILABLE);
                }
                Outcome::Unknown { event_id, .. } => {
                    budget
                        .ambiguous(BudgetStep::Authorize, event_id)
                        .retained(BudgetStep::Authorize);
                    self.budget = Some(budget);
                    return Err(Stop::Deny(reasons::AUTHORIZE_UNCONFIRMED.into()));
                }
            }
        }
        deny(last_denial.unwrap_or_else(|| "budget denied".to_owned()))
    }
}
