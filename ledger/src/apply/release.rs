//! `ReleaseHold`: give part of an Authorized hold's exposure back before capture.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::EventKind;
use crate::family::{Family, NewEvent, Step};
use crate::hold::{HoldTransition, InvocationState, MonetaryState};
use crate::ids::HoldId;

use super::hold_lookup::{hold_expired, Found};

impl Family {
    pub(crate) fn release_hold(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        released_units: u64,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        match self.touch_hold(hold_id, cmd, step)? {
            Found::JustExpired(_) => return Err(hold_expired(hold_id)),
            Found::Archived => return Err(terminal(hold_id)),
            Found::Live => {}
        }
        let hold = self.live_hold(hold_id);
        match hold.invocation_state {
            InvocationState::Authorized => {}
            InvocationState::Captured => {
                return Err(LedgerError::precondition(
                    PreconditionCode::DispatchFenceCrossed,
                    format!("hold {hold_id} crossed the dispatch commitment fence"),
                ))
            }
            InvocationState::Reversed => return Err(terminal(hold_id)),
        }
        if released_units > hold.remaining_exposure_units {
            return Err(LedgerError::precondition(
                PreconditionCode::ReleaseExceedsRemaining,
                format!(
                    "release of {released_units} exceeds the {} units remaining",
                    hold.remaining_exposure_units
                ),
            ));
        }
        let planned = self.plan_exposure_change(hold_id, released_units, 0)?;
        let mut record = self.hold_event(cmd, hold_id, EventKind::ReleaseExposure, step);
        let index = record.commit_index;
        record.exposure_units = released_units;
        record.after_images = self.commit_accounts(planned, index, step.now_ms());
        let hold = self.live_hold_mut(hold_id);
        hold.remaining_exposure_units -= released_units;
        hold.released_units += released_units;
        if hold.remaining_exposure_units == 0 {
            hold.monetary_state = MonetaryState::Released;
        }
        hold.last_release = Some(HoldTransition {
            event_id: cmd.header.event_id.clone(),
            commit_index: index,
        });
        hold.assert_conserved();
        record.hold_after = Some(hold.states());
        let remaining_units = hold.remaining_exposure_units;
        let appended = self.append(
            step,
            NewEvent {
                record,
                keep_until_ms: cmd.header.not_after_ms,
            },
        );
        assert_eq!(
            appended, index,
            "the release event must be the command's first"
        );
        let outcome = Outcome::Released {
            hold_id: hold_id.clone(),
            released_units,
            remaining_units,
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(index),
            step,
        ))
    }
}

fn terminal(hold_id: &HoldId) -> LedgerError {
    LedgerError::precondition(
        PreconditionCode::HoldNotAuthorized,
        format!("hold {hold_id} is terminal"),
    )
}
