//! A running authority node: storage, Raft, the family router, the gRPC services and the
//! background tasks (hold expiry, clock monitor, disk watcher, leader placement), started
//! together and stopped together.

pub mod backup;
pub mod clock;
pub mod cluster_time_gate;
pub mod cluster_time_keeper;
mod commit_rate;
pub mod config;
pub mod disk;
mod entry_coalescer;
pub mod expiry;
pub mod health;
pub mod leader_placement;
mod listener;
mod local_writer;
pub mod metrics;
pub mod placement;
pub mod proposer;
pub mod recent_latency;
pub mod rules_raise;
pub mod write_error;

use std::sync::Arc;
use std::time::Duration;

use openraft::{Config, SnapshotPolicy};
use tally_api::pb::admin_server::AdminServer;
use tally_api::pb::budget_server::BudgetServer;
use tally_api::pb::raft_server::RaftServer;
use tally_api::{FILE_DESCRIPTOR_SET, MAX_MESSAGE_BYTES};
use tally_raft_store::{LogRelease, LogStore, StoreMetrics};
use tally_tls::{CertIdentity, TlsMaterial, Transport};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::clock::NodeClock;
use self::config::NodeConfig;
use self::health::Health;
use self::metrics::NodeMetrics;
use self::proposer::Proposer;
use crate::families::{FamilyStoreDir, RouterConfig};
use crate::faults::NetworkFaults;
use crate::faults::ServiceFaults;
use crate::raft::network::NetworkFactory;
use crate::raft::snapshot_file::SnapshotDir;
use crate::raft::state_machine::{SharedRouter, TallyStateMachine};
use crate::raft::types::{LogId, Raft, TypeConfig};
use crate::raft::vote_floor;
use crate::service::access::{Access, AccessPolicy};
use crate::service::admin::AdminService;
use crate::service::budget::BudgetService;
use crate::service::limits::{Admission, ConnectionCap, RequestLimits};
use crate::service::peer_auth::PeerAuth;
use crate::service::raft::RaftService;
use crate::service::read_gate::ReadGate;
use crate::service::snapshot_inbox::SnapshotInbox;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("storage: {0}")]
    Storage(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("TLS: {0}")]
    Tls(String),
}

/// Handles to a started node. Dropping it does not stop the node: call `shutdown` (graceful)
/// or `abort` (a crash, for tests).
pub struct NodeHandle {
    pub config: NodeConfig,
    pub raft: Raft,
    pub router: SharedRouter,
    pub proposer: Arc<Proposer>,
    pub health: Arc<Health>,
    pub faults: Arc<NetworkFaults>,
    /// This node's clock; tests shift it to exercise the clock-offset rule.
    pub clock: Arc<NodeClock>,
    /// Client-facing fault injection (lost requests and replies), for tests.
    pub service_faults: Arc<ServiceFaults>,
    pub store_metrics: Arc<StoreMetrics>,
    /// Counters of the write path, exported on `/metrics`.
    pub metrics: Arc<NodeMetrics>,
    /// The address `/metrics` is bound to, when `metrics_addr` is set (useful with port 0).
    pub metrics_local_addr: Option<std::net::SocketAddr>,
    pub applied: watch::Receiver<Option<LogId>>,
    /// The address the client port is bound to (useful with port 0).
    pub local_addr: std::net::SocketAddr,
    /// The address the peer port is bound to.
    pub peer_local_addr: std::net::SocketAddr,
    /// How this node reaches its peers (its node certificate, or plaintext).
    pub transport: Transport,
    shutdown_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    servers: Vec<JoinHandle<Result<(), tonic::transport::Error>>>,
    /// Tells when the last handle to the Raft log is gone: a stop returns only then, so the
    /// node can start again in this process at once.
    log_release: LogRelease,
}

