//! `ReleaseHold`: give part of an Authorized hold's exposure back before capture.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::{EventKind, EventRecord};
use crate::family::{Family, Keep, NewEvent, Step};
use crate::hold::{HoldTransition, InvocationState, MonetaryState};
use crate::ids::HoldId;

use super::hold_lookup::{hold_event, hold_expired, plan_exposure_change, touch_hold, Found};

impl Family {
    pub(crate) fn release_hold(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        released_units: u64,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let (holds, mut books) = self.split();
        let hold = match touch_hold(holds, &mut books, hold_id, cmd, step)? {
            Found::JustExpired(..) => return Err(hold_expired(hold_id)),
            Found::Archived(_) => return Err(terminal(hold_id)),
            Found::Live(hold) => hold,
        };
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
        let after_images = plan_exposure_change(&books, hold, released_units, 0, step)?;
        books.commit_accounts(&after_images);
        let index = step.ctx.base_index();
        let before = hold.states();
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
        let remaining_units = hold.remaining_exposure_units;
        let record = EventRecord {
            exposure_units: released_units,
            hold_before: Some(before),
            after_images,
            ..hold_event(hold, EventKind::ReleaseExposure, &cmd.header.event_id, step)
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
            "the release event must be the command's first"
        );
        let outcome = Outcome::Released {
            hold_id: hold.hold_id.clone(),
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
