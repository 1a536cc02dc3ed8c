//! The node settings that bound the live families, end to end on a real cluster, and the
//! metrics that show the family store: a family spilled to disk is counted there and read back
//! from there. `max_live_families` is a hard cap: `spill_idle_entries` keeps families in use
//! out of the spill for the *memory budget* only, never above the count.

mod cluster_support;

use cluster_support::*;
use tally_api::pb;
use tally_authority::testing::TestCluster;

const FAMILIES: usize = 6;

/// Counted as `tally-node` counts, so Status and the metrics report the heap in use.
#[global_allocator]
static HEAP: tally_authority::heap_count::CountingAllocator =
    tally_authority::heap_count::CountingAllocator;

/// One authorize on each of `FAMILIES` families, through the leader; returns the leader.
async fn touch_every_family(cluster: &TestCluster) -> u64 {
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    for i in 0..FAMILIES {
        client
            .authorize_hold(authorize(&format!("fam{i}"), "h", 10))
            .await
            .expect("authorize");
    }
    leader
}

async fn usage_of(cluster: &TestCluster, id: u64, family: &str) -> Option<pb::Account> {
    account_of(&mut cluster.budget(id).await, family).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_families_beyond_the_limit_go_to_the_store_and_are_read_back_from_it() {
    let cluster = TestCluster::start_with(3, |config| {
        config.max_live_families = 2;
        config.spill_idle_entries = 0;
    })
    .await;
    let leader = touch_every_family(&cluster).await;
    let before = scrape(&cluster, leader).await;
    assert!(
        count(&before, "tally_family_actors{state=\"live\"}") <= 2,
        "max_live_families bounds the live families:\n{before}"
    );
    assert!(
        count(&before, "tally_family_actors{state=\"passivated\"}") >= (FAMILIES - 2) as u64,
        "the rest are in the family store:\n{before}"
    );
    assert!(count(&before, "tally_family_store_bytes{kind=\"families\"}") > 0);
    assert!(count(&before, "tally_family_store_bytes{kind=\"file\"}") > 0);
    // Status shows the same budget and use as the metrics (`tally status` warns from it).
    let memory = status_of(&cluster, leader)
        .await
        .memory
        .expect("Status reports memory");
    assert_eq!(
        memory.budget_bytes,
        tally_authority::node::config::NodeConfig::default().memory_budget_bytes
    );
    assert_eq!(
        memory.families_share_bytes,
        count(&before, "tally_live_families_bytes{kind=\"budget\"}")
    );
    assert!(memory.families_in_memory <= 2, "{memory:?}");
    assert!(
        memory.families_on_disk >= (FAMILIES - 2) as u64,
        "{memory:?}"
    );
    assert!(
        memory.families_bytes > 0 && memory.families_bytes < memory.families_share_bytes,
        "{memory:?}"
    );
    let resident = memory.process_resident_bytes.unwrap_or(0);
    let heap = memory.heap_in_use_bytes.unwrap_or(0);
    assert!(resident > 0 && heap > 0, "{memory:?}");
    // Allocated pages the process never touched are not resident, so the heap in use may pass
    // RSS a little, not by far.
    assert!(heap < resident + (64 << 20), "{memory:?}");
    assert!(count(&before, "tally_process_memory_bytes{kind=\"resident\"}") > 0);
    assert!(count(&before, "tally_process_memory_bytes{kind=\"heap_in_use\"}") > 0);

    let reads_before = count(&before, "tally_family_store_reads_total");
    let account = usage_of(&cluster, leader, "fam0")
        .await
        .expect("a spilled family's row is read back");
    assert_eq!(account.total_cost_exposed_units, 10);
    let after = scrape(&cluster, leader).await;
    assert!(
        count(&after, "tally_family_store_reads_total") > reads_before,
        "reading a spilled family goes to the store:\n{after}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_family_count_is_a_hard_cap_even_for_families_in_use() {
    let cluster = TestCluster::start_with(3, |config| {
        config.max_live_families = 2;
        config.spill_idle_entries = 1_000_000;
    })
    .await;
    let leader = touch_every_family(&cluster).await;
    for id in cluster.nodes.keys() {
        let text = scrape(&cluster, *id).await;
        assert!(
            count(&text, "tally_family_actors{state=\"live\"}") <= 2,
            "node {id}: families used in the last spill_idle_entries entries still obey the \
             count:\n{text}"
        );
    }
    for i in 0..FAMILIES {
        let account = usage_of(&cluster, leader, &format!("fam{i}")).await;
        assert_eq!(account.map(|a| a.total_cost_exposed_units), Some(10));
    }
    cluster.shutdown().await;
}

/// The family store never waits for the disk (docs/sizing.md): a crash may lose any write it
/// made since its last durable commit, tear a page, or leave a store half created. This
/// simulates the worst of it on a follower's store after a crash (not only SIGKILL, which
/// keeps the page cache): every store file cut to half and its first page overwritten, and a
/// half-created store added. The node must restart from its snapshot and log alone, to the
/// same state as its peers, with no command applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_every_unsynced_store_write_restarts_to_its_peers_state() {
    let mut cluster = TestCluster::start_with(3, |config| {
        config.max_live_families = 2;
        config.spill_idle_entries = 0;
        config.snapshot_every_entries = 8;
    })
    .await;
    let leader = touch_every_family(&cluster).await;
    let follower = a_follower(&cluster, leader);
    let store_dir = cluster.configs[&follower].data_dir.join("families");
    // The store files as the running node has them: an in-process kill drops the node's
    // router, and with it (unlike a crash) removes the files, depending on when the last
    // reader lets go. So they are taken now and put back, damaged, after the kill.
    let mut left_by_the_crash = Vec::new();
    for entry in std::fs::read_dir(&store_dir).expect("the follower's family store") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|ext| ext == "redb") {
            left_by_the_crash.push((path.clone(), std::fs::read(&path).expect("read a store")));
        }
    }
    assert!(
        !left_by_the_crash.is_empty(),
        "the follower had spilled families to its store"
    );
    cluster.kill(follower).await;

    for (path, mut bytes) in left_by_the_crash {
        bytes.truncate(bytes.len() / 2);
        let torn = bytes.len().min(4_096);
        bytes[..torn].fill(0xA5);
        std::fs::write(&path, bytes).expect("the store as the crash left it");
    }
    std::fs::write(store_dir.join("families-999999.redb"), b"half created")
        .expect("a half-created store");

    // The cluster goes on without it: the restart replays these from the log (or a snapshot).
    let mut client = cluster.budget(leader).await;
    for i in 0..FAMILIES {
        client
            .authorize_hold(authorize(&format!("fam{i}"), "h2", 5))
            .await
            .expect("authorize while the follower is down");
    }
    cluster.restart(follower).await;
    assert_converged(&cluster.converged_digests().await);
    for i in 0..FAMILIES {
        let family = format!("fam{i}");
        let on_follower = usage_of(&cluster, follower, &family).await;
        assert_eq!(
            on_follower.map(|a| (a.total_cost_exposed_units, a.reserved_invocations)),
            Some((15, 2)),
            "{family} on the restarted node: both holds, each applied once"
        );
    }
    cluster.shutdown().await;
}

