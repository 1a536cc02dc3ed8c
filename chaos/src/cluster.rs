//! The cluster under test: 3 chaos-node processes on 127.0.0.1, each port behind a proxy
//! (one for the client port, one for the peer port), all with mutual TLS and certificates of
//! the run's own CA. The harness's own control calls (status, digests, final reads) go to the
//! nodes' listen addresses directly, so a partition never blinds the harness; the workload's
//! clients go through the client proxies and Raft traffic through the peer proxies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::budget_client::BudgetClient;
use tally_api::pb::{self, NodeRole};
use tally_api::MAX_MESSAGE_BYTES;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::checker::{FamilyState, ReplicaState};
use crate::kernel::KernelProcess;
use crate::listen_port::reserved_listen_addr;
use crate::paged_read::read_all_pages;
use crate::process::{NodeProcess, NodeSpec};
use crate::proxy::{Network, Side};

/// One control call's timeout.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// One call of the final state read (the digest, a page of events, the usages, the holds).
/// Their cost grows with the state: after a long soak (debug-built nodes, every command
/// retained in full) the digest alone outlasts `CONTROL_TIMEOUT`, and a read that times out
/// leaves no invariant checked.
const STATE_READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Rows per final-state read page, and pages per list of a family.
const PAGE: u32 = 5_000;
const MAX_PAGES: usize = 200;
/// `ListEvents` consistency LOCAL: this node's applied state.
const LOCAL: i32 = pb::Consistency::Local as i32;

/// The regions the nodes are spread over, best first: the cluster's preferred leader regions.
pub const REGIONS: [&str; 3] = ["east", "central", "west"];

/// Node `id`'s region among `count` nodes: as even as possible in id order (5 nodes: east 2,
/// central 2, west 1; 3 nodes: one each), so no region holds a majority of 3 or more nodes.
pub fn region_of(id: u64, count: u64) -> &'static str {
    assert!(
        (1..=count).contains(&id),
        "node {id} is not one of {count} nodes"
    );
    REGIONS[((id - 1) * REGIONS.len() as u64 / count) as usize]
}

pub struct ChaosCluster {
    pub nodes: BTreeMap<u64, NodeProcess>,
    pub net: Network,
    /// Node id → the proxy address everyone else uses.
    pub proxies: BTreeMap<u64, String>,
    proxy_tasks: Vec<JoinHandle<()>>,
    /// Kernel node processes in front of the cluster (none without a kernel layer).
    pub kernels: BTreeMap<u64, KernelProcess>,
    /// The run's CA and certificates (nodes, `operator`, `kernel`, `reader`).
    pub tls_dir: PathBuf,
}

