//! Replays (docs/spec.md §5.2): same `event_id`, same identity. Nothing is appended and no limit is
//! re-checked; the answer comes from the stored outcome and, for authorize and capture, from
//! where the hold is now.

use crate::cold::ColdHold;
use crate::command::{ClientCommand, Operation};
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::family::Family;
use crate::hold::{HoldSlot, HoldStates, HoldTransition, InvocationState};
use crate::ids::{AttemptId, HoldId};

use super::hold_lookup::hold_expired;

/// Where a hold is, as far as a replay needs to know.
struct HoldNow {
    states: HoldStates,
    expired: bool,
    owner: Option<AttemptId>,
    captured: Option<HoldTransition>,
}

impl Family {
    pub(crate) fn replay(
        &self,
        cmd: &ClientCommand,
        original: Decision,
        now_ms: u64,
    ) -> Result<Decision, LedgerError> {
        let watches_hold = matches!(
            (&cmd.op, &original.outcome),
            (Operation::AuthorizeHold { .. }, Outcome::Authorized { .. })
                | (
                    Operation::CaptureInvocation { .. },
                    Outcome::Captured { .. }
                )
        );
        if !watches_hold {
            return Ok(original.replay_of());
        }
        let hold_id = cmd.op.hold_id().expect("authorize and capture name a hold");
        let now = self.hold_now(hold_id, now_ms);
        let is_authorize = matches!(cmd.op, Operation::AuthorizeHold { .. });
        match now.states.invocation {
            InvocationState::Authorized if now.expired => Err(hold_expired(hold_id)),
            InvocationState::Authorized => {
                assert!(
                    is_authorize,
                    "hold {hold_id} went back to Authorized after a capture"
                );
                Ok(original.replay_of())
            }
            InvocationState::Captured => {
                let captured = now.captured.expect("a captured hold records its capture");
                let outcome = Outcome::AlreadyCaptured {
                    hold_id: hold_id.clone(),
                    owner_attempt_id: now.owner.expect("a captured hold records its owner"),
                    capture_event_id: captured.event_id,
                    capture_commit_index: captured.commit_index,
                };
                Ok(Decision {
                    outcome,
                    ..original.replay_of()
                })
            }
            InvocationState::Reversed if is_authorize => Err(LedgerError::precondition(
                PreconditionCode::TerminallyReversed,
                format!("terminally reversed hold {hold_id}"),
            )),
            InvocationState::Reversed => Err(LedgerError::precondition(
                PreconditionCode::Superseded,
                format!("superseded: the capture of hold {hold_id} was cancelled"),
            )),
        }
    }

    fn hold_now(&self, hold_id: &HoldId, now_ms: u64) -> HoldNow {
        match self.holds.get(hold_id) {
            Some(HoldSlot::Live(hold)) => HoldNow {
                states: hold.states(),
                expired: hold.is_expired_at(now_ms),
                owner: hold.capture_attempt_id.clone(),
                captured: hold.captured.clone(),
            },
            Some(HoldSlot::Archived(hold)) => HoldNow {
                states: hold.states,
                expired: false,
                owner: hold.capture_attempt_id.clone(),
                captured: hold.captured.clone(),
            },
            None => match self.cold_lookup().hold(hold_id) {
                Some(ColdHold::Archived(hold)) => HoldNow {
                    states: hold.states,
                    expired: false,
                    owner: hold.capture_attempt_id.clone(),
                    captured: hold.captured.clone(),
                },
                Some(denied @ ColdHold::Denied { .. }) => {
                    panic!("an applied authorize or capture of {hold_id} left {denied:?}")
                }
                None => panic!("an applied authorize or capture of {hold_id} left no hold"),
            },
            other => panic!("an applied authorize or capture of {hold_id} left {other:?}"),
        }
    }
}
