//! The regions bench's cluster: one `tally-node serve` per node host, started inside the
//! host's namespace (`ip netns exec`, which becomes the node: its pid is the node's), with
//! certificates that name the host's address, WAN timeouts, and its region.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tally_api::pb::{
    InitializeRequest, MemberAddress, RegionList, SetParamsRequest, StatusRequest,
};
use tally_tls::issue::CertAuthority;
use tally_tls::{TlsFiles, Transport};

use super::topology::Host;
use crate::cluster::{connect, connect_within, node_worker_threads, ServeSettings};

const CLIENT_PORT: u16 = 7401;
const PEER_PORT: u16 = 7402;
const METRICS_PORT: u16 = 7403;
const CLUSTER_ID: &str = "tally-regions";

/// Raft timings for replicas up to 90 ms apart (docs/operations.md "Regions").
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct WanTimeouts {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
}

/// One node: its id, host and region's name.
#[derive(Clone, Debug)]
pub struct NodeHost {
    pub id: u64,
    pub host: Host,
    pub region: String,
}

impl NodeHost {
    pub fn endpoint(&self) -> String {
        format!("{}:{CLIENT_PORT}", self.host.address)
    }
}

/// The nodes and the operator's certificate: enough to ask who leads, from any host.
#[derive(Clone)]
pub struct ClusterView {
    pub operator: Transport,
    pub nodes: Vec<NodeHost>,
}

pub struct RegionCluster {
    pub view: ClusterView,
    pub kernel: Transport,
    children: Vec<Child>,
}

impl RegionCluster {
    /// Issues certificates naming each node's address and starts every node in its namespace.
    /// Each node's output goes to `logs/node-<id>.log`.
    pub fn start(
        binary: &Path,
        dir: &Path,
        logs: &Path,
        nodes: Vec<NodeHost>,
        timeouts: WanTimeouts,
    ) -> anyhow::Result<Self> {
        let tls_dir = dir.join("tls");
        std::fs::create_dir_all(&tls_dir)?;
        let ca = CertAuthority::generate(CLUSTER_ID, 2)?;
        ca.write(&tls_dir)?;
        for node in &nodes {
            ca.issue_node(node.id, &[node.host.address.to_string()], 2)?
                .write(&tls_dir, &format!("node-{}", node.id))?;
        }
        tally_tls::issue::ensure_dev_certs(&tls_dir, CLUSTER_ID, 0)?;
        let mut cluster = Self {
            view: ClusterView {
                operator: Transport::from_dir(&tls_dir, "operator", false)?,
                nodes: Vec::new(),
            },
            kernel: Transport::from_dir(&tls_dir, "kernel", false)?,
            children: Vec::new(),
        };
        let worker_threads = node_worker_threads(nodes.len());
        for node in nodes {
            let address = node.host.address;
            let data: PathBuf = dir.join(format!("node-{}", node.id));
            let log = std::fs::File::create(logs.join(format!("node-{}.log", node.id)))?;
            let (listen, peer, metrics) = (
                format!("{address}:{CLIENT_PORT}"),
                format!("{address}:{PEER_PORT}"),
                format!("{address}:{METRICS_PORT}"),
            );
            let settings = ServeSettings {
                id: node.id,
                worker_threads,
                listen: &listen,
                peer: &peer,
                metrics: &metrics,
                data_dir: &data,
                cluster_id: CLUSTER_ID,
                tls: TlsFiles::in_dir(&tls_dir, &format!("node-{}", node.id)),
            };
            let mut launcher = Command::new("ip");
            launcher
                .args(["netns", "exec", &node.host.namespace])
                .arg(binary);
            let child = settings
                .apply(&mut launcher)
                .env("TALLY_REGION", &node.region)
                .env(
                    "TALLY_HEARTBEAT_INTERVAL_MS",
                    timeouts.heartbeat_interval_ms.to_string(),
                )
                .env(
                    "TALLY_ELECTION_TIMEOUT_MIN_MS",
                    timeouts.election_timeout_min_ms.to_string(),
                )
                .env(
                    "TALLY_ELECTION_TIMEOUT_MAX_MS",
                    timeouts.election_timeout_max_ms.to_string(),
                )
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", binary.display()))?;
            cluster.children.push(child);
            cluster.view.nodes.push(node);
        }
        Ok(cluster)
    }
}

