//! The `Admin` service: cluster initialization, membership, leadership transfer, snapshots,
//! replicated parameters, alarms, status, and the clock probe peers use to compare clocks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use openraft::ServerState;
use tally_api::pb::admin_server::Admin;
use tally_api::pb::{self, NodeRole};
use tally_ledger::ParamsChange;
use tonic::{Request, Response, Status};

use super::outcome::{definite, failure_status, Failure};
use crate::families::{AlarmChange, AlarmKind, Alarms, MemoryUse};
use crate::node::health::Health;
use crate::node::placement::{best_region, Member};
use crate::node::proposer::{LoadShedding, Proposer};
use crate::node::write_error::WriteError;
use crate::raft::state_machine::SharedRouter;
use crate::raft::types::{NodeId, Raft, TallyNode};

pub struct AdminService {
    node_id: NodeId,
    raft: Raft,
    proposer: Arc<Proposer>,
    router: SharedRouter,
    health: Arc<Health>,
    cluster_id: String,
    /// The node's `memory_budget_bytes`, reported in Status beside what counts against it.
    memory_budget_bytes: u64,
}

impl AdminService {
    pub fn new(
        node_id: NodeId,
        raft: Raft,
        proposer: Arc<Proposer>,
        router: SharedRouter,
        health: Arc<Health>,
        cluster_id: String,
        memory_budget_bytes: u64,
    ) -> Self {
        Self {
            node_id,
            raft,
            proposer,
            router,
            health,
            cluster_id,
            memory_budget_bytes,
        }
    }

    fn not_leader(&self) -> Status {
        failure_status(
            Failure::Write(WriteError::Unavailable {
                leader: self.proposer.leader(),
                reason: "membership and parameters change on the leader".to_owned(),
            }),
            None,
        )
    }
}

fn raft_status(error: impl std::fmt::Display) -> Status {
    Status::failed_precondition(error.to_string())
}

/// A member's addresses as the membership will record them; both ports and the region are
/// required, since a member without a peer address cannot be reached by its peers.
fn member_node(member: pb::MemberAddress) -> Result<TallyNode, Status> {
    for (field, value) in [
        ("address", &member.address),
        ("peer_address", &member.peer_address),
        ("region", &member.region),
    ] {
        if value.is_empty() || value.len() > 256 {
            return Err(Status::invalid_argument(format!(
                "{field} must be 1 to 256 bytes"
            )));
        }
    }
    Ok(TallyNode::new(
        member.address,
        member.peer_address,
        member.region,
    ))
}

/// The alarms as the wire shows them, in (kind, node) order.
pub fn alarms_message(alarms: &Alarms) -> Vec<pb::Alarm> {
    alarms
        .iter()
        .map(|(kind, node_id, raised)| pb::Alarm {
            kind: alarm_kind_message(kind) as i32,
            node_id,
            reason: raised.reason.clone(),
            raised_at_index: raised.raised_at.index,
            raised_at_term: raised.raised_at.term,
            raised_at_ms: raised.raised_at_ms,
        })
        .collect()
}

fn alarm_kind_message(kind: AlarmKind) -> pb::AlarmKind {
    match kind {
        AlarmKind::NoSpace => pb::AlarmKind::NoSpace,
    }
}

fn alarm_kind(kind: i32) -> Result<AlarmKind, Status> {
    match pb::AlarmKind::try_from(kind) {
        Ok(pb::AlarmKind::NoSpace) => Ok(AlarmKind::NoSpace),
        Ok(pb::AlarmKind::Unspecified) | Err(_) => Err(Status::from(
            tally_api::pb::ErrorDetail::from(tally_ledger::LedgerError::invalid(
                "kind",
                format!("is {kind}: name an alarm kind (ALARM_KIND_NO_SPACE)"),
            )),
        )),
    }
}

