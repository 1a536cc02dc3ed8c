//! The two-phase form of the pipeline: `admit` does everything up to (and including) the
//! payment authorization and hands out a signed ticket; the caller runs the tool; any kernel
//! node then `complete`s (reconcile at `min(actual, charged)`, capture the payment) or
//! `abort`s (before dispatch: release, then cancel; after: retain). Every phase after admit
//! first checks its capture proof: a trusted signature, the ticket holder's proof of
//! possession, and the cluster's record that this very attempt owns the capture. Without all
//! three, nothing is dispatched, settled or freed.

use serde_json::json;
use tally_ledger::{HoldView, InvocationState};

use super::evaluation::{deny, Evaluation, Step, Stop};
use super::kernel::Kernel;
use super::possession::{self, Method, Possession, Signable};
use super::reasons;
use super::request::{Arguments, KernelError, Response, ToolCallRequest};
use super::ticket::{AdmissionTicket, SignedTicket};
use super::ticket_calls::{AbortCall, CompleteCall, DispatchCall, TicketCall};
use crate::money::Money;
use crate::receipt::BudgetStep;
use crate::tool::ToolOutput;
use tally_ledger::BudgetCommitIndex;

/// `admit`'s answer: the signed receipt, and on `Allow` the ticket to complete with.
#[derive(Clone, Debug)]
pub struct Admission {
    pub response: Response,
    pub ticket: Option<SignedTicket>,
}

/// What a call on a ticket presents as its proof of possession.
struct Presented<'a> {
    method: Method,
    call: &'a (dyn Signable + Sync),
    possession: Option<&'a Possession>,
}

impl<'a> Presented<'a> {
    fn of<C: TicketCall + Sync>(call: &'a C) -> Self {
        Self {
            method: C::METHOD,
            call,
            possession: call.possession(),
        }
    }
}

/// The request a ticket call's receipt describes; it is never itself verified or run.
fn ticket_request(ticket: &AdmissionTicket, arguments: Arguments) -> ToolCallRequest {
    ToolCallRequest {
        request_id: ticket.request_id.clone(),
        capability: ticket.capability.clone(),
        server: ticket.server.clone(),
        tool: ticket.tool.clone(),
        arguments,
        execution_nonce: None,
        possession: None,
    }
}

impl Kernel {
    /// Phase one: budget, nonce, capture and payment; no dispatch.
    pub async fn admit(&self, request: &ToolCallRequest) -> Result<Admission, KernelError> {
        self.check_receipt_gate()?;
        let mut evaluation = Evaluation::new(self, request);
        let admitted = evaluation.admit(Method::Admit).await;
        let mut ticket = None;
        let result = match admitted {
            Ok((held, payment)) => {
                let capture = evaluation
                    .budget
                    .as_ref()
                    .and_then(|b| b.steps.get(&BudgetStep::InvocationCapture))
                    .and_then(|step| step.commit_index.map(|i| (step.event_id.clone(), i)));
                match (capture, evaluation.capability.clone()) {
                    (Some((capture_event_id, capture_index)), Some(capability)) => {
                        let signed = AdmissionTicket {
                            request_id: request.request_id.clone(),
                            server: request.server.clone(),
                            tool: request.tool.clone(),
                            capability: request.capability.clone(),
                            holder: capability.subject(),
                            family_id: held.header.family_id.clone(),
                            capability_id: held.header.capability_id.clone(),
                            grant_index: held.header.grant_index,
                            hold_id: held.hold_id.clone(),
                            authorize_commit_index: held.authorize_index.0,
                            capture_event_id,
                            capture_commit_index: capture_index.0,
                            attempt_id: evaluation.attempt_id.clone(),
                            payment_reference: payment.as_ref().map(|_| request.request_id.clone()),
                            exposure_units: held.exposure,
                            limits: held.limits.clone(),
                            issued_at_ms: evaluation.now_ms,
                        }
                        .sign(&self.keypair);
                        match signed {
                            Ok(signed) => {
                                evaluation.extra.insert(
                                    "admission".into(),
                                    json!({ "attempt_id": evaluation.attempt_id.as_str(), "ticket_issued": true }),
                                );
                                ticket = Some(signed);
                                Ok(ToolOutput {
                                    content: json!({ "admitted": true }),
                                    cost: None,
                                })
                            }
                            // Captured and paid, but no ticket: keep everything for a reconciler.
                            Err(error) => {
                                evaluation
                                    .budget_mut()
                                    .retained(BudgetStep::InvocationCapture);
                                deny(format!("admission ticket could not be signed: {error}"))
                            }
                        }
                    }
                    _ => deny("admission has no committed capture"),
                }
            }
            Err(stop) => Err(stop),
        };
        let response = evaluation.finish(result)?;
        Ok(Admission { response, ticket })
    }

    /// Phase two, after the caller ran the tool: settle at `min(actual_cost, charged)`.
    /// Settles an admitted call even after the receipt log failed: the call already ran.
    pub async fn complete(&self, call: &CompleteCall) -> Result<Response, KernelError> {
        let request = ticket_request(
            &call.ticket.ticket,
            Arguments::from_value(serde_json::Value::Null),
        );
        let mut evaluation = Evaluation::new(self, &request);
        let presented = Presented::of(call);
        let result = evaluation
            .complete(&call.ticket, presented, call.actual_cost.clone())
            .await;
        evaluation.finish(result)
    }

