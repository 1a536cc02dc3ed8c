//! In-process 3-node clusters over real gRPC: replication, failover, restart, forwarding,
//! linearizable reads, and docs/spec.md §10's status mapping for bad input.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_writes_and_serves_linearizable_reads() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let follower = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let mut via_follower = cluster.budget(follower).await;
    let mut via_leader = cluster.budget(leader).await;

    // A write sent to a follower is forwarded, committed and stamped by the leader.
    let reply = via_follower
        .authorize_hold(authorize("fwd", "h1", 40))
        .await
        .expect("a follower forwards the write");
    assert_eq!(
        tally_api::status::Definiteness::from_metadata(reply.metadata()),
        Some(tally_api::status::Definiteness::Definite)
    );
    assert_eq!(
        tally_api::status::leader_header(reply.metadata()),
        Some(cluster.address(leader)),
        "a forwarded write names the leader, so the client goes there next"
    );
    let decision = reply.into_inner();
    assert!(matches!(
        outcome(&decision),
        pb::outcome::Outcome::Authorized(a) if a.exposure_units == 40
    ));
    let direct = via_leader
        .authorize_hold(authorize("fwd", "h0", 1))
        .await
        .expect("the leader serves");
    assert_eq!(tally_api::status::leader_header(direct.metadata()), None);
    let stamp = decision.cluster.clone().expect("stamped");
    let leader_metrics =
        tally_authority::raft::types::current_metrics(&cluster.nodes[&leader].raft);
    assert_eq!(stamp.cluster_id, "tally-test");
    assert_eq!(stamp.guarantee_level, "raft_linearizable");
    assert_eq!(
        stamp.term, leader_metrics.current_term,
        "stamped in the leader's term"
    );
    assert!(stamp.log_index >= 1 && Some(stamp.log_index) <= leader_metrics.last_log_index);
    let log_id = decision.log_id.expect("the event's log id");
    assert_eq!(
        log_id.index, stamp.log_index,
        "a fresh decision names its own entry"
    );
    assert!(
        cluster.nodes[&follower].metrics.forwarded_writes() >= 1,
        "the follower counted the forwarded write"
    );
    assert_eq!(cluster.nodes[&leader].metrics.forwarded_writes(), 0);

    // Read-your-writes on a follower: every write acknowledged by the leader is visible to a
    // LINEARIZABLE (default) read on any follower right after.
    for i in 0..10 {
        let hold = format!("r{i}");
        let d = via_leader
            .authorize_hold(authorize("reads", &hold, 10))
            .await
            .expect("authorize on the leader")
            .into_inner();
        for id in cluster.nodes.keys().filter(|id| **id != leader) {
            let mut client = cluster.budget(*id).await;
            let seen = applied_index(&mut client, "reads", &format!("{hold}:authorize")).await;
            assert_eq!(
                seen, d.budget_commit_index,
                "follower {id} must see write {i} right after its acknowledgement"
            );
            let account = account_of(&mut client, "reads").await.expect("a usage row");
            assert_eq!(account.total_cost_exposed_units, 10 * (i + 1));
            assert_eq!(account.seq, d.budget_commit_index.unwrap());
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_documented_status_and_changes_nothing() {
    init_logs();
    let cluster = TestCluster::start_with(3, |c| c.max_batch_commands = 64).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("bad", "h1", 30))
        .await
        .expect("setup authorize");
    let before = cluster.family_state("bad").await;
    assert!(before.values().all(|s| s == &before[&leader]), "{before:?}");

    let check = |name: &str,
                 result: Result<tonic::Response<pb::Decision>, tonic::Status>,
                 code: tonic::Code,
                 kind: pb::ErrorKind|
     -> pb::ErrorDetail {
        let status = match result {
            Ok(reply) => panic!("{name}: expected {code:?}, got {:?}", reply.into_inner()),
            Err(status) => status,
        };
        assert_eq!(status.code(), code, "{name}: {status:?}");
        assert_eq!(
            definiteness(&status),
            Some(tally_api::status::Definiteness::Definite),
            "{name}: definite trailer"
        );
        let detail = detail(&status);
        assert_eq!(detail.kind, kind as i32, "{name}: {detail:?}");
        println!("{name}: {code:?} {detail:?}");
        detail
    };

    let mut no_header = authorize("bad", "h2", 10);
    no_header.header = None;
    let d = check(
        "missing header",
        client.authorize_hold(no_header).await,
        tonic::Code::InvalidArgument,
        pb::ErrorKind::InvalidArgument,
    );
    assert!(d.field.contains("header"), "{d:?}");

    let mut no_limits = authorize("bad", "h2", 10);
    no_limits.limits = None;
    let d = check(
        "missing limits",
        client.authorize_hold(no_limits).await,
        tonic::Code::InvalidArgument,
        pb::ErrorKind::InvalidArgument,
    );
    assert!(d.field.contains("limits"), "{d:?}");

    let long = "x".repeat(513);
    check(
        "oversized hold id",
        client.authorize_hold(authorize("bad", &long, 10)).await,
        tonic::Code::InvalidArgument,
        pb::ErrorKind::InvalidArgument,
    );
    let mut long_event = authorize("bad", "h3", 10);
    long_event.header.as_mut().unwrap().event_id = long.clone();
    check(
        "oversized event id",
        client.authorize_hold(long_event).await,
        tonic::Code::InvalidArgument,
        pb::ErrorKind::InvalidArgument,
    );
    check(
        "oversized family id",
        client.authorize_hold(authorize(&long, "h3", 10)).await,
        tonic::Code::InvalidArgument,
        pb::ErrorKind::InvalidArgument,
    );

    let d = check(
        "unknown hold",
        client.capture_invocation(capture("bad", "nope", "a")).await,
        tonic::Code::FailedPrecondition,
        pb::ErrorKind::FailedPrecondition,
    );
    assert_eq!(d.reason, "unknown_hold");
    assert_eq!(d.event_id, "nope:capture", "the detail names the event id");

    let release = pb::ReleaseHoldRequest {
        header: Some(header("bad", "h1:release")),
        hold_id: "h1".to_owned(),
        released_exposure_units: 0,
    };
    check(
        "zero release",
        client.release_hold(release).await,
        tonic::Code::InvalidArgument,
        pb::ErrorKind::InvalidArgument,
    );

    let mut other = authorize("bad", "h1", 31);
    other.limits.as_mut().unwrap().max_invocations = Some(7);
    let d = check(
        "same event id, another command",
        client.authorize_hold(other).await,
        tonic::Code::AlreadyExists,
        pb::ErrorKind::Conflict,
    );
    assert!(
        d.differing_fields
            .iter()
            .any(|f| f.contains("requested_exposure_units"))
            && d.differing_fields.iter().any(|f| f.contains("limits")),
        "the conflict names every differing field: {:?}",
        d.differing_fields
    );

    let mut from_cluster = authorize("bad", "h4", 10);
    from_cluster.header.as_mut().unwrap().event_id = "auto:mine".to_owned();
    check(
        "reserved event id",
        client.authorize_hold(from_cluster).await,
        tonic::Code::InvalidArgument,
        pb::ErrorKind::InvalidArgument,
    );

    // Unknown enum values (the read consistency) are refused, definite.
    let status = client
        .get_event(pb::GetEventRequest {
            family_id: "bad".to_owned(),
            event_id: "h1:authorize".to_owned(),
            consistency: 99,
        })
        .await
        .expect_err("an unknown consistency is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(detail(&status).kind, pb::ErrorKind::InvalidArgument as i32);
    assert_eq!(
        definiteness(&status),
        Some(tally_api::status::Definiteness::Definite)
    );

    // A batch over max_batch_commands is refused whole.
    let commands = (0..65)
        .map(|i| pb::Command {
            command: Some(pb::command::Command::AuthorizeHold(authorize(
                "bad",
                &format!("b{i}"),
                1,
            ))),
        })
        .collect();
    let status = client
        .batch(pb::BatchRequest { commands })
        .await
        .expect_err("65 commands exceed max_batch_commands = 64");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        definiteness(&status),
        Some(tally_api::status::Definiteness::Definite)
    );
    assert_eq!(detail(&status).kind, pb::ErrorKind::InvalidArgument as i32);

    let after = cluster.family_state("bad").await;
    assert_eq!(before, after, "refused input changed the state");
    assert_converged(&cluster.converged_digests().await);
    match get_event(&mut client, "bad", "h2:authorize").await {
        pb::event_lookup::Lookup::Unknown(_) => {}
        other => panic!("a refused command left a trace: {other:?}"),
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_expire_on_cluster_time_without_a_client_command() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    let mut request = authorize("exp", "h1", 25);
    request.hold_timeout_ms = Some(300);
    let d = client
        .authorize_hold(request)
        .await
        .expect("authorize")
        .into_inner();
    assert!(matches!(outcome(&d), pb::outcome::Outcome::Authorized(_)));

    let started = std::time::Instant::now();
    let hold = loop {
        let hold = live_hold(&mut client, "exp", "h1").await;
        if hold.invocation_state == pb::InvocationState::Reversed as i32 {
            break hold;
        }
        assert!(
            started.elapsed() < LIVENESS,
            "the hold did not expire within {LIVENESS:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    println!(
        "hold expired {} ms after authorize",
        started.elapsed().as_millis()
    );
    assert_eq!(hold.monetary_state, pb::MonetaryState::Reversed as i32);
    assert_eq!(hold.remaining_exposure_units, 0);
    assert_eq!(hold.reversed_units, 25);
    let terminal = hold.terminal.expect("a terminal transition");
    assert!(terminal.event_id.starts_with("auto:"), "{terminal:?}");

    let events = client
        .list_events(pb::ListEventsRequest {
            family_id: "exp".to_owned(),
            capability_id: None,
            grant_index: None,
            after_commit_index: None,
            limit: 0,
            consistency: 0,
        })
        .await
        .expect("list_events")
        .into_inner()
        .events;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"reserve_invocation"), "{kinds:?}");
    let expiry = events
        .iter()
        .find(|e| e.kind == "expire_hold")
        .unwrap_or_else(|| panic!("an expire_hold event: {kinds:?}"));
    assert_eq!(expiry.hold_id.as_deref(), Some("h1"));
    assert_eq!(expiry.event_id, terminal.event_id);
    let usage = account_of(&mut client, "exp").await.expect("a row");
    assert_eq!(usage.invocation_count, 0, "expiry gave the slot back");
    assert_eq!(usage.total_cost_exposed_units, 0, "and the exposure");
    assert_converged(&cluster.converged_digests().await);
    cluster.shutdown().await;
}

fn limited(max_invocations: u32) -> pb::GrantLimits {
    pb::GrantLimits {
        max_invocations: Some(max_invocations),
        ..limits()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_answers_each_command_in_order_like_unary_calls() {
    init_logs();
    let cluster = TestCluster::start_with(3, |c| c.max_batch_commands = 64).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;

    // Mixed valid and invalid: one result per command, in request order.
    let mut no_limits = authorize("mix", "m2", 10);
    no_limits.limits = None;
    let long = "y".repeat(600);
    let commands: Vec<pb::command::Command> = vec![
        pb::command::Command::AuthorizeHold(authorize("mix", "m1", 10)),
        pb::command::Command::AuthorizeHold(no_limits),
        pb::command::Command::CaptureInvocation(capture("mix", "m1", "att")),
        pb::command::Command::CaptureInvocation(capture("mix", "ghost", "att")),
        pb::command::Command::AuthorizeHold(authorize("mix", &long, 10)),
        pb::command::Command::ReconcileHold(reconcile("mix", "m1", 10, 4)),
    ];
    let reply = client
        .batch(pb::BatchRequest {
            commands: commands
                .into_iter()
                .map(|c| pb::Command { command: Some(c) })
                .collect(),
        })
        .await
        .expect("a batch with bad commands still answers")
        .into_inner();
    assert_eq!(reply.results.len(), 6);
    use pb::batch_result::Result as R;
    let results: Vec<&R> = reply
        .results
        .iter()
        .map(|r| r.result.as_ref().expect("a result"))
        .collect();
    let decision = |r: &R| match r {
        R::Decision(d) => outcome(d).clone(),
        R::Error(e) => panic!("expected a decision, got {e:?}"),
    };
    let error = |r: &R| match r {
        R::Error(e) => e.clone(),
        R::Decision(d) => panic!("expected an error, got {d:?}"),
    };
    assert!(matches!(
        decision(results[0]),
        pb::outcome::Outcome::Authorized(_)
    ));
    assert_eq!(
        error(results[1]).kind,
        pb::ErrorKind::InvalidArgument as i32
    );
    assert!(matches!(
        decision(results[2]),
        pb::outcome::Outcome::Captured(_)
    ));
    let ghost = error(results[3]);
    assert_eq!(ghost.kind, pb::ErrorKind::FailedPrecondition as i32);
    assert_eq!(ghost.reason, "unknown_hold");
    assert_eq!(ghost.event_id, "ghost:capture");
    assert_eq!(
        error(results[4]).kind,
        pb::ErrorKind::InvalidArgument as i32
    );
    assert!(matches!(
        decision(results[5]),
        pb::outcome::Outcome::Reconciled(r) if r.realized_units == 4 && r.unspent_units == 6
    ));
    // The valid ones share one entry, in order.
    let indexes: Vec<u64> = [0, 2, 5]
        .iter()
        .map(|i| match results[*i] {
            R::Decision(d) => d.budget_commit_index.expect("an index"),
            R::Error(_) => unreachable!(),
        })
        .collect();
    assert!(indexes.windows(2).all(|w| w[0] < w[1]), "{indexes:?}");
    assert!(
        indexes.iter().all(|i| i >> 20 == indexes[0] >> 20),
        "one log entry"
    );

    // 64 commands in one batch decide exactly like 64 unary calls on a twin family: with
    // max_invocations 40, holds 40..63 are denied; some holds are captured in the same batch.
    let twin = |family: &str| -> Vec<pb::command::Command> {
        (0..64)
            .map(|i| {
                if i % 8 == 7 {
                    pb::command::Command::CaptureInvocation(capture(
                        family,
                        &format!("t{}", i - 1),
                        "att",
                    ))
                } else {
                    let mut a = authorize(family, &format!("t{i}"), 5 + i as u64);
                    a.limits = Some(limited(40));
                    pb::command::Command::AuthorizeHold(a)
                }
            })
            .collect()
    };
    let batched = client
        .batch(pb::BatchRequest {
            commands: twin("twin-a")
                .into_iter()
                .map(|c| pb::Command { command: Some(c) })
                .collect(),
        })
        .await
        .expect("batch of 64")
        .into_inner()
        .results;
    assert_eq!(batched.len(), 64);
    let mut unary = Vec::new();
    for command in twin("twin-b") {
        unary.push(Answer::of(&send(&mut client, command).await));
    }
    let mut denied = 0;
    for (i, (b, u)) in batched.iter().zip(&unary).enumerate() {
        let b = match b.result.as_ref().expect("a result") {
            R::Decision(d) => Answer::Decision(outcome(d).clone(), None),
            R::Error(e) => Answer::Error(
                tally_api::status::grpc_code(
                    pb::ErrorKind::try_from(e.kind).expect("a known kind"),
                ),
                e.reason.clone(),
            ),
        };
        let u = match u {
            Answer::Decision(outcome, _) => Answer::Decision(outcome.clone(), None),
            error => error.clone(),
        };
        assert_eq!(b, u, "command {i}: batch vs unary");
        if matches!(b, Answer::Decision(pb::outcome::Outcome::Denied(_), _)) {
            denied += 1;
        }
    }
    assert!(denied > 0, "the twin runs reached the invocation limit");
    let usage = |family: &'static str| {
        let mut client = client.clone();
        async move { account_of(&mut client, family).await.expect("a row") }
    };
    let (a, b) = (usage("twin-a").await, usage("twin-b").await);
    assert_eq!(a.invocation_count, 40);
    assert_eq!(
        (
            a.invocation_count,
            a.reserved_invocations,
            a.captured_invocations,
            a.total_cost_exposed_units
        ),
        (
            b.invocation_count,
            b.reserved_invocations,
            b.captured_invocations,
            b.total_cost_exposed_units
        ),
    );
    assert_converged(&cluster.converged_digests().await);
    cluster.shutdown().await;
}

/// Unary writes that reach the leader together share log entries (the entry coalescer), and
/// each caller still gets exactly its own answer: its own decision with its own commit index,
/// or its own refusal, which leaves the commands beside it in the entry unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_unary_writes_share_entries_and_each_gets_its_own_answer() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let client = cluster.budget(leader).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..72usize {
        let mut client = client.clone();
        calls.spawn(async move {
            let command = if i % 9 == 8 {
                pb::command::Command::CaptureInvocation(capture("co", &format!("ghost{i}"), "att"))
            } else {
                let mut a = authorize("co", &format!("c{i}"), 5);
                a.limits = Some(limited(40));
                pb::command::Command::AuthorizeHold(a)
            };
            (i, Answer::of(&send(&mut client, command).await))
        });
    }
    let mut authorized = 0;
    let mut denied = 0;
    let mut indexes = Vec::new();
    while let Some(answer) = calls.join_next().await {
        let (i, answer) = answer.expect("call task");
        match answer {
            Answer::Decision(outcome, index) => {
                assert_ne!(i % 9, 8, "call {i}: a capture of an unknown hold decided");
                match outcome {
                    pb::outcome::Outcome::Authorized(_) => authorized += 1,
                    pb::outcome::Outcome::Denied(_) => denied += 1,
                    other => panic!("call {i}: {other:?}"),
                }
                indexes.push(index.expect("a commit index"));
            }
            Answer::Error(code, reason) => {
                assert_eq!(i % 9, 8, "call {i}: refused ({code:?} {reason})");
                assert_eq!(
                    (code, reason.as_str()),
                    (tonic::Code::FailedPrecondition, "unknown_hold")
                );
            }
        }
    }
    assert_eq!(
        (authorized, denied),
        (40, 24),
        "the invocation limit, exactly"
    );
    let distinct: std::collections::BTreeSet<u64> = indexes.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        indexes.len(),
        "every decision its own commit index"
    );
    let entries: std::collections::BTreeSet<u64> = indexes.iter().map(|i| i >> 20).collect();
    assert!(
        entries.len() < indexes.len(),
        "64 concurrent writes took {} entries: none shared",
        entries.len()
    );
    let mut client = client.clone();
    let account = account_of(&mut client, "co").await.expect("a row");
    assert_eq!(account.invocation_count, 40);
    assert_converged(&cluster.converged_digests().await);
    cluster.shutdown().await;
}

