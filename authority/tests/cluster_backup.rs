//! Backup and restore (docs/operations.md "Backup and restore"): a whole cluster lost at once
//! comes back from one node's snapshot copied out, with every write the snapshot covers and
//! their commit indexes, and serves again; restore refuses a data dir that holds state, and a
//! damaged backup; a backup never overwrites a file.

mod cluster_support;

use std::time::Instant;

use cluster_support::*;
use tally_api::pb;
use tally_authority::node::backup::{self, BackupError};
use tally_authority::raft::types::current_metrics;
use tally_authority::testing::{TestCluster, LIVENESS};

const WRITES: usize = 10;
/// The term the cluster reaches before the writes and the backup.
const RAISED_TERM: u64 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_lost_whole_comes_back_from_one_backup() {
    let mut cluster = TestCluster::start(3).await;
    // Elections until the writes below carry a term well above the first ones: a restored
    // node starts with no vote (term 0), and one elected below the snapshot's term would
    // append behind it (openraft's replication panicked on that).
    let mut leader = cluster.wait_leader().await;
    let started = Instant::now();
    while current_metrics(&cluster.nodes[&leader].raft).current_term < RAISED_TERM {
        assert!(started.elapsed() < LIVENESS, "the term did not rise");
        let term = current_metrics(&cluster.nodes[&leader].raft).current_term;
        let follower = (1..=3).find(|id| *id != leader).expect("a follower");
        let raft = &cluster.nodes[&follower].raft;
        raft.trigger().elect(false).await.expect("an election");
        while current_metrics(raft).current_term <= term {
            assert!(
                started.elapsed() < LIVENESS,
                "node {follower} ran no election"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        leader = cluster.wait_leader().await;
    }
    let mut client = cluster.budget(leader).await;
    let mut committed = Vec::new();
    for i in 0..WRITES {
        let decision = client
            .authorize_hold(authorize("bk", &format!("h{i}"), 10))
            .await
            .expect("authorize")
            .into_inner();
        committed.push((format!("h{i}:authorize"), decision.budget_commit_index));
    }
    // A snapshot on node 1 covering every write above.
    let applied = current_metrics(&cluster.nodes[&leader].raft)
        .last_applied
        .expect("applied")
        .index;
    cluster.wait_applied(applied).await;
    cluster
        .admin(1)
        .await
        .trigger_snapshot(pb::TriggerSnapshotRequest {})
        .await
        .expect("trigger snapshot");
    let start = Instant::now();
    while current_metrics(&cluster.nodes[&1].raft)
        .snapshot
        .is_none_or(|s| s.index < applied)
    {
        assert!(start.elapsed() < LIVENESS, "node 1 wrote no snapshot");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let backups = tempfile::tempdir().expect("temp dir");
    let file = backups.path().join("tally.backup");
    let meta = backup::export(&cluster.configs[&1].data_dir, &file).expect("backup");
    assert!(meta.last_log_id.is_some_and(|id| id.index >= applied));
    assert!(
        matches!(
            backup::export(&cluster.configs[&1].data_dir, &file),
            Err(BackupError::OutputExists(_))
        ),
        "a backup never overwrites a file"
    );
    // A write after the backup: not in it.
    client
        .authorize_hold(authorize("bk", "late", 10))
        .await
        .expect("authorize after the backup");

    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for id in &ids {
        cluster.kill(*id).await;
    }
    assert!(
        matches!(
            backup::restore(&file, &cluster.configs[&1].data_dir),
            Err(BackupError::NotEmpty(_))
        ),
        "restore never replaces a node's state"
    );
    for id in &ids {
        let data_dir = &cluster.configs[id].data_dir;
        std::fs::remove_dir_all(data_dir).expect("wipe");
        std::fs::create_dir_all(data_dir).expect("empty data dir");
        backup::restore(&file, data_dir).expect("restore");
    }
    for id in &ids {
        cluster.restart(*id).await;
    }
    let leader = cluster.wait_leader().await;
    let backup_term = meta
        .last_log_id
        .expect("a backup has a log id")
        .leader_id
        .term;
    assert!(backup_term >= RAISED_TERM, "{backup_term}");
    for id in &ids {
        let term = current_metrics(&cluster.nodes[id].raft).current_term;
        assert!(
            term > backup_term,
            "node {id} runs at term {term}, not above the backup's {backup_term}"
        );
    }
    let mut client = cluster.budget(leader).await;
    for (event_id, index) in &committed {
        assert_eq!(
            applied_index(&mut client, "bk", event_id).await,
            *index,
            "{event_id} is back with its commit index"
        );
    }
    assert_eq!(
        applied_index(&mut client, "bk", "late:authorize").await,
        None,
        "a write after the backup is not in it"
    );
    client
        .authorize_hold(authorize("bk", "after-restore", 10))
        .await
        .expect("the restored cluster takes writes");
    assert_converged(&cluster.converged_digests().await);
    cluster.shutdown().await;
}

#[test]
fn a_damaged_backup_and_a_data_dir_without_snapshots_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let empty = dir.path().join("node");
    std::fs::create_dir_all(&empty).expect("dir");
    assert!(matches!(
        backup::export(&empty, &dir.path().join("out")),
        Err(BackupError::NoSnapshot(_))
    ));
    let damaged = dir.path().join("damaged.backup");
    std::fs::write(
        &damaged,
        b"TALLYSNP this is not a whole snapshot file at all, no",
    )
    .expect("write");
    let error = backup::restore(&damaged, &empty).expect_err("a damaged backup");
    assert!(matches!(error, BackupError::Snapshot(_)), "{error}");
    assert!(
        !empty
            .join("snapshots")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some()),
        "nothing was written"
    );
}