    /// Phase two when the caller did not (`before_dispatch`) or may have run the tool.
    pub async fn abort(&self, call: &AbortCall) -> Result<Response, KernelError> {
        let request = ticket_request(
            &call.ticket.ticket,
            Arguments::from_value(serde_json::Value::Null),
        );
        let mut evaluation = Evaluation::new(self, &request);
        let presented = Presented::of(call);
        let result = evaluation
            .abort(&call.ticket, presented, call.before_dispatch)
            .await;
        evaluation.finish(result)
    }

    /// Dispatches an admitted call to a registered tool server, on any node: only with a
    /// capture proof (the seed's "no direct dispatch without capture proof").
    pub async fn dispatch_admitted(&self, call: &DispatchCall) -> Result<Response, KernelError> {
        let request = ticket_request(&call.ticket.ticket, call.arguments.clone());
        let mut evaluation = Evaluation::new(self, &request);
        let presented = Presented::of(call);
        let result = evaluation.dispatch_admitted(&call.ticket, presented).await;
        evaluation.finish(result)
    }
}

impl Evaluation<'_> {
    /// Signature by a trusted kernel key, the ticket holder's proof of possession, and the
    /// cluster's record that the ticket's attempt owns the capture. The first two are local
    /// and come first: a stolen ticket costs the cluster not even a read.
    async fn check_capture_proof(
        &mut self,
        signed: &SignedTicket,
        presented: Presented<'_>,
    ) -> Step<()> {
        if let Err(error) = signed.verify(&self.kernel.kernel_keys) {
            return deny(format!("capture proof rejected: {error}"));
        }
        let ticket = &signed.ticket;
        // The holder is trustworthy only now that the kernel's signature over it verified.
        if let Err(error) = possession::verify(
            &ticket.holder,
            presented.method,
            presented.call,
            presented.possession,
            self.now_ms,
            self.kernel.config.possession_max_skew_ms,
        ) {
            return deny(format!(
                "{} for the ticket of request {}: {error}",
                reasons::POSSESSION_REJECTED,
                ticket.request_id
            ));
        }
        if let Ok(capability) = crate::token::verify(
            &ticket.capability,
            &self.kernel.token_issuers,
            ticket.issued_at_ms,
            None,
        ) {
            self.capability = Some(capability);
        }
        let mut budget = crate::receipt::BudgetAuthorityMetadata::new(ticket.hold_id.clone());
        budget
            .grant_index(ticket.grant_index)
            .committed(
                BudgetStep::Authorize,
                tally_client::ids::authorize_event(&ticket.hold_id),
                BudgetCommitIndex(ticket.authorize_commit_index),
            )
            .committed(
                BudgetStep::InvocationCapture,
                ticket.capture_event_id.clone(),
                BudgetCommitIndex(ticket.capture_commit_index),
            )
            .attempt(BudgetStep::InvocationCapture, ticket.attempt_id.clone());
        self.budget = Some(budget);
        let view = match self
            .kernel
            .ledger
            .get_hold(&ticket.family_id, &ticket.hold_id)
            .await
        {
            Ok(view) => view,
            Err(error) => return deny(format!("capture proof could not be checked: {error}")),
        };
        let (state, owner) = match &view {
            Some(HoldView::Live(hold)) => (hold.invocation_state, hold.capture_attempt_id.clone()),
            Some(HoldView::Archived { hold, .. }) => {
                (hold.states.invocation, hold.capture_attempt_id.clone())
            }
            _ => (InvocationState::Authorized, None),
        };
        if state != InvocationState::Captured || owner.as_ref() != Some(&ticket.attempt_id) {
            return deny(
                "capture proof rejected: the cluster records no capture by this ticket's attempt",
            );
        }
        Ok(())
    }

    async fn complete(
        &mut self,
        signed: &SignedTicket,
        presented: Presented<'_>,
        actual_cost: Option<Money>,
    ) -> Step<ToolOutput> {
        self.check_capture_proof(signed, presented).await?;
        let held = signed.ticket.held(self.not_after_ms());
        let payment = signed.ticket.payment();
        let output = ToolOutput {
            content: json!({ "completed": true }),
            cost: actual_cost,
        };
        self.settle(&held, payment.as_ref(), &output).await;
        Ok(output)
    }

    async fn abort(
        &mut self,
        signed: &SignedTicket,
        presented: Presented<'_>,
        before_dispatch: bool,
    ) -> Step<ToolOutput> {
        self.check_capture_proof(signed, presented).await?;
        let held = signed.ticket.held(self.not_after_ms());
        let payment = signed.ticket.payment();
        if before_dispatch {
            self.unwind_pre_dispatch(&held, payment.as_ref()).await?;
            return deny("aborted before dispatch; budget and payment released");
        }
        Err(self.retain_after_dispatch(
            payment.as_ref(),
            "aborted after dispatch; the tool may have run, so budget and payment are retained"
                .into(),
        ))
    }

    async fn dispatch_admitted(
        &mut self,
        signed: &SignedTicket,
        presented: Presented<'_>,
    ) -> Step<ToolOutput> {
        self.check_capture_proof(signed, presented).await?;
        let held = signed.ticket.held(self.not_after_ms());
        let payment = signed.ticket.payment();
        let Some(server) = self
            .kernel
            .tools
            .lookup(&self.request.server, &self.request.tool)
        else {
            self.unwind_pre_dispatch(&held, payment.as_ref()).await?;
            return Err(Stop::Deny(format!(
                "tool {}/{} is not registered on this kernel node",
                self.request.server, self.request.tool
            )));
        };
        self.dispatch(&held, payment.as_ref(), server).await
    }
}
