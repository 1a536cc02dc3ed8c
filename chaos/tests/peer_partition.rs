//! The chaos proxies front the peer port too: cutting the links between nodes there stops
//! commits even though every client still reaches the leader, and healing them lets the
//! same write commit. Without proxies on the peer port the nodes would keep replicating
//! around the "partition" and the first write would commit.

use std::time::Duration;

use tally_api::pb;
use tally_api::pb::budget_client::BudgetClient;
use tally_chaos::cluster::ChaosCluster;
use tally_chaos::proxy::Rules;

fn now_ms() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(since_epoch.as_millis()).expect("ms fit u64")
}

fn authorize(hold: &str) -> pb::AuthorizeHoldRequest {
    pb::AuthorizeHoldRequest {
        header: Some(pb::CommandHeader {
            family_id: "partition".to_owned(),
            capability_id: "cap".to_owned(),
            grant_index: 0,
            event_id: format!("{hold}:authorize"),
            // Long enough for the partition, the heal and the retries.
            not_after_ms: now_ms() + 300_000,
        }),
        hold_id: hold.to_owned(),
        requested_exposure_units: 0,
        limits: Some(pb::GrantLimits {
            max_invocations: Some(100),
            ..Default::default()
        }),
        ancestors: vec![],
        hold_timeout_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_on_the_peer_proxies_stops_commits_until_healed() {
    let dir = tempfile::tempdir().expect("dir");
    let mut cluster = ChaosCluster::start(
        env!("CARGO_BIN_EXE_chaos-node").as_ref(),
        dir.path(),
        3,
        10_000,
        10_000,
    )
    .await
    .expect("cluster starts");
    let (leader, _) = cluster
        .wait_leader(Duration::from_secs(30))
        .await
        .expect("a leader");
    let channel = cluster
        .transport("kernel")
        .expect("certificates")
        .endpoint(&cluster.proxies[&leader])
        .expect("endpoint")
        .timeout(Duration::from_secs(3))
        .connect()
        .await
        .expect("connect through the leader's client proxy");
    let mut budget = BudgetClient::new(channel);
    budget
        .authorize_hold(authorize("before"))
        .await
        .expect("a write commits before the partition");
    let committed = cluster
        .wait_converged(Duration::from_secs(30))
        .await
        .expect("converged");

    // Every node cut from every other; clients still reach every node.
    let ids = cluster.ids();
    let mut rules = Rules::default();
    for id in &ids {
        let others: Vec<u64> = ids.iter().copied().filter(|o| o != id).collect();
        rules.cut(&[*id], &others);
    }
    cluster.net.set_rules(rules);
    let status = budget
        .authorize_hold(authorize("during"))
        .await
        .expect_err("no quorum is reachable through the peer proxies");
    eprintln!("write during the partition: {status:?}");
    let applied = cluster
        .status(leader)
        .await
        .and_then(|s| s.applied_index)
        .unwrap_or(0);
    assert_eq!(
        applied, committed,
        "nothing committed while the peer links were cut"
    );

    cluster.net.heal();
    // The same event id, retried until the healed cluster answers: it commits once.
    let mut answer = None;
    for _ in 0..60 {
        if let Ok(reply) = budget.authorize_hold(authorize("during")).await {
            answer = Some(reply.into_inner());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(answer.is_some(), "the write commits once the links heal");
    let healed = cluster
        .wait_converged(Duration::from_secs(30))
        .await
        .expect("converged after healing");
    assert!(healed > committed, "the log moved on after healing");
    cluster.kill(1);
    cluster.kill(2);
    cluster.kill(3);
}
