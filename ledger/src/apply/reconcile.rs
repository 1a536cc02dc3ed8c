//! `ReconcileHold`: make a captured hold's spend final; the unspent part returns to budget.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::{EventKind, EventRecord};
use crate::family::{Family, Keep, NewEvent, Step};
use crate::hold::{HoldTransition, InvocationState, MonetaryState};
use crate::ids::HoldId;
use crate::tables::compaction_queue::CompactionItem;

use super::hold_lookup::{hold_event, hold_expired, plan_exposure_change, touch_hold, Found};

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
        let (holds, mut books) = self.split();
        let hold = match touch_hold(holds, &mut books, hold_id, cmd, step)? {
            Found::JustExpired(..) => return Err(hold_expired(hold_id)),
            Found::Archived(_) => return Err(not_captured("terminal")),
            Found::Live(hold) => hold,
        };
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
        let after_images = plan_exposure_change(&books, hold, exposed_units, realized_units, step)?;
        books.commit_accounts(&after_images);
        let index = step.ctx.base_index();
        let now_ms = step.now_ms();
        let before = hold.states();
        let unspent_units = exposed_units - realized_units;
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
        let record = EventRecord {
            exposure_units: exposed_units,
            realized_units,
            hold_before: Some(before),
            after_images,
            ..hold_event(hold, EventKind::ReconcileSpend, &cmd.header.event_id, step)
        };
        let appended = books.append(
            step,
            NewEvent {
                record,
                keep: Keep::WithCommand,
            },
        );
        assert_eq!(
            appended, index,
            "the reconcile event must be the command's first"
        );
        books.schedule(
            now_ms,
            step.ctx.params,
            CompactionItem::Hold(hold.hold_id.clone()),
        );
        let outcome = Outcome::Reconciled {
            hold_id: hold.hold_id.clone(),
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
