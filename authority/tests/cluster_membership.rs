//! In-process clusters changing shape: a node restarted from its data dir catches up, a new
//! learner is brought up by snapshot after the leader purged its log, and membership goes
//! 3 → 5 → 3 under load.

mod cluster_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::*;
use tally_api::pb;
use tally_authority::raft::types::current_metrics;

async fn write_holds(cluster: &TestCluster, family: &str, prefix: &str, n: usize) {
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    for i in 0..n {
        let hold = format!("{prefix}{i}");
        client
            .authorize_hold(authorize(family, &hold, 3))
            .await
            .expect("authorize");
        client
            .capture_invocation(capture(family, &hold, "a"))
            .await
            .expect("capture");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_restarts_from_its_data_dir_and_catches_up() {
    init_logs();
    let mut cluster = TestCluster::start(3).await;
    write_holds(&cluster, "rs", "a", 10).await;
    let leader = cluster.wait_leader().await;
    let victim = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let applied_before = current_metrics(&cluster.nodes[&victim].raft)
        .last_applied
        .map_or(0, |l| l.index);
    cluster.kill(victim).await;
    write_holds(&cluster, "rs", "b", 10).await;

    // Restart in the same process, same data dir and port: the log store must reopen.
    let restarted_at = Instant::now();
    cluster.restart(victim).await;
    write_holds(&cluster, "rs", "c", 5).await;
    let digests = cluster.converged_digests().await;
    assert_eq!(digests.len(), 3);
    assert_converged(&digests);
    let applied = current_metrics(&cluster.nodes[&victim].raft)
        .last_applied
        .map_or(0, |l| l.index);
    assert!(
        applied >= applied_before + 30,
        "30 entries were written after the kill: applied {applied}, before the kill {applied_before}"
    );
    println!(
        "node {victim} restarted and caught up {} ms later (applied {applied_before} -> {applied})",
        restarted_at.elapsed().as_millis()
    );
    // Its own reads agree: the events written while it was down are there.
    let mut client = cluster.budget(victim).await;
    for i in 0..10 {
        let event = format!("b{i}:capture");
        assert!(
            applied_index(&mut client, "rs", &event).await.is_some(),
            "{event} missing on the restarted node"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_joins_by_snapshot_and_membership_goes_3_5_3_under_load() {
    init_logs();
    let mut cluster = TestCluster::start_with(3, |c| c.snapshot_every_entries = 20).await;
    write_holds(&cluster, "mem", "s", 30).await;
    let leader = cluster.wait_leader().await;
    let mut admin = cluster.admin(leader).await;
    admin
        .trigger_snapshot(pb::TriggerSnapshotRequest {})
        .await
        .expect("trigger snapshot");
    // Wait until the leader has snapshotted and purged the head of its log.
    let start = Instant::now();
    let purged = loop {
        let m = current_metrics(&cluster.nodes[&leader].raft);
        if let (Some(snapshot), Some(purged)) = (m.snapshot, m.purged) {
            if purged.index > 1 {
                break (snapshot.index, purged.index);
            }
        }
        assert!(start.elapsed() < LIVENESS, "no snapshot and purge: {m:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    println!(
        "leader {leader}: snapshot at {}, log purged through {}",
        purged.0, purged.1
    );

    // A new node joins as a learner: the entries it needs are gone, so it gets the snapshot.
    let mut learner = config(cluster.dir.path(), 4);
    learner.snapshot_every_entries = 20;
    cluster.launch(learner).await;
    let reply = admin
        .add_learner(cluster.learner_request(4))
        .await
        .expect("add learner")
        .into_inner();
    println!("learner 4 added at log index {:?}", reply.log_index);
    let digests = cluster.converged_digests().await;
    assert_eq!(digests.len(), 4);
    assert_converged(&digests);
    let learner = current_metrics(&cluster.nodes[&4].raft);
    let installed = learner.snapshot.expect("the learner installed a snapshot");
    assert!(
        installed.index >= purged.1,
        "snapshot {installed:?} covers the purged log"
    );
    // The leader sent its linked snapshot expanded into a stream; the learner keeps what it
    // installed as a linked snapshot of its own, not as a copy of the stream.
    let snapshots = |id: u64| {
        let dir = cluster.configs[&id].data_dir.join("snapshots");
        let mut names: Vec<String> = (std::fs::read_dir(dir).expect("snapshots"))
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    };
    let kept = format!(
        "snapshot-{:020}-{:020}",
        installed.index, installed.leader_id.term
    );
    let on_learner = snapshots(4);
    assert!(
        on_learner.contains(&format!("{kept}.tsnap"))
            && on_learner.contains(&format!("{kept}.runs")),
        "{on_learner:?}"
    );
    assert!(
        snapshots(leader)
            .iter()
            .any(|name| name.ends_with(".tstream")),
        "{:?}",
        snapshots(leader)
    );

    // 3 → 5 → 3 with writes running all along.
    let mut fifth = config(cluster.dir.path(), 5);
    fifth.snapshot_every_entries = 20;
    cluster.launch(fifth).await;
    let stop = Arc::new(AtomicBool::new(false));
    let addresses: Vec<String> = (1..=4).map(|id| cluster.address(id)).collect();
    let transport = cluster.transport("kernel");
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut records = Vec::new();
            let mut at = 0;
            let mut client = budget_at(&transport, &addresses[at])
                .await
                .expect("connect");
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let command =
                    pb::command::Command::AuthorizeHold(authorize("load", &format!("l{i}"), 1));
                let result = send(&mut client, command.clone()).await;
                if result.is_err() {
                    at = (at + 1) % addresses.len();
                    if let Some(next) = budget_at(&transport, &addresses[at]).await {
                        client = next;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                records.push((command, result.map(|r| r.into_inner())));
                i += 1;
            }
            records
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    admin
        .add_learner(cluster.learner_request(5))
        .await
        .expect("add learner 5");
    admin
        .change_membership(pb::ChangeMembershipRequest {
            voters: vec![1, 2, 3, 4, 5],
            retain: false,
        })
        .await
        .expect("3 -> 5 voters");
    let voters: Vec<u64> = current_metrics(&cluster.nodes[&leader].raft)
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    assert_eq!(voters, vec![1, 2, 3, 4, 5]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Back to 3, dropping the leader itself (and node 5): leadership must move under load.
    let leader_now = cluster.wait_leader().await;
    let mut remaining: Vec<u64> = (1..=4).filter(|id| *id != leader_now).collect();
    remaining.truncate(3);
    let mut admin = cluster.admin(leader_now).await;
    let changed_at = Instant::now();
    admin
        .change_membership(pb::ChangeMembershipRequest {
            voters: remaining.clone(),
            retain: false,
        })
        .await
        .expect("5 -> 3 voters");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let records = load.await.expect("load task");

    let leader = cluster.wait_leader_among(&remaining).await;
    println!(
        "voters {remaining:?}: node {leader} leads, {} ms after the change dropped node {leader_now}",
        changed_at.elapsed().as_millis()
    );
    assert_ne!(leader, leader_now);
    let voters: Vec<u64> = current_metrics(&cluster.nodes[&leader].raft)
        .membership_config
        .membership()
        .voter_ids()
        .collect();
    assert_eq!(voters, remaining);
    let mut client = cluster.budget(leader).await;
    let mut acknowledged = 0;
    let mut failed = 0;
    for (command, result) in &records {
        let (family, event_id) = ids_of(command);
        match result {
            // Acknowledged means committed, with the same index.
            Ok(decision) => {
                acknowledged += 1;
                assert!(matches!(
                    outcome(decision),
                    pb::outcome::Outcome::Authorized(_)
                ));
                assert_eq!(
                    applied_index(&mut client, &family, &event_id).await,
                    decision.budget_commit_index,
                    "{event_id}"
                );
            }
            // Failures are definite (nothing applied) or resolve to one answer.
            Err(status) => {
                failed += 1;
                let resolved = client
                    .resolve_event(resolve(command.clone()))
                    .await
                    .expect("resolve")
                    .into_inner();
                let applied = matches!(
                    outcome(&resolved),
                    pb::outcome::Outcome::Resolved(r)
                        if matches!(r.resolution, Some(pb::resolved::Resolution::Applied(_)))
                );
                if is_definite_refusal(status) {
                    assert!(
                        !applied,
                        "{event_id} failed definitely ({status:?}) yet applied"
                    );
                }
            }
        }
    }
    println!("under membership changes: {acknowledged} writes acknowledged, {failed} failed");
    assert!(acknowledged > 0);
    for id in [leader_now, 5] {
        if !remaining.contains(&id) {
            cluster.kill(id).await;
        }
    }
    let digests = cluster.converged_digests_of(&remaining).await;
    assert_converged(&digests);
    cluster.shutdown().await;
}
