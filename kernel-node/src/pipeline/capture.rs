//! The capture: the dispatch commitment fence and the linearization point of docs/spec.md §9. Of
//! any number of identical attempts (here or on other kernel nodes) the cluster records
//! exactly one owner; only the owner goes on to pay and dispatch.

use tally_client::{ids, Outcome};
use tally_ledger::{Operation, Outcome as LedgerOutcome};

use super::evaluation::{deny, unexpected, Evaluation, Held, Step, Stop};
use super::reasons;
use crate::receipt::BudgetStep;

impl Evaluation<'_> {
    pub(super) async fn capture(&mut self, held: &Held) -> Step<()> {
        let event_id = ids::capture_event(&held.hold_id, held.authorize_index);
        let command = held.command(
            event_id,
            Operation::CaptureInvocation {
                hold_id: held.hold_id.clone(),
                attempt_id: self.attempt_id.clone(),
            },
        );
        let outcome = self.kernel.ledger.submit(command).await;
        match outcome {
            Outcome::Decided(decision) => match decision.outcome {
                LedgerOutcome::Captured { attempt_id, .. } => {
                    let Some(index) = decision.commit_index else {
                        return Err(unexpected("capture", &"no commit index"));
                    };
                    let ours = attempt_id == self.attempt_id;
                    self.budget_mut()
                        .committed(BudgetStep::InvocationCapture, decision.event_id, index)
                        .attempt(BudgetStep::InvocationCapture, attempt_id);
                    // Only the recorded owner may pay and dispatch, whatever the answer's shape.
                    if ours {
                        Ok(())
                    } else {
                        deny(reasons::CAPTURED_BY_ANOTHER_ATTEMPT)
                    }
                }
                // A lost acknowledgement resolved by a retry: ours if the owner is our attempt.
                LedgerOutcome::AlreadyCaptured {
                    owner_attempt_id,
                    capture_event_id,
                    capture_commit_index,
                    ..
                } => {
                    let ours = owner_attempt_id == self.attempt_id;
                    self.budget_mut()
                        .committed(
                            BudgetStep::InvocationCapture,
                            capture_event_id,
                            capture_commit_index,
                        )
                        .attempt(BudgetStep::InvocationCapture, owner_attempt_id);
                    if ours {
                        Ok(())
                    } else {
                        deny(reasons::CAPTURED_BY_ANOTHER_ATTEMPT)
                    }
                }
                other => Err(unexpected("capture", &other)),
            },
            Outcome::Unknown { event_id, .. } => {
                self.budget_mut()
                    .ambiguous(BudgetStep::InvocationCapture, event_id)
                    .retained(BudgetStep::InvocationCapture);
                Err(Stop::Deny(reasons::CAPTURE_UNCONFIRMED.into()))
            }
            // Definitely not captured: our Authorized hold (if it still is one) goes back.
            Outcome::Refused(error) => {
                self.reverse(held).await;
                deny(format!("budget invocation capture refused: {error}"))
            }
            Outcome::Unavailable { .. } | Outcome::NotApplied { .. } => {
                self.reverse(held).await;
                deny(format!(
                    "budget invocation capture failed: {}",
                    reasons::BUDGET_UNAVAILABLE
                ))
            }
        }
    }
}