/// This node's TLS material, checked against its configuration: its certificate must name
/// its own node id, or peers would refuse it (and it would impersonate another).
fn load_tls(config: &NodeConfig) -> Result<Option<TlsMaterial>, NodeError> {
    let Some(files) = &config.tls else {
        return Ok(None);
    };
    let material = files.load().map_err(|e| NodeError::Tls(e.to_string()))?;
    match &material.identity {
        CertIdentity::Node { id } if *id == config.node_id => Ok(Some(material)),
        other => Err(NodeError::Tls(format!(
            "{} names {}, but this is node {}: issue it with `tally-node certs node --id {}`",
            files.cert_file.display(),
            other.describe(),
            config.node_id,
            config.node_id
        ))),
    }
}

async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, NodeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| NodeError::Listen {
            addr: addr.to_string(),
            source,
        })
}

fn bound(
    listener: &TcpListener,
    addr: std::net::SocketAddr,
) -> Result<std::net::SocketAddr, NodeError> {
    listener.local_addr().map_err(|source| NodeError::Listen {
        addr: addr.to_string(),
        source,
    })
}

/// Starts a node: opens its data dir, recovers Raft state (newest snapshot + committed log),
/// and serves gRPC on `config.listen_addr`.
/// The raft log's file in data dirs written by builds before the segment log.
const LEGACY_RAFT_LOG_FILE: &str = "raft-log.redb";

/// How long a stop waits for the runtime to drop the stopped node's last handle to its Raft
/// log (a task that was aborted but not yet dropped) before it warns and returns.
const LOG_RELEASE_TIMEOUT_MS: u64 = 10_000;

/// Where a node keeps its raft log (a directory of segment files) in `data_dir`.
pub fn raft_log_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("raft-log")
}

/// Whether `data_dir` holds a node's raft log (of this build or an earlier one).
pub fn has_raft_log(data_dir: &std::path::Path) -> bool {
    raft_log_dir(data_dir).exists() || data_dir.join(LEGACY_RAFT_LOG_FILE).exists()
}

/// Where a node keeps its snapshots under its data dir.
pub fn snapshot_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("snapshots")
}

/// Whether `data_dir` holds a node's state: its raft log, or a snapshot file in place (a
/// data dir seeded by `tally-node restore` has only that until its node first starts; a
/// temporary file a crashed restore left is not state).
pub fn holds_state(data_dir: &std::path::Path) -> bool {
    has_raft_log(data_dir) || crate::raft::snapshot_file::holds_snapshot(&snapshot_dir(data_dir))
}

