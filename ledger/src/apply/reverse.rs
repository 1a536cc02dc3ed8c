//! `ReverseHold`: give an Authorized hold's slot and remaining exposure back. A hold that was
//! already reversed (by expiry, cancel or another reverse) answers `AlreadyReversed`.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::EventKind;
use crate::family::{Family, Step};
use crate::hold::{HoldSlot, InvocationState};
use crate::ids::HoldId;

use super::hold_lookup::{Found, SlotHeld};

impl Family {
    pub(crate) fn reverse_hold(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        exposure_units: u64,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let found = self.touch_hold(hold_id, cmd, step)?;
        let (state, terminal) = match self.holds.get(hold_id) {
            Some(HoldSlot::Live(hold)) => (hold.invocation_state, hold.terminal.clone()),
            Some(HoldSlot::Archived(hold)) => (hold.states.invocation, hold.terminal.clone()),
            other => unreachable!("touch_hold accepted {other:?}"),
        };
        if state == InvocationState::Reversed {
            let terminal =
                terminal.unwrap_or_else(|| panic!("reversed hold {hold_id} has no terminal event"));
            if let Found::JustExpired(index) = found {
                assert_eq!(
                    index, terminal.commit_index,
                    "the expiry just appended ends the hold"
                );
            }
            let outcome = Outcome::AlreadyReversed {
                hold_id: hold_id.clone(),
                by_event_id: terminal.event_id.clone(),
            };
            return Ok(Family::decided(
                &cmd.header.event_id,
                outcome,
                Some(terminal.commit_index),
                step,
            ));
        }
        if state != InvocationState::Authorized {
            return Err(LedgerError::precondition(
                PreconditionCode::DispatchFenceCrossed,
                format!("hold {hold_id} is {state:?}: it crossed the dispatch commitment fence"),
            ));
        }
        let remaining = self.live_hold(hold_id).remaining_exposure_units;
        if exposure_units != remaining {
            return Err(LedgerError::precondition(
                PreconditionCode::ExposureMismatch,
                format!("reverse names {exposure_units} units, the hold has {remaining} remaining"),
            ));
        }
        let kind = reverse_kind(self, hold_id);
        let index = self.end_hold(
            hold_id,
            kind,
            &cmd.header.event_id,
            cmd.header.not_after_ms,
            SlotHeld::Reserved,
            step,
        )?;
        let outcome = Outcome::Reversed {
            hold_id: hold_id.clone(),
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

/// `reverse_invocation` when the grant has a quota, else `reverse_exposure`.
fn reverse_kind(family: &Family, hold_id: &HoldId) -> EventKind {
    let hold = family.live_hold(hold_id);
    let quota = family
        .accounts
        .get(&hold.accounts[0])
        .is_some_and(|account| account.limits.max_invocations.is_some());
    if quota {
        EventKind::ReverseInvocation
    } else {
        EventKind::ReverseExposure
    }
}
