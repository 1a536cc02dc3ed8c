//! The write path: propose commands on the leader, forward them from a follower, and say
//! exactly what is known when something fails. A decision is returned only after its entry is
//! committed by a quorum and applied (docs/spec.md §6).
//!
//! Load shedding before proposing (docs/spec.md §5.6): the leader remembers when each of its
//! proposals went to Raft until it is answered, and how many commands it answers a second
//! while some wait (`local_writer::PendingProposals`). While the oldest has waited longer than
//! `shed_after_ms`, or more commands wait than it answered in `shed_after_ms` at its last
//! busy second's rate, new client commands are refused with UNAVAILABLE, definite, before
//! anything is proposed: a leader that cannot commit them in time would only queue them to
//! answer UNKNOWN at their deadline, and every UNKNOWN sends a client into retries and
//! `ResolveEvent`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use openraft::ServerState;
use tally_api::pb::raft_client::RaftClient;
use tally_api::pb::RaftBytes;
use tally_api::{decode_raft, encode_raft, MAX_MESSAGE_BYTES};
use tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;
use tally_ledger::{Command, ParamsChange};
use tally_tls::Transport;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::clock::NodeClock;
use super::cluster_time_gate::ClusterTimeGate;
use super::commit_rate::expected_wait;
use super::entry_coalescer::EntryCoalescer;
use super::local_writer::{LocalWriter, PendingView};
use super::metrics::NodeMetrics;
use super::write_error::WriteError;
use crate::families::AlarmChange;
use crate::raft::types::{AppliedTime, NodeId, Proposal, ProposalReply, Raft};

/// The most members `Budget.Members` lists: a cluster has at most 7 voters, and a few
/// learners while members are added.
pub const MAX_MEMBERS_LISTED: usize = 16;

/// Forwarded writes carry domain commands as versioned rmp-serde, like Raft messages.
pub type ForwardReply = Result<ProposalReply, WriteError>;

fn check_count(commands: &[Command]) -> Result<(), WriteError> {
    if commands.is_empty() || commands.len() > MAX_COMMANDS_PER_ENTRY {
        return Err(WriteError::Invalid {
            reason: format!(
                "{} commands, 1..={MAX_COMMANDS_PER_ENTRY} per batch",
                commands.len()
            ),
        });
    }
    Ok(())
}

pub struct Proposer {
    raft: Raft,
    node_id: NodeId,
    timeout: Duration,
    /// Proposes here: parameter and alarm changes directly, client commands through
    /// `coalescer`.
    writer: LocalWriter,
    /// Started on the first client command (it needs the runtime, and the final
    /// `shed_after`).
    coalescer: OnceLock<EntryCoalescer>,
    peers: Mutex<BTreeMap<String, RaftClient<Channel>>>,
    metrics: Arc<NodeMetrics>,
    clock: Arc<NodeClock>,
    /// Holds client commands back while cluster time trails this leader's clock.
    time_gate: Arc<ClusterTimeGate>,
    /// How this node reaches its peers' peer ports (its node certificate, or plaintext).
    transport: Transport,
}

impl Proposer {
    pub fn new(
        raft: Raft,
        node_id: NodeId,
        timeout: Duration,
        metrics: Arc<NodeMetrics>,
        clock: Arc<NodeClock>,
        transport: Transport,
        applied_time: watch::Receiver<AppliedTime>,
    ) -> Self {
        let writer = LocalWriter::new(
            raft.clone(),
            timeout,
            shed_after(super::config::DEFAULT_SHED_AFTER_MS),
            Arc::clone(&metrics),
        );
        let time_gate = Arc::new(ClusterTimeGate::new(
            applied_time,
            Arc::clone(&clock),
            Arc::clone(&metrics),
            timeout,
        ));
        Self {
            transport,
            time_gate,
            clock,
            raft,
            node_id,
            timeout,
            writer,
            coalescer: OnceLock::new(),
            peers: Mutex::new(BTreeMap::new()),
            metrics,
        }
    }

    /// Sheds new client commands once the oldest pending proposal is older than
    /// `shed_after_ms` (`NodeConfig::shed_after_ms`; 0 = never). Without this call the default,
    /// `DEFAULT_SHED_AFTER_MS`, applies.
    pub fn with_shed_after_ms(mut self, shed_after_ms: u64) -> Self {
        assert!(
            self.coalescer.get().is_none(),
            "shedding is set before the first command"
        );
        self.writer.shed_after = shed_after(shed_after_ms);
        self
    }