pub async fn start(
    mut config: NodeConfig,
    faults: Arc<NetworkFaults>,
) -> Result<NodeHandle, NodeError> {
    config
        .validate()
        .map_err(|e| NodeError::Config(e.to_string()))?;
    let tls = load_tls(&config)?;
    let transport = match &tls {
        Some(material) => Transport::tls(material.clone()),
        None => {
            tracing::warn!(
                "INSECURE: plaintext on both ports and no authentication; anyone who reaches \
                 a port can forge budget commands, append Raft entries or change membership"
            );
            Transport::Insecure
        }
    };
    std::fs::create_dir_all(&config.data_dir).map_err(|e| NodeError::Storage(e.to_string()))?;
    let log_dir = raft_log_dir(&config.data_dir);
    if let Some(imported) = tally_raft_store::import_redb_log::<TypeConfig>(
        &config.data_dir.join(LEGACY_RAFT_LOG_FILE),
        &log_dir,
    )
    .map_err(|e| NodeError::Storage(e.to_string()))?
    {
        tracing::info!(
            entries = imported.entries,
            "moved the raft log of an earlier build into {}",
            log_dir.display()
        );
    }
    let mut log_store =
        LogStore::<TypeConfig>::open(&log_dir).map_err(|e| NodeError::Storage(e.to_string()))?;
    let store_metrics = log_store.metrics_handle();
    let log_release = log_store.release_watch();
    let snapshots = SnapshotDir::open(snapshot_dir(&config.data_dir))
        .map_err(|e| NodeError::Storage(e.to_string()))?;
    // Verified here once for all of start (the directory remembers the files it verified).
    let newest_snapshot = {
        let snapshots = snapshots.clone();
        tokio::task::spawn_blocking(move || snapshots.load_latest())
            .await
            .map_err(|e| NodeError::Storage(e.to_string()))?
            .map_err(|e| NodeError::Storage(e.to_string()))?
    };
    let snapshot_last = newest_snapshot.and_then(|(meta, _)| meta.last_log_id);
    if let Some(term) =
        vote_floor::raise_to_last_log_term(&mut log_store, snapshot_last, config.node_id)
            .await
            .map_err(|e| NodeError::Storage(e.to_string()))?
    {
        tracing::info!(
            term,
            "raised the vote to the term of the newest log id (a restore)"
        );
    }
    let memory = config.memory_split();
    let router_config = RouterConfig {
        max_live_actors: config.max_live_families,
        max_live_bytes: memory.live_families_bytes,
        max_filter_bytes: Some(memory.filter_bytes),
        min_idle_entries_to_spill: config.spill_idle_entries,
        ..RouterConfig::default()
    };
    let family_stores =
        FamilyStoreDir::open(&config.data_dir.join("families"), memory.store_cache_bytes)
            .map_err(|e| NodeError::Storage(e.to_string()))?;
    let (state_machine, router, applied_watches) =
        TallyStateMachine::new(router_config, family_stores, snapshots)
            .map_err(|e| NodeError::Storage(e.to_string()))?;

    let raft_config = Config {
        cluster_name: config.cluster_id.clone(),
        heartbeat_interval: config.heartbeat_interval_ms,
        election_timeout_min: config.election_timeout_min_ms,
        election_timeout_max: config.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
        // Keep at most one snapshot interval of log behind a snapshot, so a small interval
        // also purges (a lagging or new node then catches up by snapshot).
        max_in_snapshot_log_to_keep: config.snapshot_every_entries.min(1_000),
        ..Config::default()
    }
    .validate()
    .map_err(|e| NodeError::Config(e.to_string()))?;
    let network = NetworkFactory::new(config.node_id, faults.clone(), transport.clone());
    let raft = Raft::new(
        config.node_id,
        Arc::new(raft_config),
        network,
        log_store,
        state_machine,
    )
    .await
    .map_err(|e| NodeError::Raft(e.to_string()))?;

    let timeout = Duration::from_millis(config.propose_timeout_ms);
    let metrics = Arc::new(NodeMetrics::default());
    let clock = Arc::new(NodeClock::new(config.clock_offset_ms));
    let proposer = Arc::new(
        Proposer::new(
            raft.clone(),
            config.node_id,
            timeout,
            metrics.clone(),
            clock.clone(),
            transport.clone(),
            applied_watches.time,
        )
        .with_shed_after_ms(config.shed_after_ms),
    );
    let reads = Arc::new(ReadGate::new(
        raft.clone(),
        proposer.clone(),
        applied_watches.log_id.clone(),
        timeout,
    ));
    let health = Arc::new(Health::new(
        raft.clone(),
        clock.clone(),
        config.max_rules_version,
    ));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let listener = bind(config.listen_addr).await?;
    let local_addr = bound(&listener, config.listen_addr)?;
    let peer_listener = bind(config.peer_listen_addr).await?;
    let peer_local_addr = bound(&peer_listener, config.peer_listen_addr)?;
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            metrics::bind(addr)
                .await
                .map_err(|source| NodeError::Listen {
                    addr: addr.to_string(),
                    source,
                })?,
        ),
        None => None,
    };
    let metrics_local_addr = metrics_listener
        .as_ref()
        .and_then(|listener| listener.local_addr().ok());
    // With port 0 only the bound addresses are reachable.
    if config.advertise_addr.is_none() {
        config.advertise_addr = Some(local_addr.to_string());
    }
    if config.peer_advertise_addr.is_none() {
        config.peer_advertise_addr = Some(peer_local_addr.to_string());
    }

    let service_faults = Arc::<ServiceFaults>::default();
    let budget = BudgetServer::new(BudgetService::new(
        proposer.clone(),
        reads.clone(),
        router.clone(),
        config.cluster_id.clone(),
        config.max_batch_commands,
        service_faults.clone(),
        metrics.clone(),
    ))
    .max_decoding_message_size(config.max_message_bytes)
    .max_encoding_message_size(config.max_message_bytes);
    // Only client requests are counted and shed: Raft traffic, peers' clock probes and
    // operators' Admin calls always get through (a follower's forwarded writes were counted
    // on the follower).
    let access = AccessPolicy::new(tls.is_some());
    let budget = Admission::new(
        budget,
        RequestLimits::new(
            config.max_in_flight_requests,
            Duration::from_millis(config.request_timeout_ms),
            metrics.clone(),
            proposer.clone(),
        ),
    );
    let budget = Access::new(budget, access.clone());
    let admin = AdminServer::new(AdminService::new(
        config.node_id,
        raft.clone(),
        proposer.clone(),
        router.clone(),
        health.clone(),
        config.cluster_id.clone(),
        config.memory_budget_bytes,
    ))
    .max_decoding_message_size(config.max_message_bytes)
    .max_encoding_message_size(config.max_message_bytes);
    let admin = Access::new(admin, access.clone());
    let raft_rpc = RaftServer::new(RaftService::new(
        raft.clone(),
        proposer.clone(),
        reads.clone(),
        PeerAuth::new(raft.clone(), tls.is_some()),
        SnapshotInbox::open(
            &config.data_dir,
            Duration::from_millis(config.snapshot_chunk_timeout_ms),
        )
        .map_err(|e| NodeError::Storage(format!("incoming snapshot dir: {e}")))?,
        shutdown_rx.clone(),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let health_service = Access::new(health_service, access.clone());
    // Both reflection versions: grpcurl speaks v1, Python's grpcio-reflection and many GUI
    // clients only v1alpha.
    let (reflection_v1, reflection_v1alpha) = if config.reflection {
        let v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| NodeError::Config(format!("reflection: {e}")))?;
        let v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .map_err(|e| NodeError::Config(format!("reflection: {e}")))?;
        (
            Some(Access::new(v1, access.clone())),
            Some(Access::new(v1alpha, access.clone())),
        )
    } else {
        (None, None)
    };

    // One connection budget for both ports: a flood on either cannot take more sockets
    // than the node allows in all.
    let connections = Arc::new(ConnectionCap::new(config.max_connections, metrics.clone()));
    let server_builder = || -> Result<tonic::transport::Server, NodeError> {
        let builder = tonic::transport::Server::builder()
            .max_concurrent_streams(config.max_concurrent_streams)
            .http2_keepalive_interval(Some(Duration::from_millis(
                config.http2_keepalive_interval_ms,
            )))
            .http2_keepalive_timeout(Some(Duration::from_millis(
                config.http2_keepalive_timeout_ms,
            )));
        match &tls {
            Some(material) => builder
                .tls_config(material.server_config())
                .map_err(|e| NodeError::Tls(e.to_string())),
            None => Ok(builder),
        }
    };
    let mut servers = Vec::new();
    let mut client_shutdown = shutdown_rx.clone();
    servers.push(tokio::spawn(
        server_builder()?
            .add_service(budget)
            .add_service(admin)
            .add_service(health_service)
            .add_optional_service(reflection_v1)
            .add_optional_service(reflection_v1alpha)
            .serve_with_incoming_shutdown(
                listener::accepted(listener, connections.clone(), tls.is_some(), "client"),
                async move {
                    let _ = client_shutdown.changed().await;
                },
            ),
    ));
    let mut peer_shutdown = shutdown_rx.clone();
    servers.push(tokio::spawn(
        server_builder()?
            .add_service(raft_rpc)
            .serve_with_incoming_shutdown(
                listener::accepted(peer_listener, connections, tls.is_some(), "peer"),
                async move {
                    let _ = peer_shutdown.changed().await;
                },
            ),
    ));

    let mut tasks = Vec::new();
    if let Some(listener) = metrics_listener {
        let sources = metrics::Sources {
            node_id: config.node_id,
            metrics: metrics.clone(),
            raft: raft.clone(),
            store: store_metrics.clone(),
            router: router.clone(),
            clock: clock.clone(),
        };
        tasks.push(tokio::spawn(metrics::serve(
            listener,
            sources,
            shutdown_rx.clone(),
        )));
    }
    tasks.push(tokio::spawn(metrics::watch_leader(
        raft.clone(),
        metrics.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(cluster_time_keeper::run(
        proposer.clone(),
        health.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(expiry::run(
        raft.clone(),
        router.clone(),
        proposer.clone(),
        Duration::from_millis(config.expiry_interval_ms),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(leader_placement::run(
        config.node_id,
        raft.clone(),
        router.clone(),
        health.clone(),
        metrics.clone(),
        leader_placement::PlacementPacing {
            min_between_transfers: Duration::from_millis(config.leader_placement_interval_ms),
            fresh_ack: Duration::from_millis(config.election_timeout_max_ms),
        },
        shutdown_rx.clone(),
    )));
    if config.malloc_trim_interval_ms > 0 {
        crate::allocator::keep_trimmed(
            Duration::from_millis(config.malloc_trim_interval_ms),
            config.memory_budget_bytes,
        );
    }
    tasks.push(tokio::spawn(disk::run(
        config.node_id,
        config.data_dir.clone(),
        config.disk_limits(),
        router.clone(),
        proposer.clone(),
        metrics.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(health::monitor_clock(
        config.node_id,
        raft.clone(),
        health.clone(),
        config.max_clock_offset_ms,
        Duration::from_millis(1_000),
        transport.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(rules_raise::run(
        config.node_id,
        raft.clone(),
        router.clone(),
        proposer.clone(),
        health.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(report_health(
        health.clone(),
        health_reporter,
        shutdown_rx.clone(),
    )));

    tracing::info!(
        node_id = config.node_id,
        addr = %local_addr,
        peer_addr = %peer_local_addr,
        region = %config.region,
        tls = tls.is_some(),
        reflection = config.reflection,
        max_connections = config.max_connections,
        max_concurrent_streams = config.max_concurrent_streams,
        max_in_flight_requests = config.max_in_flight_requests,
        request_timeout_ms = config.request_timeout_ms,
        http2_keepalive_interval_ms = config.http2_keepalive_interval_ms,
        http2_keepalive_timeout_ms = config.http2_keepalive_timeout_ms,
        snapshot_chunk_timeout_ms = config.snapshot_chunk_timeout_ms,
        max_message_bytes = config.max_message_bytes,
        disk_quota_bytes = config.disk_quota_bytes,
        disk_reserve_bytes = config.disk_reserve_bytes,
        disk_check_interval_ms = config.disk_check_interval_ms,
        shed_after_ms = config.shed_after_ms,
        memory_budget_bytes = config.memory_budget_bytes,
        filter_memory_bytes = config.memory_split().filter_bytes,
        malloc_trim_interval_ms = config.malloc_trim_interval_ms,
        max_rules_version = config.max_rules_version,
        "node started"
    );
    Ok(NodeHandle {
        log_release,
        config,
        raft,
        router,
        proposer,
        health,
        faults,
        clock,
        service_faults,
        store_metrics,
        metrics,
        metrics_local_addr,
        applied: applied_watches.log_id,
        local_addr,
        peer_local_addr,
        transport,
        shutdown_tx,
        tasks,
        servers,
    })
}

/// Accepted sockets with TCP_NODELAY set (tonic only sets it on listeners it binds itself:
/// without it a reply's header, body and trailer frames meet Nagle's algorithm and the peer's
/// delayed ACK, adding ~40 ms to every rpc), each holding a connection slot; a socket beyond
/// `max_connections` is closed here, before anything is read from it.
/// `grpc.health.v1` says SERVING only while the node is healthy.
async fn report_health(
    health: Arc<Health>,
    reporter: tonic_health::server::HealthReporter,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(Duration::from_millis(200));
    let mut last = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let healthy = health.is_healthy();
        if last != Some(healthy) {
            let status = if healthy {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            reporter.set_service_status("", status).await;
            reporter.set_service_status("tally.v1.Budget", status).await;
            last = Some(healthy);
        }
    }
}

/// Waits (bounded) until no handle to the node's Raft log is left. Aborted tasks are dropped
/// by the runtime when it next reaches them, which may be after their `JoinHandle` answered;
/// one of them holding a log reader kept the log's lock past a kill, and a start right after it
/// failed as "already open elsewhere" (CI, 2026-12-06).
async fn wait_for_log_release(release: &LogRelease, node_id: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(LOG_RELEASE_TIMEOUT_MS);
    while !release.is_released() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                node_id,
                timeout_ms = LOG_RELEASE_TIMEOUT_MS,
                "the stopped node still holds its raft log; a start in this process would fail"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl NodeHandle {
    /// Graceful stop: hand leadership to another voter first, then stop serving and Raft.
    /// Returns once the node has let its Raft log go.
    pub async fn shutdown(self) {
        let (log_release, node_id) = (self.log_release.clone(), self.config.node_id);
        self.stop_gracefully().await;
        wait_for_log_release(&log_release, node_id).await;
    }

    async fn stop_gracefully(self) {
        let metrics = crate::raft::types::current_metrics(&self.raft);
        if metrics.current_leader == Some(self.config.node_id) {
            let successor = metrics
                .membership_config
                .membership()
                .voter_ids()
                .find(|id| *id != self.config.node_id);
            if let Some(to) = successor {
                if self.raft.trigger().transfer_leader(to).await.is_ok() {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
                    while tokio::time::Instant::now() < deadline
                        && crate::raft::types::current_metrics(&self.raft).current_leader
                            == Some(self.config.node_id)
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
        let _ = self.shutdown_tx.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        for server in self.servers {
            let _ = server.await;
        }
        if let Err(error) = self.raft.shutdown().await {
            tracing::error!(%error, "raft shutdown failed");
        }
        tracing::info!(node_id = self.config.node_id, "node stopped");
    }

    /// A crash: every task is aborted and every handle dropped, with no goodbye to peers.
    /// Returns once the aborted tasks are gone, so what they held (the Raft log's lock among
    /// it) is released as a crashed process's is, and the node can start again at once.
    pub async fn abort(self) {
        let (log_release, node_id) = (self.log_release.clone(), self.config.node_id);
        self.stop_at_once().await;
        wait_for_log_release(&log_release, node_id).await;
    }

    async fn stop_at_once(self) {
        for server in &self.servers {
            server.abort();
        }
        for task in &self.tasks {
            task.abort();
        }
        let _ = self.raft.shutdown().await;
        for server in self.servers {
            let _ = server.await;
        }
        for task in self.tasks {
            let _ = task.await;
        }
        drop(self.router);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_in_place_is_state_and_a_leftover_temp_file_is_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(!holds_state(dir.path()), "an empty data dir");
        std::fs::create_dir_all(snapshot_dir(dir.path())).expect("mkdir");
        let leftover = snapshot_dir(dir.path()).join("snapshot-1-1.tsnap.tmp");
        std::fs::write(&leftover, b"half").expect("write");
        assert!(!holds_state(dir.path()), "what a crashed restore left");
        std::fs::rename(
            &leftover,
            snapshot_dir(dir.path()).join("snapshot-1-1.tsnap"),
        )
        .expect("rename");
        assert!(holds_state(dir.path()), "a restored data dir");
    }
}
