//! docs/architecture.md "Security", attacked from outside a running cluster: every caller
//! without the right certificate is refused before anything is proposed, and the log shows
//! it (the journal, `applied_index`, does not move).

mod cluster_support;

use cluster_support::*;
use tally_api::pb;
use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::budget_client::BudgetClient;
use tally_api::pb::raft_client::RaftClient;
use tally_api::status::Definiteness;
use tally_tls::{CertAuthority, Namespace, Role, Transport};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

/// The last index every node applied, once every node has applied the leader's log:
/// refusals must leave it where it was.
async fn settled(cluster: &TestCluster, leader: u64) -> Vec<Option<u64>> {
    let last = tally_authority::raft::types::current_metrics(&cluster.nodes[&leader].raft)
        .last_log_index
        .unwrap_or(0);
    cluster.wait_applied(last).await;
    applied(cluster)
}

fn applied(cluster: &TestCluster) -> Vec<Option<u64>> {
    cluster
        .nodes
        .values()
        .map(|n| {
            tally_authority::raft::types::current_metrics(&n.raft)
                .last_applied
                .map(|log_id| log_id.index)
        })
        .collect()
}

/// A TLS channel that trusts the cluster's CA but presents no certificate.
async fn anonymous(cluster: &TestCluster, address: &str) -> Channel {
    let ca = std::fs::read(tally_authority::testing::tls_dir(cluster.dir.path()).join("ca.pem"))
        .expect("ca");
    tally_tls::install_crypto_provider();
    Endpoint::from_shared(format!("https://{address}"))
        .expect("endpoint")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name(tally_tls::SERVER_NAME),
        )
        .expect("tls")
        .connect()
        .await
        .expect("connect")
}

