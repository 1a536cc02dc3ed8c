//! Finding the hold a command names, expiring it when it is due, and ending a hold: the
//! pieces every hold command shares.

use crate::cold::ColdHold;
use crate::command::ClientCommand;
use crate::commit_index::BudgetCommitIndex;
use crate::error::{checked_add, checked_sub, checked_sub_u32, LedgerError, PreconditionCode};
use crate::event::{AfterImages, EventKind, EventRecord};
use crate::family::{Books, Keep, NewEvent, Step};
use crate::hold::{ArchivedHold, Hold, HoldSlot, HoldTransition, InvocationState, MonetaryState};
use crate::ids::{CapabilityId, EventId, HoldId};
use crate::tables::compaction_queue::CompactionItem;
use crate::tables::id_table::IdTable;

/// What `touch_hold` found.
#[derive(Debug)]
pub(crate) enum Found<'h> {
    Live(&'h mut Hold),
    Archived(&'h ArchivedHold),
    /// It was Authorized and past its expiry: it has just been expired by this event.
    JustExpired(&'h Hold, BudgetCommitIndex),
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

/// The hold `cmd` names, on `cmd`'s own account, found with one lookup. A due Authorized hold
/// is expired first (an `expire_hold` event), as docs/spec.md §4 requires of any command that
/// touches it.
pub(crate) fn touch_hold<'h, 'f: 'h>(
    holds: &'h mut IdTable<HoldId, HoldSlot>,
    books: &mut Books<'f>,
    hold_id: &HoldId,
    cmd: &ClientCommand,
    step: &mut Step<'_>,
) -> Result<Found<'h>, LedgerError> {
    let on_other_account = |capability_id: &CapabilityId, grant_index: u32| {
        if capability_id != &cmd.header.capability_id || grant_index != cmd.header.grant_index {
            return Err(LedgerError::precondition(
                PreconditionCode::HoldOnOtherAccount,
                format!("hold {hold_id} belongs to {capability_id}/{grant_index}"),
            ));
        }
        Ok(())
    };
    let cold = books.cold;
    match holds.get_mut(hold_id) {
        None => match cold.hold(hold_id) {
            Some(ColdHold::Archived(hold)) => {
                on_other_account(&hold.capability_id, hold.grant_index)?;
                Ok(Found::Archived(hold))
            }
            // A denied authorize's claim, out of memory: as `HoldSlot::Denied` below.
            Some(ColdHold::Denied { .. }) | None => Err(LedgerError::precondition(
                PreconditionCode::UnknownHold,
                format!("unknown hold {hold_id}"),
            )),
        },
        Some(HoldSlot::Denied { .. }) => Err(LedgerError::precondition(
            PreconditionCode::UnknownHold,
            format!("unknown hold {hold_id}"),
        )),
        Some(HoldSlot::Archived(hold)) => {
            on_other_account(&hold.capability_id, hold.grant_index)?;
            Ok(Found::Archived(hold))
        }
        Some(HoldSlot::Live(hold)) => {
            on_other_account(&hold.capability_id, hold.grant_index)?;
            let hold = std::sync::Arc::make_mut(hold);
            if hold.is_expired_at(step.now_ms()) {
                let index = expire_hold(hold, books, step);
                return Ok(Found::JustExpired(hold, index));
            }
            Ok(Found::Live(hold))
        }
    }
}

/// Reverses an expired Authorized hold at cluster time (docs/spec.md §3 `expire`).
pub(crate) fn expire_hold(
    hold: &mut Hold,
    books: &mut Books<'_>,
    step: &mut Step<'_>,
) -> BudgetCommitIndex {
    let event_id = EventId::for_expiry(&hold.hold_id);
    let now_ms = step.now_ms();
    end_hold(
        hold,
        books,
        EventKind::ExpireHold,
        &event_id,
        Keep::Until(now_ms),
        SlotHeld::Reserved,
        step,
    )
    .unwrap_or_else(|err| panic!("expiring hold {} broke an invariant: {err}", hold.hold_id))
}

/// Reverse, cancel or expire: give the slot back, drop the remaining exposure on every
/// account of the hold, and make the hold terminal. Nothing changes on error.
pub(crate) fn end_hold(
    hold: &mut Hold,
    books: &mut Books<'_>,
    kind: EventKind,
    event_id: &EventId,
    keep: Keep,
    slot: SlotHeld,
    step: &mut Step<'_>,
) -> Result<BudgetCommitIndex, LedgerError> {
    let remaining = hold.remaining_exposure_units;
    let before = hold.states();
    let now_ms = step.now_ms();
    let index = step.ctx.base_index().with_event_position(step.appended());
    let after_images = books.plan_accounts(&hold.accounts, index, now_ms, |account| {
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
    books.commit_accounts(&after_images);
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
    let record = EventRecord {
        exposure_units: remaining,
        hold_before: Some(before),
        after_images,
        ..hold_event(hold, kind, event_id, step)
    };
    if let Some(at) = hold.expires_at_ms {
        books.expiry_index.remove(&(at, hold.hold_id.clone()));
    }
    let appended = books.append(step, NewEvent { record, keep });
    assert_eq!(
        appended, index,
        "the ending event must take the next position"
    );
    books.schedule(
        now_ms,
        step.ctx.params,
        CompactionItem::Hold(hold.hold_id.clone()),
    );
    Ok(index)
}

/// Plans `exposure -= removed, realized += realized` on every account of the hold.
pub(crate) fn plan_exposure_change(
    books: &Books<'_>,
    hold: &Hold,
    removed_units: u64,
    realized_units: u64,
    step: &Step<'_>,
) -> Result<AfterImages, LedgerError> {
    let index = step.ctx.base_index();
    books.plan_accounts(&hold.accounts, index, step.now_ms(), |account| {
        let mut next = account.clone();
        next.total_cost_exposed_units = checked_sub(
            next.total_cost_exposed_units,
            removed_units,
            "total_cost_exposed",
        )?;
        next.total_cost_realized_spend_units = checked_add(
            next.total_cost_realized_spend_units,
            realized_units,
            "total_cost_realized_spend",
        )?;
        Ok(next)
    })
}

/// An event on `hold` at the step's next position, with the hold's state now as its
/// after-state: the caller fills in amounts, the before-state and the after-images.
pub(crate) fn hold_event(
    hold: &Hold,
    kind: EventKind,
    event_id: &EventId,
    step: &Step<'_>,
) -> EventRecord {
    EventRecord {
        event_id: event_id.clone(),
        kind,
        commit_index: step.ctx.base_index().with_event_position(step.appended()),
        log_id: step.ctx.log_id,
        at_ms: step.now_ms(),
        capability_id: hold.capability_id.clone(),
        grant_index: hold.grant_index,
        hold_id: Some(hold.hold_id.clone()),
        attempt_id: hold.capture_attempt_id.clone(),
        nonce_id: None,
        allowed: true,
        deny_reason: None,
        exposure_units: 0,
        realized_units: 0,
        limits: None,
        hold_before: None,
        hold_after: Some(hold.states()),
        after_images: AfterImages::new(),
    }
}
