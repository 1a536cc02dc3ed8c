//! The kernel node's own gRPC port and the payment rail take mutual TLS (docs/architecture.md
//! "Security"): a caller with the right certificate of the CA is served; a plaintext caller,
//! a TLS caller without a certificate and a caller with the wrong role are refused with a
//! definite status before anything is read; a caller whose certificate comes from another CA
//! fails the handshake. Neither server needs a cluster for this, so none is started: the
//! kernel node's cluster client points at a closed port and is never asked.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tally_api::status::Definiteness;
use tally_client::Transport;
use tally_kernel::config::KernelNodeConfig;
use tally_kernel::money::Money;
use tally_kernel::payment::remote::pb::payment_rail_client::PaymentRailClient;
use tally_kernel::payment::remote::pb::LookupRequest;
use tally_kernel::payment::{PaymentAdapter, PaymentError, RailServer, RemoteRail};
use tally_kernel::port::{PortError, ServerTls};
use tally_kernel::server::pb::kernel_client::KernelClient;
use tally_kernel::server::pb::ToolCall;
use tally_kernel::server::{RunningKernel, ServerError};
use tally_kernel::{InMemoryRail, KeyPair};
use tally_tls::issue::{
    ensure_dev_certs, DEV_KERNEL_SERVER, DEV_RAIL_SERVER, KERNEL_SERVER_NAME, RAIL_SERVER_NAME,
};
use tally_tls::{TlsError, TlsFiles};
use tempfile::TempDir;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A dev CA and its certificates in a fresh directory, as `tally-node dev` writes them.
fn certs(cluster: &str) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    ensure_dev_certs(dir.path(), cluster, 1).expect("certificates");
    dir
}

/// `identity` of `dir`'s CA.
fn transport(dir: &TempDir, identity: &str) -> Transport {
    Transport::from_dir(dir.path(), identity, false).expect("certificate loads")
}

/// `identity` of another CA (`foreign`), trusting the right one (`ours`): what fails is the
/// client's certificate, not the server's.
fn foreign(ours: &TempDir, foreign: &TempDir, identity: &str) -> Transport {
    let files = TlsFiles {
        ca_file: ours.path().join("ca.pem"),
        ..TlsFiles::in_dir(foreign.path(), identity)
    };
    Transport::tls(files.load().expect("certificate loads"))
}

/// TLS that trusts `dir`'s CA and presents no certificate.
fn anonymous(dir: &TempDir, address: SocketAddr, server_name: &str) -> Endpoint {
    tally_tls::install_crypto_provider();
    let ca = std::fs::read(dir.path().join("ca.pem")).expect("ca");
    Endpoint::from_shared(format!("https://{address}"))
        .expect("endpoint")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name(server_name),
        )
        .expect("tls")
}

fn timed(endpoint: Endpoint) -> Channel {
    endpoint
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_lazy()
}

/// A kernel node serving with `dir`'s `kernel-server` certificate; its cluster is a closed
/// port, its reconciler off.
fn kernel_config(dir: &Path) -> KernelNodeConfig {
    KernelNodeConfig {
        listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        tls_dir: dir.to_owned(),
        server_identity: DEV_KERNEL_SERVER.to_owned(),
        key_seed: Some(KeyPair::generate().seed_base64()),
        trusted_issuers: vec![KeyPair::generate().public_key().to_base64()],
        cluster_endpoints: vec!["127.0.0.1:1".to_owned()],
        cluster_tls_dir: dir.to_owned(),
        reconciler: tally_kernel::config::ReconcilerSettings {
            enabled: false,
            ..KernelNodeConfig::default().reconciler
        },
        ..KernelNodeConfig::default()
    }
}

/// A call the service reads and refuses as unreadable: reaching that answer means the caller
/// got past TLS and the gate.
fn unreadable_call() -> ToolCall {
    ToolCall {
        request_id: "req-tls".to_owned(),
        capability_token: "not a token".to_owned(),
        server: "srv".to_owned(),
        tool: "t".to_owned(),
        arguments_json: "{}".to_owned(),
        execution_nonce: None,
        possession: None,
    }
}

async fn call_kernel(channel: Channel) -> Result<(), tonic::Status> {
    KernelClient::new(channel)
        .evaluate_tool_call(unreadable_call())
        .await
        .map(|_| ())
}

fn assert_refused_definite(status: &tonic::Status, code: Code, label: &str) {
    assert_eq!(status.code(), code, "{label}: {status:?}");
    assert_eq!(
        Definiteness::from_metadata(status.metadata()),
        Some(Definiteness::Definite),
        "{label}: refused before anything was read: definite"
    );
}

