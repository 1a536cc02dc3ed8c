//! A replica's final state as the checker sees it: per family, the journal, the account rows
//! and the holds, read with LOCAL consistency from that node alone.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tally_ledger::{BudgetCommitIndex, EventRecord, Hold, UsageRecord};

use crate::journal::Followed;

/// Compact records found through `GetEvent` for events no read saw in full: per family, event
/// id to commit index.
pub type Compacted = BTreeMap<String, BTreeMap<String, BudgetCommitIndex>>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FamilyState {
    pub family: String,
    /// In commit order.
    pub events: Vec<EventRecord>,
    pub usages: Vec<UsageRecord>,
    pub holds: Vec<Hold>,
    /// Events of this family were compacted before the final read (the follower saw some the
    /// read did not), so the journal may miss one the follower could not reach in time: a
    /// row whose last change no known event shows is then unobserved, not a violation.
    #[serde(skip)]
    pub compacted_events: bool,
}

/// Every family's committed event ids with their commit index, built once: the checks look an
/// event up per operation, and a soak's journals hold tens of thousands of events each. Full
/// events and compact records alike: an event compacted before any read saw it in full is
/// still committed, at the index `GetEvent` gives.
pub struct EventsById<'r>(BTreeMap<&'r str, HashMap<&'r str, BudgetCommitIndex>>);

impl<'r> EventsById<'r> {
    pub fn new(replica: &'r ReplicaState, compacted: &'r Compacted) -> Self {
        let mut by_family: BTreeMap<&'r str, HashMap<&'r str, BudgetCommitIndex>> = replica
            .families
            .iter()
            .map(|(family, state)| {
                let events = state
                    .events
                    .iter()
                    .map(|event| (event.event_id.as_str(), event.commit_index))
                    .collect();
                (family.as_str(), events)
            })
            .collect();
        for (family, records) in compacted {
            let events = by_family.entry(family.as_str()).or_default();
            for (event_id, index) in records {
                events.entry(event_id.as_str()).or_insert(*index);
            }
        }
        Self(by_family)
    }

    pub fn get(&self, family: &str, event_id: &str) -> Option<BudgetCommitIndex> {
        self.0.get(family)?.get(event_id).copied()
    }
}

/// `replica` with the followed events its final read no longer holds (compacted since) put
/// back, in commit order: the journal as it was committed, as far as any read saw it.
pub fn with_followed(replica: &ReplicaState, followed: &Followed) -> ReplicaState {
    let mut merged = replica.clone();
    for (name, family) in &mut merged.families {
        let Some(extra) = followed.get(name) else {
            continue;
        };
        let mut by_index: BTreeMap<u64, EventRecord> = extra.clone();
        let read = family.events.len();
        for event in family.events.drain(..) {
            by_index.insert(event.commit_index.0, event);
        }
        family.compacted_events |= by_index.len() > read;
        family.events = by_index.into_values().collect();
    }
    merged
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplicaState {
    pub node_id: u64,
    pub applied_index: u64,
    /// Hex of the node's state digest (Admin `StateDigest`).
    pub digest: String,
    pub families: BTreeMap<String, FamilyState>,
}