fn admin_reply(log_index: Option<u64>, message: impl Into<String>) -> Response<pb::AdminReply> {
    definite(pb::AdminReply {
        log_index,
        message: message.into(),
    })
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn initialize(
        &self,
        request: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let request = request.into_inner();
        if !request.members.is_empty() && !request.nodes.is_empty() {
            return Err(Status::invalid_argument(
                "send either nodes or the older members map, not both",
            ));
        }
        let mut nodes: BTreeMap<NodeId, TallyNode> = request
            .members
            .into_iter()
            .map(|(id, addr)| (id, TallyNode::new(addr, String::new(), String::new())))
            .collect();
        for (id, member) in request.nodes {
            nodes.insert(id, member_node(member)?);
        }
        if nodes.is_empty() || nodes.len() > 7 {
            return Err(Status::invalid_argument("initialize needs 1 to 7 members"));
        }
        if !nodes.contains_key(&self.node_id) {
            return Err(Status::invalid_argument(format!(
                "the members must include this node ({})",
                self.node_id
            )));
        }
        self.raft.initialize(nodes).await.map_err(raft_status)?;
        Ok(admin_reply(None, "initialized"))
    }

    async fn add_learner(
        &self,
        request: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let request = request.into_inner();
        if !self.proposer.is_leader() {
            return Err(self.not_leader());
        }
        let node = member_node(pb::MemberAddress {
            address: request.address,
            peer_address: request.peer_address,
            region: request.region,
        })?;
        let response = self
            .raft
            .add_learner(request.id, node, request.blocking)
            .await
            .map_err(raft_status)?;
        Ok(admin_reply(
            Some(response.log_id.index),
            format!("node {} added as a learner", request.id),
        ))
    }

    async fn change_membership(
        &self,
        request: Request<pb::ChangeMembershipRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let request = request.into_inner();
        if !self.proposer.is_leader() {
            return Err(self.not_leader());
        }
        let voters: BTreeSet<NodeId> = request.voters.into_iter().collect();
        if voters.is_empty() || voters.len() > 7 {
            return Err(Status::invalid_argument("a membership has 1 to 7 voters"));
        }
        let response = self
            .raft
            .change_membership(voters.clone(), request.retain)
            .await
            .map_err(raft_status)?;
        Ok(admin_reply(
            Some(response.log_id.index),
            format!("voters are now {voters:?}"),
        ))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let to = request.into_inner().to;
        if !self.proposer.is_leader() {
            return Err(self.not_leader());
        }
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(raft_status)?;
        Ok(admin_reply(
            None,
            format!("leadership transfer to node {to} started"),
        ))
    }

    async fn trigger_snapshot(
        &self,
        _request: Request<pb::TriggerSnapshotRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        self.raft.trigger().snapshot().await.map_err(raft_status)?;
        Ok(admin_reply(None, "snapshot triggered"))
    }

    async fn set_params(
        &self,
        request: Request<pb::SetParamsRequest>,
    ) -> Result<Response<pb::SetParamsReply>, Status> {
        // Only the named fields travel, and they apply on top of whatever is in force when the
        // entry applies: reading the parameters here and proposing a whole struct would let
        // two concurrent changes revert each other.
        let change = ParamsChange::from(request.get_ref());
        change
            .validate()
            .map_err(|e| failure_status(e.into(), None))?;
        let reply = self
            .proposer
            .propose_params(change)
            .await
            .map_err(|e| failure_status(e.into(), None))?;
        // Applied before the proposer answered, so this includes the change (and possibly a
        // change committed right after it).
        let params = params_message(&*self.router.lock().await);
        Ok(definite(pb::SetParamsReply {
            params: Some(params),
            log_index: reply.log_id.index,
        }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusReply>, Status> {
        let metrics = crate::raft::types::current_metrics(&self.raft);
        let role = match metrics.state {
            ServerState::Leader => NodeRole::Leader,
            ServerState::Follower => NodeRole::Follower,
            ServerState::Candidate => NodeRole::Candidate,
            ServerState::Learner => NodeRole::Learner,
            ServerState::Shutdown => NodeRole::Shutdown,
        };
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let matched: BTreeMap<NodeId, u64> = metrics
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(id, log_id)| (*id, log_id.as_ref().map_or(0, |l| l.index)))
                    .collect()
            })
            .unwrap_or_default();
        let members: Vec<pb::Member> = membership
            .nodes()
            .map(|(id, node)| pb::Member {
                id: *id,
                address: node.addr.clone(),
                voter: voters.contains(id),
                matched_index: matched.get(id).copied(),
                peer_address: node.peer_address().to_owned(),
                region: node.region.clone(),
            })
            .collect();
        let (cluster_time_ms, params, alarms, memory) = {
            let router = self.router.lock().await;
            (
                router.cluster_time_ms(),
                params_message(&router),
                alarms_message(router.alarms()),
                router.memory_use(),
            )
        };
        let leader_in_preferred_region = leader_in_preferred_region(
            &params.preferred_leader_regions,
            metrics.current_leader,
            &members,
        );
        let leader_address = self
            .proposer
            .leader()
            .map(|(_, address)| address)
            .unwrap_or_default();
        Ok(definite(pb::StatusReply {
            node_id: self.node_id,
            role: role as i32,
            term: metrics.current_term,
            leader_id: metrics.current_leader,
            leader_address,
            last_log_index: metrics.last_log_index,
            committed_index: metrics.local_committed.map(|c| c.index),
            applied_index: metrics.last_applied.map(|a| a.index),
            snapshot_index: metrics.snapshot.map(|s| s.index),
            members,
            cluster_time_ms,
            healthy: self.health.is_healthy(),
            clock_offset_ms: self.health.clock_offset_ms(),
            cluster_id: self.cluster_id.clone(),
            params: Some(params),
            alarms,
            load_shedding: Some(load_shedding_message(&self.proposer.load_shedding())),
            leader_in_preferred_region,
            rules_known: self.health.rules_known(),
            cluster_time_lag_ms: self.proposer.time_gate().lag_ms(),
            writes_wait_for_cluster_time: self.proposer.is_leader()
                && !self.proposer.time_gate().is_open(),
            memory: Some(memory_message(memory, self.memory_budget_bytes)),
        }))
    }

    async fn list_alarms(
        &self,
        _request: Request<pb::ListAlarmsRequest>,
    ) -> Result<Response<pb::ListAlarmsReply>, Status> {
        let router = self.router.lock().await;
        Ok(definite(pb::ListAlarmsReply {
            alarms: alarms_message(router.alarms()),
            applied_index: router.last_applied().map_or(0, |id| id.index),
        }))
    }

    /// Through the log, on the leader. Clearing what is not raised is a harmless entry, and
    /// answers so, so a scripted clear is idempotent.
    async fn clear_alarm(
        &self,
        request: Request<pb::ClearAlarmRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let request = request.into_inner();
        let kind = alarm_kind(request.kind)?;
        let change = AlarmChange::Clear {
            kind,
            node_id: request.node_id,
        };
        let reply = self
            .proposer
            .propose_alarm_here(change.clone())
            .await
            .map_err(|e| failure_status(e.into(), None))?;
        let still = self.router.lock().await.alarms().is_raised(kind);
        let note = if still {
            " (raised again since, or still raised by another node)"
        } else {
            ""
        };
        Ok(admin_reply(
            Some(reply.log_id.index),
            format!("{change} at log index {}{note}", reply.log_id.index),
        ))
    }

    /// Taken under the router lock, so the digest and the index are of the same state.
    async fn state_digest(
        &self,
        _request: Request<pb::StateDigestRequest>,
    ) -> Result<Response<pb::StateDigestReply>, Status> {
        let router = self.router.lock().await;
        let applied_index = router.last_applied().map_or(0, |id| id.index);
        let digest = router
            .digest()
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(pb::StateDigestReply {
            node_id: self.node_id,
            applied_index,
            digest: digest.to_vec(),
        }))
    }

    async fn set_failpoints(
        &self,
        request: Request<pb::SetFailpointsRequest>,
    ) -> Result<Response<pb::AdminReply>, Status> {
        let spec = request.into_inner().spec;
        if spec.len() > 4_096 {
            return Err(Status::invalid_argument(
                "a failpoint spec is at most 4 KiB",
            ));
        }
        #[cfg(feature = "failpoints")]
        {
            if !crate::failpoints::enabled() {
                return Err(Status::unimplemented(
                    "this node does not arm failpoints: only the chaos harness's chaos-node does",
                ));
            }
            let armed = crate::failpoints::configure(&spec)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            tracing::warn!(?armed, "failpoints armed");
            Ok(admin_reply(
                None,
                format!("armed {} failpoint(s)", armed.len()),
            ))
        }
        #[cfg(not(feature = "failpoints"))]
        {
            let _ = spec;
            Err(Status::unimplemented(
                "this node does not arm failpoints: only the chaos harness's chaos-node does",
            ))
        }
    }

    async fn clock_probe(
        &self,
        _request: Request<pb::ClockProbeRequest>,
    ) -> Result<Response<pb::ClockProbeReply>, Status> {
        Ok(Response::new(pb::ClockProbeReply {
            node_id: self.node_id,
            wall_clock_ms: self.health.clock().now_ms(),
            rules_known: self.health.rules_known(),
        }))
    }
}

