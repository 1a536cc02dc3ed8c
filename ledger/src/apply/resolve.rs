//! `ResolveEvent` [distributed] (SPEC.md §5.4): turns "unknown" into the committed answer or a
//! tombstone that makes "not applied" final.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome, Resolution};
use crate::error::LedgerError;
use crate::family::{CompactionItem, DedupeEntry, Family, Step};
use crate::identity::{Identity, StoredIdentity};

impl Family {
    pub(crate) fn resolve(
        &mut self,
        original: &ClientCommand,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        original.validate()?;
        let identity = Identity::of(original);
        let event_id = &original.header.event_id;
        let resolution = match self.dedupe.get(event_id) {
            Some(DedupeEntry::Tombstoned(stored)) => {
                stored
                    .compare(&identity)
                    .map_err(LedgerError::conflict_fields)?;
                Resolution::NotApplied
            }
            Some(DedupeEntry::Applied(row)) => {
                row.identity
                    .compare(&identity)
                    .map_err(LedgerError::conflict_fields)?;
                Resolution::Applied(Box::new(row.decision.replay_of()))
            }
            None => {
                let params = step.ctx.params;
                let keep_until_ms = original.header.not_after_ms;
                // Past not_after + retention no copy can apply any more: nothing to remember.
                if keep_until_ms.saturating_add(params.retention_ms) >= step.now_ms() {
                    let entry =
                        DedupeEntry::Tombstoned(Box::new(StoredIdentity::Full(Box::new(identity))));
                    self.dedupe.insert(event_id.clone(), entry);
                    self.schedule(
                        keep_until_ms.max(step.now_ms()),
                        params,
                        CompactionItem::Dedupe(crate::keyed::Keyed::new(event_id.clone())),
                    );
                }
                Resolution::NotApplied
            }
        };
        Ok(Family::decided(
            event_id,
            Outcome::Resolved(resolution),
            None,
            step,
        ))
    }
}
