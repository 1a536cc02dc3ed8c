//! A node's own view of its health: its clock agrees with a majority of its peers (docs/spec.md
//! §6), it knows a leader, and it has applied everything it knows committed. The clock
//! monitor probes peers and, when this node's clock is off, stops it from campaigning and
//! hands leadership away.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::ServerState;
use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::ClockProbeRequest;
use tally_tls::Transport;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::clock::{confirmed_by_majority, verdict, within_majority, ClockSample, NodeClock};
use crate::raft::types::{Metrics, NodeId, Raft};

pub struct Health {
    clock: Arc<NodeClock>,
    clock_ok: AtomicBool,
    /// When the last probe round began, if it found a majority of the members agreeing with
    /// this node's clock conclusively (`None` until the first round, and after one that did
    /// not).
    clock_confirmed_by_round: Mutex<Option<Instant>>,
    clock_offset_ms: AtomicI64,
    /// Whether each peer (by client address) answered the last probe with a clock within
    /// `max_clock_offset_ms` of this node's; replaced whole at every probe round, so it holds
    /// at most the current members.
    peer_clocks_agree: Mutex<BTreeMap<String, bool>>,
    /// The newest rules version each peer (by client address) reported in its last answer to
    /// a probe; a peer that did not answer keeps its last report. Replaced at every round, so
    /// it holds at most the current members.
    peer_rules_known: Mutex<BTreeMap<String, u32>>,
    /// The newest rules version this node reports knowing: its release's newest, or the
    /// lower `max_rules_version` it was configured with.
    rules_known: u32,
    raft: Raft,
}

impl Health {
    pub fn new(raft: Raft, clock: Arc<NodeClock>, rules_known: u32) -> Self {
        Self {
            clock,
            clock_ok: AtomicBool::new(true),
            clock_confirmed_by_round: Mutex::new(None),
            clock_offset_ms: AtomicI64::new(0),
            peer_clocks_agree: Mutex::new(BTreeMap::new()),
            peer_rules_known: Mutex::new(BTreeMap::new()),
            rules_known,
            raft,
        }
    }

    /// The newest rules version this node lets the cluster raise to (`max_rules_version`).
    pub fn rules_known(&self) -> u32 {
        self.rules_known
    }

    /// Whether the peer at `address` (its client address) answered the last clock probe
    /// within `max_clock_offset_ms` of this node. A peer not probed yet, or that did not
    /// answer, does not: leadership is never handed to a node that would refuse to lead.
    pub fn peer_clock_agrees(&self, address: &str) -> bool {
        self.peer_clocks_agree
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)
            .copied()
            .unwrap_or(false)
    }

    /// The newest rules version each peer at `addresses` (client addresses) reported
    /// knowing; `None` for a peer never heard from.
    pub fn peers_rules_known(&self, addresses: &[String]) -> Vec<Option<u32>> {
        let known = self
            .peer_rules_known
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        addresses
            .iter()
            .map(|address| known.get(address).copied())
            .collect()
    }

    /// This node's clock (wall clock plus its configured offset).
    pub fn clock(&self) -> &NodeClock {
        &self.clock
    }

    pub fn clock_ok(&self) -> bool {
        self.clock_ok.load(Ordering::Relaxed)
    }

    /// Whether the last probe round began at or after `since` and found a majority of the
    /// members agreeing with this node's clock by conclusive probes: a confirmation from before
    /// a clock jumped says nothing of the clock after.
    pub fn clock_confirmed_since(&self, since: Instant) -> bool {
        self.clock_confirmed_by_round
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|round| round >= since)
    }

    /// The median offset of the peers that answered the last probe, in ms.
    pub fn clock_offset_ms(&self) -> i64 {
        self.clock_offset_ms.load(Ordering::Relaxed)
    }

    /// Serving: a leader is known, everything known committed is applied, the clock agrees,
    /// and a leader has applied an entry of its own term (so it can answer writes now).
    ///
    /// A raised alarm (docs/spec.md §5.6) does not make a node NOT_SERVING: with `NoSpace`
    /// raised it still serves every read and every command on existing holds and charges,
    /// and taking it out of a load balancer would strand those. The alarm shows instead in
    /// `tally-node healthcheck`'s detail (from `Admin.ListAlarms`), `Admin.Status` and the
    /// `tally_alarms_raised` metric.
    pub fn is_healthy(&self) -> bool {
        let metrics = crate::raft::types::current_metrics(&self.raft);
        let caught_up =
            metrics.last_applied.map(|a| a.index) >= metrics.local_committed.map(|c| c.index);
        let leading_ok = metrics.state != ServerState::Leader
            || metrics.last_applied.map(|a| a.leader_id.term) == Some(metrics.current_term);
        self.clock_ok()
            && metrics.current_leader.is_some()
            && caught_up
            && leading_ok
            && metrics.state != ServerState::Shutdown
    }
}

