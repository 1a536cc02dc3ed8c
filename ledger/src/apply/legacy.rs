//! Legacy counters without a hold: what they add goes to the account's `legacy_unheld`
//! bucket, and only legacy undos take from it.

use crate::account::Account;
use crate::command::{ClientCommand, Operation};
use crate::decision::{Decision, Outcome};
use crate::error::{checked_add, checked_sub, checked_sub_u32, LedgerError, PreconditionCode};
use crate::event::{AfterImages, EventKind, EventRecord};
use crate::family::{stamped, Family, Keep, NewEvent, Step};

impl Family {
    pub(crate) fn legacy(
        &mut self,
        cmd: &ClientCommand,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let key = cmd.header.account();
        let (kind, exposure, realized, limits) = match &cmd.op {
            Operation::TryIncrement { limits } => {
                (EventKind::IncrementInvocation, 0, 0, Some(limits))
            }
            Operation::TryChargeCost { cost_units, limits } => {
                (EventKind::AuthorizeExposure, *cost_units, 0, Some(limits))
            }
            Operation::ReverseChargeCost { cost_units } => {
                (EventKind::ReverseExposure, *cost_units, 0, None)
            }
            Operation::ReduceChargeCost { cost_units } => {
                (EventKind::ReleaseExposure, *cost_units, 0, None)
            }
            Operation::SettleChargeCost {
                exposed_cost_units,
                realized_spend_units,
            } => (
                EventKind::ReconcileSpend,
                *exposed_cost_units,
                *realized_spend_units,
                None,
            ),
            other => unreachable!("legacy called with {}", other.name()),
        };
        let (next, denial) = match limits {
            Some(limits) => {
                let current = match self.accounts.get(&key) {
                    Some(account) => {
                        account.check_pinned(limits)?;
                        account.clone()
                    }
                    None => Account::new(limits.clone()),
                };
                let charge = matches!(cmd.op, Operation::TryChargeCost { .. });
                match current.admit(&key, exposure, charge)? {
                    Some(reason) => (None, Some(reason)),
                    None => (Some(current.admitted(exposure, true)?), None),
                }
            }
            None => {
                let current = self.accounts.get(&key).ok_or_else(|| {
                    LedgerError::precondition(
                        PreconditionCode::NoAccount,
                        format!("account {key:?} has no legacy charge to undo"),
                    )
                })?;
                (Some(undo(current, &cmd.op, exposure, realized)?), None)
            }
        };
        let mut record = EventRecord {
            event_id: cmd.header.event_id.clone(),
            kind,
            commit_index: step.ctx.base_index(),
            log_id: step.ctx.log_id,
            at_ms: step.now_ms(),
            capability_id: cmd.header.capability_id.clone(),
            grant_index: cmd.header.grant_index,
            hold_id: None,
            attempt_id: None,
            nonce_id: None,
            allowed: denial.is_none(),
            deny_reason: denial.clone(),
            exposure_units: exposure,
            realized_units: realized,
            limits: limits.cloned(),
            hold_before: None,
            hold_after: None,
            after_images: AfterImages::new(),
        };
        let index = record.commit_index;
        if let Some(next) = next {
            let image = stamped(&key, next, index, step.now_ms());
            let mut books = self.books();
            books.commit_accounts(std::slice::from_ref(&image));
            record.after_images = smallvec::smallvec![image];
        }
        let appended = self.append(
            step,
            NewEvent {
                record,
                keep: Keep::WithCommand,
            },
        );
        assert_eq!(
            appended, index,
            "the legacy event must be the command's first"
        );
        let outcome = match (denial, &cmd.op) {
            (Some(reason), _) => Outcome::Denied { reason },
            (None, Operation::TryIncrement { .. }) => Outcome::Incremented,
            (None, Operation::TryChargeCost { .. }) => Outcome::Charged {
                cost_units: exposure,
            },
            (None, Operation::ReverseChargeCost { .. }) => Outcome::ChargeReversed {
                cost_units: exposure,
            },
            (None, Operation::ReduceChargeCost { .. }) => Outcome::ChargeReduced {
                cost_units: exposure,
            },
            (None, _) => Outcome::ChargeSettled {
                exposed_cost_units: exposure,
                realized_spend_units: realized,
            },
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(index),
            step,
        ))
    }
}

/// Reverse, reduce or settle from the legacy bucket; short → `FailedPrecondition`.
fn undo(
    current: &Account,
    op: &Operation,
    exposure: u64,
    realized: u64,
) -> Result<Account, LedgerError> {
    let bucket = current.legacy_unheld;
    let needs_slot = matches!(op, Operation::ReverseChargeCost { .. });
    if bucket.exposed_units < exposure || (needs_slot && bucket.count == 0) {
        return Err(LedgerError::precondition(
            PreconditionCode::LegacyBucketShort,
            format!(
                "legacy bucket holds {} calls and {} units; the undo needs {} and {exposure}",
                bucket.count,
                bucket.exposed_units,
                u32::from(needs_slot)
            ),
        ));
    }
    let mut next = current.clone();
    next.total_cost_exposed_units = checked_sub(
        next.total_cost_exposed_units,
        exposure,
        "total_cost_exposed",
    )?;
    next.legacy_unheld.exposed_units =
        checked_sub(bucket.exposed_units, exposure, "legacy exposed")?;
    if needs_slot {
        next.invocation_count = checked_sub_u32(next.invocation_count, 1, "invocation_count")?;
        next.legacy_unheld.count = checked_sub_u32(bucket.count, 1, "legacy count")?;
    }
    next.total_cost_realized_spend_units = checked_add(
        next.total_cost_realized_spend_units,
        realized,
        "total_cost_realized_spend",
    )?;
    Ok(next)
}
