//! docs/spec.md §5.6 end to end: a follower's data dir fills past its small quota, its disk
//! watcher has the `NoSpace` alarm raised through the log (the follower asks the leader on the
//! peer port), every replica refuses new exposure alike with RESOURCE_EXHAUSTED (definite,
//! nothing applied) while commands on existing holds, ResolveEvent and reads go on; then the
//! space comes back, an operator clears the alarm through Admin, and the same event id applies.

mod cluster_support;

use std::time::{Duration, Instant};

use cluster_support::*;
use tally_api::pb;
use tally_api::status::Definiteness;

/// Small, so the ballast is small; sparse anyway (the watcher counts a file's length).
const QUOTA_BYTES: u64 = 64 * 1024 * 1024;
const CHECK_INTERVAL_MS: u64 = 50;

/// Waits until every node has applied an alarm state that satisfies `done`.
async fn wait_alarms(cluster: &TestCluster, what: &str, done: impl Fn(&[(u64, String)]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = true;
        for node in cluster.nodes.values() {
            let router = node.router.lock().await;
            let raised: Vec<(u64, String)> = router
                .alarms()
                .iter()
                .map(|(_, id, alarm)| (id, alarm.reason.clone()))
                .collect();
            all &= done(&raised);
        }
        if all {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not reached in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_follower_raises_no_space_through_the_log_and_an_operator_clears_it() {
    init_logs();
    let cluster = TestCluster::start_with(3, |config| {
        config.disk_quota_bytes = QUOTA_BYTES;
        config.disk_check_interval_ms = CHECK_INTERVAL_MS;
    })
    .await;
    let leader = cluster.wait_leader().await;
    let follower = a_follower(&cluster, leader);
    let mut client = cluster.budget(leader).await;
    let mut via_follower = cluster.budget(follower).await;
    let old = authorize("fam", "old", 10);
    client
        .authorize_hold(old.clone())
        .await
        .expect("a hold before the alarm");

    // Fill the follower's data dir past 90% of its quota.
    let ballast = cluster.configs[&follower].data_dir.join("ballast");
    std::fs::File::create(&ballast)
        .and_then(|file| file.set_len(QUOTA_BYTES))
        .expect("ballast");
    wait_alarms(&cluster, "NoSpace raised on every node", |raised| {
        raised.len() == 1 && raised[0].0 == follower
    })
    .await;
    let listed = cluster
        .admin(leader)
        .await
        .list_alarms(pb::ListAlarmsRequest {})
        .await
        .expect("list alarms")
        .into_inner();
    assert_eq!(listed.alarms.len(), 1, "{listed:?}");
    assert_eq!(listed.alarms[0].kind, pb::AlarmKind::NoSpace as i32);
    assert_eq!(listed.alarms[0].node_id, follower);
    assert!(listed.alarms[0].reason.contains("quota"), "{listed:?}");
    let status = status_of(&cluster, follower).await;
    assert_eq!(status.alarms, listed.alarms, "status shows the alarm");
    assert!(status.healthy, "a node with NoSpace raised still serves");
    let health_detail =
        tally_authority::cli::alarm_detail(cluster.channel(leader, "operator").await).await;
    assert!(
        health_detail.contains(&format!("NO_SPACE raised by node {follower}")),
        "the healthcheck line names the alarm: {health_detail}"
    );
    let metrics = scrape(&cluster, follower).await;
    assert!(
        metrics.contains("tally_alarms_raised{kind=\"no_space\"} 1"),
        "{metrics}"
    );
    let data_dir_bytes = count(&metrics, "tally_data_dir_bytes");
    assert!(data_dir_bytes >= QUOTA_BYTES, "{data_dir_bytes}");
    let digests_raised = cluster.converged_digests().await;
    assert_converged(&digests_raised);

    // New exposure is refused, definitely, on the leader and through a follower alike.
    let before = applied_index(&mut client, "fam", "new:authorize").await;
    assert_eq!(before, None);
    let new = authorize("fam", "new", 10);
    for (name, result) in [
        ("leader", client.authorize_hold(new.clone()).await),
        ("follower", via_follower.authorize_hold(new.clone()).await),
    ] {
        let status = result.expect_err("refused while NoSpace is raised");
        assert_eq!(
            status.code(),
            tonic::Code::ResourceExhausted,
            "{name}: {status:?}"
        );
        assert_eq!(
            definiteness(&status),
            Some(Definiteness::Definite),
            "{name}"
        );
        assert_eq!(
            detail(&status).kind,
            pb::ErrorKind::NoSpace as i32,
            "{name}"
        );
    }
    let increment = client
        .try_increment(pb::TryIncrementRequest {
            header: Some(header("fam", "inc")),
            limits: Some(limits()),
        })
        .await
        .expect_err("an increment opens exposure");
    assert_eq!(increment.code(), tonic::Code::ResourceExhausted);
    assert!(
        matches!(
            get_event(&mut via_follower, "fam", "new:authorize").await,
            pb::event_lookup::Lookup::Unknown(_)
        ),
        "nothing of the refused command was recorded"
    );

    // Existing holds go on, lost acknowledgements resolve, reads are served.
    let captured = client
        .capture_invocation(capture("fam", "old", "a"))
        .await
        .expect("a capture on an existing hold applies")
        .into_inner();
    assert!(matches!(
        outcome(&captured),
        pb::outcome::Outcome::Captured(_)
    ));
    let resolved = via_follower
        .resolve_event(resolve(pb::command::Command::AuthorizeHold(old)))
        .await
        .expect("ResolveEvent is answered")
        .into_inner();
    assert!(
        matches!(outcome(&resolved), pb::outcome::Outcome::Resolved(_)),
        "{resolved:?}"
    );
    assert!(applied_index(&mut via_follower, "fam", "old:capture")
        .await
        .is_some());

    // Space comes back; the alarm stays until an operator clears it.
    std::fs::remove_file(&ballast).expect("remove ballast");
    tokio::time::sleep(Duration::from_millis(CHECK_INTERVAL_MS * 6)).await;
    wait_alarms(&cluster, "still raised", |raised| raised.len() == 1).await;
    let refused = cluster
        .admin(leader)
        .await
        .clear_alarm(pb::ClearAlarmRequest {
            kind: pb::AlarmKind::Unspecified as i32,
            node_id: None,
        })
        .await
        .expect_err("a clear names its kind");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    let cleared = cluster
        .admin(leader)
        .await
        .clear_alarm(pb::ClearAlarmRequest {
            kind: pb::AlarmKind::NoSpace as i32,
            node_id: None,
        })
        .await
        .expect("an operator clears the alarm")
        .into_inner();
    assert!(cleared.log_index.is_some(), "{cleared:?}");
    wait_alarms(&cluster, "cleared on every node", |raised| {
        raised.is_empty()
    })
    .await;

    // The same event id now applies, fresh.
    let retried = client
        .authorize_hold(new)
        .await
        .expect("applies once cleared")
        .into_inner();
    assert!(matches!(
        outcome(&retried),
        pb::outcome::Outcome::Authorized(_)
    ));
    assert!(!retried.replayed, "applied now, not a replay of a refusal");
    // Space is back, so no check raises it again.
    tokio::time::sleep(Duration::from_millis(CHECK_INTERVAL_MS * 6)).await;
    wait_alarms(&cluster, "not raised again", |raised| raised.is_empty()).await;
    assert_converged(&cluster.converged_digests().await);
    cluster.shutdown().await;
}

/// The peer port's `RaiseAlarm` takes a raise only from the node it names, and never a clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_raises_only_its_own_alarm() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let follower = a_follower(&cluster, leader);
    let other = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != follower)
        .expect("a third node");
    let mut raft = tally_api::pb::raft_client::RaftClient::new(
        peer_channel(&cluster, &format!("node-{follower}"), leader).await,
    );
    use tally_authority::families::{AlarmChange, AlarmKind};
    let send = |change: AlarmChange| tally_api::pb::RaftBytes {
        payload: tally_api::encode_raft(&change).expect("encodes").into(),
    };
    let forged = raft
        .raise_alarm(send(AlarmChange::raise(
            AlarmKind::NoSpace,
            other,
            "forged",
        )))
        .await
        .expect_err("a raise in another node's name");
    assert_eq!(forged.code(), tonic::Code::PermissionDenied, "{forged:?}");
    let clear = raft
        .raise_alarm(send(AlarmChange::Clear {
            kind: AlarmKind::NoSpace,
            node_id: None,
        }))
        .await
        .expect_err("a peer does not clear");
    assert_eq!(clear.code(), tonic::Code::PermissionDenied, "{clear:?}");
    let own = raft
        .raise_alarm(send(AlarmChange::raise(
            AlarmKind::NoSpace,
            follower,
            "own",
        )))
        .await
        .expect("its own raise");
    let reply: tally_authority::node::proposer::ForwardReply =
        tally_api::decode_raft(&own.into_inner().payload).expect("decodes");
    reply.expect("proposed");
    wait_alarms(&cluster, "raised", |raised| {
        raised == [(follower, "own".to_owned())]
    })
    .await;
    cluster.shutdown().await;
}