/// docs/spec.md §5.5: once retention passes its `not_after_ms`, an event's full record is
/// compacted, and GetEvent on a running cluster still answers exactly from what is kept: the
/// same decision (outcome and commit index) with no full record; a replay of the command
/// gets that decision back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_event_answers_exactly_after_the_full_record_is_compacted() {
    use pb::event_lookup::Lookup;
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    set_retention(&cluster, leader, 1_000).await;
    let mut client = cluster.budget(leader).await;
    // Its full record may go once cluster time passes not_after_ms + retention_ms.
    let mut request = authorize("cmp", "k1", 10);
    request.header.as_mut().expect("a header").not_after_ms =
        tally_authority::node::clock::wall_clock_ms() + 1_500;
    let first = client
        .authorize_hold(request.clone())
        .await
        .expect("authorize")
        .into_inner();
    match get_event(&mut client, "cmp", "k1:authorize").await {
        Lookup::Applied(applied) => {
            assert!(applied.record.is_some(), "the full record while retained")
        }
        other => panic!("k1:authorize: {other:?}"),
    }
    // Later commands in the family, once cluster time is past retention, compact it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut tick = 0;
    let compacted = loop {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        tick += 1;
        client
            .authorize_hold(authorize("cmp", &format!("tick{tick}"), 1))
            .await
            .expect("a later command");
        match get_event(&mut client, "cmp", "k1:authorize").await {
            Lookup::Applied(applied) if applied.record.is_none() => break applied,
            Lookup::Applied(_) => {}
            other => panic!("k1:authorize after {tick} ticks: {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the full record was never compacted"
        );
    };
    let decision = compacted.decision.expect("the decision is kept");
    assert_eq!(decision.budget_commit_index, first.budget_commit_index);
    assert_eq!(outcome(&decision), outcome(&first));
    let replay = client
        .authorize_hold(request)
        .await
        .expect("a replay of the same command")
        .into_inner();
    assert_eq!(replay.budget_commit_index, first.budget_commit_index);
    assert_eq!(outcome(&replay), outcome(&first));
    assert_converged(&cluster.converged_digests().await);
    cluster.shutdown().await;
}

