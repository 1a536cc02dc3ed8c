//! Load shedding before proposing (docs/spec.md §5.6, §10): a leader whose oldest proposal has
//! waited for commit longer than `shed_after_ms` refuses new writes with UNAVAILABLE, definite,
//! proposing nothing, and takes writes again once commits flow.

mod cluster_support;

use std::time::{Duration, Instant};

use cluster_support::*;
use tally_api::pb;
use tally_api::status::Definiteness;

/// A refusal from load shedding: UNAVAILABLE, definite, saying why.
fn assert_shed(status: &tonic::Status, what: &str) {
    assert_eq!(
        status.code(),
        tonic::Code::Unavailable,
        "{what}: {status:?}"
    );
    assert_eq!(
        definiteness(status),
        Some(Definiteness::Definite),
        "{what}: nothing was proposed, so the refusal is definite"
    );
    assert_eq!(detail(status).kind, pb::ErrorKind::Unavailable as i32);
    assert!(
        status.message().contains("shed_after_ms"),
        "{what}: the refusal names the rule: {status:?}"
    );
}

/// Waits until `done` holds, polling; panics after `LIVENESS`.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < LIVENESS, "{what} within {LIVENESS:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Commits held up on a leader that keeps leading (its apply blocked behind the router's lock):
/// new writes are refused once the oldest proposal is past the threshold, never before, and
/// the stuck proposal itself is not dropped: it applies once apply resumes, and so do new
/// writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_apply_sheds_new_writes_definitely_and_recovers() {
    init_logs();
    let cluster = TestCluster::start(1).await;
    let leader = cluster.wait_leader().await;
    let node = &cluster.nodes[&leader];
    let shed_after = Duration::from_millis(cluster.configs[&leader].shed_after_ms);
    assert!(
        shed_after > Duration::ZERO
            && shed_after < Duration::from_millis(cluster.configs[&leader].propose_timeout_ms),
        "the test needs shedding on, below the propose timeout"
    );
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("shed", "warm", 1))
        .await
        .expect("the family exists before apply stops");

    let router = node.router.lock().await;
    // Taken before the write is sent, so no later than it is proposed.
    let sent_at = Instant::now();
    let mut stuck_client = client.clone();
    let stuck = tokio::spawn(async move {
        stuck_client
            .authorize_hold(authorize("shed", "stuck", 1))
            .await
    });
    eventually("the stuck write is proposed", || {
        node.proposer.load_shedding().awaiting_commit == 1
    })
    .await;
    assert!(
        !node.proposer.load_shedding().shedding,
        "a fresh proposal sheds nothing"
    );

    eventually("the stuck proposal passes the threshold", || {
        node.proposer.load_shedding().shedding
    })
    .await;
    assert!(
        sent_at.elapsed() >= shed_after,
        "not shed before the threshold"
    );
    let status = client
        .authorize_hold(authorize("shed", "refused", 1))
        .await
        .expect_err("a leader that cannot commit sheds new writes");
    assert_shed(&status, "a write while apply is held");
    // `/metrics` needs the router's lock, held here: the counters it renders are read
    // directly (the other test reads the rendered text).
    assert_eq!(
        node.metrics.commit_age_sheds(),
        1,
        "the shed write is counted"
    );
    assert_eq!(
        node.metrics.pending_proposals(),
        1,
        "only the stuck one waits"
    );

    drop(router);
    let decision = stuck
        .await
        .expect("task")
        .expect("the stuck write applies once apply resumes, within its timeout")
        .into_inner();
    assert!(matches!(
        outcome(&decision),
        pb::outcome::Outcome::Authorized(_)
    ));
    let state = node.proposer.load_shedding();
    assert!(!state.shedding && state.awaiting_commit == 0, "{state:?}");
    client
        .authorize_hold(authorize("shed", "after", 1))
        .await
        .expect("writes are taken again once commits flow");
    assert!(
        matches!(
            get_event(&mut client, "shed", "refused:authorize").await,
            pb::event_lookup::Lookup::Unknown(_)
        ),
        "a shed write was never proposed"
    );
    assert_eq!(node.metrics.commit_age_sheds(), 1);
    let text = scrape(&cluster, leader).await;
    assert!(
        text.contains("\ntally_writes_shed_by_commit_age_total 1\n")
            && text.contains("\ntally_proposals_pending 0\n")
            && text.contains("\ntally_oldest_pending_proposal_age_milliseconds 0\n"),
        "{text}"
    );
    cluster.shutdown().await;
}

