//! The client against in-process clusters with injected faults: lost replies, lost requests,
//! a leader killed between proposal and reply, a partitioned leader, and batching. Each test
//! checks the client's answer against the committed log.

use std::sync::Arc;
use std::time::Duration;

use tally_authority::testing::TestCluster;
use tally_client::{BatchConfig, BatchingClient, ClientConfig, Outcome, TallyClient};
use tally_ledger::{
    AccountKey, ClientCommand, CommandHeader, EventId, EventLookup, FamilyId, GrantLimits,
    LedgerError, Operation, PreconditionCode,
};

fn client_for(cluster: &TestCluster, retry_for: Duration) -> TallyClient {
    let endpoints = cluster
        .configs
        .keys()
        .map(|id| cluster.address(*id))
        .collect();
    let mut config = ClientConfig::new(endpoints, cluster.transport("kernel"));
    config.attempt_timeout = Duration::from_secs(2);
    config.retry_for = retry_for;
    config.resolve_for = Duration::from_secs(10);
    TallyClient::new(config).expect("client")
}

fn now_ms() -> u64 {
    tally_authority::node::clock::wall_clock_ms()
}

fn authorize(family: &str, hold: &str, units: u64) -> ClientCommand {
    ClientCommand {
        header: CommandHeader {
            family_id: family.into(),
            capability_id: "cap".into(),
            grant_index: 0,
            event_id: format!("{hold}:authorize").into(),
            not_after_ms: now_ms() + 60_000,
        },
        op: Operation::AuthorizeHold {
            hold_id: hold.into(),
            requested_exposure_units: units,
            limits: GrantLimits::monetary(Some(40), Some(100), Some(2_000), "USD"),
            ancestors: vec![],
            hold_timeout_ms: None,
        },
    }
}

