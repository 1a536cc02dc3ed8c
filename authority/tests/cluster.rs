//! In-process 3-node clusters over real gRPC: replication, failover, restart, forwarding,
//! linearizable reads, and SPEC.md §10's status mapping for bad input.

mod cluster_support;

use cluster_support::*;
use tally_api::pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_replicate_and_every_replica_reaches_the_same_digest() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    for i in 0..20 {
        let family = format!("fam-{}", i % 4);
        let hold = format!("h{i}");
        let d = client
            .authorize_hold(authorize(&family, &hold, 50))
            .await
            .expect("authorize")
            .into_inner();
        assert!(matches!(
            d.outcome.and_then(|o| o.outcome),
            Some(pb::outcome::Outcome::Authorized(_))
        ));
        let cluster_stamp = d.cluster.expect("decisions carry the cluster stamp");
        assert_eq!(cluster_stamp.guarantee_level, "raft_linearizable");
        assert_eq!(cluster_stamp.cluster_id, "tally-test");
        client
            .capture_invocation(capture(&family, &hold, "a"))
            .await
            .expect("capture");
        client
            .reconcile_hold(reconcile(&family, &hold, 50, 30))
            .await
            .expect("reconcile");
    }
    let digests = cluster.converged_digests().await;
    let first = digests.values().next().copied();
    assert!(
        digests.values().all(|d| Some(*d) == first),
        "replicas diverged: {digests:?}"
    );
    cluster.shutdown().await;
}
