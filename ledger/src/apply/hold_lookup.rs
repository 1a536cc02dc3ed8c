//! Finding the hold a command names, expiring it when it is due, and ending a hold: the
//! pieces every hold command shares.

use crate::account::Account;
use crate::command::ClientCommand;
use crate::commit_index::BudgetCommitIndex;
use crate::error::{checked_sub, checked_sub_u32, LedgerError, PreconditionCode};
use crate::event::{EventKind, EventRecord};
use crate::family::{CompactionItem, Family, NewEvent, Step};
use crate::hold::{HoldSlot, HoldTransition, InvocationState, MonetaryState};
use crate::ids::{EventId, HoldId};
use crate::keyed::Keyed;

/// What `touch_hold` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    Live,
    Archived,
    /// It was Authorized and past its expiry: it has just been expired.
    JustExpired(BudgetCommitIndex),
}

/// Which invocation slot an ending hold gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotHeld {
    Reserved,
    Captured,
}

pub(crate) fn hold_expired(hold_id: &HoldId) -> LedgerError {
    LedgerError::precondition(
        PreconditionCode::HoldExpired,
        format!("hold expired: {hold_id}"),
    )
}

impl Family {
    /// The hold `cmd` names, on `cmd`'s own account. A due Authorized hold is expired first
    /// (an `expire_hold` event), as SPEC.md §4 requires of any command that touches it.
    pub(crate) fn touch_hold(
        &mut self,
        hold_id: &HoldId,
        cmd: &ClientCommand,
        step: &mut Step<'_>,
    ) -> Result<Found, LedgerError> {
        let (found, capability_id, grant_index, expired) = match self.holds.get(hold_id) {
            None | Some(HoldSlot::Denied { .. }) => {
                return Err(LedgerError::precondition(
                    PreconditionCode::UnknownHold,
                    format!("unknown hold {hold_id}"),
                ))
            }
            Some(HoldSlot::Live(hold)) => (
                Found::Live,
                &hold.capability_id,
                hold.grant_index,
                hold.is_expired_at(step.now_ms()),
            ),
            Some(HoldSlot::Archived(hold)) => (
                Found::Archived,
                &hold.capability_id,
                hold.grant_index,
                false,
            ),
        };
        if capability_id != &cmd.header.capability_id || grant_index != cmd.header.grant_index {
            return Err(LedgerError::precondition(
                PreconditionCode::HoldOnOtherAccount,
                format!("hold {hold_id} belongs to {capability_id}/{grant_index}"),
            ));
        }
        if expired {
            let index = self.expire_hold(hold_id, step);
            return Ok(Found::JustExpired(index));
        }
        Ok(found)
    }

    /// Reverses an expired Authorized hold at cluster time (SPEC.md §3 `expire`).
    pub(crate) fn expire_hold(
        &mut self,
        hold_id: &HoldId,
        step: &mut Step<'_>,
    ) -> BudgetCommitIndex {
        let event_id = EventId::for_expiry(hold_id);
        let now_ms = step.now_ms();
        self.end_hold(
            hold_id,
            EventKind::ExpireHold,
            &event_id,
            now_ms,
            SlotHeld::Reserved,
            step,
        )
        .unwrap_or_else(|err| panic!("expiring hold {hold_id} broke an invariant: {err}"))
    }

