//! A replica's final state as the checker sees it: per family, the journal, the account rows
//! and the holds, read with LOCAL consistency from that node alone.

use std::collections::BTreeMap;

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

impl FamilyState {
    pub fn event(&self, event_id: &str) -> Option<&EventRecord> {
        self.events.iter().find(|e| e.event_id.as_str() == event_id)
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
