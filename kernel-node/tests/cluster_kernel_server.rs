//! The `tally-kernel` node end to end: its gRPC service in front of a real 3-node cluster,
//! dispatching to HTTP JSON tool servers, two nodes sharing tickets, `/metrics`, and the
//! binary's token and receipt subcommands.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::Ordering;

use support::Env;
use tally_kernel::config::{KernelNodeConfig, ToolServerSettings};
use tally_kernel::money::Money;
use tally_kernel::pipeline::{reasons, wall_clock_ms, Method};
use tally_kernel::receipt::Receipt;
use tally_kernel::server::pb::kernel_client::KernelClient;
use tally_kernel::server::pb::{self, Verdict};
use tally_kernel::server::{sign_complete, sign_tool_call};
use tally_kernel::tool::testing::{spawn_http_tool_server, Behavior};
use tally_kernel::{verify_receipt, Grant, KeyPair, TrustList};
use tally_tls::issue::KERNEL_SERVER_NAME;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

fn node_config(env: &Env, key: &KeyPair, tools: Vec<ToolServerSettings>) -> KernelNodeConfig {
    KernelNodeConfig {
        listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        // The test cluster's CA also issued `kernel-server` and `agent`.
        tls_dir: tally_authority::testing::tls_dir(env.cluster.dir.path()),
        metrics_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        key_seed: Some(key.seed_base64()),
        trusted_issuers: vec![env.issuer.public_key().to_base64()],
        cluster_endpoints: env
            .cluster
            .configs
            .keys()
            .map(|id| env.cluster.address(*id))
            .collect(),
        cluster_tls_dir: tally_authority::testing::tls_dir(env.cluster.dir.path()),
        tool_servers: tools,
        dispatch_deadline_ms: 300,
        client_retry_for_ms: 5_000,
        client_resolve_for_ms: 5_000,
        ..KernelNodeConfig::default()
    }
}