/// The client addresses of every member but `node_id` (voters and learners): the peers a
/// node probes, and whose reports a leader weighs.
pub fn peer_addresses(metrics: &Metrics, node_id: NodeId) -> Vec<String> {
    metrics
        .membership_config
        .membership()
        .nodes()
        .filter(|(id, _)| **id != node_id)
        .map(|(_, node)| node.addr.clone())
        .collect()
}

/// Replaces a per-peer map with one entry per current peer (so it holds at most the
/// members): `judge(at, last)` from the `at`-th peer's answer this round and its last entry;
/// `None` leaves the peer out.
fn replace_per_peer<T: Copy>(
    map: &Mutex<BTreeMap<String, T>>,
    peers: &[String],
    judge: impl Fn(usize, Option<T>) -> Option<T>,
) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    let judged: BTreeMap<String, T> = (peers.iter().enumerate())
        .filter_map(|(at, address)| {
            judge(at, map.get(address).copied()).map(|value| (address.clone(), value))
        })
        .collect();
    *map = judged;
}

/// Probes every peer's clock every `interval`, and applies docs/spec.md §6's rule; records
/// the rules version each peer reports knowing, for `rules_raise`.
pub async fn monitor_clock(
    node_id: NodeId,
    raft: Raft,
    health: Arc<Health>,
    max_offset_ms: u64,
    interval: Duration,
    transport: Transport,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut clients: BTreeMap<String, AdminClient<Channel>> = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let round_began = Instant::now();
        let metrics = crate::raft::types::current_metrics(&raft);
        let peers = peer_addresses(&metrics, node_id);
        let mut samples = Vec::with_capacity(peers.len());
        let mut rules_known = Vec::with_capacity(peers.len());
        for address in &peers {
            let answer = probe(&mut clients, &transport, address, interval, health.clock()).await;
            rules_known.push(answer.map(|(_, known)| known));
            samples.push(answer.map(|(sample, _)| sample));
        }
        // A peer that did not answer keeps its last report.
        replace_per_peer(&health.peer_rules_known, &peers, |at, last| {
            rules_known[at].or(last)
        });
        let mut offsets: Vec<i64> = samples
            .iter()
            .flatten()
            .map(ClockSample::offset_ms)
            .collect();
        offsets.sort_unstable();
        health.clock_offset_ms.store(
            offsets.get(offsets.len() / 2).copied().unwrap_or(0),
            Ordering::Relaxed,
        );
        // A probe too slow to judge by keeps the peer's last verdict (agreeing if none).
        replace_per_peer(&health.peer_clocks_agree, &peers, |at, last| {
            Some(verdict(samples[at].as_ref(), max_offset_ms).unwrap_or(last.unwrap_or(true)))
        });
        *health
            .clock_confirmed_by_round
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            confirmed_by_majority(&samples, max_offset_ms).then_some(round_began);
        let ok = within_majority(&samples, max_offset_ms);
        let was_ok = health.clock_ok.swap(ok, Ordering::Relaxed);
        if ok != was_ok {
            tracing::warn!(clock_ok = ok, offsets = ?offsets, "clock agreement with the majority changed");
        }
        raft.runtime_config().elect(ok);
        if !ok && metrics.state == ServerState::Leader {
            let successor = metrics
                .membership_config
                .membership()
                .voter_ids()
                .find(|id| *id != node_id);
            if let Some(to) = successor {
                tracing::warn!(
                    to,
                    "clock is off from the majority: handing leadership away"
                );
                if let Err(error) = raft.trigger().transfer_leader(to).await {
                    tracing::error!(%error, "leadership transfer failed");
                }
            }
        }
    }
}

async fn probe(
    clients: &mut BTreeMap<String, AdminClient<Channel>>,
    transport: &Transport,
    address: &str,
    timeout: Duration,
    clock: &NodeClock,
) -> Option<(ClockSample, u32)> {
    if !clients.contains_key(address) {
        // Peers' clocks are read on their client ports (`Admin.ClockProbe`, which node
        // certificates may call).
        let endpoint = transport.endpoint(address).ok()?.connect_timeout(timeout);
        let channel = endpoint.connect().await.ok()?;
        clients.insert(address.to_owned(), AdminClient::new(channel));
    }
    let client = clients.get_mut(address)?;
    let sent_ms = clock.now_ms();
    let reply = tokio::time::timeout(
        timeout,
        client.clock_probe(ClockProbeRequest {
            sent_at_ms: sent_ms,
        }),
    )
    .await;
    let received_ms = clock.now_ms();
    match reply {
        Ok(Ok(reply)) => {
            let reply = reply.into_inner();
            let sample = ClockSample {
                sent_ms,
                peer_ms: reply.wall_clock_ms,
                received_ms,
            };
            Some((sample, reply.rules_known))
        }
        _ => {
            clients.remove(address);
            None
        }
    }
}