    /// Whether new writes are being shed here, and why: what `Admin.Status` shows.
    pub fn load_shedding(&self) -> LoadShedding {
        let pending = self.writer.pending.snapshot();
        LoadShedding {
            shedding: self.is_leader() && refusal(self.writer.shed_after, &pending).is_some(),
            oldest_age: pending.oldest_age,
            awaiting_commit: pending.count,
            commands_awaiting_commit: pending.commands,
            commands_per_s: pending.commands_per_s,
            shed_after: self.writer.shed_after,
            shed_writes: self.metrics.commit_age_sheds(),
        }
    }

    /// Refuses, definite, while this node cannot commit a new command in time (the oldest
    /// proposal has waited past `shed_after_ms`, or the commands ahead of it would take longer
    /// at the current rate, or too many wait): nothing is proposed, so a retry is safe.
    fn shed_if_stalled(&self) -> Result<(), WriteError> {
        let pending = self.writer.pending.snapshot();
        let Some(reason) = refusal(self.writer.shed_after, &pending) else {
            return Ok(());
        };
        self.metrics.observe_commit_age_shed();
        tracing::debug!(%reason, "write shed before proposing");
        Err(WriteError::Unavailable {
            leader: self.leader(),
            reason,
        })
    }

    /// This node's clock: what it stamps entries with.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The leader as this node knows it: id and address.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        crate::raft::types::with_metrics(&self.raft, |metrics| {
            let leader = metrics.current_leader?;
            let address = metrics
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|node| node.addr.clone())
                .unwrap_or_default();
            Some((leader, address))
        })
    }

    /// The leader's peer port, where forwarded writes go (its client address for a member
    /// recorded before the peer port existed).
    fn peer_address_of(&self, leader: NodeId, client_address: &str) -> String {
        crate::raft::types::with_metrics(&self.raft, |metrics| {
            metrics
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|node| node.peer_address().to_owned())
        })
        .unwrap_or_else(|| client_address.to_owned())
    }

    /// The members as this node knows them (client address, region, voter) and the leader:
    /// what `Budget.Members` answers, so a client can find the nodes of its own region.
    pub fn members(&self) -> tally_api::pb::MembersReply {
        crate::raft::types::with_metrics(&self.raft, |metrics| {
            let membership = metrics.membership_config.membership();
            let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
            tally_api::pb::MembersReply {
                node_id: self.node_id,
                members: membership
                    .nodes()
                    .take(MAX_MEMBERS_LISTED)
                    .map(|(id, node)| tally_api::pb::MemberRegion {
                        id: *id,
                        address: node.addr.clone(),
                        region: node.region.clone(),
                        voter: voters.contains(id),
                    })
                    .collect(),
                leader_id: metrics.current_leader,
            }
        })
    }

    pub fn is_leader(&self) -> bool {
        crate::raft::types::with_metrics(&self.raft, |metrics| {
            metrics.state == ServerState::Leader && metrics.current_leader == Some(self.node_id)
        })
    }

    /// Proposes `commands` here if this node leads, else forwards them. Here they go into one log
    /// entry, possibly shared with other callers' commands proposed at the same time
    /// ([`EntryCoalescer`]).
    pub async fn propose(&self, commands: Vec<Command>) -> Result<ProposalReply, WriteError> {
        if self.is_leader() {
            return self.propose_here(commands).await;
        }
        check_count(&commands)?;
        self.forward(commands).await
    }

    /// Proposes `commands` on this node only, never forwarding (a forwarded write must not
    /// hop twice): if this node no longer leads, nothing is proposed and the caller learns
    /// who does.
    pub async fn propose_here(&self, commands: Vec<Command>) -> Result<ProposalReply, WriteError> {
        check_count(&commands)?;
        if !self.is_leader() {
            return Err(WriteError::Unavailable {
                leader: self.leader(),
                reason: "this node no longer leads".to_owned(),
            });
        }
        self.shed_if_stalled()?;
        self.time_gate.admit(|| self.leader()).await?;
        let count = commands.len();
        let coalescer = self
            .coalescer
            .get_or_init(|| EntryCoalescer::start(self.writer.clone(), Arc::clone(&self.clock)));
        let reply = coalescer.propose(commands).await?;
        assert_eq!(
            reply.results.len(),
            count,
            "one result per proposed command"
        );
        Ok(reply)
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The gate client commands pass on this leader, which the cluster time keeper serves.
    pub fn time_gate(&self) -> Arc<ClusterTimeGate> {
        Arc::clone(&self.time_gate)
    }

    /// Proposes an entry with no command, stamped now (leader only): it moves cluster time up
    /// to this node's clock by at most a step (`node/cluster_time_keeper.rs`). Left out of the
    /// commit latency a client sees: a catch-up proposes hundreds at once.
    pub async fn propose_clock_tick(&self) -> Result<ProposalReply, WriteError> {
        self.check_leads("cluster time is kept")?;
        let proposal = Proposal::clock_tick(self.clock.now_ms());
        self.writer.write_unmetered(proposal).await
    }

    /// Proposes a parameter change, validated by the caller (leader only; the admin service
    /// forwards nothing).
    pub async fn propose_params(&self, change: ParamsChange) -> Result<ProposalReply, WriteError> {
        let proposal = Proposal::change_params(self.clock.now_ms(), change);
        self.write_on_leader(proposal, "parameters change").await
    }

    /// Proposes raising the rules to `rules_version` (leader only; `node/rules_raise.rs`
    /// decides when every member knows them).
    pub async fn propose_rules(&self, rules_version: u32) -> Result<ProposalReply, WriteError> {
        let proposal = Proposal::raise_rules(self.clock.now_ms(), rules_version);
        self.write_on_leader(proposal, "rules are raised").await
    }

    /// Writes `proposal` here if this node leads; `what` says what only happens on the leader.
    async fn write_on_leader(
        &self,
        proposal: Proposal,
        what: &str,
    ) -> Result<ProposalReply, WriteError> {
        self.check_leads(what)?;
        self.writer.write(proposal).await
    }

    /// Refuses, definite, unless this node leads; `what` says what only happens on the leader.
    fn check_leads(&self, what: &str) -> Result<(), WriteError> {
        if self.is_leader() {
            return Ok(());
        }
        Err(WriteError::Unavailable {
            leader: self.leader(),
            reason: format!("{what} on the leader"),
        })
    }

    /// Proposes an alarm change on this node only, never forwarding (leader only): an
    /// operator's clear from the admin service, or a raise this node or a follower asked for.
    pub async fn propose_alarm_here(
        &self,
        change: AlarmChange,
    ) -> Result<ProposalReply, WriteError> {
        let proposal = Proposal::alarm(self.clock.now_ms(), change);
        self.write_on_leader(proposal, "alarms change").await
    }

    /// Has `change` (this node's raise) go through the log: proposed here on the leader, or
    /// sent to the leader's `Raft.RaiseAlarm`, which checks that this node is the one it names.
    pub async fn raise_alarm(&self, change: AlarmChange) -> Result<ProposalReply, WriteError> {
        assert!(
            matches!(&change, AlarmChange::Raise { node_id, .. } if *node_id == self.node_id),
            "a node raises only its own alarm: {change}"
        );
        if self.is_leader() {
            return self.propose_alarm_here(change).await;
        }
        let mut call = self.leader_client().await?;
        let leader = call.leader.0;
        let payload = encode_raft(&change).map_err(|e| WriteError::Invalid {
            reason: e.to_string(),
        })?;
        let sent = call.client.raise_alarm(RaftBytes {
            payload: payload.into(),
        });
        let reply = match tokio::time::timeout(self.timeout, sent).await {
            Ok(Ok(reply)) => {
                call.answered();
                reply.into_inner()
            }
            Ok(Err(status)) => {
                return Err(WriteError::Unknown {
                    reason: format!("alarm sent to node {leader}: {status}"),
                });
            }
            Err(_) => {
                return Err(WriteError::Unknown {
                    reason: format!(
                        "alarm sent to node {leader}, no answer within {} ms",
                        self.timeout.as_millis()
                    ),
                })
            }
        };
        let reply: ForwardReply = decode_raft(&reply.payload).map_err(|e| WriteError::Unknown {
            reason: format!("undecodable alarm reply from node {leader}: {e}"),
        })?;
        reply
    }

    /// Sends the commands to the leader's internal `Forward` rpc. Failing to connect is
    /// definite (nothing was sent); anything after sending is indefinite.
    async fn forward(&self, commands: Vec<Command>) -> Result<ProposalReply, WriteError> {
        let mut call = self.leader_client().await?;
        let leader = call.leader.0;
        let payload = encode_raft(&commands).map_err(|e| WriteError::Invalid {
            reason: e.to_string(),
        })?;
        let sent = call.client.forward(RaftBytes {
            payload: payload.into(),
        });
        self.metrics.observe_forward();
        let reply = match tokio::time::timeout(self.timeout, sent).await {
            Ok(Ok(reply)) => {
                call.answered();
                reply.into_inner()
            }
            Ok(Err(status)) => {
                return Err(WriteError::Unknown {
                    reason: format!("forwarded to node {leader}: {status}"),
                });
            }
            Err(_) => {
                return Err(WriteError::Unknown {
                    reason: format!(
                        "forwarded to node {leader}, no answer within {} ms",
                        self.timeout.as_millis()
                    ),
                })
            }
        };
        let reply: ForwardReply = decode_raft(&reply.payload).map_err(|e| WriteError::Unknown {
            reason: format!("undecodable forward reply from node {leader}: {e}"),
        })?;
        reply
    }

    /// A call to the current leader (not this node) over the cached peer connection. Failing
    /// here is definite: nothing has been sent.
    pub async fn leader_client(&self) -> Result<LeaderCall<'_>, WriteError> {
        let Some((leader, address)) = self.leader() else {
            return Err(WriteError::Unavailable {
                leader: None,
                reason: "no leader is known".to_owned(),
            });
        };
        if leader == self.node_id || address.is_empty() {
            return Err(WriteError::Unavailable {
                leader: Some((leader, address)),
                reason: "the leader is changing".to_owned(),
            });
        }
        let peer_address = self.peer_address_of(leader, &address);
        match self.peer(&peer_address).await {
            Ok(client) => Ok(LeaderCall {
                client,
                leader: (leader, address),
                proposer: self,
                peer_address,
                answered: false,
            }),
            Err(error) => Err(WriteError::Unavailable {
                leader: Some((leader, address)),
                reason: format!("cannot reach the leader: {error}"),
            }),
        }
    }

    async fn peer(&self, address: &str) -> Result<RaftClient<Channel>, tonic::transport::Error> {
        if let Some(client) = self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)
        {
            return Ok(client.clone());
        }
        let channel = self
            .transport
            .endpoint(address)?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await?;
        let client = RaftClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(address.to_owned(), client.clone());
        Ok(client)
    }

    fn forget_peer(&self, address: &str) {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(address);
    }
}

