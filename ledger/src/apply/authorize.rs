//! `AuthorizeHold`: reserve on the grant account and every ancestor account, atomically.

use crate::account::{Account, AccountKey};
use crate::command::{ClientCommand, Operation};
use crate::decision::{Decision, Outcome};
use crate::error::{checked_add, ConflictReason, LedgerError, PreconditionCode};
use crate::event::{EventKind, EventRecord};
use crate::family::{Family, NewEvent, Step};
use crate::hold::{Hold, HoldSlot, HoldTransition, InvocationState, MonetaryState};
use crate::limits::MAX_LIVE_HOLDS_PER_FAMILY;

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
        if self.holds.contains_key(hold_id) {
            return Err(LedgerError::Conflict(ConflictReason::HoldReused {
                hold_id: hold_id.to_string(),
            }));
        }
        if self.live_holds >= MAX_LIVE_HOLDS_PER_FAMILY {
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
        let mut targets: Vec<(AccountKey, &crate::account::GrantLimits)> =
            vec![(cmd.header.account(), limits)];
        targets.extend(ancestors.iter().map(|a| (a.account.clone(), &a.limits)));

        // Pinned limits first: a mismatch is an error, not a denial.
        let mut current = Vec::with_capacity(targets.len());
        for (key, limits) in &targets {
            let account = match self.accounts.get(key) {
                Some(account) => {
                    account.check_pinned(limits)?;
                    account.clone()
                }
                None => Account::new((*limits).clone()),
            };
            current.push(account);
        }
        let mut denial = None;
        for ((key, _), account) in targets.iter().zip(&current) {
            if let Some(reason) = account.admit(key, requested, true)? {
                denial = Some(reason);
                break;
            }
        }
        let planned = match denial {
            Some(_) => Vec::new(),
            None => targets
                .iter()
                .zip(&current)
                .map(|((key, _), account)| Ok((key.clone(), account.admitted(requested, false)?)))
                .collect::<Result<Vec<_>, LedgerError>>()?,
        };

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
        let mut record = EventRecord {
            event_id: cmd.header.event_id.clone(),
            kind,
            commit_index: Default::default(),
            log_id: Default::default(),
            at_ms: 0,
            capability_id: cmd.header.capability_id.clone(),
            grant_index: cmd.header.grant_index,
            hold_id: Some(hold_id.clone()),
            attempt_id: None,
            nonce_id: None,
            allowed,
            deny_reason: denial.clone(),
            exposure_units: requested,
            realized_units: 0,
            limits: Some(limits.clone()),
            hold_before: None,
            hold_after: None,
            after_images: Vec::new(),
        };
        if let Some(reason) = denial {
            let index = self.append(
                step,
                NewEvent {
                    record,
                    keep_until_ms: cmd.header.not_after_ms,
                },
            );
            self.holds.insert(
                hold_id.clone(),
                HoldSlot::Denied {
                    event_id: cmd.header.event_id.clone(),
                },
            );
            return Ok(Family::decided(
                &cmd.header.event_id,
                Outcome::Denied { reason },
                Some(index),
                step,
            ));
        }

        let accounts: Vec<AccountKey> = planned.iter().map(|(key, _)| key.clone()).collect();
        let index_preview = step.ctx.base_index();
        let hold = Hold {
            hold_id: hold_id.clone(),
            capability_id: cmd.header.capability_id.clone(),
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
                commit_index: index_preview,
            },
            captured: None,
            last_release: None,
            terminal: None,
            terminal_at_ms: None,
        };
        record.hold_after = Some(hold.states());
        record.after_images = self.commit_accounts(planned, index_preview, now_ms);
        let index = self.append(
            step,
            NewEvent {
                record,
                keep_until_ms: cmd.header.not_after_ms,
            },
        );
        assert_eq!(
            index, index_preview,
            "the authorize event must be the command's first"
        );
        if let Some(at) = expires_at_ms {
            self.expiry_index.insert((at, hold_id.clone()));
        }
        self.holds
            .insert(hold_id.clone(), HoldSlot::Live(Box::new(hold)));
        self.live_holds += 1;
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
