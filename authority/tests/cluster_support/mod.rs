//! In-process clusters over real gRPC on 127.0.0.1, sharing one fault switchboard.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::BasicNode;
use tally_api::pb;
use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::budget_client::BudgetClient;
use tally_api::status::{error_detail, Definiteness};
use tally_authority::node::config::NodeConfig;
use tally_authority::node::{self, NodeHandle};
use tally_authority::raft::faults::NetworkFaults;
use tally_authority::raft::types::current_metrics;
use tonic::transport::Channel;
use tonic::Status;

/// Liveness bound for tests: generous, never a performance assertion.
pub const LIVENESS: Duration = Duration::from_secs(30);

pub struct TestCluster {
    pub nodes: BTreeMap<u64, NodeHandle>,
    pub configs: BTreeMap<u64, NodeConfig>,
    pub faults: Arc<NetworkFaults>,
    pub dir: tempfile::TempDir,
}

pub fn config(dir: &std::path::Path, id: u64) -> NodeConfig {
    NodeConfig {
        node_id: id,
        listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.join(format!("node-{id}")),
        cluster_id: "tally-test".to_owned(),
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        propose_timeout_ms: 3_000,
        expiry_interval_ms: 200,
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
        let members: BTreeMap<u64, BasicNode> = cluster
            .nodes
            .iter()
            .map(|(id, node)| {
                (
                    *id,
                    BasicNode {
                        addr: node.local_addr.to_string(),
                    },
                )
            })
            .collect();
        cluster.nodes[&1]
            .raft
            .initialize(members)
            .await
            .expect("initialize");
        cluster.wait_leader().await;
        cluster
    }

    /// Starts a node from `config`, pinning its port so a restart reuses it.
    pub async fn launch(&mut self, mut config: NodeConfig) -> &NodeHandle {
        let id = config.node_id;
        let node = node::start(config.clone(), self.faults.clone())
            .await
            .expect("node starts");
        config.listen_addr = node.local_addr;
        config.advertise_addr = Some(node.local_addr.to_string());
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

    pub async fn budget(&self, id: u64) -> BudgetClient<Channel> {
        BudgetClient::connect(format!("http://{}", self.address(id)))
            .await
            .expect("connect")
    }

    pub async fn admin(&self, id: u64) -> AdminClient<Channel> {
        AdminClient::connect(format!("http://{}", self.address(id)))
            .await
            .expect("connect")
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
        let mut digests = BTreeMap::new();
        for (id, node) in &self.nodes {
            let digest = node.router.lock().await.digest().await.expect("digest");
            digests.insert(*id, digest);
        }
        digests
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
        let mut digests = BTreeMap::new();
        for id in ids {
            let digest = self.nodes[id]
                .router
                .lock()
                .await
                .digest()
                .await
                .expect("digest");
            digests.insert(*id, digest);
        }
        digests
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

pub fn header(family: &str, event_id: &str) -> pb::CommandHeader {
    pb::CommandHeader {
        family_id: family.to_owned(),
        capability_id: "cap".to_owned(),
        grant_index: 0,
        event_id: event_id.to_owned(),
        not_after_ms: tally_authority::node::clock::wall_clock_ms() + 60_000,
    }
}

pub fn limits() -> pb::GrantLimits {
    pb::GrantLimits {
        max_invocations: Some(1_000),
        max_cost_per_invocation_units: Some(100),
        max_total_cost_units: Some(100_000),
        currency: Some("USD".to_owned()),
    }
}

pub fn authorize(family: &str, hold: &str, units: u64) -> pb::AuthorizeHoldRequest {
    pb::AuthorizeHoldRequest {
        header: Some(header(family, &format!("{hold}:authorize"))),
        hold_id: hold.to_owned(),
        requested_exposure_units: units,
        limits: Some(limits()),
        ancestors: vec![],
        hold_timeout_ms: None,
    }
}

pub fn capture(family: &str, hold: &str, attempt: &str) -> pb::CaptureInvocationRequest {
    pb::CaptureInvocationRequest {
        header: Some(header(family, &format!("{hold}:capture"))),
        hold_id: hold.to_owned(),
        attempt_id: attempt.to_owned(),
    }
}

pub fn reconcile(
    family: &str,
    hold: &str,
    exposed: u64,
    realized: u64,
) -> pb::ReconcileHoldRequest {
    pb::ReconcileHoldRequest {
        header: Some(header(family, &format!("{hold}:reconcile"))),
        hold_id: hold.to_owned(),
        exposed_cost_units: exposed,
        realized_spend_units: realized,
    }
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Asserts every digest is the same one and returns it.
pub fn assert_converged(digests: &BTreeMap<u64, [u8; 32]>) -> [u8; 32] {
    let first = *digests.values().next().expect("at least one digest");
    assert!(
        digests.values().all(|d| *d == first),
        "replicas diverged: {digests:?}"
    );
    first
}

/// The outcome of a decision.
pub fn outcome(decision: &pb::Decision) -> &pb::outcome::Outcome {
    decision
        .outcome
        .as_ref()
        .and_then(|o| o.outcome.as_ref())
        .expect("a decision carries an outcome")
}

/// The Tally error detail of a failed call.
pub fn detail(status: &Status) -> pb::ErrorDetail {
    error_detail(status).unwrap_or_else(|e| panic!("{status:?} carries no ErrorDetail: {e}"))
}

pub fn definiteness(status: &Status) -> Option<Definiteness> {
    Definiteness::from_metadata(status.metadata())
}

/// A definite refusal: the command certainly did not apply.
pub fn is_definite_refusal(status: &Status) -> bool {
    definiteness(status) == Some(Definiteness::Definite)
        && matches!(
            status.code(),
            tonic::Code::InvalidArgument
                | tonic::Code::AlreadyExists
                | tonic::Code::FailedPrecondition
                | tonic::Code::OutOfRange
                | tonic::Code::Unavailable
        )
}

/// A linearizable GetEvent.
pub async fn get_event(
    client: &mut BudgetClient<Channel>,
    family: &str,
    event_id: &str,
) -> pb::event_lookup::Lookup {
    client
        .get_event(pb::GetEventRequest {
            family_id: family.to_owned(),
            event_id: event_id.to_owned(),
            consistency: pb::Consistency::Linearizable as i32,
        })
        .await
        .expect("get_event")
        .into_inner()
        .lookup
        .expect("a lookup answer")
}

/// The budget commit index GetEvent reports for an applied event.
pub async fn applied_index(
    client: &mut BudgetClient<Channel>,
    family: &str,
    event_id: &str,
) -> Option<u64> {
    match get_event(client, family, event_id).await {
        pb::event_lookup::Lookup::Applied(applied) => {
            applied
                .decision
                .expect("an applied event has its decision")
                .budget_commit_index
        }
        _ => None,
    }
}

pub fn resolve(original: pb::command::Command) -> pb::ResolveEventRequest {
    pb::ResolveEventRequest {
        original: Some(Box::new(pb::Command {
            command: Some(original),
        })),
    }
}

/// What a write answered, comparable across replays: the outcome and its commit index, or
/// the status code and reason.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Decision(pb::outcome::Outcome, Option<u64>),
    Error(tonic::Code, String),
}

impl Answer {
    pub fn of(result: &Result<tonic::Response<pb::Decision>, Status>) -> Self {
        match result {
            Ok(reply) => {
                let d = reply.get_ref();
                Answer::Decision(outcome(d).clone(), d.budget_commit_index)
            }
            Err(status) => Answer::Error(
                status.code(),
                error_detail(status).map(|d| d.reason).unwrap_or_default(),
            ),
        }
    }
}

/// Sends any one command over its unary rpc.
pub async fn send(
    client: &mut BudgetClient<Channel>,
    command: pb::command::Command,
) -> Result<tonic::Response<pb::Decision>, Status> {
    use pb::command::Command as C;
    match command {
        C::AuthorizeHold(r) => client.authorize_hold(r).await,
        C::CaptureInvocation(r) => client.capture_invocation(r).await,
        C::CancelCapturedBeforeDispatch(r) => client.cancel_captured_before_dispatch(r).await,
        C::ReverseHold(r) => client.reverse_hold(r).await,
        C::ReleaseHold(r) => client.release_hold(r).await,
        C::ReconcileHold(r) => client.reconcile_hold(r).await,
        C::TryIncrement(r) => client.try_increment(r).await,
        C::TryChargeCost(r) => client.try_charge_cost(r).await,
        C::ReverseChargeCost(r) => client.reverse_charge_cost(r).await,
        C::ReduceChargeCost(r) => client.reduce_charge_cost(r).await,
        C::SettleChargeCost(r) => client.settle_charge_cost(r).await,
        C::ConsumeNonce(r) => client.consume_nonce(r).await,
        C::ResolveEvent(r) => client.resolve_event(*r).await,
    }
}

/// The family and event id of a command.
pub fn ids_of(command: &pb::command::Command) -> (String, String) {
    use pb::command::Command as C;
    let header = match command {
        C::AuthorizeHold(r) => r.header.as_ref(),
        C::CaptureInvocation(r) => r.header.as_ref(),
        C::CancelCapturedBeforeDispatch(r) => r.header.as_ref(),
        C::ReverseHold(r) => r.header.as_ref(),
        C::ReleaseHold(r) => r.header.as_ref(),
        C::ReconcileHold(r) => r.header.as_ref(),
        C::TryIncrement(r) => r.header.as_ref(),
        C::TryChargeCost(r) => r.header.as_ref(),
        C::ReverseChargeCost(r) => r.header.as_ref(),
        C::ReduceChargeCost(r) => r.header.as_ref(),
        C::SettleChargeCost(r) => r.header.as_ref(),
        C::ConsumeNonce(r) => r.header.as_ref(),
        C::ResolveEvent(_) => None,
    }
    .expect("a command with a header");
    (header.family_id.clone(), header.event_id.clone())
}

/// A client for whichever node leads now (any node, if none is known).
pub async fn budget_at(address: &str) -> Option<BudgetClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .ok()?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10));
    Some(BudgetClient::new(endpoint.connect().await.ok()?))
}
