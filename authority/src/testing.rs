//! Test support, public so every crate's tests can use it: in-process clusters of real nodes
//! over gRPC on 127.0.0.1 (port 0), sharing one network fault switchboard, with crash
//! (`kill`: tasks aborted, handles dropped) and restart from the same data dir and port.
//! Clusters run with mutual TLS, as in production: each makes its own CA and certificates
//! (nodes 1 to [`MAX_TEST_NODES`], `operator`, `kernel` with every namespace, `reader`) in
//! `<dir>/tls`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::faults::NetworkFaults;
use crate::node::config::NodeConfig;
use crate::node::{self, NodeHandle};
use crate::raft::types::current_metrics;
use crate::raft::types::TallyNode;
use std::path::PathBuf;
use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::budget_client::BudgetClient;
use tally_tls::{TlsFiles, Transport};
use tonic::transport::Channel;

/// Liveness bound for tests: generous, never a performance assertion.
pub const LIVENESS: Duration = Duration::from_secs(30);

pub struct TestCluster {
    pub nodes: BTreeMap<u64, NodeHandle>,
    pub configs: BTreeMap<u64, NodeConfig>,
    pub faults: Arc<NetworkFaults>,
    pub dir: tempfile::TempDir,
}

/// Node certificates made for every test cluster.
pub const MAX_TEST_NODES: u64 = 9;

/// Where a test cluster in `dir` keeps its CA and certificates.
pub fn tls_dir(dir: &std::path::Path) -> PathBuf {
    dir.join("tls")
}

/// The certificate `identity` of the test cluster in `dir` (`kernel`, `operator`, `reader`,
/// `node-<id>`).
pub fn transport(dir: &std::path::Path, identity: &str) -> Transport {
    Transport::from_dir(&tls_dir(dir), identity, false).expect("test certificates load")
}

/// Node `id` of a test cluster in `dir`, with its certificates made if missing.
pub fn config(dir: &std::path::Path, id: u64) -> NodeConfig {
    tally_tls::issue::ensure_dev_certs(&tls_dir(dir), "tally-test", MAX_TEST_NODES)
        .expect("test certificates");
    NodeConfig {
        node_id: id,
        listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        peer_listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        tls: Some(TlsFiles::in_dir(&tls_dir(dir), &format!("node-{id}"))),
        data_dir: dir.join(format!("node-{id}")),
        cluster_id: "tally-test".to_owned(),
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        propose_timeout_ms: 3_000,
        expiry_interval_ms: 200,
        // The test nodes share one disk, whose free space is not theirs to judge: only the
        // tests that set a quota raise the NoSpace alarm.
        disk_reserve_bytes: 0,
        ..NodeConfig::default()
    }
}

impl TestCluster {
    /// Starts `n` nodes and initializes them as one cluster; returns once a leader serves.
    pub async fn start(n: u64) -> Self {
        Self::start_with(n, |_| {}).await
    }

    pub async fn start_with(n: u64, tweak: impl Fn(&mut NodeConfig)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let faults = Arc::new(NetworkFaults::default());
        let mut cluster = Self {
            nodes: BTreeMap::new(),
            configs: BTreeMap::new(),
            faults,
            dir,
        };
        for id in 1..=n {
            let mut config = config(cluster.dir.path(), id);
            tweak(&mut config);
            cluster.launch(config).await;
        }
        let members: BTreeMap<u64, TallyNode> = cluster
            .nodes
            .iter()
            .map(|(id, node)| (*id, node.config.member()))
            .collect();
        cluster.nodes[&1]
            .raft
            .initialize(members)
            .await
            .expect("initialize");
        cluster.wait_leader().await;
        // The newest every member lets the cluster raise to (`max_rules_version`).
        let common = cluster
            .configs
            .values()
            .map(|config| config.max_rules_version)
            .min()
            .unwrap_or(tally_ledger::CURRENT_RULES);
        cluster.wait_rules(common).await;
        cluster
    }

