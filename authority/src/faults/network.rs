//! A fault-injecting switchboard for the Raft network, used by tests: it can cut a link one
//! way or isolate a node. Compiled with the `testing` feature only; production builds hold
//! `inert::NetworkFaults`.

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::raft::types::NodeId;

#[derive(Debug, Default)]
pub struct NetworkFaults {
    state: Mutex<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    /// Directed links `(from, to)` whose messages are lost.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Nodes cut off from everyone, both ways.
    isolated: BTreeSet<NodeId>,
}

impl NetworkFaults {
    fn with<T>(&self, f: impl FnOnce(&mut FaultState) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut state)
    }

    /// Whether a message from `from` to `to` is lost.
    pub fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.with(|s| {
            s.cut.contains(&(from, to)) || s.isolated.contains(&from) || s.isolated.contains(&to)
        })
    }

    /// Cuts `from → to` only: `to` still reaches `from`.
    pub fn cut_one_way(&self, from: NodeId, to: NodeId) {
        self.with(|s| s.cut.insert((from, to)));
    }

    pub fn isolate(&self, node: NodeId) {
        self.with(|s| s.isolated.insert(node));
    }

    pub fn heal(&self) {
        self.with(|s| *s = FaultState::default());
    }
}