/// Reads `/metrics` over a plain HTTP/1.1 request.
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("request");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("response");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_and_move_with_writes() {
    init_logs();
    let cluster = TestCluster::start_with(3, |c| {
        c.metrics_addr = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
    })
    .await;
    let leader = cluster.wait_leader().await;
    let follower = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let leader_addr = cluster.nodes[&leader].metrics_local_addr.expect("bound");
    let follower_addr = cluster.nodes[&follower].metrics_local_addr.expect("bound");
    let before = scrape(leader_addr).await;
    let commits_before = sample(&before, "tally_commit_latency_seconds_count");

    let mut client = cluster.budget(follower).await;
    for i in 0..3 {
        let mut a = authorize("met", &format!("h{i}"), 10);
        a.limits = Some(limited(2));
        let d = client
            .authorize_hold(a)
            .await
            .expect("authorize")
            .into_inner();
        assert_eq!(
            matches!(outcome(&d), pb::outcome::Outcome::Denied(_)),
            i == 2,
            "the third hold is over max_invocations = 2"
        );
    }
    let on_leader = scrape(leader_addr).await;
    let on_follower = scrape(follower_addr).await;
    println!("{on_leader}");
    assert!(sample(&on_leader, "tally_commit_latency_seconds_count") >= commits_before + 3.0);
    assert!(
        sample(
            &on_leader,
            "tally_commit_latency_seconds_bucket{le=\"+Inf\"}"
        ) >= 3.0
    );
    assert!(sample(&on_leader, "tally_commit_latency_seconds_sum") > 0.0);
    assert_eq!(
        sample(
            &on_leader,
            "tally_denials_total{reason=\"invocation_limit\"}"
        ),
        1.0
    );
    assert_eq!(sample(&on_follower, "tally_forwarded_writes_total"), 3.0);
    assert_eq!(sample(&on_leader, "tally_forwarded_writes_total"), 0.0);
    assert!(sample(&on_leader, "tally_raft_log_entries_per_fsync") > 0.0);
    assert!(sample(&on_follower, "tally_raft_log_entries_total") >= 3.0);
    // Replication and apply read what was just appended from memory, not from the file.
    assert!(sample(&on_leader, "tally_raft_log_reads_total{source=\"cache\"}") >= 1.0);
    assert!(sample(&on_follower, "tally_raft_log_reads_total{source=\"cache\"}") >= 1.0);
    assert!(sample(&on_leader, "tally_family_actors{state=\"live\"}") >= 1.0);
    assert_eq!(
        sample(&on_leader, "tally_family_actors{state=\"passivated\"}"),
        0.0
    );
    assert!(sample(&on_leader, "tally_leader_changes_total") >= 1.0);
    assert!(sample(&on_follower, "tally_leader_changes_total") >= 1.0);
    assert_eq!(sample(&on_leader, "tally_raft_is_leader"), 1.0);
    assert!(sample(&on_leader, "tally_apply_lag_entries") >= 0.0);
    // The write spans: the follower served the three requests (handler and propose, which
    // forwarded), the leader's Raft wrote them (client_write). Each request's handler holds
    // its propose, so every percentile of the one is at least the other's.
    let span = |text: &str, series: &str| sample(text, &format!("tally_write_span_{series}"));
    assert_eq!(span(&on_follower, "samples{span=\"handler\"}"), 3.0);
    assert_eq!(span(&on_follower, "samples{span=\"propose\"}"), 3.0);
    assert!(span(&on_leader, "samples{span=\"client_write\"}") >= 3.0);
    for quantile in ["0.5", "0.99"] {
        let of = |name: &str| {
            span(
                &on_follower,
                &format!("microseconds{{span=\"{name}\",quantile=\"{quantile}\"}}"),
            )
        };
        assert!(of("propose") > 0.0, "a forwarded write takes time");
        assert!(of("handler") >= of("propose"), "quantile {quantile}");
    }
    // Anything but GET /metrics is a 404.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(leader_addr)
            .await
            .expect("connect");
        stream
            .write_all(b"GET /nope HTTP/1.1\r\n\r\n")
            .await
            .expect("request");
        let mut text = String::new();
        stream.read_to_string(&mut text).await.expect("response");
        assert!(text.starts_with("HTTP/1.1 404"), "{text}");
    }
    cluster.shutdown().await;
}

