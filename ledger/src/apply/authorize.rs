//! `AuthorizeHold`: reserve on the grant account and every ancestor account, atomically.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::account::{Account, AccountKey, GrantLimits};
use crate::command::{ClientCommand, Operation};
use crate::decision::{Decision, Outcome};
use crate::error::{checked_add, ConflictReason, LedgerError, PreconditionCode};
use crate::event::{AfterImages, EventKind, EventRecord};
use crate::family::{stamped, Family, Keep, NewEvent, Step};
use crate::hold::{Hold, HoldAccounts, HoldSlot, HoldTransition, InvocationState, MonetaryState};
use crate::limits::MAX_LIVE_HOLDS_PER_FAMILY;
use crate::tables::id_table::Entry;

impl Family {
    pub(crate) fn authorize_hold(
        &mut self,
        cmd: &ClientCommand,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let Operation::AuthorizeHold {
            hold_id,
            requested_exposure_units,
            limits,
            ancestors,
            hold_timeout_ms,
        } = &cmd.op
        else {
            unreachable!("authorize_hold called with {}", cmd.op.name());
        };
        let requested = *requested_exposure_units;
        let (holds, mut books) = self.split();
        if books.cold.hold(hold_id).is_some() {
            return Err(LedgerError::Conflict(ConflictReason::HoldReused {
                hold_id: hold_id.to_string(),
            }));
        }
        let slot = match holds.entry(hold_id.clone()) {
            Entry::Occupied(_) => {
                return Err(LedgerError::Conflict(ConflictReason::HoldReused {
                    hold_id: hold_id.to_string(),
                }))
            }
            Entry::Vacant(slot) => slot,
        };
        if *books.live_holds >= MAX_LIVE_HOLDS_PER_FAMILY {
            return Err(LedgerError::precondition(
                PreconditionCode::FamilyFull,
                format!("family holds {MAX_LIVE_HOLDS_PER_FAMILY} live holds; finish some first"),
            ));
        }
        let now_ms = step.now_ms();
        let expires_at_ms = match hold_timeout_ms {
            Some(timeout) => Some(checked_add(now_ms, *timeout, "hold expiry")?),
            None => None,
        };
        let grant = cmd.header.account();
        // The grant account, then each ancestor account, with the limits the command names.
        let targets = || {
            std::iter::once((&grant, limits))
                .chain(ancestors.iter().map(|a| (&a.account, &a.limits)))
        };

        // Pinned limits first: a mismatch is an error, not a denial.
        for (key, limits) in targets() {
            if let Some(account) = books.accounts.get(key) {
                account.check_pinned(limits)?;
            }
        }
        let mut denial = None;
        for (key, limits) in targets() {
            let (key, account) = current(books.accounts, key, limits);
            if let Some(reason) = account.admit(key, requested, true)? {
                denial = Some(reason);
                break;
            }
        }
        let index = step.ctx.base_index();
        let mut after_images = AfterImages::new();
        if denial.is_none() {
            after_images.reserve_exact(1 + ancestors.len());
            for (key, limits) in targets() {
                let (key, account) = current(books.accounts, key, limits);
                let next = account.admitted(requested, false)?;
                after_images.push(stamped(key, next, index, now_ms));
            }
        }

        let kind = if limits.max_invocations.is_some() {
            EventKind::ReserveInvocation
        } else {
            EventKind::AuthorizeExposure
        };
        let monetary = if requested > 0 {
            MonetaryState::Exposed
        } else {
            MonetaryState::None
        };
        let allowed = denial.is_none();
        let capability_id = after_images
            .first()
            .map_or(&cmd.header.capability_id, |grant| &grant.key.capability_id);
        let mut record = EventRecord {
            event_id: cmd.header.event_id.clone(),
            kind,
            commit_index: Default::default(),
            log_id: Default::default(),
            at_ms: 0,
            capability_id: capability_id.clone(),
            grant_index: cmd.header.grant_index,
            hold_id: Some(hold_id.clone()),
            attempt_id: None,
            nonce_id: None,
            allowed,
            deny_reason: denial.clone(),
            exposure_units: requested,
            realized_units: 0,
            // The grant's image holds the pinned limits, equal to the command's: its copy is
            // the row's where the account existed.
            limits: Some(
                after_images
                    .first()
                    .map_or(limits, |grant| &grant.account.limits)
                    .clone(),
            ),
            hold_before: None,
            hold_after: None,
            after_images: AfterImages::new(),
        };
        if let Some(reason) = denial {
            let index = books.append(
                step,
                NewEvent {
                    record,
                    keep: Keep::WithCommand,
                },
            );
            slot.insert(HoldSlot::Denied {
                event_id: cmd.header.event_id.clone(),
            });
            return Ok(Family::decided(
                &cmd.header.event_id,
                Outcome::Denied { reason },
                Some(index),
                step,
            ));
        }

        let accounts: HoldAccounts = after_images.iter().map(|image| image.key.clone()).collect();
        let hold = Hold {
            hold_id: hold_id.clone(),
            capability_id: capability_id.clone(),
            grant_index: cmd.header.grant_index,
            accounts,
            authorized_exposure_units: requested,
            remaining_exposure_units: requested,
            released_units: 0,
            reversed_units: 0,
            realized_units: 0,
            unspent_units: 0,
            invocation_state: InvocationState::Authorized,
            monetary_state: monetary,
            expires_at_ms,
            created_at_ms: now_ms,
            capture_attempt_id: None,
            authorized: HoldTransition {
                event_id: cmd.header.event_id.clone(),
                commit_index: index,
            },
            captured: None,
            last_release: None,
            terminal: None,
            terminal_at_ms: None,
        };
        books.commit_accounts(&after_images);
        record.hold_after = Some(hold.states());
        record.after_images = after_images;
        let appended = books.append(
            step,
            NewEvent {
                record,
                keep: Keep::WithCommand,
            },
        );
        assert_eq!(
            appended, index,
            "the authorize event must be the command's first"
        );
        if let Some(at) = expires_at_ms {
            books.expiry_index.insert((at, hold_id.clone()));
        }
        slot.insert(HoldSlot::Live(std::sync::Arc::new(hold)));
        *books.live_holds += 1;
        let outcome = Outcome::Authorized {
            hold_id: hold_id.clone(),
            exposure_units: requested,
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(index),
            step,
        ))
    }
}

/// An account as it stands before the command, under the row's own key where the account
/// exists: the hold, its images and its records then share one string with the row (and
/// compare by pointer) instead of keeping the command's copy alive.
fn current<'a>(
    accounts: &'a BTreeMap<AccountKey, Account>,
    key: &'a AccountKey,
    limits: &GrantLimits,
) -> (&'a AccountKey, Cow<'a, Account>) {
    match accounts.get_key_value(key) {
        Some((stored, account)) => (stored, Cow::Borrowed(account)),
        None => (key, Cow::Owned(Account::new(limits.clone()))),
    }
}
