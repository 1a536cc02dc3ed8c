//! `ConsumeNonce` \[distributed\]: an execution nonce is spent once per family, on whichever
//! kernel node presents it, and remembered until it expires.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome};
use crate::error::{LedgerError, PreconditionCode};
use crate::event::{AfterImages, EventKind, EventRecord};
use crate::family::{Family, Keep, NewEvent, Step};
use crate::ids::NonceId;
use crate::limits::MAX_NONCE_TTL_MS;
use crate::tables::compaction_queue::CompactionItem;

impl Family {
    pub(crate) fn consume_nonce(
        &mut self,
        cmd: &ClientCommand,
        nonce_id: &NonceId,
        expires_at_ms: u64,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        let now_ms = step.now_ms();
        if self.nonces.contains_key(nonce_id) {
            return Err(LedgerError::precondition(
                PreconditionCode::NonceReplayed,
                format!("nonce {nonce_id} was consumed already"),
            ));
        }
        if expires_at_ms <= now_ms {
            return Err(LedgerError::precondition(
                PreconditionCode::NonceExpired,
                format!("nonce {nonce_id} expired at {expires_at_ms}, cluster time is {now_ms}"),
            ));
        }
        if expires_at_ms - now_ms > MAX_NONCE_TTL_MS {
            return Err(LedgerError::precondition(
                PreconditionCode::NonceLifetimeTooLong,
                format!("nonce {nonce_id} lives past the {MAX_NONCE_TTL_MS} ms limit"),
            ));
        }
        let record = EventRecord {
            event_id: cmd.header.event_id.clone(),
            kind: EventKind::ConsumeNonce,
            commit_index: step.ctx.base_index(),
            log_id: step.ctx.log_id,
            at_ms: now_ms,
            capability_id: cmd.header.capability_id.clone(),
            grant_index: cmd.header.grant_index,
            hold_id: None,
            attempt_id: None,
            nonce_id: Some(nonce_id.clone()),
            allowed: true,
            deny_reason: None,
            exposure_units: 0,
            realized_units: 0,
            limits: None,
            hold_before: None,
            hold_after: None,
            after_images: AfterImages::new(),
        };
        let index = self.append(
            step,
            NewEvent {
                record,
                keep: Keep::WithCommand,
            },
        );
        self.nonces.insert(nonce_id.clone(), expires_at_ms);
        // Forgotten once expired: a late copy is refused as expired, not as fresh.
        self.compaction_queue.push(
            step.ctx.params.compaction_key_at(expires_at_ms),
            CompactionItem::Nonce(nonce_id.clone()),
            None,
        );
        let outcome = Outcome::NonceConsumed {
            nonce_id: nonce_id.clone(),
        };
        Ok(Family::decided(
            &cmd.header.event_id,
            outcome,
            Some(index),
            step,
        ))
    }
}