/// Every replicated parameter: the ledger's, and the preferred leader regions kept beside them.
fn params_message(router: &crate::families::FamilyRouter) -> pb::ClusterParams {
    pb::ClusterParams {
        preferred_leader_regions: router.preferred_leader_regions().to_vec(),
        ..router.params().into()
    }
}

/// Whether `leader` is in the best preferred region that has a voter; `None` when nothing is
/// preferred or no leader is known. Health is not weighed: a follower answering status does
/// not know it, and the leader placement task moves leadership only to a healthy voter.
fn leader_in_preferred_region(
    preferred: &[String],
    leader: Option<NodeId>,
    members: &[pb::Member],
) -> Option<bool> {
    let leader = leader?;
    if preferred.is_empty() {
        return None;
    }
    let placed: Vec<Member<'_>> = members
        .iter()
        .map(|m| Member {
            id: m.id,
            region: &m.region,
            voter: m.voter,
            healthy: true,
        })
        .collect();
    let best = best_region(preferred, &placed, |_| true);
    let leader_region = members
        .iter()
        .find(|m| m.id == leader)
        .map(|m| m.region.as_str());
    Some(best.is_some() && best == leader_region)
}

/// Durations in whole ms, as the status message counts them.
/// The families' share of the memory budget and what counts against it
/// (`FamilyRouter::memory_use`, the figures `/metrics` shows too), beside the whole budget and
/// the process's resident memory and heap bytes in use.
fn memory_message(used: MemoryUse, budget_bytes: u64) -> pb::MemoryUse {
    let bytes = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    pb::MemoryUse {
        budget_bytes,
        families_share_bytes: bytes(used.share_bytes),
        families_bytes: bytes(used.families_bytes),
        filter_bytes: bytes(used.filter_bytes),
        store_memory_bytes: bytes(used.store_memory_bytes),
        families_in_memory: bytes(used.families_in_memory),
        families_on_disk: bytes(used.families_on_disk),
        process_resident_bytes: crate::allocator::process_resident_bytes(),
        heap_in_use_bytes: crate::heap_count::heap_in_use_bytes(),
    }
}

fn load_shedding_message(state: &LoadShedding) -> pb::LoadShedding {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    pb::LoadShedding {
        shedding: state.shedding,
        oldest_proposal_age_ms: state.oldest_age.map(ms),
        proposals_pending: state.awaiting_commit as u64,
        commands_pending: state.commands_awaiting_commit as u64,
        commands_answered_per_s: state.commands_per_s.map(|per_s| per_s.round() as u64),
        shed_after_ms: state.shed_after.map_or(0, ms),
        shed_writes: state.shed_writes,
    }
}