/// A leader cut off from its followers (docs/spec.md §5.6): its first write cannot commit;
/// past the threshold the next writes are shed, definite, also after the first one's own
/// timeout answered UNKNOWN (the entry still waits in its log); after the partition heals the
/// old leader's entry is discarded, it sheds nothing, and writes through it are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_sheds_writes_past_the_threshold_and_serves_after_healing() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let old = cluster.wait_leader().await;
    let config = &cluster.configs[&old];
    let shed_after = Duration::from_millis(config.shed_after_ms);
    let propose_timeout = Duration::from_millis(config.propose_timeout_ms);
    assert!(shed_after > Duration::ZERO && shed_after < propose_timeout);
    let mut on_old = cluster.budget(old).await;
    on_old
        .authorize_hold(authorize("iso-shed", "h0", 1))
        .await
        .expect("a write before the partition");

    cluster.faults.isolate(old);
    let node = &cluster.nodes[&old];
    // Proposed at once, while the leader's lease still holds: appended, never committed.
    let sent_at = Instant::now();
    let mut first_client = on_old.clone();
    let first = tokio::spawn(async move {
        first_client
            .authorize_hold(authorize("iso-shed", "p0", 1))
            .await
    });
    eventually("the first write is proposed", || {
        node.proposer.load_shedding().awaiting_commit == 1
    })
    .await;

    eventually(
        "the isolated leader's proposal passes the threshold",
        || node.proposer.load_shedding().shedding,
    )
    .await;
    assert!(
        sent_at.elapsed() >= shed_after,
        "not shed before the threshold"
    );
    let status = on_old
        .authorize_hold(authorize("iso-shed", "p1", 1))
        .await
        .expect_err("shed");
    assert_shed(&status, "a write past the threshold");
    let shown = status_of(&cluster, old)
        .await
        .load_shedding
        .expect("status shows load shedding");
    assert!(shown.shedding, "{shown:?}");
    assert_eq!(shown.shed_after_ms, config.shed_after_ms);
    assert_eq!(shown.shed_writes, 1);
    assert_eq!(shown.proposals_pending, 1);
    assert!(shown.oldest_proposal_age_ms.expect("one waits") >= config.shed_after_ms);

    // The first write's own timeout answers UNKNOWN; its entry still waits, so writes are
    // still shed rather than proposed to time out in turn.
    let first = first.await.expect("task").expect_err("never committed");
    assert_eq!(first.code(), tonic::Code::Unknown, "{first:?}");
    let status = on_old
        .authorize_hold(authorize("iso-shed", "p2", 1))
        .await
        .expect_err("still shed");
    assert_shed(&status, "a write after the first one's timeout");
    assert_eq!(node.metrics.commit_age_sheds(), 2);
    let text = scrape(&cluster, old).await;
    assert!(
        text.contains("\ntally_writes_shed_by_commit_age_total 2\n"),
        "{text}"
    );
    assert!(text.contains("\ntally_proposals_pending 1\n"), "{text}");

    cluster.faults.heal();
    let leader = cluster.wait_leader().await;
    assert_ne!(
        leader, old,
        "the majority's leader, with the longer log, leads"
    );
    eventually("the old leader's discarded entry stops counting", || {
        node.proposer.load_shedding().awaiting_commit == 0
    })
    .await;
    assert!(!node.proposer.load_shedding().shedding);
    let mut on_old = cluster.budget(old).await;
    on_old
        .authorize_hold(authorize("iso-shed", "q1", 1))
        .await
        .expect("the old leader forwards writes again");
    let mut client = cluster.budget(leader).await;
    for hold in ["p1", "p2"] {
        assert!(
            matches!(
                get_event(&mut client, "iso-shed", &format!("{hold}:authorize")).await,
                pb::event_lookup::Lookup::Unknown(_)
            ),
            "{hold} was shed, so never proposed"
        );
    }
    let digests = cluster.converged_digests().await;
    assert_converged(&digests);
    cluster.shutdown().await;
}

