//! `CaptureInvocation`: the dispatch commitment fence. Of N identical requests exactly one
//! attempt owns the capture; the others see `AlreadyCaptured` with the owner's attempt id.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{checked_add_u32, checked_sub_u32, LedgerError, PreconditionCode};
use crate::event::{EventKind, EventRecord};
use crate::family::{Family, Keep, NewEvent, Step};
use crate::hold::{HoldTransition, InvocationState};
use crate::ids::{AttemptId, HoldId};
use crate::tables::compaction_queue::CompactionItem;

use super::hold_lookup::{hold_event, hold_expired, touch_hold, Found};

impl Family {
    pub(crate) fn capture(
        &mut self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        attempt_id: &AttemptId,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let (holds, mut books) = self.split();
        let hold = match touch_hold(holds, &mut books, hold_id, cmd, step)? {
            Found::JustExpired(..) => return Err(hold_expired(hold_id)),
            Found::Archived(_) => return Err(not_authorized(hold_id, "terminal")),
            Found::Live(hold) => hold,
        };
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
        let now_ms = step.now_ms();
        let index = step.ctx.base_index();
        let after_images = books.plan_accounts(&hold.accounts, index, now_ms, |account| {
            let mut next = account.clone();
            next.reserved_invocations =
                checked_sub_u32(next.reserved_invocations, 1, "reserved_invocations")?;
            next.captured_invocations =
                checked_add_u32(next.captured_invocations, 1, "captured_invocations")?;
            Ok(next)
        })?;
        books.commit_accounts(&after_images);
        hold.invocation_state = InvocationState::Captured;
        hold.capture_attempt_id = Some(attempt_id.clone());
        hold.captured = Some(HoldTransition {
            event_id: cmd.header.event_id.clone(),
            commit_index: index,
        });
        let record = EventRecord {
            exposure_units: hold.remaining_exposure_units,
            hold_before: Some(before),
            after_images,
            ..hold_event(
                hold,
                EventKind::CaptureInvocation,
                &cmd.header.event_id,
                step,
            )
        };
        if let Some(at) = hold.expires_at_ms {
            // Captured holds never expire: the tool may have run.
            books.expiry_index.remove(&(at, hold.hold_id.clone()));
        }
        let appended = books.append(
            step,
            NewEvent {
                record,
                keep: Keep::WithCommand,
            },
        );
        assert_eq!(
            appended, index,
            "the capture event must be the command's first"
        );
        if hold.authorized_exposure_units == 0 {
            // Final once captured; archived after retention like a terminal hold.
            books.schedule(
                now_ms,
                step.ctx.params,
                CompactionItem::Hold(hold.hold_id.clone()),
            );
        }
        let outcome = Outcome::Captured {
            hold_id: hold.hold_id.clone(),
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