/// docs/spec.md §6 and the cluster time keeper: after downtime (every clock jumps ten minutes
/// past cluster time, which moves at most `max_clock_step_ms` per entry), a hold authorized at
/// once still lives for its whole timeout. Without the keeper its entry was clamped ~590 s into
/// the past, and the next sixty entries expired it: the capture below answered `hold_expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_authorized_right_after_downtime_lives_for_its_whole_timeout() {
    init_logs();
    const DOWN_MS: u64 = 600_000;
    const HOLD_TIMEOUT_MS: u64 = 120_000;
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("down", "before", 1))
        .await
        .expect("a write before the downtime");
    for node in cluster.nodes.values() {
        node.clock.set_offset_ms(DOWN_MS as i64);
    }
    let shifted_now_ms = || tally_authority::node::clock::wall_clock_ms() + DOWN_MS;
    let shifted = |mut header: pb::CommandHeader| {
        header.not_after_ms = shifted_now_ms() + 60_000;
        Some(header)
    };
    // Through a follower, so the forwarded write passes the leader's gate.
    let mut via_follower = cluster.budget(a_follower(&cluster, leader)).await;
    let mut request = authorize("down", "after", 10);
    request.header = shifted(request.header.expect("a header"));
    request.hold_timeout_ms = Some(HOLD_TIMEOUT_MS);
    let asked_at_ms = shifted_now_ms();
    // The gate may refuse (UNAVAILABLE, definite) until a clock probe confirms the jumped
    // clocks and cluster time has caught up; a client retries.
    let started = std::time::Instant::now();
    let authorized = loop {
        match via_follower.authorize_hold(request.clone()).await {
            Ok(reply) => break reply.into_inner(),
            Err(status) if is_definite_refusal(&status) && started.elapsed() < LIVENESS => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(status) => panic!("not authorized once cluster time caught up: {status:?}"),
        }
    };
    assert!(matches!(
        outcome(&authorized),
        pb::outcome::Outcome::Authorized(_)
    ));
    // Enough entries to have carried the old clamp past the hold's expiry.
    for i in 0..80 {
        let mut request = authorize("down", &format!("later-{i}"), 1);
        request.header = shifted(request.header.expect("a header"));
        client.authorize_hold(request).await.expect("later writes");
    }
    let hold = live_hold(&mut client, "down", "after").await;
    let expires_at_ms = hold.expires_at_ms.expect("a hold with a timeout expires");
    assert!(
        expires_at_ms >= asked_at_ms + HOLD_TIMEOUT_MS,
        "the hold's timeout counts from when it was asked for: expires at {expires_at_ms}, \
         asked at {asked_at_ms} (+{HOLD_TIMEOUT_MS} ms)"
    );
    let mut request = capture("down", "after", "a");
    request.header = shifted(request.header.expect("a header"));
    let captured = client
        .capture_invocation(request)
        .await
        .expect("the hold is still live")
        .into_inner();
    assert!(
        matches!(outcome(&captured), pb::outcome::Outcome::Captured(_)),
        "{captured:?}"
    );
    // Every node's count: whichever led proposed them.
    let mut ticks = 0u64;
    for id in cluster.nodes.keys() {
        let metrics = cluster_support::scrape(&cluster, *id).await;
        ticks += count(&metrics, "tally_clock_ticks_total");
    }
    assert!(
        ticks >= DOWN_MS / 10_000,
        "ten minutes at one 10 s step per entry: {ticks} ticks"
    );
    cluster.shutdown().await;
}