/// One call to the leader over the cached peer connection. Unless [`LeaderCall::answered`]
/// says an answer came, dropping it drops that connection, so the next call opens a fresh one:
/// a call that failed, timed out, or that its caller gave up on (a client's own attempt
/// timeout cancels it) may be stuck behind a stalled TCP connection. After a network cut heals,
/// such a connection sends nothing until its next retransmission, seconds away after its
/// backoff: measured with a region cut off for 20 s (`tally-bench regions`), writes forwarded
/// from a region stalled ~7 s after leadership moved back, on the connection from before.
pub struct LeaderCall<'p> {
    pub client: RaftClient<Channel>,
    /// The leader's id and client address.
    pub leader: (NodeId, String),
    proposer: &'p Proposer,
    peer_address: String,
    answered: bool,
}

impl LeaderCall<'_> {
    /// The leader answered (a reply, not an error status): the connection is kept.
    pub fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for LeaderCall<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.proposer.forget_peer(&self.peer_address);
        }
    }
}

/// Why a new client command would be shed now, with `pending` as it is and `shed_after` the
/// threshold (`None`: shedding is off); `None` if it would be proposed.
fn refusal(shed_after: Option<Duration>, pending: &PendingView) -> Option<String> {
    let limit = shed_after?;
    if let Some(age) = pending.oldest_age.filter(|age| *age > limit) {
        return Some(format!(
            "overloaded: the oldest proposal on this node has waited {} ms for commit \
             (shed_after_ms = {}); nothing was proposed, retry after a backoff",
            age.as_millis(),
            limit.as_millis()
        ));
    }
    if pending.commands >= MIN_COMMANDS_JUDGED_BY_RATE {
        if let Some(per_s) = pending.commands_per_s {
            let wait = expected_wait(pending.commands, per_s);
            if wait.is_none_or(|wait| wait > limit) {
                return Some(format!(
                    "overloaded: {} commands on this node await commit and it answered {per_s:.0} \
                     a second over its last busy second, so a new one would wait {} (shed_after_ms \
                     = {}); nothing was proposed, retry after a backoff",
                    pending.commands,
                    wait.map_or("for ever".to_owned(), |w| format!("~{} ms", w.as_millis())),
                    limit.as_millis()
                ));
            }
        }
    }
    (pending.count >= MAX_PENDING_PROPOSALS).then(|| {
        format!(
            "overloaded: {} proposals on this node await commit; nothing was proposed, retry \
             after a backoff",
            pending.count
        )
    })
}

