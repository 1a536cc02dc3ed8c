//! Bringing a kernel node up from its config: the cluster client, the rail, the tool servers,
//! the receipt log, the gRPC service with health (mutual TLS, agents only: [`crate::port`]),
//! `/metrics`, and the reconciler; and taking it down on shutdown. `main` stays thin: parse,
//! load, `run(config, ctrl_c)`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tally_tls::identity::Role;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use super::metrics::{self, Metrics};
use super::service::KernelService;
use crate::config::{ConfigError, KernelNodeConfig};
use crate::payment::{InMemoryRail, PaymentAdapter, RemoteRail};
use crate::pipeline::{BudgetLedger, Kernel};
use crate::port::{self, Gate, PortError};
use crate::receipt::ReceiptLog;
use crate::reconciler::Reconciler;
use crate::tool::{HttpToolServer, ToolRegistry};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cluster client: {0}")]
    Client(#[from] tally_client::ClientError),
    #[error("payment rail: {0}")]
    Rail(String),
    #[error("receipt log: {0}")]
    ReceiptLog(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    // The credential errors carry their cause in the message and not as a `source`: they are
    // what an operator sees first, and `{:#}` would print the cause twice.
    #[error("cluster credentials: {0}")]
    Tls(tally_tls::TlsError),
    #[error("server credentials: {0}")]
    ServerTls(PortError),
}

impl From<tally_tls::TlsError> for ServerError {
    fn from(error: tally_tls::TlsError) -> Self {
        ServerError::Tls(error)
    }
}

impl From<PortError> for ServerError {
    fn from(error: PortError) -> Self {
        ServerError::ServerTls(error)
    }
}

/// The kernel service's name, as refusals name it.
const KERNEL_SERVICE: &str = "tally.kernel.v1.Kernel";
const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// A node that is serving.
pub struct RunningKernel {
    pub local_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    shutdown: oneshot::Sender<()>,
    stop_reconciler: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RunningKernel {
    /// Stops accepting calls, lets in-flight ones finish, and stops the background tasks.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        let _ = self.shutdown.send(());
        let _ = self.stop_reconciler.send(true);
        let served = self.server.await;
        for task in self.tasks {
            task.abort();
        }
        match served {
            Ok(result) => Ok(result?),
            Err(join) => Err(ServerError::Io(std::io::Error::other(join.to_string()))),
        }
    }
}

/// The kernel, its ledger and its rail, as configured.
pub fn build_kernel(
    config: &KernelNodeConfig,
) -> Result<(Kernel, Arc<dyn BudgetLedger>, Arc<dyn PaymentAdapter>), ServerError> {
    let ledger: Arc<dyn BudgetLedger> = Arc::new(tally_client::TallyClient::new(config.client()?)?);
    let rail: Arc<dyn PaymentAdapter> = match config.rail.kind.as_str() {
        "remote" => {
            let endpoint = config.rail.endpoint.clone().unwrap_or_default();
            let transport = config
                .rail_transport()
                .map_err(|e| ServerError::Rail(e.to_string()))?;
            if !transport.is_tls() {
                tracing::warn!(
                    %endpoint,
                    "the payment rail is reached in plaintext, unauthenticated (rail.insecure)"
                );
            }
            Arc::new(
                RemoteRail::connect(
                    &endpoint,
                    &transport,
                    Duration::from_millis(config.rail.call_timeout_ms),
                )
                .map_err(|e| ServerError::Rail(e.to_string()))?,
            )
        }
        _ => Arc::new(InMemoryRail::new()),
    };
    let mut tools = ToolRegistry::new();
    for server in &config.tool_servers {
        let http = HttpToolServer::new(&server.id, server.tools.clone(), &server.url)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        tools.register(Arc::new(http));
    }
    let mut kernel = Kernel::new(
        config.keypair()?,
        config.token_issuers()?,
        Arc::clone(&ledger),
        Arc::clone(&rail),
    )
    .with_config(config.pipeline())
    .with_tools(tools);
    for key in config.kernel_keys()? {
        kernel = kernel.trust_kernel_key(key);
    }
    if let Some(path) = &config.receipt_log {
        let log = ReceiptLog::open(path).map_err(|e| ServerError::ReceiptLog(e.to_string()))?;
        kernel = kernel.with_receipt_log(Arc::new(log));
    }
    Ok((kernel, ledger, rail))
}

/// Starts serving; returns once the sockets are bound.
pub async fn start(config: KernelNodeConfig) -> Result<RunningKernel, ServerError> {
    config.validate()?;
    // Before anything else starts: a missing certificate is a start-up error, named.
    let tls = config.server_tls()?;
    let (kernel, ledger, rail) = build_kernel(&config)?;
    let metrics = Arc::new(Metrics::default());
    let mut tasks = Vec::new();
    let (stop_reconciler, stopped) = watch::channel(false);
    if config.reconciler.enabled {
        let reconciler = Reconciler::new(ledger, rail, config.reconciler());
        tasks.push(tokio::spawn(async move { reconciler.run(stopped).await }));
    }
    let mut metrics_addr = None;
    if let Some(address) = config.metrics_addr {
        let listener = metrics::bind(address).await?;
        metrics_addr = Some(listener.local_addr()?);
        tasks.push(tokio::spawn(metrics::serve(listener, Arc::clone(&metrics))));
    }
    let listener = TcpListener::bind(config.listen_addr).await?;
    let local_addr = listener.local_addr()?;
    if !tls.is_tls() {
        tracing::warn!(
            %local_addr,
            "tally-kernel serves in plaintext and checks no caller (insecure): anyone who \
             reaches this port may call it"
        );
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let receipt_log = kernel.watch_receipt_log();
    let service = KernelService::new(Arc::new(kernel), Arc::clone(&metrics)).into_server();
    health_reporter
        .set_serving::<super::pb::kernel_server::KernelServer<KernelService>>()
        .await;
    tasks.push(tokio::spawn(report_receipt_log(
        receipt_log,
        health_reporter,
        Arc::clone(&metrics),
    )));
    let enforced = tls.is_tls();
    let health_service = InterceptedService::new(
        health_service,
        Gate::any_certificate(HEALTH_SERVICE, enforced),
    );
    let service =
        InterceptedService::new(service, Gate::role(KERNEL_SERVICE, Role::Agent, enforced));
    let (shutdown, stop) = oneshot::channel::<()>();
    let server = tokio::spawn(
        tls.builder()?
            .add_service(health_service)
            .add_service(service)
            .serve_with_incoming_shutdown(
                port::incoming(listener, enforced, "kernel node"),
                async {
                    let _ = stop.await;
                },
            ),
    );
    tracing::info!(%local_addr, ?metrics_addr, tls = enforced, "tally-kernel serving");
    Ok(RunningKernel {
        local_addr,
        metrics_addr,
        metrics,
        shutdown,
        stop_reconciler,
        tasks,
        server,
    })
}

/// Turns the node unhealthy (gRPC health `NOT_SERVING` for the kernel service and the whole
/// server, the `/metrics` gauge 0) once its receipt log fails, so a load balancer stops sending
/// it calls it would refuse anyway. There is no way back short of a restart.
async fn report_receipt_log(
    mut failure: watch::Receiver<Option<String>>,
    health: HealthReporter,
    metrics: Arc<Metrics>,
) {
    loop {
        let failed = failure.borrow_and_update().clone();
        if let Some(reason) = failed {
            tracing::error!(%reason, "receipt log failed: this node now refuses new calls and reports NOT_SERVING");
            metrics.receipt_log_failed.store(true, Ordering::Relaxed);
            health
                .set_not_serving::<super::pb::kernel_server::KernelServer<KernelService>>()
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
            return;
        }
        if failure.changed().await.is_err() {
            return;
        }
    }
}

/// Serves until `shutdown` completes.
pub async fn run(
    config: KernelNodeConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let running = start(config).await?;
    shutdown.await;
    running.shutdown().await
}