/// docs/spec.md §6: a leader whose clock jumps far ahead does not carry cluster time with it
/// before its clock probes make it step down. The probe round before the jump confirmed its
/// clock; the keeper trusts only a round begun after it saw the lag, and goes a step a second
/// until then (when it trusted the earlier round, cluster time leapt the whole ten minutes
/// within milliseconds, expiring every hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_jumps_ahead_does_not_carry_cluster_time_with_it() {
    init_logs();
    const JUMP_MS: i64 = 600_000;
    let cluster = TestCluster::start(3).await;
    let skewed = cluster.wait_leader().await;
    let mut client = cluster.budget(skewed).await;
    client
        .authorize_hold(authorize("jump", "before", 1))
        .await
        .expect("a write before the jump");
    // Let a probe round confirm every clock first.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    cluster.nodes[&skewed].clock.set_offset_ms(JUMP_MS);
    let started = std::time::Instant::now();
    while cluster.leader_now() == Some(skewed) || cluster.leader_now().is_none() {
        assert!(
            started.elapsed() < LIVENESS,
            "the leader whose clock jumped kept leading"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let digests = cluster.converged_digests().await;
    assert_converged(&digests);
    let ahead_ms = cluster.nodes[&skewed]
        .router
        .lock()
        .await
        .cluster_time_ms()
        .saturating_sub(tally_authority::node::clock::wall_clock_ms());
    println!(
        "the jumped leader stepped down after {} ms; cluster time {ahead_ms} ms ahead",
        started.elapsed().as_millis()
    );
    assert!(
        ahead_ms < 60_000,
        "cluster time ran {ahead_ms} ms ahead of the wall clock with one leader's jumped clock"
    );
    cluster.shutdown().await;
}

/// docs/spec.md §10, "catching up": after a week down, cluster time trails every clock by
/// 60,480 steps, more than the keeper catches up within the gate's wait (750 ms here) even
/// once a clock probe has confirmed the clocks (a day's 8,640 took 0.5–0.7 s in this debug
/// build), so the first write is refused UNAVAILABLE, definite, with nothing proposed: once
/// cluster time has caught up the event is unknown on every node, and the same request then
/// authorizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_while_cluster_time_catches_up_is_refused_definite_and_applies_on_retry() {
    init_logs();
    const DOWN_MS: u64 = 7 * 86_400_000;
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("catch", "before", 1))
        .await
        .expect("a write before the downtime");
    for node in cluster.nodes.values() {
        node.clock.set_offset_ms(DOWN_MS as i64);
    }
    let mut request = authorize("catch", "after", 10);
    let header = request.header.as_mut().expect("a header");
    header.not_after_ms = tally_authority::node::clock::wall_clock_ms() + DOWN_MS + 600_000;
    let asked = std::time::Instant::now();
    let status = client
        .authorize_hold(request.clone())
        .await
        .expect_err("cluster time a week behind cannot catch up within the gate's wait");
    println!(
        "refused after {} ms: {}",
        asked.elapsed().as_millis(),
        status.message()
    );
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(is_definite_refusal(&status), "{status:?}");
    assert_eq!(detail(&status).kind, pb::ErrorKind::Unavailable as i32);
    assert!(
        status.message().contains("cluster time trails"),
        "the refusal says why: {status:?}"
    );
    let metrics = cluster_support::scrape(&cluster, leader).await;
    let refused = count(&metrics, "tally_writes_refused_for_cluster_time_total");
    assert!(refused >= 1, "the refusal is counted: {refused}");
    // Wait for the catch-up on the node that refused (still the leader: every clock agrees).
    let started = std::time::Instant::now();
    loop {
        let status = status_of(&cluster, leader).await;
        if status.leader_id == Some(leader) && !status.writes_wait_for_cluster_time {
            break;
        }
        assert!(
            started.elapsed() < LIVENESS,
            "cluster time did not catch up within {LIVENESS:?}: {} ms behind",
            status.cluster_time_lag_ms
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    println!("caught up after {} ms", started.elapsed().as_millis());
    for id in cluster.nodes.keys() {
        let mut reader = cluster.budget(*id).await;
        match get_event(&mut reader, "catch", "after:authorize").await {
            pb::event_lookup::Lookup::Unknown(_) => {}
            other => panic!("node {id}: the refused write left a trace: {other:?}"),
        }
    }
    let retried = client
        .authorize_hold(request)
        .await
        .expect("the same request once cluster time caught up")
        .into_inner();
    assert!(
        matches!(outcome(&retried), pb::outcome::Outcome::Authorized(_)),
        "{retried:?}"
    );
    assert_converged(&cluster.converged_digests().await);
    cluster.shutdown().await;
}

/// docs/spec.md §6: a node whose clock is off from a majority of its peers by more than
/// `max_clock_offset_ms` hands leadership away, does not campaign, and reports unhealthy; once
/// its clock agrees again it is healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_off_refuses_to_lead_and_reports_unhealthy() {
    let cluster = TestCluster::start(3).await;
    let skewed = cluster.wait_leader().await;
    cluster.nodes[&skewed].clock.set_offset_ms(5_000);
    let started = std::time::Instant::now();
    loop {
        let leader = cluster.leader_now();
        let unhealthy = !cluster.nodes[&skewed].health.is_healthy();
        if unhealthy && leader.is_some() && leader != Some(skewed) {
            break;
        }
        assert!(
            started.elapsed() < LIVENESS,
            "the skewed leader kept leading or stayed healthy"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    println!(
        "the skewed leader stepped down after {} ms",
        started.elapsed().as_millis()
    );
    let status = status_of(&cluster, skewed).await;
    assert!(!status.healthy, "Status reports the skewed node unhealthy");
    assert!(
        status.clock_offset_ms.abs() > 500,
        "Status reports the offset: {}",
        status.clock_offset_ms
    );
    // It does not win an election while skewed, even after a few election timeouts.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_ne!(
        cluster.leader_now(),
        Some(skewed),
        "a skewed node must not lead"
    );
    // The cluster still serves writes.
    let leader = cluster
        .wait_leader_among(
            &cluster
                .nodes
                .keys()
                .copied()
                .filter(|id| *id != skewed)
                .collect::<Vec<_>>(),
        )
        .await;
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("fam", "after-skew", 10))
        .await
        .expect("writes go on");
    cluster.nodes[&skewed].clock.set_offset_ms(0);
    let started = std::time::Instant::now();
    while !cluster.nodes[&skewed].health.is_healthy() {
        assert!(
            started.elapsed() < LIVENESS,
            "the node never became healthy again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    cluster.shutdown().await;
}

/// docs/spec.md §10: with no leader, a write is refused before proposing: UNAVAILABLE, definite
/// (not applied), with no leader hint to follow; nothing is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_with_no_leader_is_unavailable_and_definite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let faults = std::sync::Arc::new(tally_authority::faults::NetworkFaults::default());
    // Never initialized: this node knows no leader and never will on its own.
    let node = tally_authority::node::start(config(dir.path(), 1), faults)
        .await
        .expect("starts");
    let channel = tally_authority::testing::transport(dir.path(), "kernel")
        .endpoint(&node.local_addr.to_string())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = tally_api::pb::budget_client::BudgetClient::new(channel);
    let status = client
        .authorize_hold(authorize("fam", "h1", 10))
        .await
        .expect_err("no leader");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        definiteness(&status),
        Some(tally_api::status::Definiteness::Definite)
    );
    assert_eq!(detail(&status).kind, pb::ErrorKind::Unavailable as i32);
    assert!(
        tally_api::status::leader_hint(&status).is_none(),
        "no leader to point at"
    );
    let last = tally_authority::raft::types::current_metrics(&node.raft).last_log_index;
    assert_eq!(last, None, "nothing was appended");
    node.abort().await;
}

/// A workspace build compiles the failpoints into every node (the chaos crate turns the
/// feature on), so arming them must need more than the feature: only chaos-node enables them.
/// Were this node to arm the abort below, the capture would kill this test process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_not_chaos_node_refuses_to_arm_failpoints() {
    init_logs();
    let cluster = TestCluster::start(1).await;
    let leader = cluster.wait_leader().await;
    let refused = cluster
        .admin(leader)
        .await
        .set_failpoints(pb::SetFailpointsRequest {
            spec: "apply.after.capture_invocation=return".into(),
        })
        .await
        .expect_err("failpoints are refused");
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused:?}");
    assert!(refused.message().contains("chaos-node"), "{refused:?}");
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("fam-fp", "h1", 10))
        .await
        .expect("authorize");
    let captured = client
        .capture_invocation(capture("fam-fp", "h1", "a"))
        .await
        .expect("the capture applies and the node lives")
        .into_inner();
    assert!(matches!(
        captured.outcome.and_then(|o| o.outcome),
        Some(pb::outcome::Outcome::Captured(_))
    ));
    cluster.shutdown().await;
}

