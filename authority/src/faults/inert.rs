//! The production stand-ins for the fault switchboards: same queries, nothing ever injected.

use tally_ledger::Command;

use crate::raft::types::NodeId;

/// The Raft network's fault switchboard in a build without the `testing` feature.
#[derive(Debug, Default)]
pub struct NetworkFaults;

impl NetworkFaults {
    #[inline(always)]
    pub fn is_cut(&self, _from: NodeId, _to: NodeId) -> bool {
        false
    }
}

/// The client service's fault switchboard in a build without the `testing` feature.
#[derive(Debug, Default)]
pub struct ServiceFaults;

impl ServiceFaults {
    #[inline(always)]
    pub fn drops_request(&self, _commands: &[Command]) -> bool {
        false
    }

    #[inline(always)]
    pub fn drops_reply(&self, _commands: &[Command]) -> bool {
        false
    }
}
