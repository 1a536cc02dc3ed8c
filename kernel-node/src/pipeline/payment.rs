//! Money, after the capture is ours: authorize under the `request_id`, and unwind before
//! dispatch. Only a definite decline frees the capture; anything ambiguous keeps both. An
//! unwind releases the payment first and cancels the capture only once the release is
//! confirmed, so budget never comes back while money may still be held.

use serde_json::Value;

use super::cleanup::Cleanup;
use super::evaluation::{deny, Evaluation, Held, Step, Stop};
use super::reasons;
use crate::money::Money;
use crate::payment::{ReleaseStatus, SettlementStatus};
use crate::receipt::BudgetStep;

impl Evaluation<'_> {
    /// `None` for a hold with no exposure (nothing to pay).
    pub(super) async fn authorize_payment(&mut self, held: &Held) -> Step<Option<Money>> {
        if held.exposure == 0 {
            return Ok(None);
        }
        let Some(currency) = held.limits.currency.clone() else {
            return deny("monetary hold without a currency");
        };
        let amount = Money::new(held.exposure, &currency);
        let reference = self.request.request_id.clone();
        self.financial_mut().currency = Some(currency.to_string());
        match self.kernel.payments.authorize(&reference, &amount).await {
            Ok(authorization) => {
                let financial = self.financial_mut();
                financial.authorization_id = Some(authorization.authorization_id);
                financial.authorized_units = Some(authorization.amount.units);
                financial.settlement_status = Some(SettlementStatus::Authorized);
                Ok(Some(amount))
            }
            Err(error) if error.is_definite_denial() => {
                self.financial_mut().payment_error = Some(error.to_string());
                match self.cancel(held).await {
                    Cleanup::Confirmed => deny(format!("payment authorization denied: {error}")),
                    Cleanup::Unconfirmed => deny(reasons::CANCEL_UNCONFIRMED),
                }
            }
            Err(error) => {
                let financial = self.financial_mut();
                financial.payment_error = Some(error.to_string());
                financial.payment_authorization_ambiguous = Some(true);
                financial.payment_authorization_retained = Some(true);
                self.budget_mut().retained(BudgetStep::InvocationCapture);
                deny(reasons::PAYMENT_UNCONFIRMED)
            }
        }
    }

    /// The tool was provably not entered: release the payment, then cancel the capture.
    /// `Ok` only when both are confirmed; otherwise the denial to return.
    pub(super) async fn unwind_pre_dispatch(
        &mut self,
        held: &Held,
        payment: Option<&Money>,
    ) -> Step<()> {
        if payment.is_some() {
            let reference = self.request.request_id.clone();
            self.financial_extra.insert(
                "payment_release_attempt_reference".into(),
                Value::from(reference.as_str()),
            );
            let released = match self.kernel.payments.release(&reference).await {
                Ok(status) => {
                    self.financial_mut().payment_release_status = Some(status);
                    status.is_confirmed()
                }
                Err(error) => {
                    self.financial_mut().payment_error = Some(error.to_string());
                    false
                }
            };
            if !released {
                self.financial_mut().payment_authorization_retained = Some(true);
                self.financial_extra
                    .insert("payment_release_unconfirmed".into(), Value::from(true));
                self.budget_mut().retained(BudgetStep::InvocationCapture);
                return Err(Stop::Deny(
                    "payment release could not be confirmed; budget and payment are retained"
                        .into(),
                ));
            }
            let financial = self.financial_mut();
            financial.payment_release_confirmed = Some(true);
            financial.payment_release_reference = Some(reference);
            financial.settlement_status = Some(SettlementStatus::Released);
            if financial.payment_release_status == Some(ReleaseStatus::NotFound) {
                financial.authorization_id = None;
            }
        }
        match self.cancel(held).await {
            Cleanup::Confirmed => Ok(()),
            Cleanup::Unconfirmed => deny(reasons::CANCEL_UNCONFIRMED),
        }
    }
}