async fn start_kernel(dir: &TempDir) -> RunningKernel {
    tally_kernel::server::start(kernel_config(dir.path()))
        .await
        .expect("kernel node starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernel_port_serves_agents_and_refuses_everyone_else() {
    let ours = certs("tls-ports");
    let theirs = certs("intruder");
    let node = start_kernel(&ours).await;
    let address = node.local_addr.to_string();
    let reached = || node.metrics.invalid_requests.load(Ordering::SeqCst);

    // The agent certificate reaches the service (which refuses the unreadable token) and
    // health.
    let agent = timed(
        transport(&ours, "agent")
            .endpoint_to(&address, KERNEL_SERVER_NAME)
            .expect("endpoint"),
    );
    let status = call_kernel(agent.clone())
        .await
        .expect_err("an unreadable token");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reached(), 1, "the agent's call reached the service");
    let health = HealthClient::new(agent)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    // Plaintext: answered UNAUTHENTICATED, saying the port takes TLS.
    let plaintext = timed(
        Transport::Insecure
            .endpoint_to(&address, KERNEL_SERVER_NAME)
            .expect("endpoint"),
    );
    let status = call_kernel(plaintext).await.expect_err("plaintext");
    assert_refused_definite(&status, Code::Unauthenticated, "plaintext");
    assert!(status.message().contains("TLS"), "{status:?}");

    // TLS without a client certificate.
    let status = call_kernel(timed(anonymous(&ours, node.local_addr, KERNEL_SERVER_NAME)))
        .await
        .expect_err("no certificate");
    assert_refused_definite(&status, Code::Unauthenticated, "no certificate");
    assert!(status.message().contains("agent"), "{status:?}");

    // A certificate of the CA with another role: the kernel's own cluster certificate may
    // write budgets, not call kernels; health is open to it.
    let kernel = timed(
        transport(&ours, "kernel")
            .endpoint_to(&address, KERNEL_SERVER_NAME)
            .expect("endpoint"),
    );
    let status = call_kernel(kernel.clone()).await.expect_err("wrong role");
    assert_refused_definite(&status, Code::PermissionDenied, "kernel role");
    HealthClient::new(kernel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health takes any certificate of the CA");

    // An agent certificate of another CA fails the handshake.
    let intruder = timed(
        foreign(&ours, &theirs, "agent")
            .endpoint_to(&address, KERNEL_SERVER_NAME)
            .expect("endpoint"),
    );
    let status = call_kernel(intruder).await.expect_err("another CA");
    assert!(
        !matches!(status.code(), Code::InvalidArgument | Code::Ok),
        "{status:?}"
    );

    assert_eq!(reached(), 1, "no refused call reached the service");
    node.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_node_without_its_server_certificate_does_not_start_unless_insecure() {
    let ours = certs("tls-ports");
    let mut config = kernel_config(ours.path());
    config.server_identity = "missing".to_owned();
    let error = tally_kernel::server::start(config.clone())
        .await
        .err()
        .expect("no certificate");
    assert!(
        matches!(
            error,
            ServerError::ServerTls(PortError::NoServerCertificate { .. })
        ),
        "{error}"
    );
    assert!(error.to_string().contains("tally-node dev"), "{error}");

    // A client certificate where the server's should be.
    config.server_identity = "agent".to_owned();
    let error = tally_kernel::server::start(config.clone())
        .await
        .err()
        .expect("a client certificate");
    assert!(
        matches!(
            error,
            ServerError::ServerTls(PortError::Tls(TlsError::WrongServerName { .. }))
        ),
        "{error}"
    );

    // Insecure: plaintext, nobody checked.
    config.insecure = true;
    let node = tally_kernel::server::start(config)
        .await
        .expect("insecure starts");
    let plaintext = timed(
        Transport::Insecure
            .endpoint_to(&node.local_addr.to_string(), KERNEL_SERVER_NAME)
            .expect("endpoint"),
    );
    let status = call_kernel(plaintext).await.expect_err("unreadable token");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    node.shutdown().await.expect("shutdown");
}

async fn start_rail(dir: &TempDir, rail: Arc<InMemoryRail>) -> RailServer {
    let tls = ServerTls::from_dir(dir.path(), DEV_RAIL_SERVER, RAIL_SERVER_NAME, false)
        .expect("rail certificate");
    RailServer::start(rail, SocketAddr::from(([127, 0, 0, 1], 0)), tls)
        .await
        .expect("rail starts")
}

fn rail_client(server: &RailServer, transport: &Transport) -> RemoteRail {
    let endpoint = if transport.is_tls() {
        server.endpoint()
    } else {
        format!("http://{}", server.local_addr())
    };
    RemoteRail::connect(&endpoint, transport, Duration::from_secs(10)).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rail_serves_kernels_and_refuses_everyone_else() {
    let ours = certs("tls-ports");
    let theirs = certs("intruder");
    let rail = Arc::new(InMemoryRail::new());
    let server = start_rail(&ours, rail.clone()).await;
    let usd = Money::new(10, "USD");

    rail_client(&server, &transport(&ours, "kernel"))
        .authorize("req-kernel", &usd)
        .await
        .expect("a kernel pays");
    assert_eq!(rail.counts("req-kernel").authorizations, 1);

    // Refused by the rail's gate: not performed, said so (`Unavailable`). A failed handshake
    // is a transport error whose outcome the client cannot know. Neither is a definite
    // denial, the one answer that would let a kernel free budget.
    let refused = [
        ("plaintext", Transport::Insecure, true),
        ("an agent", transport(&ours, "agent"), true),
        ("another CA", foreign(&ours, &theirs, "kernel"), false),
    ];
    for (label, transport, by_the_gate) in refused {
        let reference = format!("req-{}", label.replace(' ', "-"));
        let error = rail_client(&server, &transport)
            .authorize(&reference, &usd)
            .await
            .expect_err(label);
        assert!(!error.is_definite_denial(), "{label}: {error:?}");
        if by_the_gate {
            assert!(
                matches!(&error, PaymentError::Unavailable(m) if m.contains("credentials")),
                "{label}: {error:?}"
            );
        }
        assert_eq!(rail.counts(&reference).authorizations, 0, "{label}");
    }

    // The rail's own answers, before the kernel's client maps them.
    let raw = |channel: Channel| async move {
        PaymentRailClient::new(channel)
            .lookup(LookupRequest {
                reference: "req-kernel".to_owned(),
            })
            .await
            .expect_err("refused")
    };
    let status = raw(timed(anonymous(
        &ours,
        server.local_addr(),
        RAIL_SERVER_NAME,
    )))
    .await;
    assert_refused_definite(&status, Code::Unauthenticated, "no certificate");
    let status = raw(timed(
        Transport::Insecure
            .endpoint_to(&server.local_addr().to_string(), RAIL_SERVER_NAME)
            .expect("endpoint"),
    ))
    .await;
    assert_refused_definite(&status, Code::Unauthenticated, "plaintext");
    let status = raw(timed(
        transport(&ours, "agent")
            .endpoint_to(&server.local_addr().to_string(), RAIL_SERVER_NAME)
            .expect("endpoint"),
    ))
    .await;
    assert_refused_definite(&status, Code::PermissionDenied, "an agent");
    server.shutdown().await.expect("shutdown");
}

/// A kernel node reaches a TLS rail with its cluster certificate by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_node_pays_through_a_tls_rail_with_its_kernel_certificate() {
    let ours = certs("tls-ports");
    let rail = Arc::new(InMemoryRail::new());
    let server = start_rail(&ours, rail.clone()).await;
    let mut config = kernel_config(ours.path());
    config.rail.kind = "remote".to_owned();
    config.rail.endpoint = Some(server.endpoint());
    config.validate().expect("valid");
    let (_, _, adapter): (_, _, Arc<dyn PaymentAdapter>) =
        tally_kernel::server::build_kernel(&config).expect("kernel");
    adapter
        .authorize("req-node", &Money::new(5, "USD"))
        .await
        .expect("authorized over TLS");
    assert_eq!(rail.counts("req-node").authorizations, 1);

    config.rail.endpoint = Some(format!("http://{}", server.local_addr()));
    let error = config.validate().expect_err("plaintext scheme over TLS");
    assert!(error.to_string().contains("rail.endpoint"), "{error}");
    server.shutdown().await.expect("shutdown");
}

/// `tally-kernel healthcheck`, the exec probe of the image and of Kubernetes: exit 0 and
/// SERVING with a certificate of the node's CA; exit 1, nothing printed as serving, with
/// another CA's certificate or when nothing listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_healthcheck_command_passes_with_the_cas_certificate_only() {
    let ours = certs("tls-healthcheck");
    let theirs = certs("intruder");
    let node = start_kernel(&ours).await;
    let address = node.local_addr.to_string();
    let healthcheck = |dir: &Path, endpoint: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tally-kernel"))
            .args([
                "healthcheck",
                "--endpoint",
                endpoint,
                "--timeout-ms",
                "5000",
            ])
            .arg("--tls-dir")
            .arg(dir)
            .output()
            .expect("tally-kernel runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let ours_dir = ours.path().to_owned();
    let (code, stdout, stderr) =
        tokio::task::spawn_blocking(move || healthcheck(&ours_dir, &address))
            .await
            .expect("probe");
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    assert!(stdout.contains("SERVING"), "{stdout}");

    let address = node.local_addr.to_string();
    let theirs_dir = theirs.path().to_owned();
    let (code, stdout, _) = tokio::task::spawn_blocking(move || healthcheck(&theirs_dir, &address))
        .await
        .expect("probe");
    assert_eq!(code, Some(1), "another CA's certificate: {stdout}");
    assert!(!stdout.contains("SERVING"), "{stdout}");

    // A port nothing listens on (this one was bound, then closed).
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .to_string();
    let ours_dir = ours.path().to_owned();
    let (code, _, stderr) = tokio::task::spawn_blocking(move || healthcheck(&ours_dir, &closed))
        .await
        .expect("probe");
    assert_eq!(code, Some(1), "nothing listening");
    assert!(
        stderr.contains("127.0.0.1"),
        "the error names the endpoint: {stderr}"
    );
}
