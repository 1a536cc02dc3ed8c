//! `CancelCapturedBeforeDispatch`: the only way budget comes back after the capture fence,
//! for a kernel that can prove the tool was never entered and the capture is its own.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::EventKind;
use crate::family::{Family, Keep, Step};
use crate::hold::{InvocationState, MonetaryState};
use crate::ids::HoldId;

use super::hold_lookup::{end_hold, hold_expired, touch_hold, Found, SlotHeld};

impl Family {
    pub(crate) fn cancel_captured(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let (holds, mut books) = self.split();
        let hold = match touch_hold(holds, &mut books, hold_id, cmd, step)? {
            Found::JustExpired(..) => return Err(hold_expired(hold_id)),
            Found::Archived(_) => {
                return Err(LedgerError::precondition(
                    PreconditionCode::HoldArchived,
                    format!("hold {hold_id} is past retention; it can no longer be cancelled"),
                ))
            }
            Found::Live(hold) => hold,
        };
        if hold.invocation_state != InvocationState::Captured {
            return Err(LedgerError::precondition(
                PreconditionCode::HoldNotCaptured,
                format!(
                    "hold {hold_id} is {:?}, not Captured",
                    hold.invocation_state
                ),
            ));
        }
        if hold.monetary_state == MonetaryState::Reconciled {
            return Err(LedgerError::precondition(
                PreconditionCode::AlreadyReconciled,
                format!("hold {hold_id} is reconciled"),
            ));
        }
        if hold.remaining_exposure_units != hold.authorized_exposure_units {
            return Err(LedgerError::precondition(
                PreconditionCode::PartiallyReleased,
                format!("hold {hold_id} released part of its exposure"),
            ));
        }
        let exposure_units = hold.remaining_exposure_units;
        let index = end_hold(
            hold,
            &mut books,
            EventKind::CancelCapturedBeforeDispatch,
            &cmd.header.event_id,
            Keep::WithCommand,
            SlotHeld::Captured,
            step,
        )?;
        let outcome = Outcome::Cancelled {
            hold_id: hold.hold_id.clone(),
            exposure_units,
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(index),
            step,
        ))
    }
}