impl ChaosCluster {
    /// Starts `count` nodes from `binary` under `dir`, each behind a proxy, initializes the
    /// cluster and waits for a leader.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        count: u64,
        snapshot_every_entries: u64,
        max_live_families: usize,
    ) -> anyhow::Result<Self> {
        let net = Network::new();
        let tls_dir = dir.join("tls");
        tally_tls::issue::ensure_dev_certs(&tls_dir, "tally-chaos", count)?;
        let mut cluster = Self {
            tls_dir: tls_dir.clone(),
            nodes: BTreeMap::new(),
            net: net.clone(),
            proxies: BTreeMap::new(),
            proxy_tasks: Vec::new(),
            kernels: BTreeMap::new(),
        };
        for id in 1..=count {
            let listen = reserved_listen_addr()?;
            let front = TcpListener::bind("127.0.0.1:0").await?;
            let front_addr = front.local_addr()?;
            cluster
                .proxy_tasks
                .push(net.spawn_proxy(id, front, listen, Side::Client));
            let peer_listen = reserved_listen_addr()?;
            let peer_front = TcpListener::bind("127.0.0.1:0").await?;
            let peer_front_addr = peer_front.local_addr()?;
            cluster
                .proxy_tasks
                .push(net.spawn_proxy(id, peer_front, peer_listen, Side::Peer));
            let data_dir: PathBuf = dir.join(format!("node-{id}"));
            std::fs::create_dir_all(&data_dir)?;
            let spec = NodeSpec {
                id,
                binary: binary.to_owned(),
                listen: listen.to_string(),
                advertise: front_addr.to_string(),
                peer_listen: peer_listen.to_string(),
                peer_advertise: peer_front_addr.to_string(),
                tls: tally_tls::TlsFiles::in_dir(&tls_dir, &format!("node-{id}")),
                data_dir,
                log_file: dir.join(format!("node-{id}.log")),
                cluster_id: "tally-chaos".to_owned(),
                region: region_of(id, count).to_owned(),
                snapshot_every_entries,
                max_live_families,
            };
            cluster.proxies.insert(id, front_addr.to_string());
            cluster.nodes.insert(id, NodeProcess::new(spec));
            cluster.start_node(id, None)?;
        }
        let members: BTreeMap<u64, pb::MemberAddress> = cluster
            .nodes
            .iter()
            .map(|(id, node)| {
                (
                    *id,
                    pb::MemberAddress {
                        address: node.spec.advertise.clone(),
                        peer_address: node.spec.peer_advertise.clone(),
                        region: node.spec.region.clone(),
                    },
                )
            })
            .collect();
        let start = Instant::now();
        loop {
            let result = async {
                let mut admin = cluster.admin(1).await?;
                admin
                    .initialize(pb::InitializeRequest {
                        members: BTreeMap::new(),
                        nodes: members.clone(),
                    })
                    .await?;
                anyhow::Ok(())
            }
            .await;
            match result {
                Ok(()) => break,
                Err(error) if start.elapsed() > Duration::from_secs(30) => {
                    return Err(error.context("initialize the cluster"))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        cluster
            .wait_leader(Duration::from_secs(30))
            .await
            .context("no leader after initialize")?;
        // The leader is moved back into east after every failover that takes it elsewhere,
        // so leadership transfers run under the faults too.
        cluster
            .set_params(
                pb::SetParamsRequest {
                    preferred_leader_regions: Some(pb::RegionList {
                        regions: REGIONS.iter().map(|r| (*r).to_owned()).collect(),
                    }),
                    ..pb::SetParamsRequest::default()
                },
                Duration::from_secs(30),
            )
            .await
            .context("set the preferred leader regions")?;
        Ok(cluster)
    }

    /// Node `id`'s region.
    pub fn region(&self, id: u64) -> Option<&str> {
        self.nodes.get(&id).map(|node| node.spec.region.as_str())
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    pub fn client_endpoints(&self) -> Vec<String> {
        self.proxies.values().cloned().collect()
    }

    /// The run's certificate `identity` (`kernel`, `operator`, `reader`).
    pub fn transport(&self, identity: &str) -> anyhow::Result<tally_tls::Transport> {
        Ok(tally_tls::Transport::from_dir(
            &self.tls_dir,
            identity,
            false,
        )?)
    }

    /// (Re)starts node `id` from its data dir with `failpoints` armed, if any.
    pub fn start_node(&mut self, id: u64, failpoints: Option<&str>) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(&id).context("no such node")?;
        let pid = node.start(failpoints)?;
        self.net.set_pid(id, Some(pid));
        Ok(())
    }

    pub fn kill(&mut self, id: u64) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.kill();
        }
        self.net.set_pid(id, None);
    }

    pub fn pause(&mut self, id: u64) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.pause();
        }
    }

    pub fn resume(&mut self, id: u64) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.resume();
        }
    }

    pub fn is_running(&mut self, id: u64) -> bool {
        self.nodes.get_mut(&id).is_some_and(NodeProcess::is_running)
    }

    /// A direct channel to node `id`'s client port, presenting `identity` (`operator` for
    /// control calls, `reader` for the final state read: it may read every family and the
    /// digest, and write nothing).
    async fn channel(
        &self,
        id: u64,
        identity: &str,
        call_timeout: Duration,
    ) -> anyhow::Result<Channel> {
        let node = self.nodes.get(&id).context("no such node")?;
        let endpoint = self
            .transport(identity)?
            .endpoint(&node.spec.listen)?
            .connect_timeout(CONTROL_TIMEOUT)
            .timeout(call_timeout);
        Ok(tokio::time::timeout(CONTROL_TIMEOUT, endpoint.connect())
            .await
            .context("connect timed out")??)
    }

    pub async fn admin(&self, id: u64) -> anyhow::Result<AdminClient<Channel>> {
        Ok(AdminClient::new(
            self.channel(id, "operator", CONTROL_TIMEOUT).await?,
        ))
    }

    /// A client for the final state read (see `STATE_READ_TIMEOUT`).
    async fn state_reader(&self, id: u64) -> anyhow::Result<BudgetClient<Channel>> {
        Ok(
            BudgetClient::new(self.channel(id, "reader", STATE_READ_TIMEOUT).await?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    pub async fn status(&self, id: u64) -> Option<pb::StatusReply> {
        if self.nodes.get(&id).is_none_or(NodeProcess::is_paused) {
            return None;
        }
        let mut admin = self.admin(id).await.ok()?;
        let call = admin.status(pb::StatusRequest {});
        match tokio::time::timeout(CONTROL_TIMEOUT, call).await {
            Ok(Ok(reply)) => Some(reply.into_inner()),
            _ => None,
        }
    }

    /// The rules version each node applies (docs/spec.md §5.5, "Rules versions"), as
    /// `id: version`; `?` for a node that does not answer.
    pub async fn rules_versions(&self) -> String {
        let mut out = Vec::new();
        for id in self.ids() {
            let version = self.status(id).await.and_then(|s| s.params);
            out.push(match version {
                Some(params) => format!("{id}: {}", params.rules_version),
                None => format!("{id}: ?"),
            });
        }
        out.join(", ")
    }

    /// The node that says it leads, at the highest term among those that answer.
    pub async fn leader(&self) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64)> = None;
        for id in self.ids() {
            if let Some(status) = self.status(id).await {
                if status.role == NodeRole::Leader as i32
                    && best.is_none_or(|(_, term)| status.term > term)
                {
                    best = Some((id, status.term));
                }
            }
        }
        best
    }

    pub async fn wait_leader(&self, within: Duration) -> anyhow::Result<(u64, u64)> {
        let start = Instant::now();
        loop {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            anyhow::ensure!(start.elapsed() < within, "no leader within {within:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Raises `max_clock_step_ms` to its largest value through the log, so that an idle
    /// leader's cluster time keeper writes no entry for about five minutes (it ticks once
    /// cluster time trails its clock by half of the step less a second, docs/spec.md §6): the
    /// final read compares every replica at one applied index, and at the default step an
    /// idle cluster applies an entry every 4.5 s, which a long read round would never fit
    /// between.
    pub async fn quiet_cluster_time_keeper(&self, within: Duration) -> anyhow::Result<()> {
        let request = pb::SetParamsRequest {
            max_clock_step_ms: Some(*tally_ledger::cluster_time::MAX_CLOCK_STEP_MS.end()),
            ..pb::SetParamsRequest::default()
        };
        self.set_params(request, within).await
    }

    /// Sets the cluster's retention through the log, on the leader (within `within`).
    pub async fn set_retention_ms(
        &self,
        retention_ms: u64,
        within: Duration,
    ) -> anyhow::Result<()> {
        let request = pb::SetParamsRequest {
            retention_ms: Some(retention_ms),
            ..pb::SetParamsRequest::default()
        };
        self.set_params(request, within).await
    }

    /// Changes cluster parameters through the log, on the leader (within `within`).
    pub async fn set_params(
        &self,
        request: pb::SetParamsRequest,
        within: Duration,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            let (leader, _) = self.wait_leader(within).await?;
            let request = request.clone();
            let call = async {
                self.admin(leader)
                    .await?
                    .set_params(request)
                    .await
                    .map_err(anyhow::Error::from)
            };
            match tokio::time::timeout(CONTROL_TIMEOUT, call).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(error)) if start.elapsed() >= within => return Err(error),
                Err(_) if start.elapsed() >= within => anyhow::bail!("set_params timed out"),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Waits until every node has applied the leader's last log index, and returns it.
    pub async fn wait_converged(&self, within: Duration) -> anyhow::Result<u64> {
        let start = Instant::now();
        loop {
            let mut applied = Vec::new();
            let mut last = None;
            for id in self.ids() {
                if let Some(status) = self.status(id).await {
                    applied.push(status.applied_index.unwrap_or(0));
                    if status.role == NodeRole::Leader as i32 {
                        last = status.last_log_index;
                    }
                }
            }
            if let Some(last) = last {
                if applied.len() == self.nodes.len() && applied.iter().all(|a| *a == last) {
                    return Ok(last);
                }
            }
            anyhow::ensure!(
                start.elapsed() < within,
                "replicas did not converge within {within:?}: applied {applied:?}, leader's last {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Node `id`'s state digest and the applied index it was taken at.
    pub async fn digest(&self, id: u64) -> anyhow::Result<(u64, String)> {
        let mut admin = AdminClient::new(self.channel(id, "reader", STATE_READ_TIMEOUT).await?);
        let reply = admin
            .state_digest(pb::StateDigestRequest {})
            .await?
            .into_inner();
        let hex: String = reply.digest.iter().map(|b| format!("{b:02x}")).collect();
        Ok((reply.applied_index, hex))
    }

    /// Node `id`'s final state of `families`, read LOCAL from that node alone.
    pub async fn read_state(&self, id: u64, families: &[String]) -> anyhow::Result<ReplicaState> {
        let (applied_index, digest) = self.digest(id).await?;
        let budget = self.state_reader(id).await?;
        let mut out = ReplicaState {
            node_id: id,
            applied_index,
            digest,
            families: BTreeMap::new(),
        };
        for family in families {
            let mut state = FamilyState {
                family: family.clone(),
                ..FamilyState::default()
            };
            state.events = read_all_pages(
                &format!("node {id}: events of family {family}"),
                MAX_PAGES,
                |after: Option<u64>| {
                    let request = pb::ListEventsRequest {
                        family_id: family.clone(),
                        capability_id: None,
                        grant_index: None,
                        after_commit_index: after,
                        limit: PAGE,
                        consistency: LOCAL,
                    };
                    let mut budget = budget.clone();
                    async move {
                        let page = budget
                            .list_events(request)
                            .await?
                            .into_inner()
                            .into_records()?;
                        let next = (page.len() == PAGE as usize)
                            .then(|| page.last().map(|event| event.commit_index.0))
                            .flatten();
                        Ok((page, next))
                    }
                },
            )
            .await?;
            let usages = read_all_pages(
                &format!("node {id}: accounts of family {family}"),
                MAX_PAGES,
                |after: Option<pb::UsagePosition>| {
                    let request = pb::ListUsagesRequest {
                        family_id: Some(family.clone()),
                        capability_id: None,
                        limit: PAGE,
                        consistency: LOCAL,
                        after,
                    };
                    let mut budget = budget.clone();
                    async move {
                        let reply = budget.list_usages(request).await?.into_inner();
                        let next = reply.next.clone();
                        Ok((reply.into_page()?.rows, next))
                    }
                },
            )
            .await?;
            state.usages = usages.into_iter().map(|(_, usage)| usage).collect();
            state.usages.sort_by(|a, b| a.key.cmp(&b.key));
            let holds = read_all_pages(
                &format!("node {id}: live holds of family {family}"),
                MAX_PAGES,
                |after: Option<pb::HoldPosition>| {
                    let request = pb::ListHoldsRequest {
                        family_id: Some(family.clone()),
                        state: None,
                        created_before_ms: None,
                        limit: PAGE,
                        consistency: LOCAL,
                        with_remaining_exposure: false,
                        after,
                    };
                    let mut budget = budget.clone();
                    async move {
                        let reply = budget.list_holds(request).await?.into_inner();
                        let next = reply.next.clone();
                        Ok((reply.into_page()?.holds, next))
                    }
                },
            )
            .await?;
            state.holds = holds.into_iter().map(|(_, hold)| hold).collect();
            out.families.insert(family.clone(), state);
        }
        Ok(out)
    }
}

impl Drop for ChaosCluster {
    fn drop(&mut self) {
        for task in &self.proxy_tasks {
            task.abort();
        }
        // Each NodeProcess kills its process on drop.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_spread_over_the_regions_so_none_holds_a_majority() {
        let layout = |count: u64| {
            (1..=count)
                .map(|id| region_of(id, count))
                .collect::<Vec<_>>()
        };
        assert_eq!(layout(5), ["east", "east", "central", "central", "west"]);
        assert_eq!(layout(3), ["east", "central", "west"]);
        assert_eq!(layout(1), ["east"]);
        for count in 3..=7 {
            for region in REGIONS {
                let inside = layout(count).iter().filter(|r| **r == region).count() as u64;
                assert!(2 * inside <= count, "{region} holds {inside} of {count}");
            }
        }
    }
}