/// `ListHolds` and `ListUsages` across families, page by page over gRPC: the pages joined are
/// the whole list in order, each row names its family, only a full page has `next`, and a
/// malformed position is refused (definite) without touching anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reads_page_through_every_family() {
    init_logs();
    let cluster = TestCluster::start(1).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    for family in ["pages-a", "pages-b", "pages-c", "pages-d"] {
        for hold in ["h0", "h1", "h2"] {
            client
                .authorize_hold(authorize(family, hold, 5))
                .await
                .expect("authorize");
        }
    }
    let holds = |limit: u32, after: Option<pb::HoldPosition>| pb::ListHoldsRequest {
        limit,
        after,
        ..Default::default()
    };
    let whole = client
        .list_holds(holds(100, None))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(whole.holds.len(), 12);
    assert_eq!(whole.next, None, "a short page is the last");
    let mut paged = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = client
            .list_holds(holds(5, after))
            .await
            .expect("page")
            .into_inner();
        pages += 1;
        assert!(page.holds.len() <= 5);
        assert_eq!(page.next.is_some(), page.holds.len() == 5, "{page:?}");
        paged.extend(page.holds);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, 3, "5 + 5 + 2");
    assert_eq!(paged, whole.holds, "the pages joined are the whole list");
    let named: std::collections::BTreeSet<_> = paged
        .iter()
        .map(|h| (h.family_id.clone(), h.hold_id.clone()))
        .collect();
    assert_eq!(named.len(), 12, "each hold names its family: {named:?}");

    let usages = |limit: u32, after: Option<pb::UsagePosition>| pb::ListUsagesRequest {
        limit,
        after,
        ..Default::default()
    };
    let whole = client
        .list_usages(usages(100, None))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(whole.usages.len(), 4, "one account per family");
    let first = client
        .list_usages(usages(3, None))
        .await
        .expect("page")
        .into_inner();
    let rest = client
        .list_usages(usages(3, first.next.clone()))
        .await
        .expect("page")
        .into_inner();
    assert_eq!(rest.next, None);
    let joined: Vec<_> = first.usages.into_iter().chain(rest.usages).collect();
    assert_eq!(joined, whole.usages, "the pages joined are the whole list");
    let order: Vec<_> = joined
        .iter()
        .map(|u| {
            let updated = u.account.as_ref().expect("account").updated_at_ms;
            (std::cmp::Reverse(updated), u.family_id.clone())
        })
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "most recently updated first, then by family");
    let families: std::collections::BTreeSet<_> = order.iter().map(|(_, f)| f.as_str()).collect();
    assert_eq!(families.len(), 4, "each row names its family: {families:?}");

    let before = cluster.family_state("pages-a").await;
    let refused = [
        client
            .list_holds(holds(
                5,
                Some(pb::HoldPosition {
                    created_at_ms: 1,
                    family_id: String::new(),
                    hold_id: "h0".into(),
                }),
            ))
            .await
            .map(|_| ()),
        client
            .list_holds(holds(
                5,
                Some(pb::HoldPosition {
                    created_at_ms: 1,
                    family_id: "pages-a".into(),
                    hold_id: "x".repeat(513),
                }),
            ))
            .await
            .map(|_| ()),
        client
            .list_usages(usages(
                5,
                Some(pb::UsagePosition {
                    updated_at_ms: 1,
                    account: None,
                    family_id: "pages-a".into(),
                }),
            ))
            .await
            .map(|_| ()),
    ];
    for result in refused {
        let status = result.expect_err("a malformed position is refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert_eq!(
            definiteness(&status),
            Some(tally_api::status::Definiteness::Definite)
        );
        assert!(detail(&status).field.contains("after"), "{status:?}");
    }
    assert_eq!(cluster.family_state("pages-a").await, before);
    cluster.shutdown().await;
}

/// Every hold `ListHolds` answers for `family` (`None`: across families), page by page.
async fn all_holds(
    client: &mut tally_api::pb::budget_client::BudgetClient<tonic::transport::Channel>,
    family: Option<&str>,
) -> Vec<pb::Hold> {
    let mut holds = Vec::new();
    let mut after = None;
    loop {
        let page = client
            .list_holds(pb::ListHoldsRequest {
                family_id: family.map(str::to_owned),
                limit: 2,
                after,
                ..Default::default()
            })
            .await
            .expect("list holds")
            .into_inner();
        holds.extend(page.holds);
        match page.next {
            Some(next) => after = Some(next),
            None => return holds,
        }
    }
}

/// A node restarted from a snapshot restores every family passivated and uncounted in its
/// hold index, counts them in the background (`rebuild_hold_index`, off the router lock),
/// and ends with exactly the families that hold live holds; `ListHolds` across families
/// answers, page by page, what listing every family one by one answers, before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_from_a_snapshot_rebuilds_its_hold_index() {
    init_logs();
    let mut cluster = TestCluster::start_with(1, |c| c.max_live_families = 2).await;
    let leader = cluster.wait_leader().await;
    let mut client = cluster.budget(leader).await;
    for (family, hold, units) in [
        ("idx-a", "h0", 5),
        ("idx-a", "h1", 5),
        ("idx-b", "h0", 5),
        ("idx-c", "h0", 1_000), // over the per-call limit: denied, no hold
        ("idx-d", "h0", 5),
    ] {
        client
            .authorize_hold(authorize(family, hold, units))
            .await
            .expect("authorize");
    }
    client
        .capture_invocation(capture("idx-b", "h0", "a"))
        .await
        .expect("capture");
    let families = ["idx-a", "idx-b", "idx-c", "idx-d"];
    let mut one_by_one = Vec::new();
    for family in families {
        one_by_one.extend(all_holds(&mut client, Some(family)).await);
    }
    one_by_one.sort_by(|a, b| {
        (a.created_at_ms, &a.family_id, &a.hold_id).cmp(&(
            b.created_at_ms,
            &b.family_id,
            &b.hold_id,
        ))
    });
    assert_eq!(one_by_one.len(), 4);
    assert_eq!(all_holds(&mut client, None).await, one_by_one);
    let holding = ["idx-a", "idx-b", "idx-d"]
        .map(tally_ledger::FamilyId::from)
        .to_vec();
    assert_eq!(
        cluster.nodes[&leader]
            .router
            .lock()
            .await
            .families_with_live_holds(),
        holding
    );

    let applied =
        tally_authority::raft::types::current_metrics(&cluster.nodes[&leader].raft).last_applied;
    cluster
        .admin(leader)
        .await
        .trigger_snapshot(pb::TriggerSnapshotRequest {})
        .await
        .expect("trigger snapshot");
    let start = std::time::Instant::now();
    while tally_authority::raft::types::current_metrics(&cluster.nodes[&leader].raft).snapshot
        < applied
    {
        assert!(start.elapsed() < LIVENESS, "no snapshot");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    drop(client);
    cluster.kill(leader).await;
    // A kill returns once the node has let its log go, so it starts again at once.
    let config = cluster.configs[&leader].clone();
    let node = tally_authority::node::start(config, cluster.faults.clone())
        .await
        .unwrap_or_else(|error| panic!("the killed node does not start again at once: {error}"));
    cluster.nodes.insert(leader, node);
    let leader = cluster.wait_leader().await;
    let router = cluster.nodes[&leader].router.clone();
    {
        let router = router.lock().await;
        assert_eq!(router.family_count(), 4);
        assert_eq!(
            router.live_actors(),
            0,
            "restored from the snapshot, not replayed"
        );
    }
    let start = std::time::Instant::now();
    while router.lock().await.families_uncounted() > 0 {
        assert!(start.elapsed() < LIVENESS, "the hold index was not rebuilt");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    {
        let router = router.lock().await;
        assert_eq!(router.families_with_live_holds(), holding);
        assert_eq!(
            router.live_actors(),
            0,
            "counting decodes nothing into actors"
        );
    }
    let mut client = cluster.budget(leader).await;
    assert_eq!(all_holds(&mut client, None).await, one_by_one);
    cluster.shutdown().await;
}

/// The parameters in force on node `id`, as `Admin.Status` reports them.
async fn params_on(cluster: &TestCluster, id: u64) -> pb::ClusterParams {
    status_of(cluster, id)
        .await
        .params
        .expect("status carries the parameters")
}

/// Issue 22: `SetParams` validates each named field's range and refuses an empty change,
/// INVALID_ARGUMENT and definite, naming the field and the range; nothing is proposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_params_refuses_out_of_range_and_empty_changes_and_proposes_nothing() {
    init_logs();
    let cluster = TestCluster::start(1).await;
    let leader = cluster.wait_leader().await;
    let mut admin = cluster.admin(leader).await;
    let before = params_on(&cluster, leader).await;
    let last = || {
        tally_authority::raft::types::current_metrics(&cluster.nodes[&leader].raft).last_log_index
    };
    let appended = last();
    let refusals = [
        (
            pb::SetParamsRequest {
                retention_ms: Some(u64::MAX),
                max_clock_step_ms: None,
                preferred_leader_regions: None,
            },
            "retention_ms must be within 1000..=31536000000 ms",
        ),
        (
            pb::SetParamsRequest {
                retention_ms: Some(999),
                max_clock_step_ms: None,
                preferred_leader_regions: None,
            },
            "retention_ms must be within 1000..=31536000000 ms",
        ),
        (
            pb::SetParamsRequest {
                retention_ms: Some(3_600_000),
                max_clock_step_ms: Some(u64::MAX),
                preferred_leader_regions: None,
            },
            "max_clock_step_ms must be within 1000..=600000 ms",
        ),
        (
            pb::SetParamsRequest {
                retention_ms: None,
                max_clock_step_ms: Some(0),
                preferred_leader_regions: None,
            },
            "max_clock_step_ms must be within 1000..=600000 ms",
        ),
        (
            pb::SetParamsRequest::default(),
            "params name at least one parameter",
        ),
    ];
    for (request, expected) in refusals {
        assert_params_refused(&mut admin, request, &[expected]).await;
    }
    assert_eq!(last(), appended, "nothing was proposed");
    assert_eq!(params_on(&cluster, leader).await, before);

    // In range, at the bounds: accepted and committed.
    let reply = admin
        .set_params(pb::SetParamsRequest {
            retention_ms: Some(1_000),
            max_clock_step_ms: Some(600_000),
            preferred_leader_regions: None,
        })
        .await
        .expect("in range")
        .into_inner();
    let expected = pb::ClusterParams {
        retention_ms: 1_000,
        max_clock_step_ms: 600_000,
        preferred_leader_regions: Vec::new(),
        rules_version: tally_ledger::CURRENT_RULES,
    };
    assert_eq!(reply.params, Some(expected.clone()));
    assert_eq!(params_on(&cluster, leader).await, expected);
    cluster.shutdown().await;
}