impl ClusterView {
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(NodeHost::endpoint).collect()
    }

    fn node(&self, id: u64) -> Option<&NodeHost> {
        self.nodes.iter().find(|node| node.id == id)
    }

    /// The region of node `id`.
    pub fn region_of(&self, id: u64) -> Option<&str> {
        self.node(id).map(|node| node.region.as_str())
    }

    /// The index in `REGIONS` of node `id`'s region.
    pub fn region_index(&self, id: u64) -> Option<usize> {
        self.node(id).map(|node| node.host.region)
    }

    /// Initializes the cluster with every node's region and sets the preferred leader
    /// regions; called from a host that reaches every node.
    pub async fn initialize(&self, preferred: &[String]) -> anyhow::Result<()> {
        let members: BTreeMap<u64, MemberAddress> = self
            .nodes
            .iter()
            .map(|node| {
                (
                    node.id,
                    MemberAddress {
                        address: node.endpoint(),
                        peer_address: format!("{}:{PEER_PORT}", node.host.address),
                        region: node.region.clone(),
                    },
                )
            })
            .collect();
        let mut first = connect_within(
            &self.operator,
            &self.nodes[0].endpoint(),
            Duration::from_secs(20),
        )
        .await?;
        first
            .initialize(InitializeRequest {
                members: BTreeMap::new(),
                nodes: members,
            })
            .await?;
        let start = Instant::now();
        loop {
            if let Some((leader, _)) = self.leader(Duration::from_secs(1)).await {
                let mut admin = connect(&self.operator, &self.endpoint_of(leader)).await?;
                admin
                    .set_params(SetParamsRequest {
                        preferred_leader_regions: Some(RegionList {
                            regions: preferred.to_vec(),
                        }),
                        ..SetParamsRequest::default()
                    })
                    .await?;
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(30),
                "no leader within 30 s of initializing"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn endpoint_of(&self, id: u64) -> String {
        self.node(id).map(NodeHost::endpoint).unwrap_or_default()
    }

    /// The leader as the nodes reachable within `timeout` see it: the node that says it leads
    /// at the highest term, with that term.
    pub async fn leader(&self, timeout: Duration) -> Option<(u64, u64)> {
        let mut asks = tokio::task::JoinSet::new();
        for node in &self.nodes {
            let (transport, endpoint) = (self.operator.clone(), node.endpoint());
            asks.spawn(async move {
                let ask = async {
                    let mut admin = connect(&transport, &endpoint).await.ok()?;
                    admin
                        .status(StatusRequest {})
                        .await
                        .ok()
                        .map(|r| r.into_inner())
                };
                tokio::time::timeout(timeout, ask).await.ok().flatten()
            });
        }
        let mut leader: Option<(u64, u64)> = None;
        while let Some(answer) = asks.join_next().await {
            let Ok(Some(status)) = answer else { continue };
            if status.leader_id == Some(status.node_id)
                && leader.is_none_or(|(_, term)| status.term > term)
            {
                leader = Some((status.node_id, status.term));
            }
        }
        leader
    }

    /// Waits until the leader is in `region`, up to `within`.
    pub async fn wait_leader_in(&self, region: &str, within: Duration) -> anyhow::Result<u64> {
        let start = Instant::now();
        loop {
            if let Some((leader, _)) = self.leader(Duration::from_millis(500)).await {
                if self.region_of(leader) == Some(region) {
                    return Ok(leader);
                }
            }
            anyhow::ensure!(
                start.elapsed() < within,
                "the leader did not move to {region} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for RegionCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
