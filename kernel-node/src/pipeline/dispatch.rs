//! Dispatch under a deadline, and settlement. Once the call is handed to the server, any
//! failure (cancellation, deadline, incomplete, error, even "tool not registered" from the
//! server itself) keeps budget and payment: the tool may have run. Only a server that says it
//! did not run (URL elicitation) gets the pre-dispatch unwind.

use std::sync::Arc;

use tally_client::{ids, Outcome};
use tally_ledger::Operation;

use super::evaluation::{Evaluation, Held, Step, Stop};
use super::reasons;
use crate::money::Money;
use crate::payment::SettlementStatus;
use crate::receipt::BudgetStep;
use crate::tool::{ToolError, ToolOutput, ToolServer};

impl Evaluation<'_> {
    pub(super) async fn dispatch(
        &mut self,
        held: &Held,
        payment: Option<&Money>,
        server: Arc<dyn ToolServer>,
    ) -> Step<ToolOutput> {
        let call = server.call(&self.request.tool, self.request.arguments.value());
        match tokio::time::timeout(self.kernel.config.dispatch_deadline, call).await {
            Err(_) => Err(self.retain_after_dispatch(payment, reasons::DISPATCH_DEADLINE.into())),
            Ok(Err(error)) if error.is_pre_dispatch() => {
                self.unwind_pre_dispatch(held, payment).await?;
                match error {
                    ToolError::UrlElicitationRequired { message } => {
                        Err(Stop::UrlElicitation { message })
                    }
                    other => Err(Stop::Deny(other.to_string())),
                }
            }
            Ok(Err(error)) => Err(self.retain_after_dispatch(
                payment,
                format!("{error}; the tool may have run, so budget and payment are retained"),
            )),
            Ok(Ok(output)) => {
                self.settle(held, payment, &output).await;
                Ok(output)
            }
        }
    }

    pub(super) fn retain_after_dispatch(
        &mut self,
        payment: Option<&Money>,
        reason: String,
    ) -> Stop {
        self.budget_mut().retained(BudgetStep::InvocationCapture);
        if payment.is_some() {
            self.financial_mut().payment_authorization_retained = Some(true);
        }
        Stop::Deny(reason)
    }

    /// Reconcile at `min(actual, charged)` and take that much on the rail. The tool ran, so
    /// the verdict is `Allow` whatever happens here; a lost answer is flagged for a reconciler.
    pub(super) async fn settle(
        &mut self,
        held: &Held,
        payment: Option<&Money>,
        output: &ToolOutput,
    ) {
        let Some(charged) = payment else {
            return;
        };
        let realized = match &output.cost {
            Some(cost) if cost.currency == charged.currency => cost.units.min(charged.units),
            _ => charged.units,
        };
        let command = held.command(
            ids::reconcile_event(&held.hold_id),
            Operation::ReconcileHold {
                hold_id: held.hold_id.clone(),
                exposed_cost_units: held.exposure,
                realized_spend_units: realized,
            },
        );
        match self.kernel.ledger.submit(command).await {
            Outcome::Decided(decision) => {
                if let Some(index) = decision.commit_index {
                    self.budget_mut()
                        .committed(BudgetStep::Reconcile, decision.event_id, index);
                }
            }
            Outcome::Unknown { event_id, .. } => {
                self.budget_mut().ambiguous(BudgetStep::Reconcile, event_id);
            }
            other => {
                self.budget_extra
                    .insert("reconcile_error".into(), format!("{other:?}").into());
            }
        }
        let reference = self.request.request_id.clone();
        if realized == 0 {
            let status = self.kernel.payments.release(&reference).await;
            let financial = self.financial_mut();
            match status {
                Ok(status) => financial.payment_release_status = Some(status),
                Err(error) => financial.payment_error = Some(error.to_string()),
            }
            return;
        }
        let amount = Money::new(realized, &charged.currency);
        let captured = self.kernel.payments.capture(&reference, &amount).await;
        let financial = self.financial_mut();
        match captured {
            Ok(capture) => {
                financial.captured_units = Some(capture.amount.units);
                financial.transaction_id = Some(capture.transaction_id);
                financial.settlement_status = Some(SettlementStatus::Captured);
            }
            Err(error) => {
                financial.payment_error = Some(error.to_string());
                financial.payment_capture_ambiguous = Some(true);
            }
        }
    }
}
