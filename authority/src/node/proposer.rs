//! The write path: propose commands on the leader, forward them from a follower, and say
//! exactly what is known when something fails. A decision is returned only after its entry is
//! committed by a quorum and applied (docs/spec.md §6).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::errors::{ClientWriteError, RaftError};
use openraft::ServerState;
use tally_api::pb::raft_client::RaftClient;
use tally_api::pb::RaftBytes;
use tally_api::{decode_raft, encode_raft, MAX_MESSAGE_BYTES};
use tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;
use tally_ledger::{Command, ParamsChange};
use tally_tls::Transport;
use tonic::transport::Channel;

use super::clock::NodeClock;
use super::metrics::NodeMetrics;
use super::write_error::WriteError;
use crate::families::AlarmChange;
use crate::raft::types::{NodeId, Proposal, ProposalReply, Raft};

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
    peers: Mutex<BTreeMap<String, RaftClient<Channel>>>,
    metrics: Arc<NodeMetrics>,
    clock: Arc<NodeClock>,
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
    ) -> Self {
        Self {
            transport,
            clock,
            raft,
            node_id,
            timeout,
            peers: Mutex::new(BTreeMap::new()),
            metrics,
        }
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

    pub fn is_leader(&self) -> bool {
        crate::raft::types::with_metrics(&self.raft, |metrics| {
            metrics.state == ServerState::Leader && metrics.current_leader == Some(self.node_id)
        })
    }

    /// Proposes `commands` as one log entry here if this node leads, else forwards them.
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
        let count = commands.len();
        let reply = self
            .write_local(Proposal::commands(self.clock.now_ms(), commands))
            .await?;
        assert_eq!(
            reply.results.len(),
            count,
            "one result per proposed command"
        );
        Ok(reply)
    }

    /// Proposes a parameter change, validated by the caller (leader only; the admin service
    /// forwards nothing).
    pub async fn propose_params(&self, change: ParamsChange) -> Result<ProposalReply, WriteError> {
        if !self.is_leader() {
            return Err(WriteError::Unavailable {
                leader: self.leader(),
                reason: "parameters change on the leader".to_owned(),
            });
        }
        self.write_local(Proposal::change_params(self.clock.now_ms(), change))
            .await
    }

    /// Proposes an alarm change on this node only, never forwarding (leader only): an
    /// operator's clear from the admin service, or a raise this node or a follower asked for.
    pub async fn propose_alarm_here(
        &self,
        change: AlarmChange,
    ) -> Result<ProposalReply, WriteError> {
        if !self.is_leader() {
            return Err(WriteError::Unavailable {
                leader: self.leader(),
                reason: "alarms change on the leader".to_owned(),
            });
        }
        self.write_local(Proposal::alarm(self.clock.now_ms(), change))
            .await
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
        let (mut client, (leader, address)) = self.leader_client().await?;
        let payload = encode_raft(&change).map_err(|e| WriteError::Invalid {
            reason: e.to_string(),
        })?;
        let call = client.raise_alarm(RaftBytes {
            payload: payload.into(),
        });
        let reply = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) => {
                self.forget_peer(&self.peer_address_of(leader, &address));
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

    /// Writes on this node, believed to lead. Anything but a reply is indefinite: the entry
    /// may have been appended before leadership was lost (openraft reports a discarded entry
    /// as `ForwardToLeader`, which is why that is `Unknown` here, never `Unavailable`).
    async fn write_local(&self, proposal: Proposal) -> Result<ProposalReply, WriteError> {
        let started = Instant::now();
        match tokio::time::timeout(self.timeout, self.raft.client_write(proposal)).await {
            Ok(Ok(response)) => {
                self.metrics.observe_commit(started.elapsed());
                for decision in response.data.results.iter().flatten() {
                    self.metrics
                        .observe_decision(&decision.outcome, decision.replayed);
                }
                Ok(response.data)
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to)))) => {
                Err(WriteError::Unknown {
                    reason: format!(
                        "leadership moved to {:?} while the entry was in flight",
                        to.leader_id
                    ),
                })
            }
            Ok(Err(RaftError::APIError(other))) => Err(WriteError::Unknown {
                reason: other.to_string(),
            }),
            Ok(Err(RaftError::Fatal(fatal))) => Err(WriteError::Internal {
                reason: fatal.to_string(),
            }),
            Err(_) => Err(WriteError::Unknown {
                reason: format!(
                    "not committed within {} ms of proposing",
                    self.timeout.as_millis()
                ),
            }),
        }
    }

    /// Sends the commands to the leader's internal `Forward` rpc. Failing to connect is
    /// definite (nothing was sent); anything after sending is indefinite.
    async fn forward(&self, commands: Vec<Command>) -> Result<ProposalReply, WriteError> {
        let (mut client, (leader, address)) = self.leader_client().await?;
        let payload = encode_raft(&commands).map_err(|e| WriteError::Invalid {
            reason: e.to_string(),
        })?;
        let call = client.forward(RaftBytes {
            payload: payload.into(),
        });
        self.metrics.observe_forward();
        let reply = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(reply)) => reply.into_inner(),
            Ok(Err(status)) => {
                self.forget_peer(&self.peer_address_of(leader, &address));
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

    /// A client for the current leader (not this node). Failing here is definite: nothing
    /// has been sent.
    pub async fn leader_client(
        &self,
    ) -> Result<(RaftClient<Channel>, (NodeId, String)), WriteError> {
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
        match self.peer(&self.peer_address_of(leader, &address)).await {
            Ok(client) => Ok((client, (leader, address))),
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