/// Issue 22: two changes of different fields in flight at once both hold. Each entry carries
/// only its named field and applies on top of the parameters in force at apply time; a
/// whole struct read before proposing would let the second change revert the first. Holding
/// the leader's router lock keeps both proposals unapplied until both are in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_param_changes_of_different_fields_both_hold() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let before = params_on(&cluster, leader).await;
    assert_ne!(before.retention_ms, 3_600_000);
    assert_ne!(before.max_clock_step_ms, 2_000);
    let raft = cluster.nodes[&leader].raft.clone();
    let appended = tally_authority::raft::types::current_metrics(&raft)
        .last_log_index
        .unwrap_or(0);

    let router = cluster.nodes[&leader].router.lock().await;
    let mut retention_admin = cluster.admin(leader).await;
    let mut step_admin = cluster.admin(leader).await;
    let retention = tokio::spawn(async move {
        retention_admin
            .set_params(pb::SetParamsRequest {
                retention_ms: Some(3_600_000),
                max_clock_step_ms: None,
                preferred_leader_regions: None,
            })
            .await
    });
    let step = tokio::spawn(async move {
        step_admin
            .set_params(pb::SetParamsRequest {
                retention_ms: None,
                max_clock_step_ms: Some(2_000),
                preferred_leader_regions: None,
            })
            .await
    });
    // Both in the log, neither applied (bounded: a node that reads the parameters before
    // proposing is stuck on the lock, and the test must still end and fail).
    let start = std::time::Instant::now();
    while tally_authority::raft::types::current_metrics(&raft)
        .last_log_index
        .unwrap_or(0)
        < appended + 2
        && start.elapsed() < std::time::Duration::from_secs(2)
    {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(router);
    for call in [retention, step] {
        call.await.expect("joins").expect("both changes commit");
    }
    let expected = pb::ClusterParams {
        retention_ms: 3_600_000,
        max_clock_step_ms: 2_000,
        preferred_leader_regions: Vec::new(),
        rules_version: tally_ledger::CURRENT_RULES,
    };
    cluster.converged_digests().await;
    for id in cluster.nodes.keys() {
        assert_eq!(
            params_on(&cluster, *id).await,
            expected,
            "node {id}: neither change reverted the other"
        );
    }
    cluster.shutdown().await;
}

/// Issue 22: beyond `max_in_flight_requests`, a `Budget` request is refused at once with a
/// definite UNAVAILABLE and nothing is proposed for it, while the admitted ones are answered
/// and the node serves again right after. The leader's router lock holds the admitted
/// requests in flight (proposed, not applied), so the flood meets a full node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_beyond_the_in_flight_limit_is_shed_at_once_and_definitely() {
    const LIMIT: usize = 4;
    const FLOOD: usize = 36;
    init_logs();
    let cluster = TestCluster::start_with(1, |c| c.max_in_flight_requests = LIMIT).await;
    let leader = cluster.wait_leader().await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(cluster.budget(leader).await);
    }
    clients[0]
        .authorize_hold(authorize("flood", "warm", 1))
        .await
        .expect("the family exists before the flood");

    let router = cluster.nodes[&leader].router.lock().await;
    let (answers_tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..FLOOD {
        let mut client = clients[i % clients.len()].clone();
        let answers_tx = answers_tx.clone();
        tokio::spawn(async move {
            let hold = format!("h{i}");
            let result = client.authorize_hold(authorize("flood", &hold, 1)).await;
            let _ = answers_tx.send((hold, result));
        });
    }
    drop(answers_tx);
    // Every refusal arrives while the admitted requests are still stuck behind the lock: the
    // flood was never queued behind them.
    let mut shed = Vec::new();
    while shed.len() < FLOOD - LIMIT {
        let (hold, result) = tokio::time::timeout(LIVENESS, answers.recv())
            .await
            .expect("refusals arrive while the admitted requests are in flight")
            .expect("an answer");
        let status = result.expect_err("only refusals can arrive while apply is held");
        assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "{hold}: {status:?}"
        );
        assert_eq!(
            definiteness(&status),
            Some(tally_api::status::Definiteness::Definite),
            "{hold}: a shed request was certainly not applied"
        );
        assert_eq!(detail(&status).kind, pb::ErrorKind::Unavailable as i32);
        shed.push(hold);
    }
    drop(router);
    let mut admitted = Vec::new();
    while let Some((hold, result)) = answers.recv().await {
        let decision = result
            .unwrap_or_else(|s| panic!("{hold}: admitted, so answered: {s:?}"))
            .into_inner();
        assert!(matches!(
            outcome(&decision),
            pb::outcome::Outcome::Authorized(_)
        ));
        admitted.push(hold);
    }
    assert_eq!(admitted.len(), LIMIT, "exactly the limit was admitted");
    let node = &cluster.nodes[&leader];
    assert_eq!(node.metrics.shed_requests(), (FLOOD - LIMIT) as u64);
    let scrape = cluster_support::scrape(&cluster, leader).await;
    assert!(
        scrape.contains(&format!("\ntally_requests_shed_total {}\n", FLOOD - LIMIT)),
        "{scrape}"
    );

    // Nothing was proposed for a shed request; the node serves again at once.
    let client = &mut clients[1];
    for hold in &shed {
        let lookup = get_event(client, "flood", &format!("{hold}:authorize")).await;
        assert!(
            matches!(lookup, pb::event_lookup::Lookup::Unknown(_)),
            "{hold} was shed, so never applied: {lookup:?}"
        );
    }
    for hold in &admitted {
        let lookup = get_event(client, "flood", &format!("{hold}:authorize")).await;
        assert!(
            matches!(lookup, pb::event_lookup::Lookup::Applied(_)),
            "{hold}: {lookup:?}"
        );
    }
    client
        .authorize_hold(authorize("flood", "after", 1))
        .await
        .expect("the node serves after the flood");
    cluster.shutdown().await;
}

