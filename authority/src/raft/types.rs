//! The openraft type configuration of a Tally cluster, and what one log entry carries.

use std::fmt;

use serde::{Deserialize, Serialize};
use tally_ledger::{ClusterParams, Command, Decision, LedgerError, LogPosition, ParamsChange};

use crate::families::{AlarmChange, EntryPayload};

/// Raft node ids are small integers chosen by the operator.
pub type NodeId = u64;

/// Version of [`Proposal`]; a node that meets an entry of another version stops rather than
/// guess at its meaning (docs/architecture.md: an unknown payload version is fatal). A new
/// [`ProposalBody`] variant keeps the version: variants are encoded by name, so the entries
/// already logged decode as before, and a node that does not know the variant fails to decode
/// it rather than misread it.
pub const PROPOSAL_VERSION: u8 = 1;

/// The payload of a normal log entry: commands or a parameter change, stamped with the
/// leader's clock when it proposed them (docs/spec.md §6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub version: u8,
    pub stamped_ms: u64,
    pub body: ProposalBody,
}

/// Append variants at the end and never change one's payload: the log keeps every entry ever
/// proposed, and an old log must replay to the same state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProposalBody {
    /// At most `tally_ledger::limits::MAX_COMMANDS_PER_ENTRY` commands, applied in order.
    Commands(Vec<Command>),
    /// The whole parameter struct, as nodes proposed it before [`Self::ChangeParams`]. No
    /// longer proposed; still applied, as the change that names every field, so an old log
    /// replays to the same parameters.
    SetParams(ClusterParams),
    /// Cluster parameters change only through the log: the named fields only, applied on top
    /// of the parameters in force when the entry applies (so two changes of different fields
    /// both hold).
    ChangeParams(ParamsChange),
    /// An alarm raised or cleared through the log (docs/spec.md §5.6).
    Alarm(AlarmChange),
    /// The rules raised to this version, proposed by a leader once every member runs a release
    /// that knows it (`node/rules_raise.rs`). A node from before this variant cannot decode it
    /// and stops, as it would have to: it does not know the rules.
    RaiseRules(u32),
}

impl ProposalBody {
    /// What the router applies for this body.
    pub fn into_payload(self) -> EntryPayload {
        match self {
            Self::Commands(commands) => EntryPayload::Commands(commands),
            Self::SetParams(params) => EntryPayload::SetParams(ParamsChange::from(params)),
            Self::ChangeParams(change) => EntryPayload::SetParams(change),
            Self::Alarm(change) => EntryPayload::Alarm(change),
            Self::RaiseRules(version) => EntryPayload::RaiseRules(version),
        }
    }
}

impl Proposal {
    pub fn commands(stamped_ms: u64, commands: Vec<Command>) -> Self {
        Self {
            version: PROPOSAL_VERSION,
            stamped_ms,
            body: ProposalBody::Commands(commands),
        }
    }

    /// The commands it carries, what load shedding weighs it by: a parameter, alarm or rules
    /// change counts as one, a clock tick as none.
    pub fn command_count(&self) -> usize {
        match &self.body {
            ProposalBody::Commands(commands) => commands.len(),
            ProposalBody::SetParams(_)
            | ProposalBody::ChangeParams(_)
            | ProposalBody::Alarm(_)
            | ProposalBody::RaiseRules(_) => 1,
        }
    }

    /// An entry with no command, stamped with the leader's clock: it only moves cluster time
    /// (`node/cluster_time_keeper.rs`). An empty `Commands` body, so every release applies it.
    pub fn clock_tick(stamped_ms: u64) -> Self {
        Self::commands(stamped_ms, Vec::new())
    }

    pub fn change_params(stamped_ms: u64, change: ParamsChange) -> Self {
        Self {
            version: PROPOSAL_VERSION,
            stamped_ms,
            body: ProposalBody::ChangeParams(change),
        }
    }

    pub fn alarm(stamped_ms: u64, change: AlarmChange) -> Self {
        Self {
            version: PROPOSAL_VERSION,
            stamped_ms,
            body: ProposalBody::Alarm(change),
        }
    }

