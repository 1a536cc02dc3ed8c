//! Undoing a hold before dispatch. Only a confirmed answer counts: an unknown one leaves the
//! budget held (fail-closed) and names the exact event for a reconciler. Reverse is for an
//! Authorized hold; after capture only `CancelCapturedBeforeDispatch` (its own event id, so a
//! tombstoned reverse never blocks it) may give budget back.

use serde_json::Value;
use tally_client::{ids, Outcome};
use tally_ledger::{Operation, Outcome as LedgerOutcome, PreconditionCode};

use super::evaluation::{Evaluation, Held};
use crate::receipt::BudgetStep;

/// Whether a cleanup is known to have happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cleanup {
    Confirmed,
    Unconfirmed,
}

impl Evaluation<'_> {
    fn note_cleanup(&mut self, held: &Held, event_id: &str) {
        let kind = if held.limits.max_invocations.is_some() {
            "invocation"
        } else {
            "exposure"
        };
        for (key, value) in [
            ("cleanup_mutation_kind", Value::from(kind)),
            ("cleanup_hold_id", Value::from(held.hold_id.as_str())),
            (
                "cleanup_capability_id",
                Value::from(held.header.capability_id.as_str()),
            ),
            ("cleanup_grant_index", Value::from(held.header.grant_index)),
            ("cleanup_attempt_event_id", Value::from(event_id)),
            ("cleanup_attempt_event_id_available", Value::from(true)),
        ] {
            self.budget_extra.insert(key.to_owned(), value);
        }
    }

    /// `ReverseHold` of an Authorized hold (event `{hold}:authorize:rollback:{index}`).
    pub(super) async fn reverse(&mut self, held: &Held) -> Cleanup {
        let event_id = ids::rollback_event(&held.hold_id, held.authorize_index);
        self.note_cleanup(held, event_id.as_str());
        let command = held.command(
            event_id.clone(),
            Operation::ReverseHold {
                hold_id: held.hold_id.clone(),
                exposure_units: held.exposure,
            },
        );
        let outcome = self.kernel.ledger.submit(command).await;
        let cleanup = match outcome {
            Outcome::Decided(decision) => match decision.outcome {
                LedgerOutcome::Reversed { .. } | LedgerOutcome::AlreadyReversed { .. } => {
                    if let Some(index) = decision.commit_index {
                        self.budget_mut()
                            .committed(BudgetStep::Reverse, decision.event_id, index);
                    }
                    Cleanup::Confirmed
                }
                other => {
                    self.budget_extra
                        .insert("cleanup_answer".into(), format!("{other:?}").into());
                    Cleanup::Unconfirmed
                }
            },
            // Touching an expired hold expires it first: the cluster did the reverse.
            Outcome::Refused(error)
                if error.precondition_code() == Some(PreconditionCode::HoldExpired) =>
            {
                Cleanup::Confirmed
            }
            Outcome::Refused(error) => {
                self.budget_extra
                    .insert("cleanup_error".into(), error.to_string().into());
                Cleanup::Unconfirmed
            }
            Outcome::Unavailable { .. } | Outcome::NotApplied { .. } => Cleanup::Unconfirmed,
            Outcome::Unknown { event_id, .. } => {
                self.budget_mut().ambiguous(BudgetStep::Reverse, event_id);
                Cleanup::Unconfirmed
            }
        };
        if cleanup == Cleanup::Unconfirmed {
            self.budget_mut().retained(BudgetStep::Authorize);
        }
        cleanup
    }

    /// `CancelCapturedBeforeDispatch` of our own capture, when the tool was provably not entered.
    pub(super) async fn cancel(&mut self, held: &Held) -> Cleanup {
        let event_id = ids::cancel_event(&held.hold_id, held.authorize_index);
        let command = held.command(
            event_id,
            Operation::CancelCapturedBeforeDispatch {
                hold_id: held.hold_id.clone(),
            },
        );
        let outcome = self.kernel.ledger.submit(command).await;
        let cleanup = match outcome {
            Outcome::Decided(decision) => match decision.outcome {
                LedgerOutcome::Cancelled { .. } | LedgerOutcome::AlreadyReversed { .. } => {
                    if let Some(index) = decision.commit_index {
                        self.budget_mut().committed(
                            BudgetStep::CancelCapturedBeforeDispatch,
                            decision.event_id,
                            index,
                        );
                    }
                    Cleanup::Confirmed
                }
                other => {
                    self.budget_extra
                        .insert("cancellation_answer".into(), format!("{other:?}").into());
                    Cleanup::Unconfirmed
                }
            },
            Outcome::Refused(error) => {
                self.budget_extra
                    .insert("cancellation_error".into(), error.to_string().into());
                Cleanup::Unconfirmed
            }
            Outcome::Unavailable { .. } | Outcome::NotApplied { .. } => Cleanup::Unconfirmed,
            Outcome::Unknown { event_id, .. } => {
                self.budget_mut()
                    .ambiguous(BudgetStep::CancelCapturedBeforeDispatch, event_id);
                Cleanup::Unconfirmed
            }
        };
        if cleanup == Cleanup::Unconfirmed {
            self.budget_mut().retained(BudgetStep::InvocationCapture);
        }
        cleanup
    }
}
