//! The background reconciler every kernel node runs. It finds Captured holds that nobody
//! finished (a kernel died between capture and reconcile, or signed an ambiguous receipt) with
//! `ListHolds`, and finishes only what is provably safe for a node that did not run the call:
//! it tombstones any lost cancel (`ResolveEvent`), then reconciles at `realized = authorized`
//! (it cannot know the actual cost, so it never gives budget back) and captures the payment
//! authorized under the request's reference. Authorized holds are left to the cluster's expiry.

mod holds;
#[cfg(test)]
mod tests;

use std::time::Duration;

use std::sync::{Arc, Mutex};

use tally_client::{ids, ClientError, Outcome};
use tally_ledger::{
    ClientCommand, CommandHeader, FamilyId, Hold, HoldFilter, HoldPosition, InvocationState,
    Operation, Outcome as LedgerOutcome,
};

use crate::money::Money;
use crate::payment::{PaymentAdapter, SettlementStatus};
use crate::pipeline::{wall_clock_ms, BudgetLedger};

pub use holds::request_id_of;

/// Errors kept in one report.
pub const MAX_REPORTED_ERRORS: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcilerConfig {
    /// A Captured hold is someone else's work until it is this old.
    pub stale_after_ms: u64,
    /// Holds examined per pass.
    pub batch_limit: u32,
    pub interval: Duration,
    pub command_lifetime_ms: u64,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            stale_after_ms: 10 * 60_000,
            batch_limit: 256,
            interval: Duration::from_secs(30),
            command_lifetime_ms: 60_000,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    pub examined: usize,
    pub reconciled: usize,
    pub payments_captured: usize,
    pub skipped: usize,
    pub errors: Vec<String>,
}

impl ReconcileReport {
    fn error(&mut self, error: String) {
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.errors.push(error);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcilerError {
    #[error("listing holds: {0}")]
    List(#[from] ClientError),
}

pub struct Reconciler {
    ledger: Arc<dyn BudgetLedger>,
    payments: Arc<dyn PaymentAdapter>,
    config: ReconcilerConfig,
    /// Where the last pass's page ended: the next pass reads on from there, so holds a pass
    /// could not finish never keep the ones behind them from being read. `None`: from the
    /// oldest hold.
    resume_after: Mutex<Option<HoldPosition>>,
}

impl Reconciler {
    pub fn new(
        ledger: Arc<dyn BudgetLedger>,
        payments: Arc<dyn PaymentAdapter>,
        config: ReconcilerConfig,
    ) -> Self {
        Self {
            ledger,
            payments,
            config,
            resume_after: Mutex::new(None),
        }
    }

    /// Passes every `interval` until `shutdown` turns true.
    pub async fn run(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            match self.run_once().await {
                Ok(report) if report.reconciled > 0 || !report.errors.is_empty() => {
                    tracing::info!(?report, "reconciler pass");
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "reconciler pass failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.interval) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }

    /// One page of stale Captured holds (`batch_limit`), after where the last pass ended;
    /// after the last page the next pass starts again from the oldest.
    pub async fn run_once(&self) -> Result<ReconcileReport, ReconcilerError> {
        let now = wall_clock_ms();
        let filter = HoldFilter {
            state: Some(InvocationState::Captured),
            created_before_ms: Some(now.saturating_sub(self.config.stale_after_ms)),
            // Captured calls without exposure are final: they must not fill the batch.
            with_remaining_exposure: true,
            after: self.resume_after().clone(),
        };
        let page = self
            .ledger
            .list_holds(None, &filter, self.config.batch_limit)
            .await?;
        *self.resume_after() = page.next;
        let mut report = ReconcileReport::default();
        for (family_id, hold) in page.holds {
            report.examined += 1;
            // Zero-exposure captures are final; reconciled ones are done.
            if hold.invocation_state != InvocationState::Captured
                || hold.remaining_exposure_units == 0
                || hold.is_terminal()
            {
                report.skipped += 1;
                continue;
            }
            self.finish(&family_id, &hold, now, &mut report).await;
        }
        Ok(report)
    }

    fn resume_after(&self) -> std::sync::MutexGuard<'_, Option<HoldPosition>> {
        // A panic while the position was held leaves a valid position (it is replaced whole).
        self.resume_after
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn finish(
        &self,
        family_id: &FamilyId,
        hold: &Hold,
        now: u64,
        report: &mut ReconcileReport,
    ) {
        let header = |event_id| CommandHeader {
            family_id: family_id.clone(),
            capability_id: hold.capability_id.clone(),
            grant_index: hold.grant_index,
            event_id,
            not_after_ms: now.saturating_add(self.config.command_lifetime_ms),
        };
        // A cancel lost by the owner must never land after we reconcile: make it final.
        let cancel = ClientCommand {
            header: header(ids::cancel_event(
                &hold.hold_id,
                hold.authorized.commit_index,
            )),
            op: Operation::CancelCapturedBeforeDispatch {
                hold_id: hold.hold_id.clone(),
            },
        };
        match self.ledger.resolve(cancel).await {
            Outcome::NotApplied { .. } => {}
            Outcome::Decided(_) => {
                report.skipped += 1;
                return;
            }
            other => {
                report.error(format!("{}: resolving its cancel: {other:?}", hold.hold_id));
                return;
            }
        }
        let amount = hold.remaining_exposure_units;
        let reconcile = ClientCommand {
            header: header(ids::reconcile_event(&hold.hold_id)),
            op: Operation::ReconcileHold {
                hold_id: hold.hold_id.clone(),
                exposed_cost_units: amount,
                realized_spend_units: amount,
            },
        };
        match self.ledger.submit(reconcile).await {
            Outcome::Decided(decision)
                if matches!(decision.outcome, LedgerOutcome::Reconciled { .. }) =>
            {
                report.reconciled += 1;
            }
            // The owner reconciled with its own amounts (or someone else finished first).
            Outcome::Refused(_) => {
                report.skipped += 1;
                return;
            }
            other => {
                report.error(format!("{}: reconcile: {other:?}", hold.hold_id));
                return;
            }
        }
        self.capture_payment(hold, amount, report).await;
    }

    /// Takes the reconciled amount from the authorization under the request's reference.
    async fn capture_payment(&self, hold: &Hold, amount: u64, report: &mut ReconcileReport) {
        let Some(reference) = request_id_of(hold) else {
            return;
        };
        match self.payments.lookup(&reference).await {
            Ok(Some(record)) if record.status == SettlementStatus::Authorized => {
                let units = amount.min(record.authorized.units);
                let money = Money::new(units, &record.authorized.currency);
                match self.payments.capture(&reference, &money).await {
                    Ok(_) => report.payments_captured += 1,
                    Err(error) => report.error(format!("{reference}: payment capture: {error}")),
                }
            }
            Ok(_) => {}
            Err(error) => report.error(format!("{reference}: payment lookup: {error}")),
        }
    }
}