/// Issue 22: a client that opens a request and never finishes sending it holds an in-flight
/// slot only until `request_timeout_ms`: it is then answered UNKNOWN (indefinite: nothing is
/// known of a request never read), the slot is free, and other clients are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_request_holds_its_slot_only_until_the_request_timeout() {
    init_logs();
    let cluster = TestCluster::start_with(1, |c| {
        c.max_in_flight_requests = 2;
        c.propose_timeout_ms = 500;
        c.request_timeout_ms = 2_000;
    })
    .await;
    let leader = cluster.wait_leader().await;
    let channel = cluster.channel(leader, "kernel").await;
    let hang = |channel: tonic::transport::Channel| async move {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("ready");
        let request = tonic::Request::new(futures_util::stream::pending::<()>());
        grpc.client_streaming(
            request,
            tonic::codegen::http::uri::PathAndQuery::from_static("/tally.v1.Budget/GetUsage"),
            Silent,
        )
        .await
    };
    let hanging = [
        tokio::spawn(hang(channel.clone())),
        tokio::spawn(hang(channel.clone())),
    ];
    let mut client = cluster.budget(leader).await;
    let metrics = cluster.nodes[&leader].metrics.clone();
    // While both hang, every slot is taken: another request is refused at once, not queued.
    let start = std::time::Instant::now();
    while metrics.in_flight_requests() < 2 {
        assert!(
            start.elapsed() < LIVENESS,
            "the hanging requests never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let status = client
        .authorize_hold(authorize("hang", "h1", 1))
        .await
        .expect_err("every slot is held by a hanging request");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        definiteness(&status),
        Some(tally_api::status::Definiteness::Definite)
    );
    for call in hanging {
        let status = tokio::time::timeout(LIVENESS, call)
            .await
            .expect("a hanging request is answered at its timeout")
            .expect("joins")
            .expect_err("answered with an error");
        assert_eq!(status.code(), tonic::Code::Unknown, "{status:?}");
        assert_eq!(
            definiteness(&status),
            Some(tally_api::status::Definiteness::Indefinite)
        );
    }
    assert_eq!(metrics.expired_requests(), 2);
    client
        .authorize_hold(authorize("hang", "h2", 1))
        .await
        .expect("served once the hanging requests timed out");
    cluster.shutdown().await;
}

/// Issue 22: beyond `max_connections` a connection is closed as soon as it is accepted, and
/// one is served again once another closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once() {
    init_logs();
    let cluster = TestCluster::start_with(1, |c| c.max_connections = 2).await;
    let leader = cluster.wait_leader().await;
    let metrics = cluster.nodes[&leader].metrics.clone();
    let address = cluster.address(leader);
    let transport = cluster.transport("kernel");
    let wait_open = |count: u64| {
        let metrics = metrics.clone();
        async move {
            let start = std::time::Instant::now();
            while metrics.open_connections() != count {
                assert!(
                    start.elapsed() < LIVENESS,
                    "{} connections open, expected {count}",
                    metrics.open_connections()
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    wait_open(0).await;
    let first = tokio::net::TcpStream::connect(&address).await.expect("tcp");
    let _second = tokio::net::TcpStream::connect(&address).await.expect("tcp");
    wait_open(2).await;

    let refused = async {
        let channel = transport
            .endpoint(&address)
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = tally_api::pb::budget_client::BudgetClient::new(channel);
        client
            .authorize_hold(authorize("cap", "h1", 1))
            .await
            .map_err(|e| e.to_string())
    };
    let result = tokio::time::timeout(LIVENESS, refused)
        .await
        .expect("closed at once, not left waiting");
    assert!(
        result.is_err(),
        "a third connection is not served: {result:?}"
    );
    assert!(metrics.refused_connections() >= 1);

    drop(first);
    wait_open(1).await;
    let mut client = cluster.budget(leader).await;
    client
        .authorize_hold(authorize("cap", "h2", 1))
        .await
        .expect("served once a connection closed");
    cluster.shutdown().await;
}

/// docs/spec.md §5.5, "Rules versions": a member configured with a lower `max_rules_version`
/// reports it in its clock probes and status, and the leader keeps the rules where they are
/// until that member lets them rise (here: restarted without the setting). The pure choice
/// is `rules_raise.rs`'s unit test; this is the wiring, from config through probe to the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_holds_the_rules_back_keeps_them_until_it_lets_them_rise() {
    use tally_ledger::{CURRENT_RULES, LEGACY_RULES};
    init_logs();
    let held_by = 3;
    let mut cluster = TestCluster::start_with(3, |config| {
        if config.node_id == held_by {
            config.max_rules_version = LEGACY_RULES;
        }
    })
    .await;
    let leader = cluster.wait_leader().await;

    // Every member reports what it knows: in its status, and (to the leader) in its probes.
    for id in 1..=3 {
        let status = status_of(&cluster, id).await;
        let expected = if id == held_by {
            LEGACY_RULES
        } else {
            CURRENT_RULES
        };
        assert_eq!(status.rules_known, expected, "node {id}'s status");
    }
    let peers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let addresses: Vec<String> = peers.iter().map(|id| cluster.address(*id)).collect();
    let start = std::time::Instant::now();
    let reported = loop {
        let reported = cluster.nodes[&leader].health.peers_rules_known(&addresses);
        if reported.iter().all(Option::is_some) {
            break reported;
        }
        assert!(
            start.elapsed() < LIVENESS,
            "the leader never heard its peers' probes"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    for (id, known) in peers.iter().zip(&reported) {
        let expected = if *id == held_by {
            LEGACY_RULES
        } else {
            CURRENT_RULES
        };
        assert_eq!(*known, Some(expected), "node {id} as the leader heard it");
    }

    // The leader has looked several times since hearing every member; the rules stay.
    tokio::time::sleep(tally_authority::node::rules_raise::CHECK_EVERY * 3).await;
    for id in 1..=3 {
        assert_eq!(
            params_on(&cluster, id).await.rules_version,
            LEGACY_RULES,
            "node {id}: the rules rose past what node {held_by} lets them"
        );
    }

    // Restarted without the setting, the member lets them rise, and the leader raises them.
    cluster.kill(held_by).await;
    cluster
        .configs
        .get_mut(&held_by)
        .expect("its config")
        .max_rules_version = CURRENT_RULES;
    cluster.restart(held_by).await;
    cluster.wait_rules(CURRENT_RULES).await;
    cluster.shutdown().await;
}