fn assert_refused(status: &tonic::Status, code: Code, what: &str) {
    assert_eq!(status.code(), code, "{what}: {status:?}");
    assert_eq!(
        definiteness(status),
        Some(Definiteness::Definite),
        "{what}: refusals are definite"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_the_right_certificate_are_refused_and_nothing_is_written() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let address = cluster.address(leader);
    let before = settled(&cluster, leader).await;

    // No certificate: UNAUTHENTICATED on Budget and Admin.
    let channel = anonymous(&cluster, &address).await;
    let status = BudgetClient::new(channel.clone())
        .authorize_hold(authorize("fam", "h1", 10))
        .await
        .expect_err("no certificate");
    assert_refused(
        &status,
        Code::Unauthenticated,
        "budget without a certificate",
    );
    let status = AdminClient::new(channel)
        .set_params(pb::SetParamsRequest {
            retention_ms: Some(60_000),
            max_clock_step_ms: None,
            preferred_leader_regions: None,
        })
        .await
        .expect_err("no certificate");
    assert_refused(
        &status,
        Code::Unauthenticated,
        "admin without a certificate",
    );

    // A certificate of another CA fails the handshake: no rpc reaches a service.
    let other = tempfile::tempdir().expect("dir");
    tally_tls::issue::ensure_dev_certs(other.path(), "intruder", 1).expect("other CA");
    let intruder = Transport::from_dir(other.path(), "kernel", false).expect("loads");
    let result = async {
        let channel = intruder.endpoint(&address)?.connect().await?;
        anyhow::Ok(
            BudgetClient::new(channel)
                .authorize_hold(authorize("fam", "h1", 10))
                .await?,
        )
    }
    .await;
    assert!(result.is_err(), "another CA's certificate must not get in");

    // Wrong role: a reader cannot write, a kernel cannot administer, an operator cannot
    // spend.
    let status = BudgetClient::new(cluster.channel(leader, "reader").await)
        .authorize_hold(authorize("fam", "h1", 10))
        .await
        .expect_err("reader writes");
    assert_refused(&status, Code::PermissionDenied, "reader writing");
    let status = AdminClient::new(cluster.channel(leader, "kernel").await)
        .set_params(pb::SetParamsRequest {
            retention_ms: Some(60_000),
            max_clock_step_ms: None,
            preferred_leader_regions: None,
        })
        .await
        .expect_err("kernel administers");
    assert_refused(&status, Code::PermissionDenied, "kernel calling SetParams");
    let status = BudgetClient::new(cluster.channel(leader, "operator").await)
        .authorize_hold(authorize("fam", "h1", 10))
        .await
        .expect_err("operator spends");
    assert_refused(&status, Code::PermissionDenied, "operator writing");
    // A reader may read.
    BudgetClient::new(cluster.channel(leader, "reader").await)
        .list_holds(pb::ListHoldsRequest::default())
        .await
        .expect("a reader reads");

    // A kernel bound to one issuer's namespace: its own families pass, others' are refused,
    // in a single call and inside a batch (where nothing of the batch is proposed).
    let tls = tally_authority::testing::tls_dir(cluster.dir.path());
    CertAuthority::load(&tls)
        .expect("ca")
        .issue_client(
            "tenant-a",
            Role::Kernel,
            vec![Namespace::parse("aa").expect("hex")],
            1,
        )
        .expect("issued")
        .write(&tls, "tenant-a")
        .expect("written");
    let mut tenant = BudgetClient::new(cluster.channel(leader, "tenant-a").await);
    let status = tenant
        .authorize_hold(authorize("bb:token", "h1", 10))
        .await
        .expect_err("another tenant's family");
    assert_refused(
        &status,
        Code::PermissionDenied,
        "kernel outside its namespace",
    );
    let status = tenant
        .resolve_event(resolve(pb::command::Command::AuthorizeHold(authorize(
            "bb:token", "h2", 10,
        ))))
        .await
        .expect_err("pre-tombstoning another tenant's event");
    assert_refused(
        &status,
        Code::PermissionDenied,
        "ResolveEvent outside its namespace",
    );
    let batch = pb::BatchRequest {
        commands: vec![
            pb::Command {
                command: Some(pb::command::Command::AuthorizeHold(authorize(
                    "aa:token", "h3", 10,
                ))),
            },
            pb::Command {
                command: Some(pb::command::Command::AuthorizeHold(authorize(
                    "bb:token", "h4", 10,
                ))),
            },
        ],
    };
    let status = tenant.batch(batch).await.expect_err("mixed batch");
    assert_refused(
        &status,
        Code::PermissionDenied,
        "batch touching another namespace",
    );
    assert_eq!(applied(&cluster), before, "no refusal wrote anything");

    tenant
        .authorize_hold(authorize("aa:token", "h5", 10))
        .await
        .expect("its own family");
    // Reads across families (the reconciler's `ListHolds` with no family) answer a
    // namespace-bound kernel with its own families only, never another tenant's rows.
    BudgetClient::new(cluster.channel(leader, "kernel").await)
        .authorize_hold(authorize("bb:token", "h6", 10))
        .await
        .expect("the unbound kernel writes another tenant's family");
    let holds = tenant
        .list_holds(pb::ListHoldsRequest::default())
        .await
        .expect("a bound kernel lists its own holds")
        .into_inner();
    let families: Vec<_> = holds.holds.iter().map(|h| h.family_id.clone()).collect();
    assert_eq!(families, vec!["aa:token".to_owned()], "own holds only");
    let usages = tenant
        .list_usages(pb::ListUsagesRequest::default())
        .await
        .expect("a bound kernel lists its own usages")
        .into_inner();
    assert!(
        usages.usages.iter().all(|u| u.family_id == "aa:token") && !usages.usages.is_empty(),
        "own usages only: {usages:?}"
    );
    let all = BudgetClient::new(cluster.channel(leader, "reader").await)
        .list_holds(pb::ListHoldsRequest::default())
        .await
        .expect("a reader lists every family")
        .into_inner();
    assert_eq!(all.holds.len(), 2, "a reader sees both tenants: {all:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_takes_only_member_nodes_speaking_for_themselves() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let follower = a_follower(&cluster, leader);
    let peer = cluster.nodes[&follower].peer_local_addr.to_string();
    let before = settled(&cluster, leader).await;
    let forward = |channel: Channel| async move {
        let commands: Vec<tally_ledger::Command> = Vec::new();
        RaftClient::new(channel)
            .forward(pb::RaftBytes {
                payload: tally_api::encode_raft(&commands).expect("encodes").into(),
            })
            .await
    };

    // A valid client certificate (even an operator's) is not a node.
    let status = forward(peer_channel(&cluster, "operator", follower).await)
        .await
        .expect_err("a client on the peer port");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // No certificate at all.
    let status = forward(anonymous(&cluster, &peer).await)
        .await
        .expect_err("anonymous on the peer port");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // A node certificate of the CA whose node is not a member.
    let status = forward(peer_channel(&cluster, "node-9", follower).await)
        .await
        .expect_err("a non-member node");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("not a member"), "{status:?}");

    // A member's certificate cannot campaign as another member: node `leader`'s certificate
    // asking for votes as node `follower`'s neighbour.
    let impostor = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != follower)
        .expect("third node");
    let metrics = tally_authority::raft::types::current_metrics(&cluster.nodes[&follower].raft);
    let vote = openraft::raft::VoteRequest::<tally_authority::raft::types::TypeConfig>::new(
        openraft::Vote::new(metrics.current_term + 10, impostor),
        None,
    );
    let channel = peer_channel(&cluster, &format!("node-{leader}"), follower).await;
    let status = RaftClient::new(channel)
        .vote(pb::RaftBytes {
            payload: tally_api::encode_raft(&vote).expect("encodes").into(),
        })
        .await
        .expect_err("a vote request as another node");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        tally_authority::raft::types::current_metrics(&cluster.nodes[&follower].raft).vote,
        metrics.vote,
        "the refused vote request changed nothing"
    );
    assert_eq!(applied(&cluster), before, "nothing written");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_certificate_names_another_id_does_not_start() {
    let dir = tempfile::tempdir().expect("dir");
    let mut config = tally_authority::testing::config(dir.path(), 4);
    config.tls = Some(tally_tls::TlsFiles::in_dir(
        &tally_authority::testing::tls_dir(dir.path()),
        "node-5",
    ));
    let error = tally_authority::node::start(config, Default::default())
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("names node 5"), "{error}");
}

