//! A client with a region talks to the node of its region: linearizable reads are served
//! there (the follower asks the leader only for its read index), and writes go there and are
//! forwarded to the leader. When that node dies, the client falls back to the others.

use std::time::Duration;

use tally_authority::testing::TestCluster;
use tally_client::{ClientConfig, Outcome, TallyClient};
use tally_ledger::{
    AccountKey, ClientCommand, CommandHeader, EventId, EventLookup, FamilyId, GrantLimits,
    Operation,
};

const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

fn region_of(id: u64) -> &'static str {
    REGIONS[usize::try_from(id - 1).expect("small")]
}

fn authorize(family: &str, hold: &str) -> ClientCommand {
    ClientCommand {
        header: CommandHeader {
            family_id: family.into(),
            capability_id: "cap".into(),
            grant_index: 0,
            event_id: format!("{hold}:authorize").into(),
            not_after_ms: tally_authority::node::clock::wall_clock_ms() + 60_000,
        },
        op: Operation::AuthorizeHold {
            hold_id: hold.into(),
            requested_exposure_units: 5,
            limits: GrantLimits::monetary(Some(40), Some(100), Some(2_000), "USD"),
            ancestors: vec![],
            hold_timeout_ms: None,
        },
    }
}

/// Reads and forwarded writes per node, from each node's metrics.
fn counters(cluster: &TestCluster) -> Vec<(u64, u64, u64)> {
    cluster
        .nodes
        .iter()
        .map(|(id, node)| (*id, node.metrics.reads(), node.metrics.forwarded_writes()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_region_reads_and_writes_through_its_regions_node() {
    let mut cluster = TestCluster::start_with(3, |config| {
        config.region = region_of(config.node_id).to_owned();
    })
    .await;
    let leader = cluster.wait_leader().await;
    let local = (1..=3).find(|id| *id != leader).expect("a follower");
    let endpoints = (1..=3).map(|id| cluster.address(id)).collect();
    let mut config = ClientConfig::new(endpoints, cluster.transport("kernel"));
    config.attempt_timeout = Duration::from_secs(2);
    config.region = Some(region_of(local).to_owned());
    let client = TallyClient::new(config).expect("client");

    let before = counters(&cluster);
    let outcome = client.submit(authorize("fam", "h1")).await;
    assert!(
        matches!(outcome, Outcome::Decided(_)),
        "the write is decided: {outcome:?}"
    );
    const READS: u64 = 5;
    for _ in 0..READS {
        let lookup = client
            .get_event(&FamilyId::from("fam"), &EventId::from("h1:authorize"))
            .await
            .expect("read");
        assert!(
            matches!(lookup, EventLookup::Applied { .. }),
            "a linearizable read on the follower sees the write: {lookup:?}"
        );
    }
    assert_eq!(client.local_endpoints(), [cluster.address(local)]);
    let after = counters(&cluster);
    for ((id, reads_before, forwards_before), (_, reads_after, forwards_after)) in
        before.iter().zip(&after)
    {
        if *id == local {
            assert_eq!(
                reads_after - reads_before,
                READS,
                "node {id} served the reads"
            );
            assert_eq!(
                forwards_after - forwards_before,
                1,
                "node {id} forwarded the write"
            );
        } else {
            assert_eq!(reads_after, reads_before, "node {id} served no read");
            assert_eq!(
                forwards_after, forwards_before,
                "node {id} forwarded nothing"
            );
        }
    }

    // The region's node dies: reads and writes go elsewhere, and are still answered.
    cluster.kill(local).await;
    let outcome = client.submit(authorize("fam", "h2")).await;
    assert!(
        matches!(outcome, Outcome::Decided(_)),
        "the write is decided without the region's node: {outcome:?}"
    );
    let usage = client
        .get_usage(&FamilyId::from("fam"), &AccountKey::new("cap", 0))
        .await
        .expect("read without the region's node");
    assert!(usage.is_some(), "the holds are visible: {usage:?}");
    cluster.shutdown().await;
}