/// A channel to the kernel node at `address`, over mutual TLS with the test CA's `agent`
/// certificate (the role a kernel node's port admits).
async fn agent_channel(env: &Env, address: SocketAddr) -> Channel {
    env.cluster
        .transport("agent")
        .endpoint_to(&address.to_string(), KERNEL_SERVER_NAME)
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

/// An unsigned call: what a thief holding only the token would send.
fn call(request_id: &str, token: &tally_kernel::CapabilityToken, tool: &str) -> pb::ToolCall {
    pb::ToolCall {
        request_id: request_id.to_owned(),
        capability_token: token.to_text().expect("text"),
        server: "http-srv".to_owned(),
        tool: tool.to_owned(),
        arguments_json: r#"{"path": "/tmp/x"}"#.to_owned(),
        execution_nonce: None,
        possession: None,
    }
}

/// `call` signed by the token's holder for `method`; sign after the last change to a field.
fn signed(mut call: pb::ToolCall, method: Method) -> pb::ToolCall {
    sign_tool_call(&mut call, method, &support::agent(), wall_clock_ms()).expect("sign");
    call
}

async fn scrape(address: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    text
}

/// One node serves `EvaluateToolCall` over gRPC, dispatching to an HTTP JSON tool server that
/// reports a cost of 40 (of 100 held): `ALLOW`, the tool's JSON back, a receipt signed by the
/// node's key, and the cluster realizing 40. A hanging HTTP tool hits the node's deadline:
/// `DENY`, everything retained. A tool server nobody listens for was provably never entered:
/// `DENY` with budget and payment released. A second node completes a ticket the first admitted. An
/// unreadable token is `INVALID_ARGUMENT`; `/metrics` counts all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernel_node_serves_evaluate_and_two_phase_over_grpc() {
    let env = Env::start().await;
    let (fast, fast_calls, _fast) = spawn_http_tool_server(Behavior::Succeed {
        cost: Some(Money::new(40, "USD")),
    })
    .await
    .expect("tool server");
    // A port nothing listens on: bound, then closed.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let (slow, slow_calls, _slow) = spawn_http_tool_server(Behavior::Hang)
        .await
        .expect("tool server");
    let tools = vec![
        ToolServerSettings {
            id: "http-srv".into(),
            url: format!("http://{fast}/call"),
            tools: vec!["compute".into()],
        },
        ToolServerSettings {
            id: "http-slow".into(),
            url: format!("http://{slow}/call"),
            tools: vec!["compute".into()],
        },
        ToolServerSettings {
            id: "http-dead".into(),
            url: format!("http://{dead}/call"),
            tools: vec!["compute".into()],
        },
    ];
    let key_a = KeyPair::generate();
    let node_a = tally_kernel::server::start(node_config(&env, &key_a, tools.clone()))
        .await
        .expect("node a");
    let mut config_b = node_config(&env, &KeyPair::generate(), tools);
    config_b.trusted_kernel_keys = vec![key_a.public_key().to_base64()];
    let node_b = tally_kernel::server::start(config_b).await.expect("node b");
    let mut a = KernelClient::new(agent_channel(&env, node_a.local_addr).await);
    let mut b = KernelClient::new(agent_channel(&env, node_b.local_addr).await);
    let token = env.token(vec![
        Grant::monetary("http-srv", "compute", 100, 1000, "USD"),
        Grant::monetary("http-slow", "compute", 100, 1000, "USD"),
        Grant::monetary("http-dead", "compute", 100, 1000, "USD"),
    ]);

    let evaluation = a
        .evaluate_tool_call(signed(
            call("req-grpc-1", &token, "compute"),
            Method::EvaluateToolCall,
        ))
        .await
        .expect("evaluate")
        .into_inner();
    assert_eq!(
        evaluation.verdict,
        Verdict::Allow as i32,
        "{:?}",
        evaluation.reason
    );
    let output: serde_json::Value =
        serde_json::from_str(evaluation.output_json.as_deref().expect("output")).expect("json");
    assert_eq!(output["arguments"]["path"], "/tmp/x");
    let receipt: Receipt = serde_json::from_str(&evaluation.receipt_json).expect("receipt");
    verify_receipt(&receipt, &TrustList::new([key_a.public_key()])).expect("signed by node a");
    assert_eq!(env.usage(&token, 0).await, Some((1, 40)));
    assert_eq!(fast_calls.load(Ordering::SeqCst), 1);

    let mut slow_call = call("req-grpc-slow", &token, "compute");
    slow_call.server = "http-slow".into();
    let slow_eval = a
        .evaluate_tool_call(signed(slow_call, Method::EvaluateToolCall))
        .await
        .expect("evaluate")
        .into_inner();
    assert_eq!(slow_eval.verdict, Verdict::Deny as i32);
    assert!(slow_eval
        .reason
        .as_deref()
        .is_some_and(|r| r.contains("deadline")));
    assert_eq!(
        env.usage(&token, 1).await,
        Some((1, 100)),
        "retained after the deadline"
    );
    assert_eq!(slow_calls.load(Ordering::SeqCst), 1);

    let mut dead_call = call("req-grpc-dead", &token, "compute");
    dead_call.server = "http-dead".into();
    let dead_eval = a
        .evaluate_tool_call(signed(dead_call, Method::EvaluateToolCall))
        .await
        .expect("evaluate")
        .into_inner();
    assert_eq!(dead_eval.verdict, Verdict::Deny as i32);
    assert!(
        dead_eval
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("not delivered")),
        "{:?}",
        dead_eval.reason
    );
    assert_eq!(
        env.usage(&token, 2).await,
        Some((0, 0)),
        "never delivered: released, then cancelled"
    );

    let admission = a
        .admit(signed(
            call("req-grpc-two-phase", &token, "compute"),
            Method::Admit,
        ))
        .await
        .expect("admit")
        .into_inner();
    let ticket = admission.ticket.expect("ticket");
    let mut complete = pb::CompleteRequest {
        ticket,
        actual_cost: Some(pb::Money {
            units: 25,
            currency: "USD".into(),
        }),
        possession: None,
    };
    // The ticket without its holder's signature, or signed by another key, settles nothing.
    let before = env.usage(&token, 0).await;
    let mut stolen = complete.clone();
    sign_complete(&mut stolen, &KeyPair::generate(), wall_clock_ms()).expect("sign");
    for (label, request) in [("unsigned", complete.clone()), ("other key", stolen)] {
        let refused = b.complete(request).await.expect("complete").into_inner();
        assert_eq!(refused.verdict, Verdict::Deny as i32, "{label}");
        assert!(
            refused
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(reasons::POSSESSION_REJECTED)),
            "{label}: {:?}",
            refused.reason
        );
        assert_eq!(
            env.usage(&token, 0).await,
            before,
            "{label}: nothing settled"
        );
    }
    sign_complete(&mut complete, &support::agent(), wall_clock_ms()).expect("sign");
    let completed = b.complete(complete).await.expect("complete").into_inner();
    assert_eq!(
        completed.verdict,
        Verdict::Allow as i32,
        "{:?}",
        completed.reason
    );
    assert_eq!(env.usage(&token, 0).await, Some((2, 65)));

    let mut garbled = call("req-grpc-garbled", &token, "compute");
    garbled.capability_token = "not-a-token".into();
    let status = a.evaluate_tool_call(garbled).await.expect_err("unreadable");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let mut short_signature = signed(
        call("req-grpc-short-signature", &token, "compute"),
        Method::EvaluateToolCall,
    );
    if let Some(possession) = short_signature.possession.as_mut() {
        possession.signature.truncate(10);
    }
    let status = a
        .evaluate_tool_call(short_signature)
        .await
        .expect_err("unreadable signature");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    // The token alone: denied with the reason, and nothing held for it.
    let unsigned = a
        .evaluate_tool_call(call("req-grpc-unsigned", &token, "compute"))
        .await
        .expect("evaluate")
        .into_inner();
    assert_eq!(unsigned.verdict, Verdict::Deny as i32);
    assert!(
        unsigned
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(reasons::POSSESSION_REJECTED)),
        "{:?}",
        unsigned.reason
    );
    let hold = tally_client::ids::hold_id("req-grpc-unsigned", token.id(), 0).expect("id");
    assert_eq!(
        env.client
            .get_hold(&token.family_id(), &hold)
            .await
            .expect("read"),
        None
    );

    let metrics = scrape(node_a.metrics_addr.expect("metrics")).await;
    assert!(
        metrics.contains("tally_kernel_evaluations_total{verdict=\"allow\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tally_kernel_evaluations_total{verdict=\"deny\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tally_kernel_invalid_requests_total 2"),
        "{metrics}"
    );
    node_a.shutdown().await.expect("shutdown a");
    node_b.shutdown().await.expect("shutdown b");
}

