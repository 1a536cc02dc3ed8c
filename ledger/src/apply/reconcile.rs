//! `ReconcileHold`: make a captured hold's spend final; the unspent part returns to budget.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::EventKind;
use crate::family::{CompactionItem, Family, NewEvent, Step};
use crate::hold::{HoldTransition, InvocationState, MonetaryState};
use crate::ids::HoldId;

use super::hold_lookup::{hold_expired, Found};

impl Family {
    pub(crate) fn reconcile_hold(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        exposed_units: u64,
        realized_units: u64,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let not_captured = |state: &str| {
            LedgerError::precondition(
                PreconditionCode::HoldNotCaptured,
                format!("hold {hold_id} is {state}, not Captured"),
            )
        };
        match self.touch_hold(hold_id, cmd, step)? {
            Found::JustExpired(_) => return Err(hold_expired(hold_id)),
            Found::Archived => return Err(not_captured("terminal")),
            Found::Live => {}
        }
        let hold = self.live_hold(hold_id);
        if hold.invocation_state != InvocationState::Captured {
            return Err(not_captured(&format!("{:?}", hold.invocation_state)));
        }
        if hold.monetary_state == MonetaryState::Reconciled {
            return Err(LedgerError::precondition(
                PreconditionCode::AlreadyReconciled,
                format!("hold {hold_id} is reconciled already"),
            ));
        }
        if exposed_units != hold.remaining_exposure_units {
            return Err(LedgerError::precondition(
                PreconditionCode::ExposureMismatch,
                format!(
                    "reconcile names {exposed_units} exposed units, the hold has {} remaining",
                    hold.remaining_exposure_units
                ),
            ));
        }
        let planned = self.plan_exposure_change(hold_id, exposed_units, realized_units)?;
        let mut record = self.hold_event(cmd, hold_id, EventKind::ReconcileSpend, step);
        let index = record.commit_index;
        let now_ms = step.now_ms();
        record.exposure_units = exposed_units;
        record.realized_units = realized_units;
        record.after_images = self.commit_accounts(planned, index, now_ms);
        let unspent_units = exposed_units - realized_units;
        let hold = self.live_hold_mut(hold_id);
        hold.remaining_exposure_units = 0;
        hold.realized_units = realized_units;
        hold.unspent_units = unspent_units;
        hold.monetary_state = MonetaryState::Reconciled;
        hold.terminal = Some(HoldTransition {
            event_id: cmd.header.event_id.clone(),
            commit_index: index,
        });
        hold.terminal_at_ms = Some(now_ms);
        hold.assert_conserved();
        record.hold_after = Some(hold.states());
        let appended = self.append(
            step,
            NewEvent {
                record,
                keep_until_ms: cmd.header.not_after_ms,
            },
        );
        assert_eq!(
            appended, index,
            "the reconcile event must be the command's first"
        );
        self.schedule(
            now_ms,
            step.ctx.params,
            CompactionItem::Hold(crate::keyed::Keyed::new(hold_id.clone())),
        );
        let outcome = Outcome::Reconciled {
            hold_id: hold_id.clone(),
            realized_units,
            unspent_units,
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(index),
            step,
        ))
    }
}