    /// Waits until every node applies the rules of `version`: a new cluster's leader raises
    /// them once the members' clock probes report knowing them (`node/rules_raise.rs`), a
    /// second or two after the first election. Tests start from there, so the entry that
    /// raises them is not among the entries a test counts.
    pub async fn wait_rules(&self, version: u32) {
        let start = Instant::now();
        loop {
            let mut in_force = Vec::with_capacity(self.nodes.len());
            for node in self.nodes.values() {
                in_force.push(node.router.lock().await.params().rules_version);
            }
            if in_force.iter().all(|v| *v == version) {
                return;
            }
            assert!(
                start.elapsed() < LIVENESS,
                "rules not raised to {version} within {LIVENESS:?}: {in_force:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Starts a node from `config`, pinning its port so a restart reuses it.
    pub async fn launch(&mut self, mut config: NodeConfig) -> &NodeHandle {
        let id = config.node_id;
        let node = node::start(config.clone(), self.faults.clone())
            .await
            .unwrap_or_else(|error| panic!("node {id} starts: {error}"));
        config.listen_addr = node.local_addr;
        config.advertise_addr = Some(node.local_addr.to_string());
        config.peer_listen_addr = node.peer_local_addr;
        config.peer_advertise_addr = Some(node.peer_local_addr.to_string());
        self.configs.insert(id, config);
        self.nodes.insert(id, node);
        &self.nodes[&id]
    }

    /// Waits until a node leads, has applied an entry of its term (it can answer writes),
    /// and every live node knows it; returns its id.
    pub async fn wait_leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let leaders: Vec<Option<u64>> = self
                .nodes
                .values()
                .map(|n| current_metrics(&n.raft).current_leader)
                .collect();
            if let Some(Some(leader)) = leaders.first() {
                let agreed =
                    self.nodes.contains_key(leader) && leaders.iter().all(|l| l == &Some(*leader));
                if agreed && self.nodes[leader].health.is_healthy() {
                    return *leader;
                }
            }
            assert!(
                start.elapsed() < LIVENESS,
                "no agreed leader within {LIVENESS:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Like `wait_leader`, but only `ids` must agree (the others may be cut off or removed).
    pub async fn wait_leader_among(&self, ids: &[u64]) -> u64 {
        let start = Instant::now();
        loop {
            let leaders: Vec<Option<u64>> = ids
                .iter()
                .map(|id| current_metrics(&self.nodes[id].raft).current_leader)
                .collect();
            if let Some(Some(leader)) = leaders.first() {
                let agreed = ids.contains(leader) && leaders.iter().all(|l| l == &Some(*leader));
                if agreed && self.nodes[leader].health.is_healthy() {
                    return *leader;
                }
            }
            assert!(
                start.elapsed() < LIVENESS,
                "no agreed leader among {ids:?} within {LIVENESS:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub fn leader_now(&self) -> Option<u64> {
        self.nodes.values().find_map(|n| {
            let m = current_metrics(&n.raft);
            (m.current_leader == Some(n.config.node_id)).then_some(n.config.node_id)
        })
    }

    pub fn address(&self, id: u64) -> String {
        self.configs[&id].listen_addr.to_string()
    }

    /// The certificate `identity` of this cluster (`kernel`, `operator`, `reader`...).
    pub fn transport(&self, identity: &str) -> Transport {
        transport(self.dir.path(), identity)
    }

    /// A channel to node `id`'s client port, presenting `identity`.
    pub async fn channel(&self, id: u64, identity: &str) -> Channel {
        self.transport(identity)
            .endpoint(&self.address(id))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    /// The request that adds node `id` (already launched) as a learner, waiting for it.
    pub fn learner_request(&self, id: u64) -> tally_api::pb::AddLearnerRequest {
        let member = self.configs[&id].member();
        tally_api::pb::AddLearnerRequest {
            id,
            address: member.addr,
            blocking: true,
            peer_address: member.peer_addr,
            region: member.region,
        }
    }

    /// Budget calls as the cluster's `kernel`.
    pub async fn budget(&self, id: u64) -> BudgetClient<Channel> {
        BudgetClient::new(self.channel(id, "kernel").await)
    }

    /// Admin calls as the cluster's `operator`.
    pub async fn admin(&self, id: u64) -> AdminClient<Channel> {
        AdminClient::new(self.channel(id, "operator").await)
    }

    /// A crash: tasks aborted and handles dropped, no leadership transfer.
    pub async fn kill(&mut self, id: u64) {
        let node = self.nodes.remove(&id).expect("node is running");
        node.abort().await;
    }

    pub async fn restart(&mut self, id: u64) {
        let config = self.configs[&id].clone();
        self.launch(config).await;
    }

    /// Waits until every live node has applied through `index`.
    pub async fn wait_applied(&self, index: u64) {
        let start = Instant::now();
        for node in self.nodes.values() {
            while current_metrics(&node.raft)
                .last_applied
                .map_or(0, |l| l.index)
                < index
            {
                assert!(
                    start.elapsed() < LIVENESS,
                    "node {} did not apply {index}",
                    node.config.node_id
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Every live node's state digest, once all have applied the leader's last log index.
    pub async fn converged_digests(&self) -> BTreeMap<u64, [u8; 32]> {
        let leader = self.wait_leader().await;
        let last = current_metrics(&self.nodes[&leader].raft)
            .last_log_index
            .unwrap_or(0);
        self.wait_applied(last).await;
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.digests_at_one_index(&ids).await
    }

    /// The state digests of `ids` taken at one applied index: the leader keeps proposing
    /// entries of its own (cluster time ticks, hold expiry), and one of those applied between
    /// two nodes' reads would make their digests differ, so a read that straddles one is
    /// taken again.
    async fn digests_at_one_index(&self, ids: &[u64]) -> BTreeMap<u64, [u8; 32]> {
        let start = Instant::now();
        loop {
            let mut read = BTreeMap::new();
            for id in ids {
                let router = self.nodes[id].router.lock().await;
                let applied = router.last_applied();
                let digest = router.digest().await.expect("digest");
                read.insert(*id, (applied, digest));
            }
            let first = read.values().next().map(|(applied, _)| *applied);
            if read.values().all(|(applied, _)| Some(*applied) == first) {
                return read.into_iter().map(|(id, (_, d))| (id, d)).collect();
            }
            assert!(
                start.elapsed() < LIVENESS,
                "the nodes never stood at one applied index: {:?}",
                read.iter()
                    .map(|(id, (a, _))| (*id, *a))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The state digests of `ids`, once each has applied the last log index of the leader
    /// they agree on.
    pub async fn converged_digests_of(&self, ids: &[u64]) -> BTreeMap<u64, [u8; 32]> {
        let leader = self.wait_leader_among(ids).await;
        let last = current_metrics(&self.nodes[&leader].raft)
            .last_log_index
            .unwrap_or(0);
        let start = Instant::now();
        for id in ids {
            while current_metrics(&self.nodes[id].raft)
                .last_applied
                .map_or(0, |l| l.index)
                < last
            {
                assert!(start.elapsed() < LIVENESS, "node {id} did not apply {last}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.digests_at_one_index(ids).await
    }

    /// Once converged: each node's digest of `family` and its number of families. The whole
    /// state digest moves with every entry (cluster time, last applied); a family's does not.
    pub async fn family_state(&self, family: &str) -> BTreeMap<u64, (Option<[u8; 32]>, usize)> {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.converged_digests_of(&ids).await;
        let family = tally_ledger::FamilyId::from(family);
        let mut out = BTreeMap::new();
        for (id, node) in &self.nodes {
            let router = node.router.lock().await;
            let digest = router.family_digest(&family).await.expect("family digest");
            out.insert(*id, (digest, router.family_count()));
        }
        out
    }

    pub async fn shutdown(self) {
        for (_, node) in self.nodes {
            node.abort().await;
        }
    }
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