    /// Reverse, cancel or expire: give the slot back, drop the remaining exposure on every
    /// account of the hold, and make the hold terminal. Nothing changes on error.
    pub(crate) fn end_hold(
        &mut self,
        hold_id: &HoldId,
        kind: EventKind,
        event_id: &EventId,
        keep_until_ms: u64,
        slot: SlotHeld,
        step: &mut Step<'_>,
    ) -> Result<BudgetCommitIndex, LedgerError> {
        let hold = self.live_hold(hold_id);
        let remaining = hold.remaining_exposure_units;
        let before = hold.states();
        let planned = self.plan_accounts(&hold.accounts, |account: &Account| {
            let mut next = account.clone();
            next.invocation_count = checked_sub_u32(next.invocation_count, 1, "invocation_count")?;
            next.total_cost_exposed_units = checked_sub(
                next.total_cost_exposed_units,
                remaining,
                "total_cost_exposed",
            )?;
            match slot {
                SlotHeld::Reserved => {
                    next.reserved_invocations =
                        checked_sub_u32(next.reserved_invocations, 1, "reserved_invocations")?
                }
                SlotHeld::Captured => {
                    next.captured_invocations =
                        checked_sub_u32(next.captured_invocations, 1, "captured_invocations")?
                }
            }
            Ok(next)
        })?;
        let now_ms = step.now_ms();
        let index = step.ctx.base_index().with_event_position(step.appended());
        let after_images = self.commit_accounts(planned, index, now_ms);
        let hold = self.live_hold_mut(hold_id);
        hold.reversed_units += remaining;
        hold.remaining_exposure_units = 0;
        hold.invocation_state = InvocationState::Reversed;
        if hold.monetary_state != MonetaryState::None {
            hold.monetary_state = MonetaryState::Reversed;
        }
        hold.terminal = Some(HoldTransition {
            event_id: event_id.clone(),
            commit_index: index,
        });
        hold.terminal_at_ms = Some(now_ms);
        hold.assert_conserved();
        let after = hold.states();
        let record = EventRecord {
            event_id: event_id.clone(),
            kind,
            commit_index: index,
            log_id: step.ctx.log_id,
            at_ms: now_ms,
            capability_id: hold.capability_id.clone(),
            grant_index: hold.grant_index,
            hold_id: Some(hold_id.clone()),
            attempt_id: hold.capture_attempt_id.clone(),
            nonce_id: None,
            allowed: true,
            deny_reason: None,
            exposure_units: remaining,
            realized_units: 0,
            limits: None,
            hold_before: Some(before),
            hold_after: Some(after),
            after_images,
        };
        if let Some(at) = hold.expires_at_ms {
            self.expiry_index.remove(&(at, hold_id.clone()));
        }
        let appended = self.append(
            step,
            NewEvent {
                record,
                keep_until_ms,
            },
        );
        assert_eq!(
            appended, index,
            "the ending event must take the next position"
        );
        self.schedule(
            now_ms,
            step.ctx.params,
            CompactionItem::Hold(Keyed::new(hold_id.clone())),
        );
        Ok(index)
    }
}

impl Family {
    /// Plans `exposure -= removed, realized += realized` on every account of the hold.
    pub(crate) fn plan_exposure_change(
        &self,
        hold_id: &HoldId,
        removed_units: u64,
        realized_units: u64,
    ) -> Result<Vec<(crate::account::AccountKey, Account)>, LedgerError> {
        let hold = self.live_hold(hold_id);
        self.plan_accounts(&hold.accounts, |account| {
            let mut next = account.clone();
            next.total_cost_exposed_units = checked_sub(
                next.total_cost_exposed_units,
                removed_units,
                "total_cost_exposed",
            )?;
            next.total_cost_realized_spend_units = crate::error::checked_add(
                next.total_cost_realized_spend_units,
                realized_units,
                "total_cost_realized_spend",
            )?;
            Ok(next)
        })
    }

    /// An event on a live hold, with the fields common to release and reconcile.
    pub(crate) fn hold_event(
        &self,
        cmd: &ClientCommand,
        hold_id: &HoldId,
        kind: EventKind,
        step: &Step<'_>,
    ) -> EventRecord {
        let hold = self.live_hold(hold_id);
        EventRecord {
            event_id: cmd.header.event_id.clone(),
            kind,
            commit_index: step.ctx.base_index(),
            log_id: step.ctx.log_id,
            at_ms: step.now_ms(),
            capability_id: hold.capability_id.clone(),
            grant_index: hold.grant_index,
            hold_id: Some(hold_id.clone()),
            attempt_id: hold.capture_attempt_id.clone(),
            nonce_id: None,
            allowed: true,
            deny_reason: None,
            exposure_units: 0,
            realized_units: 0,
            limits: None,
            hold_before: Some(hold.states()),
            hold_after: None,
            after_images: Vec::new(),
        }
    }
}
