//! Regions (docs/operations.md "Regions"): the preferred leader regions are a parameter set
//! through the log, refused whole when invalid, and the leader placement task brings
//! leadership back to the best preferred region that has a healthy voter, after a transfer
//! away, a failover and a healing.

mod cluster_support;

use std::time::{Duration, Instant};

use cluster_support::*;
use tally_api::pb;
use tally_authority::raft::types::current_metrics;

/// Node 1 in eu-west, node 2 in us-east, node 3 in ap-south.
const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// Generous: an election, a catch-up and a placement check fit many times over. Not a
/// timing test.
const PLACEMENT_BOUND: Duration = Duration::from_secs(30);

async fn three_regions() -> TestCluster {
    TestCluster::start_with(3, |config| {
        config.region = REGIONS[usize::try_from(config.node_id - 1).expect("small")].to_owned();
        config.leader_placement_interval_ms = 500;
    })
    .await
}

fn regions(list: &[&str]) -> pb::SetParamsRequest {
    pb::SetParamsRequest {
        preferred_leader_regions: Some(pb::RegionList {
            regions: list.iter().map(|r| (*r).to_owned()).collect(),
        }),
        ..pb::SetParamsRequest::default()
    }
}

/// Waits until every live node agrees that `expected` leads; panics with what was seen.
async fn wait_for_leader(cluster: &TestCluster, expected: u64, why: &str) {
    let start = Instant::now();
    loop {
        let leaders: Vec<Option<u64>> = cluster
            .nodes
            .values()
            .map(|n| current_metrics(&n.raft).current_leader)
            .collect();
        if leaders.iter().all(|l| *l == Some(expected)) {
            return;
        }
        assert!(
            start.elapsed() < PLACEMENT_BOUND,
            "{why}: node {expected} did not lead within {PLACEMENT_BOUND:?}: {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_returns_to_the_best_healthy_preferred_region() {
    init_logs();
    let mut cluster = three_regions().await;
    let leader = cluster.wait_leader().await;

    let reply = cluster
        .admin(leader)
        .await
        .set_params(regions(&["us-east", "eu-west"]))
        .await
        .expect("a valid preference is accepted")
        .into_inner();
    let params = reply.params.expect("the reply carries the parameters");
    assert_eq!(params.preferred_leader_regions, ["us-east", "eu-west"]);
    wait_for_leader(&cluster, 2, "set to us-east first").await;
    let status = status_of(&cluster, 1).await;
    assert_eq!(status.leader_in_preferred_region, Some(true), "{status:?}");
    assert_eq!(
        status.params.expect("params").preferred_leader_regions,
        ["us-east", "eu-west"],
        "a follower applied the preference from the log"
    );
    let regions_shown: Vec<(u64, String)> = status
        .members
        .iter()
        .map(|m| (m.id, m.region.clone()))
        .collect();
    assert_eq!(
        regions_shown,
        [
            (1, "eu-west".to_owned()),
            (2, "us-east".to_owned()),
            (3, "ap-south".to_owned())
        ]
    );

    // Moved away by hand, to an unlisted region: the new leader hands it back.
    let transfers_before = cluster.nodes[&3].metrics.leader_placement_transfers();
    cluster.nodes[&2]
        .raft
        .trigger()
        .transfer_leader(3)
        .await
        .expect("transfer starts");
    let start = Instant::now();
    while cluster.nodes[&3].metrics.leader_placement_transfers() == transfers_before {
        assert!(
            start.elapsed() < PLACEMENT_BOUND,
            "node 3 never led and handed leadership back (leader now {:?})",
            cluster.leader_now()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    wait_for_leader(&cluster, 2, "handed back after a transfer away").await;

    // Failover: us-east dies; the best region with a healthy voter is eu-west.
    cluster.kill(2).await;
    wait_for_leader(&cluster, 1, "us-east down, eu-west next").await;
    let status = status_of(&cluster, 1).await;
    assert_eq!(
        status.leader_in_preferred_region,
        Some(false),
        "us-east still has a voter, down or not: {status:?}"
    );

    // Healing: us-east returns, catches up, and leadership goes back to it.
    cluster.restart(2).await;
    wait_for_leader(&cluster, 2, "us-east healed").await;
    let digests = cluster.converged_digests().await;
    assert_converged(&digests);
    cluster.shutdown().await;
}

/// A bad preference is INVALID_ARGUMENT and definite, names what is wrong, and changes
/// nothing: no entry is appended and the preference in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_preference_is_refused_whole_and_nothing_changes() {
    init_logs();
    let cluster = three_regions().await;
    let leader = cluster.wait_leader().await;
    let mut admin = cluster.admin(leader).await;
    admin
        .set_params(regions(&["eu-west", "us-east"]))
        .await
        .expect("valid");
    let last = || current_metrics(&cluster.nodes[&leader].raft).last_log_index;
    let appended = last();
    let nine: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
    let nine: Vec<&str> = nine.iter().map(String::as_str).collect();
    let refusals = [
        (regions(&nine), "at most 8 regions, got 9"),
        (
            regions(&["eu-west", "us-east", "eu-west"]),
            "region \"eu-west\" is named twice",
        ),
        (regions(&["eu west"]), "region must be 1-64 letters"),
        (regions(&[""]), "region must be 1-64 letters"),
        (
            pb::SetParamsRequest {
                retention_ms: Some(3_600_000),
                ..regions(&["us-east", "us-east"])
            },
            "named twice",
        ),
    ];
    for (request, expected) in refusals {
        assert_params_refused(&mut admin, request, &["preferred_leader_regions", expected]).await;
    }
    assert_eq!(last(), appended, "nothing was proposed");
    let params = status_of(&cluster, leader).await.params.expect("params");
    assert_eq!(params.preferred_leader_regions, ["eu-west", "us-east"]);
    assert_ne!(
        params.retention_ms, 3_600_000,
        "no field of a refused change holds"
    );

    // Clearing is a change of its own: the preference is gone on every node.
    admin.set_params(regions(&[])).await.expect("clearing");
    cluster.converged_digests().await;
    for id in cluster.nodes.keys() {
        let status = status_of(&cluster, *id).await;
        assert!(
            status
                .params
                .expect("params")
                .preferred_leader_regions
                .is_empty(),
            "node {id}"
        );
        assert_eq!(status.leader_in_preferred_region, None, "node {id}");
    }
    cluster.shutdown().await;
}

/// A voter whose clock is off refuses to lead (docs/spec.md §6), so the leader never hands
/// leadership to it, even in the best region: it goes to the next region and stays there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_whose_clock_is_off_is_never_made_leader() {
    init_logs();
    let cluster = TestCluster::start_with(3, |config| {
        config.region = REGIONS[usize::try_from(config.node_id - 1).expect("small")].to_owned();
        config.leader_placement_interval_ms = 500;
        if config.node_id == 2 {
            config.clock_offset_ms = 5_000;
        }
    })
    .await;
    let leader = cluster.wait_leader().await;
    cluster
        .admin(leader)
        .await
        .set_params(regions(&["us-east", "eu-west"]))
        .await
        .expect("valid");
    wait_for_leader(&cluster, 1, "us-east's only voter has a bad clock").await;
    let transfers = cluster.nodes[&1].metrics.leader_placement_transfers();
    // Several placement checks pass; none hands leadership to node 2.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            cluster.leader_now(),
            Some(1),
            "leadership stayed in eu-west"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        cluster.nodes[&1].metrics.leader_placement_transfers(),
        transfers,
        "node 1 started no transfer"
    );
    cluster.shutdown().await;
}