/// Below this many commands awaiting commit the rate rule does not apply: a handful waiting on
/// a leader that was just slow for a second says little about its rate, and the age rule
/// still holds them to `shed_after_ms`.
const MIN_COMMANDS_JUDGED_BY_RATE: usize = 256;

/// `shed_after_ms` as the proposer holds it: 0 turns shedding off.
fn shed_after(shed_after_ms: u64) -> Option<Duration> {
    (shed_after_ms > 0).then(|| Duration::from_millis(shed_after_ms))
}

/// Past this many proposals awaiting commit on this node, new client commands are shed too
/// (while shedding is on). Each holds a task and a few hundred bytes, and they can outlive
/// their requests (see `LocalWriter::write`), so their number has a bound of its own; a healthy
/// leader has at most the callers' in-flight requests pending, a few thousand.
pub const MAX_PENDING_PROPOSALS: usize = 65_536;

/// What `Admin.Status` shows of load shedding.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadShedding {
    /// This node leads and refuses new client commands now.
    pub shedding: bool,
    /// How long the oldest proposal on this node has waited for its answer.
    pub oldest_age: Option<Duration>,
    pub awaiting_commit: usize,
    /// The commands of those proposals.
    pub commands_awaiting_commit: usize,
    /// Commands answered per second over the last second in which some waited throughout.
    pub commands_per_s: Option<f64>,
    pub shed_after: Option<Duration>,
    /// Writes refused by this rule since the node started.
    pub shed_writes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_turns_shedding_off() {
        assert_eq!(shed_after(0), None);
        assert_eq!(shed_after(2_000), Some(Duration::from_secs(2)));
    }

    fn pending(commands: usize, oldest_ms: u64, commands_per_s: Option<f64>) -> PendingView {
        PendingView {
            count: commands.div_ceil(64),
            commands,
            oldest_age: Some(Duration::from_millis(oldest_ms)),
            commands_per_s,
        }
    }

    #[test]
    fn a_queue_older_than_the_threshold_is_shed() {
        let limit = shed_after(2_000);
        assert_eq!(refusal(limit, &pending(10, 1_999, None)), None);
        let reason = refusal(limit, &pending(10, 2_001, None)).expect("too old");
        assert!(reason.contains("waited 2001 ms"), "{reason}");
        assert_eq!(
            refusal(None, &pending(10, 60_000, None)),
            None,
            "shedding off"
        );
    }

    #[test]
    fn a_queue_longer_than_the_rate_commits_in_time_is_shed() {
        let limit = shed_after(2_000);
        // 100 a second: 300 commands take 3 s, past 2 s, though the oldest is young.
        let reason = refusal(limit, &pending(300, 100, Some(100.0))).expect("too long");
        assert!(
            reason.contains("300 commands") && reason.contains("~3000 ms"),
            "{reason}"
        );
        // 200 a second: 1.5 s, in time.
        assert_eq!(refusal(limit, &pending(300, 100, Some(200.0))), None);
        // Nothing answered over a busy second: no end to the wait.
        let reason = refusal(limit, &pending(300, 100, Some(0.0))).expect("stalled");
        assert!(reason.contains("for ever"), "{reason}");
        // No busy second measured (the queue emptied): the age rule alone.
        assert_eq!(refusal(limit, &pending(300, 100, None)), None);
        // Too few to judge by the rate.
        let few = MIN_COMMANDS_JUDGED_BY_RATE - 1;
        assert_eq!(refusal(limit, &pending(few, 100, Some(1.0))), None);
        assert_eq!(
            refusal(None, &pending(300, 100, Some(0.0))),
            None,
            "shedding off"
        );
    }

    #[test]
    fn too_many_proposals_are_shed_whatever_their_rate() {
        let mut view = pending(1, 0, Some(1e9));
        view.count = MAX_PENDING_PROPOSALS;
        let reason = refusal(shed_after(2_000), &view).expect("too many");
        assert!(
            reason.contains("proposals on this node await commit"),
            "{reason}"
        );
    }
}
