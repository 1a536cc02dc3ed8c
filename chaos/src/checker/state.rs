//! A replica's final state as the checker sees it: per family, the journal, the account rows
//! and the holds, read with LOCAL consistency from that node alone.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tally_ledger::{EventRecord, Hold, UsageRecord};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FamilyState {
    pub family: String,
    /// In commit order.
    pub events: Vec<EventRecord>,
    pub usages: Vec<UsageRecord>,
    pub holds: Vec<Hold>,
}

/// Every family's events by id, built once: the checks look an event up per operation, and a
/// soak's journals hold tens of thousands of events each.
pub struct EventsById<'r>(BTreeMap<&'r str, HashMap<&'r str, &'r EventRecord>>);

impl<'r> EventsById<'r> {
    pub fn new(replica: &'r ReplicaState) -> Self {
        Self(
            replica
                .families
                .iter()
                .map(|(family, state)| {
                    let events = state
                        .events
                        .iter()
                        .map(|event| (event.event_id.as_str(), event))
                        .collect();
                    (family.as_str(), events)
                })
                .collect(),
        )
    }

    pub fn get(&self, family: &str, event_id: &str) -> Option<&'r EventRecord> {
        self.0.get(family)?.get(event_id).copied()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplicaState {
    pub node_id: u64,
    pub applied_index: u64,
    /// Hex of the node's state digest (Admin `StateDigest`).
    pub digest: String,
    pub families: BTreeMap<String, FamilyState>,
}
