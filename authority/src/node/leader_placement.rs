//! The leader placement task: on the leader only, once a second, it asks whether a healthy,
//! caught-up voter sits in a better preferred region than the leader's own
//! ([`super::placement::transfer_target`]) and, if so, hands leadership to it with openraft's
//! leader transfer. After a failover the leader may land anywhere; this brings it back to the
//! preferred region once that region is healthy again, so writes stop crossing the WAN twice.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::health::Health;
use super::metrics::NodeMetrics;
use super::placement::{transfer_target, Member};
use crate::raft::state_machine::SharedRouter;
use crate::raft::types::{Metrics, NodeId, Raft};

/// How often the leader checks its placement. Cheap (a metrics read and the router lock for a
/// moment), and well below the default interval between transfers.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A voter is caught up when its matched log index is at most this many entries behind the
/// leader's last index: it can take over without a long catch-up that would stall writes.
pub const MAX_LAG_ENTRIES: u64 = 64;

/// How the task paces itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementPacing {
    /// At most one transfer per this interval (`leader_placement_interval_ms`): a region
    /// that flaps cannot bounce leadership back and forth faster than this.
    pub min_between_transfers: Duration,
    /// A voter whose last acknowledgement of the leader is older than this is not healthy.
    pub fresh_ack: Duration,
}

pub async fn run(
    node_id: NodeId,
    raft: Raft,
    router: SharedRouter,
    health: Arc<Health>,
    metrics: Arc<NodeMetrics>,
    pacing: PlacementPacing,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(CHECK_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_transfer: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let leads = crate::raft::types::with_metrics(&raft, |m| {
            m.current_leader == Some(node_id) && m.state == openraft::ServerState::Leader
        });
        if !leads || last_transfer.is_some_and(|at| at.elapsed() < pacing.min_between_transfers) {
            continue;
        }
        let preferred = router.lock().await.preferred_leader_regions().to_vec();
        if preferred.is_empty() {
            continue;
        }
        let choice = crate::raft::types::with_metrics(&raft, |m| {
            choose(m, node_id, &preferred, pacing.fresh_ack, |address| {
                health.peer_clock_agrees(address)
            })
        });
        let Some((target, from_region, to_region)) = choice else {
            continue;
        };
        match raft.trigger().transfer_leader(target).await {
            Ok(()) => {
                last_transfer = Some(Instant::now());
                metrics.observe_leader_placement_transfer();
                tracing::info!(
                    from = node_id,
                    to = target,
                    %from_region,
                    %to_region,
                    ?preferred,
                    "leader placement: transferring leadership to a preferred region"
                );
            }
            Err(fatal) => {
                // Raft has stopped: there is nothing left to place.
                tracing::warn!(%fatal, to = target, "leader placement: transfer not started");
                return;
            }
        }
    }
}

/// The target and both regions, from this leader's metrics; `None` while a membership change
/// is in flight (the voters are about to change) or when no move is called for. A voter whose
/// clock the leader's probe finds off (`clock_agrees` by client address) is not healthy: it
/// would refuse to lead and hand leadership straight back.
fn choose(
    m: &Metrics,
    leader: NodeId,
    preferred: &[String],
    fresh_ack: Duration,
    clock_agrees: impl Fn(&str) -> bool,
) -> Option<(NodeId, String, String)> {
    let membership = m.membership_config.membership();
    let changing = m.membership_config.log_id() != m.committed_membership_config.log_id()
        || membership.get_joint_config().len() > 1;
    if changing {
        return None;
    }
    let last_index = m.last_log_index.unwrap_or(0);
    let healthy = |id: &NodeId, address: &str| {
        if *id == leader {
            return true;
        }
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(id).copied().flatten())
            .map_or(0, |log_id| log_id.index);
        let acked = m
            .heartbeat
            .as_ref()
            .and_then(|h| h.get(id).cloned().flatten())
            .is_some_and(|at| openraft::Instant::elapsed(&*at) <= fresh_ack);
        acked && last_index.saturating_sub(matched) <= MAX_LAG_ENTRIES && clock_agrees(address)
    };
    let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
    let members: Vec<Member<'_>> = membership
        .nodes()
        .map(|(id, node)| Member {
            id: *id,
            region: &node.region,
            voter: voters.contains(id),
            healthy: healthy(id, &node.addr),
        })
        .collect();
    let target = transfer_target(preferred, leader, &members)?;
    let region_of = |id: NodeId| {
        members
            .iter()
            .find(|m| m.id == id)
            .map_or_else(String::new, |m| m.region.to_owned())
    };
    Some((target, region_of(leader), region_of(target)))
}