/// What the leader's log says of `event_id` (a linearizable read through any node).
async fn committed(client: &TallyClient, family: &str, event_id: &str) -> EventLookup {
    client
        .get_event(&FamilyId::from(family), &EventId::from(event_id))
        .await
        .expect("read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_lost_after_commit_returns_the_committed_decision_once() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    for node in cluster.nodes.values() {
        node.service_faults
            .drop_reply_after_commit("h1:authorize".into());
    }
    let client = client_for(&cluster, Duration::from_secs(10));
    let outcome = client.submit(authorize("fam", "h1", 50)).await;
    let Outcome::Decided(decision) = outcome else {
        panic!("expected the committed decision, got {outcome:?}")
    };
    assert!(
        decision.replayed,
        "the answer came from a retry of the same event id"
    );
    let EventLookup::Applied {
        decision: logged, ..
    } = committed(&client, "fam", "h1:authorize").await
    else {
        panic!("the decision the client got is not in the log")
    };
    assert_eq!(logged.commit_index, decision.commit_index);
    let events = client
        .list_events(&"fam".into(), None, None, None, 100)
        .await
        .expect("events");
    assert_eq!(
        events.len(),
        1,
        "one command, one event, however many tries: {events:?}"
    );
    let _ = leader;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_lost_before_the_leader_is_tombstoned_and_a_late_copy_is_aborted() {
    let cluster = TestCluster::start(3).await;
    for node in cluster.nodes.values() {
        node.service_faults.drop_requests_for("h2:authorize".into());
    }
    let client = client_for(&cluster, Duration::from_millis(800));
    let command = authorize("fam", "h2", 50);
    let outcome = client.submit(command.clone()).await;
    assert_eq!(
        outcome,
        Outcome::NotApplied {
            event_id: "h2:authorize".into()
        },
        "resolved to a final no"
    );
    assert_eq!(
        committed(&client, "fam", "h2:authorize").await,
        EventLookup::Tombstoned
    );
    for node in cluster.nodes.values() {
        node.service_faults.heal();
    }
    // The delayed duplicate of the original arrives after all: it can never apply.
    let late = client.submit(command).await;
    let Outcome::Refused(LedgerError::FailedPrecondition { code, .. }) = late else {
        panic!("{late:?}")
    };
    assert_eq!(code, PreconditionCode::EventAborted);
    let usage = client
        .get_usage(&"fam".into(), &AccountKey::new("cap", 0))
        .await
        .expect("read");
    assert!(usage.is_none(), "nothing was reserved: {usage:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_between_proposal_and_reply_gets_an_answer_that_matches_the_log() {
    let mut cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    cluster.nodes[&leader]
        .service_faults
        .drop_reply_after_commit("h3:authorize".into());
    let client = Arc::new(client_for(&cluster, Duration::from_secs(20)));
    let submit = {
        let client = client.clone();
        tokio::spawn(async move { client.submit(authorize("fam", "h3", 50)).await })
    };
    // Kill the leader once the command is committed and applied there, before any reply.
    let router = cluster.nodes[&leader].router.clone();
    let started = std::time::Instant::now();
    loop {
        let lookup = router
            .lock()
            .await
            .get_event(&"fam".into(), &"h3:authorize".into())
            .await
            .expect("read");
        if matches!(lookup, EventLookup::Applied { .. }) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the command never applied"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.kill(leader).await;
    let outcome = submit.await.expect("task");
    let Outcome::Decided(decision) = outcome else {
        panic!("{outcome:?}")
    };
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    let EventLookup::Applied {
        decision: logged, ..
    } = committed(&client, "fam", "h3:authorize").await
    else {
        panic!("not in the log")
    };
    assert_eq!(
        logged.commit_index, decision.commit_index,
        "the client's answer is the log's"
    );
    cluster.shutdown().await;
}

/// A read sent the moment the leader dies meets only followers that name a dead leader or
/// none: the client waits for the election instead of failing (CI once failed a test on this).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_sent_while_the_leader_dies_waits_for_the_next_leader() {
    let mut cluster = TestCluster::start(3).await;
    let client = client_for(&cluster, Duration::from_secs(20));
    let Outcome::Decided(_) = client.submit(authorize("fam", "r1", 10)).await else {
        panic!("the first write must commit")
    };
    let leader = cluster.wait_leader().await;
    cluster.kill(leader).await;
    let lookup = committed(&client, "fam", "r1:authorize").await;
    assert!(
        matches!(lookup, EventLookup::Applied { .. }),
        "the committed write is read back after the failover: {lookup:?}"
    );
    let usage = client
        .get_usage(&FamilyId::from("fam"), &AccountKey::new("cap", 0))
        .await
        .expect("usage read after the failover");
    assert!(usage.is_some(), "the account row survives the failover");
    assert_ne!(cluster.wait_leader().await, leader);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_partitioned_into_a_minority_never_contradicts_the_log() {
    let cluster = TestCluster::start(3).await;
    let old = cluster.wait_leader().await;
    cluster.faults.isolate(old);
    let client = client_for(&cluster, Duration::from_secs(15));
    let mut answers = Vec::new();
    for i in 0..4 {
        let hold = format!("p{i}");
        answers.push((
            hold.clone(),
            client.submit(authorize("fam", &hold, 10)).await,
        ));
    }
    cluster.faults.heal();
    for (hold, outcome) in answers {
        let event_id = format!("{hold}:authorize");
        let lookup = committed(&client, "fam", &event_id).await;
        match &outcome {
            Outcome::Decided(decision) => {
                let EventLookup::Applied {
                    decision: logged, ..
                } = &lookup
                else {
                    panic!("{event_id} acknowledged but not in the log: {lookup:?}")
                };
                assert_eq!(logged.commit_index, decision.commit_index);
            }
            Outcome::NotApplied { .. } | Outcome::Unavailable { .. } | Outcome::Refused(_) => {
                assert!(
                    !matches!(lookup, EventLookup::Applied { .. }),
                    "{event_id}: a definite no that applied"
                );
            }
            Outcome::Unknown { .. } => {}
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_under_64_concurrent_callers_gives_the_same_decisions_as_unary_calls() {
    let cluster = TestCluster::start(3).await;
    let client = Arc::new(client_for(&cluster, Duration::from_secs(10)));
    let batching = BatchingClient::new(
        client.clone(),
        BatchConfig {
            max_commands: 64,
            ..BatchConfig::default()
        },
    );
    // 64 authorizes of 50 against a 2,000 budget and a 40-call quota: some are denied.
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let batching = batching.clone();
            tokio::spawn(async move {
                batching
                    .submit(authorize("batched", &format!("b{i}"), 50))
                    .await
            })
        })
        .collect();
    let mut batched = Vec::new();
    for task in tasks {
        batched.push(task.await.expect("task"));
    }
    let mut unary = Vec::new();
    for i in 0..64 {
        unary.push(
            client
                .submit(authorize("unary", &format!("b{i}"), 50))
                .await,
        );
    }
    let kinds = |outcomes: &[Outcome]| {
        let mut allowed = 0;
        let mut denied = 0;
        for outcome in outcomes {
            match outcome {
                Outcome::Decided(d) if d.outcome.is_denied() => denied += 1,
                Outcome::Decided(_) => allowed += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        (allowed, denied)
    };
    assert_eq!(
        kinds(&batched),
        kinds(&unary),
        "same decisions, however the calls were grouped"
    );
    assert_eq!(kinds(&unary), (40, 24), "the quota admits 40");
    let row = |family: &str| {
        let client = client.clone();
        let family = family.to_owned();
        async move {
            client
                .get_usage(&family.as_str().into(), &AccountKey::new("cap", 0))
                .await
                .expect("read")
                .expect("row")
        }
    };
    let (a, b) = (row("batched").await.account, row("unary").await.account);
    assert_eq!(
        (a.invocation_count, a.total_cost_exposed_units),
        (b.invocation_count, b.total_cost_exposed_units)
    );
    cluster.shutdown().await;
}

/// A client that knows only a follower learns the leader from the first forwarded reply and
/// sends every later write straight there, unary and batched alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_knows_only_a_follower_moves_to_the_leader_after_one_write() {
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let follower = *cluster.configs.keys().find(|id| **id != leader).unwrap();
    let mut config =
        ClientConfig::new(vec![cluster.address(follower)], cluster.transport("kernel"));
    config.attempt_timeout = Duration::from_secs(2);
    let client = Arc::new(TallyClient::new(config).expect("client"));
    let forwarded = || cluster.nodes[&follower].metrics.forwarded_writes();
    for i in 0..3 {
        let outcome = client
            .submit(authorize("follow", &format!("u{i}"), 10))
            .await;
        assert!(matches!(outcome, Outcome::Decided(_)), "{outcome:?}");
    }
    assert_eq!(forwarded(), 1, "only the first write took the extra hop");
    let batching = BatchingClient::new(client.clone(), BatchConfig::default());
    for i in 0..3 {
        let outcome = batching
            .submit(authorize("follow", &format!("b{i}"), 10))
            .await;
        assert!(matches!(outcome, Outcome::Decided(_)), "{outcome:?}");
    }
    assert_eq!(forwarded(), 1, "batches go to the leader too");
    cluster.shutdown().await;
}

/// docs/spec.md §5.6 from the client's side: while `NoSpace` is raised (here by the leader's
/// own disk watcher), a new hold is a definite refusal answered at once, not retried as if the
/// outcome were unknown; once an operator clears the alarm the same command applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_space_refusal_is_definite_and_the_same_command_applies_once_cleared() {
    const QUOTA_BYTES: u64 = 64 * 1024 * 1024;
    let cluster = TestCluster::start_with(3, |config| {
        config.disk_quota_bytes = QUOTA_BYTES;
        config.disk_check_interval_ms = 50;
    })
    .await;
    let leader = cluster.wait_leader().await;
    let ballast = cluster.configs[&leader].data_dir.join("ballast");
    std::fs::File::create(&ballast)
        .and_then(|file| file.set_len(QUOTA_BYTES))
        .expect("ballast");
    let raised = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if cluster.nodes[&leader]
                .router
                .lock()
                .await
                .alarms()
                .no_space()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    raised.expect("the leader raises NoSpace");

    let client = client_for(&cluster, Duration::from_secs(10));
    let started = std::time::Instant::now();
    let outcome = client.submit(authorize("fam", "h1", 50)).await;
    assert!(
        matches!(outcome, Outcome::Refused(LedgerError::NoSpace { .. })),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a definite refusal is not retried until the deadline"
    );
    assert_eq!(
        committed(&client, "fam", "h1:authorize").await,
        EventLookup::Unknown,
        "nothing was recorded"
    );

    std::fs::remove_file(&ballast).expect("remove ballast");
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster
        .admin(leader)
        .await
        .clear_alarm(tally_api::pb::ClearAlarmRequest {
            kind: tally_api::pb::AlarmKind::NoSpace as i32,
            node_id: Some(leader),
        })
        .await
        .expect("an operator clears the alarm");
    let outcome = client.submit(authorize("fam", "h1", 50)).await;
    let Outcome::Decided(decision) = outcome else {
        panic!("expected the hold once cleared, got {outcome:?}")
    };
    assert!(!decision.replayed, "applied now, for the first time");
    cluster.shutdown().await;
}