fn tally_kernel_bin(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tally-kernel"))
        .args(args)
        .output()
        .expect("run tally-kernel");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `token issue | inspect | verify` and `receipts verify`, through the real binary, against
/// receipts a kernel node signed into its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_issues_inspects_and_verifies_tokens_and_receipts() {
    let issuer = KeyPair::generate();
    let subject = KeyPair::generate().public_key().to_base64();
    let seed = issuer.seed_base64();
    let (ok, token, err) = tally_kernel_bin(&[
        "token",
        "issue",
        "--issuer-seed",
        &seed,
        "--subject",
        &subject,
        "--grant",
        "cost-srv:compute:100:1000:USD:3",
        "--grant",
        "srv-a:read_file",
    ]);
    assert!(ok, "{err}");
    let token = token.trim().to_owned();
    let (ok, inspected, err) = tally_kernel_bin(&["token", "inspect", &token]);
    assert!(ok, "{err}");
    assert!(inspected.contains("\"cost-srv\""), "{inspected}");
    let trusted = issuer.public_key().to_base64();
    let (ok, verified, err) = tally_kernel_bin(&["token", "verify", &token, "--trust", &trusted]);
    assert!(ok, "{err}");
    assert!(verified.starts_with("ok:"), "{verified}");
    let stranger = KeyPair::generate().public_key().to_base64();
    let (ok, _, err) = tally_kernel_bin(&["token", "verify", &token, "--trust", &stranger]);
    assert!(!ok && err.contains("not in the trust list"), "{err}");

    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("receipts.jsonl");
    let kernel_key = KeyPair::generate();
    let log = tally_kernel::ReceiptLog::open(&path).expect("log");
    for id in ["req-1", "req-2"] {
        let receipt = tally_kernel::receipt::ReceiptDraft::new(
            id,
            "cost-srv",
            "compute",
            tally_kernel::Verdict::Allow,
            1,
        )
        .sign(&kernel_key)
        .expect("sign");
        log.append(&receipt).expect("append");
    }
    drop(log);
    let path_text = path.display().to_string();
    let key_text = kernel_key.public_key().to_base64();
    let (ok, out, err) =
        tally_kernel_bin(&["receipts", "verify", &path_text, "--kernel-key", &key_text]);
    assert!(ok, "{err}");
    assert!(out.contains("2 receipt(s) verified"), "{out}");
    let (ok, _, _) =
        tally_kernel_bin(&["receipts", "verify", &path_text, "--kernel-key", &stranger]);
    assert!(
        !ok,
        "a receipt from an untrusted kernel key fails verification"
    );

    // `keygen --out` writes a key file a node accepts: mode 0600 from the start.
    let key_path = dir.path().join("kernel.key");
    let key_text = key_path.display().to_string();
    let (ok, out, err) = tally_kernel_bin(&["keygen", "--out", &key_text]);
    assert!(ok, "{err}");
    assert!(out.contains("public_key: "), "{out}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_path)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    tally_kernel::key_file::read_key_file(&key_path).expect("a node reads it");
    let (ok, _, err) = tally_kernel_bin(&["keygen", "--out", &key_text]);
    assert!(
        !ok && err.contains("kernel.key"),
        "never overwritten: {err}"
    );
}

/// A node whose receipt log cannot be written (`/dev/full`) answers the call that found out
/// (its tool ran; nothing is unwound), then turns unhealthy: gRPC health `NOT_SERVING`,
/// `/metrics` `tally_kernel_receipt_log_healthy 0`, and every new call `UNAVAILABLE` with
/// nothing held for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_receipt_log_fails_refuses_new_calls_and_reports_unhealthy() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let env = Env::start().await;
    let (tool, tool_calls, _tool) = spawn_http_tool_server(Behavior::Succeed {
        cost: Some(Money::new(40, "USD")),
    })
    .await
    .expect("tool server");
    let tools = vec![ToolServerSettings {
        id: "http-srv".into(),
        url: format!("http://{tool}/call"),
        tools: vec!["compute".into()],
    }];
    let mut config = node_config(&env, &KeyPair::generate(), tools);
    config.receipt_log = Some("/dev/full".into());
    let node = tally_kernel::server::start(config)
        .await
        .expect("node starts: /dev/full opens");
    let channel = agent_channel(&env, node.local_addr).await;
    let mut kernel = KernelClient::new(channel.clone());
    let health = HealthClient::new(channel);
    let serving = |service: &'static str| {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest {
                    service: service.to_owned(),
                })
                .await
                .expect("health")
                .into_inner()
                .status
        }
    };
    assert_eq!(serving("").await, ServingStatus::Serving as i32);
    let token = env.token(vec![Grant::monetary(
        "http-srv", "compute", 100, 1000, "USD",
    )]);

    let first = kernel
        .evaluate_tool_call(signed(
            call("req-log-first", &token, "compute"),
            Method::EvaluateToolCall,
        ))
        .await
        .expect("the call that found out is answered")
        .into_inner();
    assert_eq!(first.verdict, Verdict::Allow as i32, "{:?}", first.reason);
    assert_eq!(tool_calls.load(Ordering::SeqCst), 1);
    assert_eq!(env.usage(&token, 0).await, Some((1, 40)), "not unwound");

    let kernel_service = "tally.kernel.v1.Kernel";
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while serving(kernel_service).await != ServingStatus::NotServing as i32 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the node reports NOT_SERVING");
    assert_eq!(serving("").await, ServingStatus::NotServing as i32);

    let status = kernel
        .evaluate_tool_call(signed(
            call("req-log-refused", &token, "compute"),
            Method::EvaluateToolCall,
        ))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("receipt log"), "{status:?}");
    assert_eq!(
        tally_api::status::Definiteness::from_metadata(status.metadata()),
        Some(tally_api::status::Definiteness::Definite),
        "nothing was done: definite"
    );
    let status = kernel
        .admit(signed(
            call("req-log-refused-admit", &token, "compute"),
            Method::Admit,
        ))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    for request_id in ["req-log-refused", "req-log-refused-admit"] {
        let hold = tally_client::ids::hold_id(request_id, token.id(), 0).expect("id");
        assert_eq!(
            env.client
                .get_hold(&token.family_id(), &hold)
                .await
                .expect("read"),
            None,
            "{request_id}: nothing held"
        );
    }
    assert_eq!(tool_calls.load(Ordering::SeqCst), 1);

    let metrics = scrape(node.metrics_addr.expect("metrics")).await;
    assert!(
        metrics.contains("tally_kernel_receipt_log_healthy 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tally_kernel_receipt_log_refusals_total 2"),
        "{metrics}"
    );
    node.shutdown().await.expect("shutdown");
}
