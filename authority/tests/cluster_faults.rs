//! In-process 3-node clusters under faults: the leader killed in the middle of a capture
//! stream, and a leader isolated from its peers (docs/spec.md §10, §11.6–8).

mod cluster_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_support::*;
use tally_api::pb;
use tally_api::status::Definiteness;

type Record = (pb::command::Command, Result<pb::Decision, tonic::Status>);

/// A capture that applied answers `Captured` once and `AlreadyCaptured` (owned by the same
/// attempt, same index) on every replay (docs/spec.md §5.2): the same decision.
fn normalized(answer: Answer) -> Answer {
    match answer {
        Answer::Decision(pb::outcome::Outcome::Captured(c), Some(index)) => Answer::Decision(
            pb::outcome::Outcome::AlreadyCaptured(pb::AlreadyCaptured {
                capture_event_id: format!("{}:capture", c.hold_id),
                hold_id: c.hold_id,
                owner_attempt_id: c.attempt_id,
                capture_commit_index: index,
            }),
            Some(index),
        ),
        other => other,
    }
}

/// Whether a replay on a serving leader is a single definite outcome.
fn definite(answer: &Result<tonic::Response<pb::Decision>, tonic::Status>) -> bool {
    match answer {
        Ok(_) => true,
        Err(status) => is_definite_refusal(status) && status.code() != tonic::Code::Unavailable,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_capture_stream_loses_no_acknowledged_decision() {
    init_logs();
    let mut cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    let acked = Arc::new(AtomicUsize::new(0));

    // Four concurrent clients, spread over all three nodes (two through followers, which
    // forward), each authorizing and capturing its own holds.
    let mut clients = Vec::new();
    for k in 0..4u64 {
        // Each client starts on its own node and, after a failure, backs off briefly and
        // moves on to the next node (as a client that lost its connection would).
        let addresses: Vec<String> = (0..ids.len())
            .map(|i| cluster.address(ids[(k as usize + i) % ids.len()]))
            .collect();
        let acked = acked.clone();
        let transport = cluster.transport("kernel");
        clients.push(tokio::spawn(async move {
            let mut at = 0;
            let mut client = budget_at(&transport, &addresses[at])
                .await
                .expect("connect");
            let family = format!("kill-{}", k % 2);
            let mut records: Vec<Record> = Vec::new();
            for j in 0..30 {
                let hold = format!("c{k}-h{j}");
                let commands = [
                    pb::command::Command::AuthorizeHold(authorize(&family, &hold, 7)),
                    pb::command::Command::CaptureInvocation(capture(
                        &family,
                        &hold,
                        &format!("att-{k}-{j}"),
                    )),
                ];
                for command in commands {
                    let result = send(&mut client, command.clone()).await;
                    let failed = result.is_err();
                    if !failed {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    records.push((command, result.map(|r| r.into_inner())));
                    if failed {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        at = (at + 1) % addresses.len();
                        if let Some(next) = budget_at(&transport, &addresses[at]).await {
                            client = next;
                        }
                    }
                }
            }
            records
        }));
    }

    let start = Instant::now();
    while acked.load(Ordering::Relaxed) < 40 {
        assert!(start.elapsed() < LIVENESS, "the clients made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acked_at_kill = acked.load(Ordering::Relaxed);
    let killed_at = Instant::now();
    cluster.kill(leader).await;
    let survivors: Vec<u64> = ids.iter().copied().filter(|id| *id != leader).collect();
    let new_leader = cluster.wait_leader_among(&survivors).await;
    let election = killed_at.elapsed();
    println!(
        "killed leader {leader} after {acked_at_kill} acknowledged writes; node {new_leader} \
         serves after {} ms",
        election.as_millis()
    );

    let mut records: Vec<Record> = Vec::new();
    for client in clients {
        records.extend(client.await.expect("client task"));
    }
    println!(
        "clients done {} ms after the kill",
        killed_at.elapsed().as_millis()
    );
    let (ok, lost): (Vec<&Record>, Vec<&Record>) = records.iter().partition(|(_, r)| r.is_ok());
    let lost_indefinite = lost
        .iter()
        .filter(|(_, r)| r.as_ref().err().and_then(definiteness) != Some(Definiteness::Definite))
        .count();
    println!(
        "{} writes: {} acknowledged, {} failed ({} of them indefinite)",
        records.len(),
        ok.len(),
        lost.len(),
        lost_indefinite
    );
    assert!(
        ok.len() > acked_at_kill,
        "writes went on after the failover"
    );

    // Every acknowledged decision is committed, with the same commit index.
    let mut client = cluster.budget(new_leader).await;
    for (command, result) in &ok {
        let decision = result.as_ref().expect("acknowledged");
        let (family, event_id) = ids_of(command);
        let seen = applied_index(&mut client, &family, &event_id).await;
        assert_eq!(
            seen, decision.budget_commit_index,
            "acknowledged {event_id} lost or moved after the failover"
        );
    }
    println!(
        "acknowledged checked {} ms after the kill",
        killed_at.elapsed().as_millis()
    );
    // Every unacknowledged one, replayed with the same event id, gets one definite answer,
    // and a second replay repeats it.
    let mut applied_late = 0;
    for (command, first) in &lost {
        let replay = send(&mut client, command.clone()).await;
        assert!(
            definite(&replay),
            "replay of {:?} (first: {first:?}) is not definite: {replay:?}",
            ids_of(command)
        );
        let again = send(&mut client, command.clone()).await;
        assert_eq!(
            normalized(Answer::of(&replay)),
            normalized(Answer::of(&again)),
            "a second replay of {:?} answered differently",
            ids_of(command)
        );
        if let Ok(reply) = &replay {
            if reply.get_ref().replayed {
                applied_late += 1;
            }
        }
    }
    println!(
        "{applied_late} of the unacknowledged writes had applied before the failover (replay \
         answered from the stored outcome)"
    );

    println!(
        "replays checked {} ms after the kill",
        killed_at.elapsed().as_millis()
    );
    // The killed node restarts from its data dir and catches up.
    cluster.restart(leader).await;
    let digests = cluster.converged_digests().await;
    assert_eq!(digests.len(), 3);
    assert_converged(&digests);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_never_acknowledges_and_lost_outcomes_resolve() {
    init_logs();
    let mut cluster = TestCluster::start_with(3, |c| c.propose_timeout_ms = 1_000).await;
    let old = cluster.wait_leader().await;
    let mut on_old = cluster.budget(old).await;
    on_old
        .authorize_hold(authorize("iso", "h0", 10))
        .await
        .expect("a write before the partition");

    cluster.faults.isolate(old);
    let cut_at = Instant::now();
    // The old leader still believes it leads: what it proposes cannot commit.
    let mut lost = Vec::new();
    for i in 0..3 {
        let request = authorize("iso", &format!("p{i}"), 10);
        let event_id = request.header.as_ref().unwrap().event_id.clone();
        let status = on_old
            .authorize_hold(request.clone())
            .await
            .expect_err("an isolated leader must never acknowledge a write");
        println!(
            "write {i} on the isolated leader: {:?} {}",
            status.code(),
            status.message()
        );
        match status.code() {
            tonic::Code::Unknown => {
                assert_eq!(definiteness(&status), Some(Definiteness::Indefinite));
                let d = detail(&status);
                assert_eq!(d.kind, pb::ErrorKind::Unknown as i32);
                assert_eq!(
                    d.event_id, event_id,
                    "UNKNOWN names the event id to resolve"
                );
            }
            tonic::Code::Unavailable => {
                assert_eq!(definiteness(&status), Some(Definiteness::Definite));
            }
            other => panic!("an isolated leader answered {other:?}: {status:?}"),
        }
        lost.push((request, status.code()));
    }
    assert_eq!(
        lost[0].1,
        tonic::Code::Unknown,
        "the first write was proposed on the old leader, so its outcome is unknown"
    );

    // The majority elects a leader and goes on serving.
    let majority: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|id| *id != old)
        .collect();
    let new_leader = cluster.wait_leader_among(&majority).await;
    println!(
        "node {new_leader} leads the majority {} ms after the partition",
        cut_at.elapsed().as_millis()
    );
    assert_ne!(new_leader, old);
    let mut on_new = cluster.budget(new_leader).await;
    let during = on_new
        .authorize_hold(authorize("iso", "q1", 10))
        .await
        .expect("the majority serves")
        .into_inner();

    cluster.faults.heal();
    let leader = cluster.wait_leader().await;
    assert_ne!(leader, old, "a deposed leader with a stale log cannot win");
    let mut client = cluster.budget(leader).await;
    assert_eq!(
        applied_index(&mut client, "iso", "q1:authorize").await,
        during.budget_commit_index
    );
    for (request, code) in &lost {
        let event_id = request.header.as_ref().unwrap().event_id.clone();
        let original = pb::command::Command::AuthorizeHold(request.clone());
        let resolved = client
            .resolve_event(resolve(original.clone()))
            .await
            .expect("resolve")
            .into_inner();
        let resolution = match outcome(&resolved) {
            pb::outcome::Outcome::Resolved(r) => r.resolution.clone().expect("a resolution"),
            other => panic!("resolve answered {other:?}"),
        };
        let replay = send(&mut client, original).await;
        match resolution {
            pb::resolved::Resolution::NotApplied(_) => {
                let status = replay.expect_err("a tombstoned command never applies");
                assert_eq!(status.code(), tonic::Code::FailedPrecondition);
                assert_eq!(detail(&status).reason, "event_aborted");
                assert!(matches!(
                    get_event(&mut client, "iso", &event_id).await,
                    pb::event_lookup::Lookup::Tombstoned(_)
                ));
            }
            pb::resolved::Resolution::Applied(decision) => {
                let replay = replay.expect("an applied command replays").into_inner();
                assert_eq!(replay.budget_commit_index, decision.budget_commit_index);
            }
        }
        // The old leader's entries were never replicated, so the majority's log replaced
        // them: none of these writes may exist.
        println!("{event_id} (answered {code:?} while isolated) resolved as not applied");
    }
    for (request, _) in &lost {
        let event_id = &request.header.as_ref().unwrap().event_id;
        assert!(
            matches!(
                get_event(&mut client, "iso", event_id).await,
                pb::event_lookup::Lookup::Tombstoned(_)
            ),
            "{event_id} applied although the isolated leader could not commit it"
        );
    }
    let digests = cluster.converged_digests().await;
    assert_eq!(digests.len(), 3);
    assert_converged(&digests);
    let _ = &mut cluster;
    cluster.shutdown().await;
}
