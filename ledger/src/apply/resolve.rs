//! `ResolveEvent` \[distributed\] (docs/spec.md §5.4): turns "unknown" into the committed answer or
//! a tombstone that makes "not applied" final.

use crate::command::ClientCommand;
use crate::decision::{Decision, Outcome, Resolution};
use crate::error::LedgerError;
use crate::family::{Family, Step};
use crate::tables::compaction_queue::CompactionItem;
use crate::tables::dedupe_table::DedupeRow;

impl Family {
    pub(crate) fn resolve(
        &mut self,
        original: &ClientCommand,
        step: &mut Step<'_>,
    ) -> Result<Decision, LedgerError> {
        original.validate()?;
        let event_id = &original.header.event_id;
        let row = (self.dedupe.get(event_id))
            .or_else(|| self.cold_lookup().event(event_id).map(DedupeRow::Applied));
        let resolution = match row {
            Some(DedupeRow::Tombstoned(stored)) => {
                self.same_command(stored, CompactionItem::Tombstone, original)?;
                Resolution::NotApplied
            }
            Some(DedupeRow::Applied(row)) => {
                self.same_command(&row.identity, CompactionItem::Command, original)?;
                Resolution::Applied(Box::new(row.decision(event_id).replay_of()))
            }
            None => {
                let retention_ms = step.ctx.params.retention_ms;
                let keep_until_ms = original.header.not_after_ms;
                // Past not_after + retention no copy can apply any more: nothing to remember.
                if keep_until_ms.saturating_add(retention_ms) >= step.now_ms() {
                    let key = (step.ctx.params).compaction_key(keep_until_ms.max(step.now_ms()));
                    let identity = self.retain(original, key, CompactionItem::Tombstone, None);
                    assert!(
                        self.dedupe.insert_tombstone(event_id.clone(), identity),
                        "event {event_id} was resolved twice"
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