    pub fn raise_rules(stamped_ms: u64, rules_version: u32) -> Self {
        Self {
            version: PROPOSAL_VERSION,
            stamped_ms,
            body: ProposalBody::RaiseRules(rules_version),
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
            ProposalBody::ChangeParams(change) => {
                write!(
                    f,
                    "proposal v{} @{}: change {change:?}",
                    self.version, self.stamped_ms
                )
            }
            ProposalBody::Alarm(change) => {
                write!(
                    f,
                    "proposal v{} @{}: alarm {change}",
                    self.version, self.stamped_ms
                )
            }
            ProposalBody::RaiseRules(version) => {
                write!(
                    f,
                    "proposal v{} @{}: raise the rules to version {version}",
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

/// Cluster time after the last applied entry, and the step that bounds its next advance
/// (docs/spec.md §6): what a leader compares with its clock before proposing a client command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppliedTime {
    /// 0 until the first stamped entry applies (it then takes that entry's stamp whole).
    pub cluster_time_ms: u64,
    pub max_clock_step_ms: u64,
}

impl AppliedTime {
    /// How far cluster time trails `now_ms`; 0 before the first stamped entry, which takes its
    /// stamp whole, and when `now_ms` is behind.
    pub fn lag_ms(&self, now_ms: u64) -> u64 {
        if self.cluster_time_ms == 0 {
            return 0;
        }
        now_ms.saturating_sub(self.cluster_time_ms)
    }
}

/// A member as the membership records it: where clients reach it, where peers reach it, and
/// its region. Entries written before the peer port existed carry only `addr` (the node then
/// served Raft on its client port); they decode with `peer_addr` and `region` empty, and
/// [`TallyNode::peer_address`] falls back to `addr`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TallyNode {
    /// The client port (Budget, Admin, health), as clients and leader hints name it.
    pub addr: String,
    /// The peer port (the internal Raft service, mutual TLS between members).
    #[serde(default)]
    pub peer_addr: String,
    /// The region the node runs in (docs/architecture.md "Deployment and regions").
    #[serde(default)]
    pub region: String,
}

impl TallyNode {
    pub fn new(addr: String, peer_addr: String, region: String) -> Self {
        Self {
            addr,
            peer_addr,
            region,
        }
    }

    /// Where peers send Raft traffic.
    pub fn peer_address(&self) -> &str {
        if self.peer_addr.is_empty() {
            &self.addr
        } else {
            &self.peer_addr
        }
    }
}

impl fmt::Display for TallyNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (peer {}", self.addr, self.peer_address())?;
        if !self.region.is_empty() {
            write!(f, ", region {}", self.region)?;
        }
        f.write_str(")")
    }
}

openraft::declare_raft_types!(
    /// Tally's Raft types: u64 node ids and terms, [`TallyNode`] members, and [`Proposal`]
    /// entries.
    pub TypeConfig:
        D = Proposal,
        R = ProposalReply,
        Node = TallyNode,
);

pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Membership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot =
    openraft::type_config::alias::SnapshotOf<TypeConfig, super::snapshot_file::SnapshotFile>;
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

#[cfg(test)]
mod tests {
    use tally_ledger::{ClusterParams, LogPosition, ParamsChange};

    use super::{AppliedTime, Proposal, ProposalBody, PROPOSAL_VERSION};
    use crate::families::{EntryInput, EntryPayload, RouterState};

    const T0: u64 = 1_700_000_000_000;

    /// `rmp_serde::to_vec_named` (the log store's encoding) of a whole-struct `SetParams`
    /// proposal as nodes wrote it before parameter changes were named field by field:
    /// `{version: 1, stamped_ms: T0, body: {SetParams: {retention_ms: 3600000,
    /// max_clock_step_ms: 5000}}}`.
    const OLD_SET_PARAMS: &str = "83a776657273696f6e01aa7374616d7065645f6d73cf0000018bcfe56800\
        a4626f647981a9536574506172616d7382ac726574656e74696f6e5f6d73ce0036ee80b16d61785f636c6f\
        636b5f737465705f6d73cd1388";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn enter(state: &mut RouterState, index: u64, payload: EntryPayload) {
        state
            .enter(&EntryInput {
                log_id: LogPosition { term: 1, index },
                stamped_ms: T0 + index,
                payload,
            })
            .expect("in log order");
    }

    #[test]
    fn no_lag_before_the_first_stamp_or_behind_it() {
        let fresh = AppliedTime {
            cluster_time_ms: 0,
            max_clock_step_ms: 10_000,
        };
        assert_eq!(fresh.lag_ms(1_700_000_000_000), 0);
        let running = AppliedTime {
            cluster_time_ms: 1_000_000,
            max_clock_step_ms: 10_000,
        };
        assert_eq!(running.lag_ms(999_000), 0);
        assert_eq!(running.lag_ms(1_012_000), 12_000);
    }

    #[test]
    fn an_old_whole_struct_entry_still_decodes_and_replays_to_the_same_params() {
        let old = ClusterParams {
            retention_ms: 3_600_000,
            max_clock_step_ms: 5_000,
            rules_version: tally_ledger::LEGACY_RULES,
            keyed_retention_ms: None,
        };
        let decoded: Proposal =
            rmp_serde::from_slice(&hex(OLD_SET_PARAMS)).expect("an old entry decodes");
        assert_eq!(
            decoded,
            Proposal {
                version: PROPOSAL_VERSION,
                stamped_ms: T0,
                body: ProposalBody::SetParams(old),
            }
        );
        assert_eq!(
            rmp_serde::to_vec_named(&decoded).expect("encodes"),
            hex(OLD_SET_PARAMS),
            "the old variant's encoding is unchanged"
        );
        let mut replayed = RouterState::default();
        enter(&mut replayed, 1, EntryPayload::Commands(Vec::new()));
        enter(&mut replayed, 2, decoded.body.into_payload());
        assert_eq!(replayed.params, old, "a whole struct replaces every field");
        // A later named change still applies on top of it.
        let step = ParamsChange {
            max_clock_step_ms: Some(2_000),
            ..ParamsChange::default()
        };
        enter(
            &mut replayed,
            3,
            ProposalBody::ChangeParams(step).into_payload(),
        );
        assert_eq!(replayed.params.retention_ms, 3_600_000);
        assert_eq!(replayed.params.max_clock_step_ms, 2_000);
    }

    #[test]
    fn two_changes_of_different_fields_proposed_at_once_both_hold() {
        let current = ClusterParams::default();
        let retention = ParamsChange {
            retention_ms: Some(60_000),
            ..ParamsChange::default()
        };
        let step = ParamsChange {
            max_clock_step_ms: Some(2_000),
            ..ParamsChange::default()
        };
        // Both proposed against `current`, neither applied yet: the log carries the changes.
        let mut state = RouterState::default();
        for (index, change) in [(1, retention), (2, step)] {
            let proposal = Proposal::change_params(T0, change);
            let bytes = rmp_serde::to_vec_named(&proposal).expect("encodes");
            let logged: Proposal = rmp_serde::from_slice(&bytes).expect("decodes");
            enter(&mut state, index, logged.body.into_payload());
        }
        assert_eq!(
            state.params,
            ClusterParams {
                retention_ms: 60_000,
                max_clock_step_ms: 2_000,
                rules_version: tally_ledger::LEGACY_RULES,
                keyed_retention_ms: None,
            },
            "neither change reverts the other (started from {current:?})"
        );
    }

    /// A membership written before the peer port existed (`BasicNode { addr }`) still decodes,
    /// in the log store's named encoding and in the positional one of snapshots and the wire.
    #[test]
    fn an_old_member_decodes_with_its_client_address_as_peer_address() {
        let old = openraft::BasicNode {
            addr: "10.0.0.1:7401".to_owned(),
        };
        use super::TallyNode;
        let named: TallyNode =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&old).expect("encodes"))
                .expect("decodes");
        let positional: TallyNode =
            rmp_serde::from_slice(&rmp_serde::to_vec(&old).expect("encodes")).expect("decodes");
        for node in [named, positional] {
            assert_eq!(node.addr, "10.0.0.1:7401");
            assert_eq!(node.peer_address(), "10.0.0.1:7401");
            assert_eq!(node.region, "");
        }
    }
}
