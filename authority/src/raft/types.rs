//! The openraft type configuration of a Tally cluster, and what one log entry carries.

use std::fmt;

use serde::{Deserialize, Serialize};
use tally_ledger::{ClusterParams, Command, Decision, LedgerError, LogPosition};

/// Raft node ids are small integers chosen by the operator.
pub type NodeId = u64;

/// Version of [`Proposal`]; a node that meets an entry of another version stops rather than
/// guess at its meaning (docs/architecture.md: an unknown payload version is fatal).
pub const PROPOSAL_VERSION: u8 = 1;

/// The payload of a normal log entry: commands or a parameter change, stamped with the
/// leader's clock when it proposed them (docs/spec.md §6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub version: u8,
    pub stamped_ms: u64,
    pub body: ProposalBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProposalBody {
    /// At most `tally_ledger::limits::MAX_COMMANDS_PER_ENTRY` commands, applied in order.
    Commands(Vec<Command>),
    /// Cluster parameters change only through the log.
    SetParams(ClusterParams),
}

impl Proposal {
    pub fn commands(stamped_ms: u64, commands: Vec<Command>) -> Self {
        Self {
            version: PROPOSAL_VERSION,
            stamped_ms,
            body: ProposalBody::Commands(commands),
        }
    }

    pub fn set_params(stamped_ms: u64, params: ClusterParams) -> Self {
        Self {
            version: PROPOSAL_VERSION,
            stamped_ms,
            body: ProposalBody::SetParams(params),
        }
    }
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.body {
            ProposalBody::Commands(commands) => {
                write!(
                    f,
                    "proposal v{} @{}: {} commands",
                    self.version,
                    self.stamped_ms,
                    commands.len()
                )
            }
            ProposalBody::SetParams(params) => {
                write!(
                    f,
                    "proposal v{} @{}: set {params:?}",
                    self.version, self.stamped_ms
                )
            }
        }
    }
}

/// What applying one entry answered: one result per command, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalReply {
    pub log_id: LogPosition,
    pub cluster_time_ms: u64,
    pub results: Vec<Result<Decision, LedgerError>>,
}

openraft::declare_raft_types!(
    /// Tally's Raft types: u64 node ids and terms, `BasicNode { addr }` with the node's gRPC
    /// address, and [`Proposal`] entries.
    pub TypeConfig:
        D = Proposal,
        R = ProposalReply,
);

pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Membership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, Vec<u8>>;
pub type Raft = openraft::Raft<TypeConfig, super::state_machine::TallyStateMachine>;

/// A Raft log id as the ledger records it.
pub fn log_position(log_id: &LogId) -> LogPosition {
    LogPosition {
        term: log_id.leader_id.term,
        index: log_id.index,
    }
}

pub type Metrics = openraft::metrics::RaftMetrics<TypeConfig>;

/// The latest Raft metrics of this node (role, term, leader, indexes, membership).
pub fn current_metrics(raft: &Raft) -> Metrics {
    with_metrics(raft, Metrics::clone)
}

/// Reads the latest metrics in place: the request path asks "who leads?" on every write and
/// need not copy the whole membership to answer.
pub fn with_metrics<T>(raft: &Raft, read: impl FnOnce(&Metrics) -> T) -> T {
    use openraft::async_runtime::WatchReceiver;
    let receiver = raft.metrics();
    let metrics = receiver.borrow_watched();
    read(&metrics)
}