/// A node's own snapshots link the store's runs of rows instead of copying them, so the runs
/// are part of the checkpoint (docs/architecture.md, crash contract): a follower that crashes
/// after rows left memory, in the middle of writing a snapshot (its file not in place, its
/// runs directory half linked), restarts from its newest linked snapshot, taking its runs
/// back by link, and the log, to its peers' state; it answers for its rows out of memory
/// and applied each command once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarts_from_its_linked_snapshot_after_losing_unsynced_writes() {
    let mut cluster = TestCluster::start_with(3, |config| {
        config.snapshot_every_entries = 8;
    })
    .await;
    let leader = cluster.wait_leader().await;
    set_retention(&cluster, leader, 1_000).await;
    let mut client = cluster.budget(leader).await;
    for i in 0..FAMILIES {
        let mut request = authorize(&format!("fam{i}"), "old", 10);
        request.header.as_mut().expect("a header").not_after_ms =
            tally_authority::node::clock::wall_clock_ms() + 1_200;
        client.authorize_hold(request).await.expect("authorize");
    }
    let follower = a_follower(&cluster, leader);
    // Later commands, once cluster time is past retention, move the old rows out of memory;
    // snapshots every 8 entries link them.
    let snapshots = cluster.configs[&follower].data_dir.join("snapshots");
    let linked_runs = || {
        (std::fs::read_dir(&snapshots).expect("snapshots"))
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                (path.extension()? == "runs").then(|| std::fs::read_dir(path).ok())?
            })
            .map(Iterator::count)
            .sum::<usize>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut round = 0;
    while linked_runs() == 0 || count(&scrape(&cluster, follower).await, "tally_cold_rows") == 0 {
        assert!(std::time::Instant::now() < deadline, "no rows left memory");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        round += 1;
        for i in 0..FAMILIES {
            (client
                .authorize_hold(authorize(&format!("fam{i}"), &format!("r{round}"), 1))
                .await)
                .expect("a later command");
        }
    }
    cluster.kill(follower).await;

    // What the crash lost: a snapshot being written, its file not renamed into place, its
    // runs directory partly linked (the store itself is emptied at start anyway).
    let store_dir = cluster.configs[&follower].data_dir.join("families");
    let half = snapshots.join(format!("snapshot-{:020}-{:020}", u64::MAX / 2, 1));
    std::fs::create_dir(half.with_extension("runs")).expect("a half-linked runs dir");
    std::fs::write(half.with_extension("runs").join("000000.run"), b"torn").expect("write");
    std::fs::write(half.with_extension("tsnap.tmp"), b"half written").expect("write");

    for i in 0..FAMILIES {
        (client
            .authorize_hold(authorize(&format!("fam{i}"), "after", 5))
            .await)
            .expect("authorize while the follower is down");
    }
    cluster.restart(follower).await;
    assert_converged(&cluster.converged_digests().await);
    let adopted = (std::fs::read_dir(&store_dir).expect("the restarted store"))
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "run"))
        .filter(|path| std::os::unix::fs::MetadataExt::nlink(&path.metadata().expect("meta")) > 1)
        .count();
    assert!(
        adopted > 0,
        "the restart took the snapshot's runs in by link, without copying"
    );
    let leader_snapshots = cluster.configs[&leader].data_dir.join("snapshots");
    assert!(
        (std::fs::read_dir(leader_snapshots).expect("snapshots")).all(|entry| !entry
            .expect("entry")
            .path()
            .to_string_lossy()
            .ends_with(".tstream")),
        "the follower restarted from its own snapshot, not one the leader sent"
    );
    let restarted = scrape(&cluster, follower).await;
    assert!(
        count(&restarted, "tally_cold_rows") > 0,
        "the restarted node has its rows out of memory:\n{restarted}"
    );
    let mut on_follower = cluster.budget(follower).await;
    for i in 0..FAMILIES {
        let family = format!("fam{i}");
        // The old hold's authorize was compacted out of memory: still exact on the follower.
        match get_event(&mut on_follower, &family, "old:authorize").await {
            pb::event_lookup::Lookup::Applied(applied) => {
                assert!(applied.decision.is_some(), "{family}: the decision is kept")
            }
            other => panic!("{family} old:authorize on the restarted node: {other:?}"),
        }
        let account = usage_of(&cluster, follower, &family)
            .await
            .expect("an account");
        assert_eq!(
            account.total_cost_exposed_units,
            10 + round as u64 + 5,
            "{family}: every hold once"
        );
    }
    cluster.shutdown().await;
}