/// A plaintext client on either TLS port gets a real gRPC answer that says what is wrong
/// (UNAUTHENTICATED, definite, naming TLS), not "h2 protocol error", and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_is_told_the_port_needs_tls() {
    init_logs();
    let cluster = TestCluster::start(1).await;
    let leader = cluster.wait_leader().await;
    let before = settled(&cluster, leader).await;
    let plaintext = |address: String| async move {
        Endpoint::from_shared(format!("http://{address}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("a plaintext connection is accepted, to be answered")
    };
    for _ in 0..2 {
        let status = BudgetClient::new(plaintext(cluster.address(leader)).await)
            .authorize_hold(authorize("fam", "h1", 10))
            .await
            .expect_err("plaintext on the client port");
        assert_refused(&status, Code::Unauthenticated, "plaintext budget call");
        assert!(
            status
                .message()
                .contains("takes TLS with a client certificate"),
            "the refusal says why: {status:?}"
        );
    }
    let peer = cluster.nodes[&leader].peer_local_addr.to_string();
    let status = RaftClient::new(plaintext(peer).await)
        .vote(pb::RaftBytes::default())
        .await
        .expect_err("plaintext on the peer port");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("peer port"), "{status:?}");
    assert_eq!(applied(&cluster), before, "plaintext calls wrote nothing");
    // TLS clients are still served on the same ports.
    cluster
        .budget(leader)
        .await
        .authorize_hold(authorize("fam", "h2", 10))
        .await
        .expect("a TLS client is served");
    assert_ne!(
        settled(&cluster, leader).await,
        before,
        "the TLS write applied"
    );
    cluster.shutdown().await;
}

/// The `Append` stream checks every message before openraft sees it: a member's certificate
/// cannot append as another member, and a message that does not decode is refused. Each
/// refusal is the stream's last item (PERMISSION_DENIED, INVALID_ARGUMENT), never a silent end,
/// and the follower's vote and log stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_stream_refuses_a_message_as_another_node_or_undecodable() {
    init_logs();
    let cluster = TestCluster::start(3).await;
    let leader = cluster.wait_leader().await;
    let follower = a_follower(&cluster, leader);
    let impostor = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != follower)
        .expect("third node");
    let before = settled(&cluster, leader).await;
    let metrics = tally_authority::raft::types::current_metrics(&cluster.nodes[&follower].raft);
    let append = openraft::raft::AppendEntriesRequest::<tally_authority::raft::types::TypeConfig> {
        vote: openraft::Vote::new_committed(metrics.current_term + 10, impostor),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let as_impostor = pb::RaftBytes {
        payload: tally_api::encode_raft(&append).expect("encodes").into(),
    };
    let garbled = pb::RaftBytes {
        payload: vec![0xc1, 0xff, 0x00].into(),
    };
    for (message, code) in [
        (as_impostor, Code::PermissionDenied),
        (garbled, Code::InvalidArgument),
    ] {
        let channel = peer_channel(&cluster, &format!("node-{leader}"), follower).await;
        let mut replies = RaftClient::new(channel)
            .append(tokio_stream::iter(vec![message]))
            .await
            .expect("the stream opens")
            .into_inner();
        let status = replies
            .message()
            .await
            .expect_err("the refused message ends the stream with its status");
        assert_eq!(status.code(), code, "{status:?}");
    }
    assert_eq!(
        tally_authority::raft::types::current_metrics(&cluster.nodes[&follower].raft).vote,
        metrics.vote,
        "the refused appends changed nothing"
    );
    assert_eq!(applied(&cluster), before, "nothing written");
    cluster.shutdown().await;
}