/// The rate rule (docs/spec.md §5.6): more commands waiting than the leader commits within
/// `shed_after_ms` at its current rate are shed before the oldest of them is that old. Apply
/// is held while 300 writes wait: over a whole second with a queue nothing is answered, so the
/// leader's rate is zero and a new write is refused, definite, while the oldest has waited
/// under half of `shed_after_ms`; once apply resumes the 300 apply and writes are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_the_leader_cannot_commit_in_time_is_shed_before_it_ages() {
    const QUEUED: usize = 300;
    init_logs();
    let cluster = TestCluster::start_with(1, |config| {
        config.shed_after_ms = 5_000;
        config.propose_timeout_ms = 20_000;
        config.request_timeout_ms = 30_000;
    })
    .await;
    let leader = cluster.wait_leader().await;
    let node = &cluster.nodes[&leader];
    let shed_after = Duration::from_millis(cluster.configs[&leader].shed_after_ms);
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("rate", "warm", 1))
        .await
        .expect("the family exists before apply stops");

    let router = node.router.lock().await;
    let sent_at = Instant::now();
    let queued: Vec<_> = (0..QUEUED)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .authorize_hold(authorize("rate", &format!("q{i}"), 1))
                    .await
            })
        })
        .collect();
    eventually("every queued write is proposed", || {
        node.proposer.load_shedding().commands_awaiting_commit == QUEUED
    })
    .await;
    eventually("a busy second with no answer", || {
        node.proposer.load_shedding().shedding
    })
    .await;
    let state = node.proposer.load_shedding();
    assert_eq!(state.commands_per_s, Some(0.0), "{state:?}");
    let oldest = state.oldest_age.expect("writes wait");
    assert!(
        oldest < shed_after / 2,
        "shed by the rate after {oldest:?}, not by age ({shed_after:?})"
    );
    let status = client
        .authorize_hold(authorize("rate", "refused", 1))
        .await
        .expect_err("a queue the leader cannot commit in time");
    assert_shed(&status, "a write behind a queue that does not move");
    assert!(
        status.message().contains("300 commands") && status.message().contains("for ever"),
        "the refusal says which rule: {status:?}"
    );
    println!(
        "shed {} ms after the queue formed: {}",
        sent_at.elapsed().as_millis(),
        status.message()
    );
    assert_eq!(node.metrics.commit_age_sheds(), 1);

    drop(router);
    for write in queued {
        let decision = write
            .await
            .expect("task")
            .expect("a queued write applies once apply resumes")
            .into_inner();
        assert!(matches!(
            outcome(&decision),
            pb::outcome::Outcome::Authorized(_)
        ));
    }
    client
        .authorize_hold(authorize("rate", "after", 1))
        .await
        .expect("writes are taken again once the queue is gone");
    assert!(
        matches!(
            get_event(&mut client, "rate", "refused:authorize").await,
            pb::event_lookup::Lookup::Unknown(_)
        ),
        "a shed write was never proposed"
    );
    let shown = status_of(&cluster, leader)
        .await
        .load_shedding
        .expect("status shows load shedding");
    assert!(!shown.shedding && shown.commands_pending == 0, "{shown:?}");
    cluster.shutdown().await;
}
