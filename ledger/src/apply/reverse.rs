//! `ReverseHold`: give an Authorized hold's slot and remaining exposure back. A hold that was
//! already reversed (by expiry, cancel or another reverse) answers `AlreadyReversed`.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::EventKind;
use crate::family::{Books, Family, Keep, Step};
use crate::hold::{Hold, InvocationState};
use crate::ids::HoldId;

use super::hold_lookup::{end_hold, touch_hold, Found, SlotHeld};

impl Family {
    pub(crate) fn reverse_hold(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        exposure_units: u64,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let (holds, mut books) = self.split();
        let (state, terminal) = match touch_hold(holds, &mut books, hold_id, cmd, step)? {
            Found::Live(hold) if hold.invocation_state == InvocationState::Authorized => {
                let remaining = hold.remaining_exposure_units;
                if exposure_units != remaining {
                    return Err(LedgerError::precondition(
                        PreconditionCode::ExposureMismatch,
                        format!(
                            "reverse names {exposure_units} units, the hold has {remaining} remaining"
                        ),
                    ));
                }
                let kind = reverse_kind(&books, hold);
                let index = end_hold(
                    hold,
                    &mut books,
                    kind,
                    &cmd.header.event_id,
                    Keep::WithCommand,
                    SlotHeld::Reserved,
                    step,
                )?;
                let outcome = Outcome::Reversed {
                    hold_id: hold.hold_id.clone(),
                    exposure_units,
                };
                return Ok(Family::decided(
                    &cmd.header.event_id,
                    outcome,
                    Some(index),
                    step,
                ));
            }
            Found::Live(hold) => (hold.invocation_state, hold.terminal.clone()),
            Found::Archived(hold) => (hold.states.invocation, hold.terminal.clone()),
            Found::JustExpired(hold, index) => {
                assert_eq!(
                    hold.terminal.as_ref().map(|t| t.commit_index),
                    Some(index),
                    "the expiry just appended ends the hold"
                );
                (hold.invocation_state, hold.terminal.clone())
            }
        };
        if state != InvocationState::Reversed {
            return Err(LedgerError::precondition(
                PreconditionCode::DispatchFenceCrossed,
                format!("hold {hold_id} is {state:?}: it crossed the dispatch commitment fence"),
            ));
        }
        let terminal =
            terminal.unwrap_or_else(|| panic!("reversed hold {hold_id} has no terminal event"));
        let outcome = Outcome::AlreadyReversed {
            hold_id: hold_id.clone(),
            by_event_id: terminal.event_id,
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(terminal.commit_index),
            step,
        ))
    }
}

/// `reverse_invocation` when the grant has a quota, else `reverse_exposure`.
fn reverse_kind(books: &Books<'_>, hold: &Hold) -> EventKind {
    let quota = books
        .accounts
        .get(&hold.accounts[0])
        .is_some_and(|account| account.limits.max_invocations.is_some());
    if quota {
        EventKind::ReverseInvocation
    } else {
        EventKind::ReverseExposure
    }
}
