//! Issue 22: a flood of streams and a slow snapshot stream do not stop a node from serving
//! others. The attacker here holds a member's certificate (the worst case: a compromised or
//! broken peer), so it passes the peer port's checks and reaches the handlers.

mod cluster_support;

use std::time::{Duration, Instant};

use cluster_support::*;
use tally_api::pb;
use tally_api::pb::raft_client::RaftClient;
use tally_authority::raft::types::{current_metrics, SnapshotMeta};
use tonic::Code;

const CHUNK_TIMEOUT_MS: u64 = 700;

/// The first chunk of a snapshot stream, claiming to come from `leader` in its term.
fn snapshot_header(cluster: &TestCluster, leader: u64) -> pb::SnapshotChunk {
    // The leader's own vote: the header passes the "comes from the node it claims" check.
    let vote = current_metrics(&cluster.nodes[&leader].raft).vote;
    let meta = SnapshotMeta {
        last_log_id: None,
        last_membership: Default::default(),
    };
    pb::SnapshotChunk {
        header: tally_api::encode_raft(&(vote, meta, [0u8; 32]))
            .expect("encodes")
            .into(),
        offset: 0,
        data: vec![0u8; 1024].into(),
        done: false,
    }
}

/// Writes through the leader and waits until every node applied them: the cluster serves.
async fn writes_commit_everywhere(cluster: &TestCluster, leader: u64, family: &str) {
    let mut budget = cluster.budget(leader).await;
    let start = Instant::now();
    for i in 0..5 {
        budget
            .authorize_hold(authorize(family, &format!("h{i}"), 1))
            .await
            .expect("a write is served");
    }
    let last = current_metrics(&cluster.nodes[&leader].raft)
        .last_log_index
        .unwrap_or(0);
    cluster.wait_applied(last).await;
    eprintln!(
        "5 writes committed and applied on every node in {:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_snapshot_stream_is_dropped_and_never_blocks_the_node() {
    init_logs();
    let cluster = TestCluster::start_with(3, |c| {
        c.snapshot_chunk_timeout_ms = CHUNK_TIMEOUT_MS;
    })
    .await;
    let leader = cluster.wait_leader().await;
    let follower = a_follower(&cluster, leader);
    let (chunks_tx, chunks_rx) = tokio::sync::mpsc::channel::<pb::SnapshotChunk>(4);
    chunks_tx
        .send(snapshot_header(&cluster, leader))
        .await
        .expect("queued");
    let mut stalled_client =
        RaftClient::new(peer_channel(&cluster, &format!("node-{leader}"), follower).await);
    let started = Instant::now();
    let stalled = tokio::spawn(async move {
        stalled_client
            .install_snapshot(tokio_stream::wrappers::ReceiverStream::new(chunks_rx))
            .await
    });

    // While the stream stalls, the follower keeps replicating and applying.
    writes_commit_everywhere(&cluster, leader, "stall-a").await;

    // A second install while the first one streams is refused at once, not queued.
    let mut second =
        RaftClient::new(peer_channel(&cluster, &format!("node-{leader}"), follower).await);
    let status = second
        .install_snapshot(futures_util::stream::iter(vec![snapshot_header(
            &cluster, leader,
        )]))
        .await
        .expect_err("one install streams at a time");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");

    let status = tokio::time::timeout(LIVENESS, stalled)
        .await
        .expect("the stalled stream is dropped by the node, not left open")
        .expect("task")
        .expect_err("a stalled install fails");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(CHUNK_TIMEOUT_MS),
        "dropped after the chunk timeout, not before"
    );
    drop(chunks_tx);
    // Nothing was installed: the follower's state is the cluster's.
    writes_commit_everywhere(&cluster, leader, "stall-b").await;
    let digests = cluster.converged_digests().await;
    assert_eq!(
        digests
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        1,
        "replicas agree: {digests:?}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_streams_leaves_the_node_serving_others() {
    const STREAMS_PER_CONNECTION: usize = 200;
    const CONNECTIONS: usize = 3;
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let follower = a_follower(&cluster, leader);
    // Idle streams on the leader's peer port (append streams that never send) and on its
    // client port (requests whose body never comes), each side on several connections.
    let mut held = Vec::new();
    for _ in 0..CONNECTIONS {
        let peer = peer_channel(&cluster, &format!("node-{follower}"), leader).await;
        let client = cluster.channel(leader, "kernel").await;
        for _ in 0..STREAMS_PER_CONNECTION {
            let mut raft = RaftClient::new(peer.clone());
            held.push(tokio::spawn(async move {
                let _ = raft
                    .append(futures_util::stream::pending::<pb::RaftBytes>())
                    .await;
            }));
            let client = client.clone();
            held.push(tokio::spawn(async move {
                let mut grpc = tonic::client::Grpc::new(client);
                if grpc.ready().await.is_ok() {
                    let _ = grpc
                        .client_streaming::<_, (), (), _>(
                            tonic::Request::new(futures_util::stream::pending::<()>()),
                            tonic::codegen::http::uri::PathAndQuery::from_static(
                                "/tally.v1.Budget/GetUsage",
                            ),
                            Silent,
                        )
                        .await;
                }
            }));
        }
    }
    let metrics = cluster.nodes[&leader].metrics.clone();
    let start = Instant::now();
    while metrics.in_flight_requests() == 0 {
        assert!(start.elapsed() < LIVENESS, "the flood never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "{} idle streams opened, {} client requests in flight on the leader",
        held.len(),
        metrics.in_flight_requests()
    );
    // Meanwhile another client's writes commit on every node, and a new connection serves.
    writes_commit_everywhere(&cluster, leader, "flooded").await;
    let mut admin = cluster.admin(leader).await;
    admin
        .status(pb::StatusRequest {})
        .await
        .expect("an operator is served during the flood");
    for task in held {
        task.abort();
    }
    cluster.shutdown().await;
}

/// spec §5.5: a snapshot is verified against its sender's digest before it replaces
/// anything. A stream that decodes but holds another state is refused with DATA_LOSS, one
/// that does not decode with INVALID_ARGUMENT; openraft never sees either, and the follower
/// goes on serving the cluster's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_does_not_match_its_digest_is_refused_before_install() {
    use tally_authority::families::{RouterSnapshot, RouterState, SNAPSHOT_FORMAT_VERSION};
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let follower = a_follower(&cluster, leader);
    writes_commit_everywhere(&cluster, leader, "digest-a").await;
    let empty = RouterSnapshot {
        format_version: SNAPSHOT_FORMAT_VERSION,
        state: RouterState::default(),
        maintenance_due: Default::default(),
        families: Default::default(),
        cold_rows: Default::default(),
    };
    assert_ne!(
        empty.digest(),
        [0u8; 32],
        "the header's digest names another state"
    );
    let mut client =
        RaftClient::new(peer_channel(&cluster, &format!("node-{leader}"), follower).await);
    for (data, code) in [
        (empty.to_bytes().expect("encodes"), Code::DataLoss),
        (vec![0xc1; 64], Code::InvalidArgument),
    ] {
        let chunk = pb::SnapshotChunk {
            data: data.into(),
            done: true,
            ..snapshot_header(&cluster, leader)
        };
        let status = client
            .install_snapshot(futures_util::stream::iter(vec![chunk]))
            .await
            .expect_err("a stream that does not match its digest is refused");
        assert_eq!(status.code(), code, "{status:?}");
    }
    writes_commit_everywhere(&cluster, leader, "digest-b").await;
    let digests = cluster.converged_digests().await;
    assert_eq!(
        digests
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        1,
        "nothing was installed: every replica holds the same state"
    );
}
