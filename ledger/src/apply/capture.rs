//! `CaptureInvocation`: the dispatch commitment fence. Of N identical requests exactly one
//! attempt owns the capture; the others see `AlreadyCaptured` with the owner's attempt id.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{checked_add_u32, checked_sub_u32, LedgerError, PreconditionCode};
use crate::event::{EventKind, EventRecord};
use crate::family::{Family, NewEvent, Step};
use crate::hold::{HoldTransition, InvocationState};
use crate::ids::{AttemptId, HoldId};

use super::hold_lookup::{hold_expired, Found};

impl Family {
    pub(crate) fn capture(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        attempt_id: &AttemptId,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        match self.touch_hold(hold_id, cmd, step)? {
            Found::JustExpired(_) => return Err(hold_expired(hold_id)),
            Found::Archived => return Err(not_authorized(hold_id, "terminal")),
            Found::Live => {}
        }
        let hold = self.live_hold(hold_id);
        if hold.invocation_state != InvocationState::Authorized {
            return Err(not_authorized(
                hold_id,
                &format!("{:?}", hold.invocation_state),
            ));
        }
        if hold.authorized_exposure_units > 0 && hold.remaining_exposure_units == 0 {
            return Err(LedgerError::precondition(
                PreconditionCode::NoRemainingExposure,
                format!("hold {hold_id} released all its exposure; nothing left to capture"),
            ));
        }
        let before = hold.states();
        let planned = self.plan_accounts(&hold.accounts, |account| {
            let mut next = account.clone();
            next.reserved_invocations =
                checked_sub_u32(next.reserved_invocations, 1, "reserved_invocations")?;
            next.captured_invocations =
                checked_add_u32(next.captured_invocations, 1, "captured_invocations")?;
            Ok(next)
        })?;
        let now_ms = step.now_ms();
        let index = step.ctx.base_index();
        let after_images = self.commit_accounts(planned, index, now_ms);
        let hold = self.live_hold_mut(hold_id);
        hold.invocation_state = InvocationState::Captured;
        hold.capture_attempt_id = Some(attempt_id.clone());
        hold.captured = Some(HoldTransition {
            event_id: cmd.header.event_id.clone(),
            commit_index: index,
        });
        let zero_exposure = hold.authorized_exposure_units == 0;
        let record = EventRecord {
            event_id: cmd.header.event_id.clone(),
            kind: EventKind::CaptureInvocation,
            commit_index: index,
            log_id: step.ctx.log_id,
            at_ms: now_ms,
            capability_id: cmd.header.capability_id.clone(),
            grant_index: cmd.header.grant_index,
            hold_id: Some(hold_id.clone()),
            attempt_id: Some(attempt_id.clone()),
            nonce_id: None,
            allowed: true,
            deny_reason: None,
            exposure_units: hold.remaining_exposure_units,
            realized_units: 0,
            limits: None,
            hold_before: Some(before),
            hold_after: Some(hold.states()),
            after_images,
        };
        if let Some(at) = hold.expires_at_ms {
            // Captured holds never expire: the tool may have run.
            self.expiry_index.remove(&(at, hold_id.clone()));
        }
        let appended = self.append(
            step,
            NewEvent {
                record,
                keep_until_ms: cmd.header.not_after_ms,
            },
        );
        assert_eq!(
            appended, index,
            "the capture event must be the command's first"
        );
        if zero_exposure {
            // Final once captured; archived after retention like a terminal hold.
            self.schedule(
                now_ms,
                step.ctx.params,
                crate::family::CompactionItem::Hold(crate::keyed::Keyed::new(hold_id.clone())),
            );
        }
        let outcome = Outcome::Captured {
            hold_id: hold_id.clone(),
            attempt_id: attempt_id.clone(),
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(index),
            step,
        ))
    }
}

fn not_authorized(hold_id: &HoldId, state: &str) -> LedgerError {
    LedgerError::precondition(
        PreconditionCode::HoldNotAuthorized,
        format!("hold {hold_id} is {state}, not Authorized"),
    )
}
