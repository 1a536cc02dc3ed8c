//! The reads of docs/spec.md §7, over one family. The router merges them across families.

use crate::account::{AccountKey, UsageRecord};
use crate::commit_index::BudgetCommitIndex;
use crate::event::{EventLookup, EventRecord};
use crate::family::Family;
use crate::hold::{Hold, HoldSlot, HoldView, InvocationState};
use crate::ids::{CapabilityId, EventId, HoldId};
use crate::limits::MAX_LIST_LIMIT;
use crate::list_position::{hold_order, usage_order, HoldPosition, UsagePosition};
use crate::tables::dedupe_table::DedupeRow;

/// Which holds `list_holds` returns (for reconcilers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HoldFilter {
    pub state: Option<InvocationState>,
    pub created_before_ms: Option<u64>,
    /// Only holds that still expose funds (remaining exposure > 0): the ones a reconciler can
    /// finish. Captured calls without exposure are final and would otherwise crowd them out.
    pub with_remaining_exposure: bool,
    /// Only holds after this one in list order: the next page after a full one.
    pub after: Option<HoldPosition>,
}

impl Family {
    pub fn get_usage(&self, key: &AccountKey) -> Option<UsageRecord> {
        self.accounts.get(key).map(|account| UsageRecord {
            key: key.clone(),
            account: account.clone(),
        })
    }

    /// Ordered by `(updated_at_ms desc, capability_id, grant_index)`; after `after` (a
    /// position in the cross-family order, see `list_position.rs`) when given.
    pub fn list_usages(
        &self,
        capability_id: Option<&CapabilityId>,
        after: Option<&UsagePosition>,
        limit: usize,
    ) -> Vec<UsageRecord> {
        let mut rows: Vec<UsageRecord> = self
            .accounts
            .iter()
            .filter(|(key, _)| capability_id.is_none_or(|c| &key.capability_id == c))
            .map(|(key, account)| UsageRecord {
                key: key.clone(),
                account: account.clone(),
            })
            .filter(|row| after.is_none_or(|after| after.compare_row(&self.family_id, row).is_gt()))
            .collect();
        rows.sort_by(|a, b| usage_order((&self.family_id, a), (&self.family_id, b)));
        rows.truncate(limit.min(MAX_LIST_LIMIT));
        rows
    }

    /// Retained events in commit order, after `after` when given.
    pub fn list_events(
        &self,
        capability_id: Option<&CapabilityId>,
        grant_index: Option<u32>,
        after: Option<BudgetCommitIndex>,
        limit: usize,
    ) -> Vec<EventRecord> {
        self.journal
            .records_after(after)
            .filter(|r| capability_id.is_none_or(|c| &r.capability_id == c))
            .filter(|r| grant_index.is_none_or(|g| r.grant_index == g))
            .take(limit.min(MAX_LIST_LIMIT))
            .cloned()
            .collect()
    }

    /// `Unknown` is never a no: only `ResolveEvent` makes "not applied" final.
    pub fn get_event(&self, event_id: &EventId) -> EventLookup {
        match self.dedupe.get(event_id) {
            Some(DedupeRow::Applied(row)) => {
                let decision = row.decision(event_id);
                let record = decision
                    .commit_index
                    .and_then(|index| self.journal.get(index))
                    .filter(|record| &record.event_id == event_id)
                    .cloned();
                EventLookup::Applied { decision, record }
            }
            Some(DedupeRow::Tombstoned(_)) => EventLookup::Tombstoned,
            None if event_id.is_reserved() => self.cluster_event(event_id),
            // Moved out by the last batch, so perhaps not in the node's store yet.
            None => match self.cold_rows.moved_event(event_id) {
                Some(row) => EventLookup::Applied {
                    decision: row.decision(event_id),
                    record: None,
                },
                // Perhaps among the rows out of memory: the caller looks there next.
                None => EventLookup::Unknown,
            },
        }
    }

    /// Cluster-minted events (expiries) are not deduped; find them in the journal.
    fn cluster_event(&self, event_id: &EventId) -> EventLookup {
        self.journal
            .records()
            .find(|record| &record.event_id == event_id)
            .map_or(EventLookup::Unknown, |record| EventLookup::Applied {
                decision: crate::decision::Decision {
                    event_id: event_id.clone(),
                    outcome: crate::decision::Outcome::AlreadyReversed {
                        hold_id: record.hold_id.clone().expect("expiry names its hold"),
                        by_event_id: event_id.clone(),
                    },
                    commit_index: Some(record.commit_index),
                    log_id: Some(record.log_id),
                    replayed: true,
                },
                record: Some(record.clone()),
            })
    }

    /// `None`: no such hold in memory; it may be among the rows out of memory, which the
    /// caller reads next.
    pub fn get_hold(&self, hold_id: &HoldId) -> Option<HoldView> {
        let Some(slot) = self.holds.get(hold_id) else {
            return self
                .cold_rows
                .moved_hold(hold_id)
                .map(|hold| hold.clone().into_view(hold_id));
        };
        Some(match slot {
            HoldSlot::Live(hold) => HoldView::Live((**hold).clone()),
            HoldSlot::Denied { event_id } => HoldView::Denied {
                hold_id: hold_id.clone(),
                event_id: event_id.clone(),
            },
            HoldSlot::Archived(hold) => HoldView::Archived {
                hold_id: hold_id.clone(),
                hold: (**hold).clone(),
            },
        })
    }

    /// Live holds matching `filter`, oldest first (then by hold id), for reconcilers.
    pub fn list_holds(&self, filter: &HoldFilter, limit: usize) -> Vec<Hold> {
        let mut holds: Vec<&Hold> = self
            .holds
            .iter_unordered()
            .filter_map(|(_, slot)| match slot {
                HoldSlot::Live(hold) => Some(&**hold),
                _ => None,
            })
            .filter(|h| filter.state.is_none_or(|s| h.invocation_state == s))
            .filter(|h| filter.created_before_ms.is_none_or(|t| h.created_at_ms < t))
            .filter(|h| !filter.with_remaining_exposure || h.remaining_exposure_units > 0)
            .filter(|h| {
                (filter.after.as_ref())
                    .is_none_or(|after| after.compare_hold(&self.family_id, h).is_gt())
            })
            .collect();
        holds.sort_by(|a, b| hold_order((&self.family_id, a), (&self.family_id, b)));
        holds
            .into_iter()
            .take(limit.min(MAX_LIST_LIMIT))
            .cloned()
            .collect()
    }

    pub fn live_hold_count(&self) -> usize {
        self.live_holds
    }

    pub fn journal_len(&self) -> usize {
        self.journal.len()
    }
}
