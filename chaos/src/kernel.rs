//! The kernel layer of a run: kernel node processes (`chaos-kernel serve`) in front of the
//! cluster's proxies, sharing one payment rail (a `RailServer` over a seeded `FaultyRail`
//! over an `InMemoryRail`) and one HTTP JSON tool server, both hosted by the harness and both
//! counting per request id, so a double payment or dispatch across kernels is visible.
//! Every port is mutual TLS with the run's certificates (`<run>/tls`, from
//! `ensure_dev_certs`): the kernels serve `kernel-server` to the workload's `agent`
//! certificate, and the rail serves `rail` to the kernels' `kernel` certificate.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tally_kernel::config::{KernelNodeConfig, RailSettings, ToolServerSettings};
use tally_kernel::payment::{Fault, FaultyRail, RailOp, RailServer};
use tally_kernel::port::ServerTls;
use tally_kernel::tool::testing::{read_json_request, write_json_reply};
use tally_kernel::{InMemoryRail, KeyPair, PaymentError, PublicKey};
use tokio::task::JoinHandle;

use crate::listen_port::reserved_listen_addr;

/// The tool server and tool every kernel grant names.
pub const TOOL_SERVER: &str = "chaos-tools";
pub const TOOL: &str = "compute";
/// Request bytes the tool server reads per connection.
const MAX_TOOL_REQUEST_BYTES: usize = 256 * 1024;
/// How long a (re)started kernel gets to listen.
const KERNEL_START: Duration = Duration::from_secs(15);

/// One kernel node process, killed (SIGKILL) and restarted by pid; dropping it kills it.
pub struct KernelProcess {
    pub id: u64,
    pub binary: PathBuf,
    pub config_file: PathBuf,
    pub log_file: PathBuf,
    pub listen: SocketAddr,
    pub receipt_log: PathBuf,
    pub public_key: PublicKey,
    child: Option<Child>,
    pub starts: u32,
}

impl KernelProcess {
    pub fn start(&mut self) -> anyhow::Result<u32> {
        self.kill();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .with_context(|| format!("open {}", self.log_file.display()))?;
        let log_err = log.try_clone()?;
        let mut command = Command::new(&self.binary);
        command
            .arg("serve")
            .arg("--config")
            .arg(&self.config_file)
            .env("RUST_LOG", "warn")
            .env_remove("TALLY_KERNEL_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // SAFETY: prctl is async-signal-safe and touches only the child's own state.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("start kernel {} from {}", self.id, self.binary.display()))?;
        let pid = child.id();
        self.child = Some(child);
        self.starts += 1;
        Ok(pid)
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits (bounded) until the kernel accepts connections.
    pub async fn wait_listening(&self, within: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if tokio::net::TcpStream::connect(self.listen).await.is_ok() {
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < within,
                "kernel {} not listening on {} within {within:?} (see {})",
                self.id,
                self.listen,
                self.log_file.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for KernelProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Dispatches per request id (the `request_id` argument), as the tool server saw them.
#[derive(Clone, Default)]
pub struct ToolCounts(Arc<Mutex<BTreeMap<String, u64>>>);

impl ToolCounts {
    fn entered(&self, request_id: &str) {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry(request_id.to_owned()).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// An HTTP JSON tool server on 127.0.0.1 that counts every call by its `request_id`
/// argument, answers with the `cost` argument as the call's cost, and fails after its side
/// effect when the arguments say `"fail": true`.
pub async fn spawn_tool_server() -> std::io::Result<(SocketAddr, ToolCounts, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let counts = ToolCounts::default();
    let shared = counts.clone();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counts = shared.clone();
            tokio::spawn(async move {
                let _ = answer(stream, counts).await;
            });
        }
    });
    Ok((address, counts, task))
}

async fn answer(mut stream: tokio::net::TcpStream, counts: ToolCounts) -> std::io::Result<()> {
    let Some(call) = read_json_request(&mut stream, MAX_TOOL_REQUEST_BYTES).await? else {
        return Ok(());
    };
    let arguments = call.get("arguments").cloned().unwrap_or(Value::Null);
    let request_id = arguments
        .get("request_id")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    counts.entered(request_id);
    let (status, reply) = if arguments.get("fail") == Some(&Value::Bool(true)) {
        (
            500,
            json!({ "error": { "kind": "failed", "message": "tool crashed after its side effect" } }),
        )
    } else {
        let cost = arguments.get("cost").and_then(Value::as_u64).unwrap_or(0);
        (
            200,
            json!({ "content": { "request_id": request_id }, "cost": { "units": cost, "currency": "USD" } }),
        )
    };
    write_json_reply(&mut stream, status, &reply).await
}

/// What the fleet shares and counts; the processes themselves live in the cluster (so the
/// nemeses can kill them).
pub struct KernelFleet {
    pub rail: Arc<InMemoryRail>,
    pub faulty: Arc<FaultyRail>,
    rail_server: Option<RailServer>,
    pub tools: ToolCounts,
    tool_task: JoinHandle<()>,
    pub issuer: KeyPair,
    pub agent: KeyPair,
    pub kernel_keys: Vec<PublicKey>,
    pub endpoints: KernelEndpoints,
    pub receipt_logs: Vec<PathBuf>,
    /// The scripted rail faults, for the report.
    pub rail_faults: Vec<String>,
}

/// Where the kernels listen (`host:port` by kernel id), and how the workload reaches them:
/// with the run's `agent` certificate, the one role a kernel node's port admits.
#[derive(Clone, Debug)]
pub struct KernelEndpoints {
    pub transport: tally_client::Transport,
    pub addresses: BTreeMap<u64, String>,
}

fn seeded_key(rng: &mut StdRng) -> KeyPair {
    let mut seed = [0u8; 32];
    rng.fill(&mut seed);
    KeyPair::from_seed(&seed)
}

/// Seeded rail faults at seeded positions among the first calls: a definite decline and an
/// outage of an authorization, a lost authorization acknowledgement, an unavailable capture.
fn script_rail(faulty: &FaultyRail, rng: &mut StdRng) -> Vec<String> {
    let mut out = Vec::new();
    let authorize = [
        Fault::Fail(PaymentError::Declined("chaos: card declined".into())),
        Fault::Fail(PaymentError::Unavailable("chaos: rail down".into())),
        Fault::LoseAck(PaymentError::RailError(
            "chaos: acknowledgement lost".into(),
        )),
    ];
    for fault in authorize {
        let skip = rng.random_range(2..15);
        for _ in 0..skip {
            faulty.push(RailOp::Authorize, Fault::Delay(Duration::ZERO));
        }
        out.push(format!("authorize: {fault:?} after {skip} more call(s)"));
        faulty.push(RailOp::Authorize, fault);
    }
    let skip = rng.random_range(2..15);
    for _ in 0..skip {
        faulty.push(RailOp::Capture, Fault::Delay(Duration::ZERO));
    }
    let fault = Fault::Fail(PaymentError::Unavailable("chaos: capture outage".into()));
    out.push(format!("capture: {fault:?} after {skip} call(s)"));
    faulty.push(RailOp::Capture, fault);
    out
}

impl KernelFleet {
    /// Starts the rail and the tool server, writes each kernel's config under `dir`, and
    /// returns the fleet and the (started, listening) kernel processes.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        count: u64,
        cluster_endpoints: Vec<String>,
        cluster_tls_dir: &Path,
        seed: u64,
    ) -> anyhow::Result<(Self, BTreeMap<u64, KernelProcess>)> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6b65_726e);
        let rail = Arc::new(InMemoryRail::new());
        let faulty = Arc::new(FaultyRail::new(rail.clone()));
        let rail_faults = script_rail(&faulty, &mut rng);
        let rail_tls = ServerTls::from_dir(
            cluster_tls_dir,
            tally_tls::issue::DEV_RAIL_SERVER,
            tally_tls::issue::RAIL_SERVER_NAME,
            false,
        )
        .context("the run's rail certificate")?;
        let rail_server = RailServer::start(
            faulty.clone(),
            SocketAddr::from(([127, 0, 0, 1], 0)),
            rail_tls,
        )
        .await
        .context("start the rail server")?;
        let agent_transport = tally_client::Transport::from_dir(cluster_tls_dir, "agent", false)
            .context("the run's agent certificate")?;
        let (tool_addr, tools, tool_task) =
            spawn_tool_server().await.context("start the tool server")?;
        let issuer = seeded_key(&mut rng);
        let agent = seeded_key(&mut rng);
        let keys: Vec<KeyPair> = (0..count).map(|_| seeded_key(&mut rng)).collect();
        let kernel_keys: Vec<PublicKey> = keys.iter().map(KeyPair::public_key).collect();
        std::fs::create_dir_all(dir)?;
        let mut processes = BTreeMap::new();
        let mut endpoints = BTreeMap::new();
        let mut receipt_logs = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let id = index as u64 + 1;
            let listen = reserved_listen_addr()?;
            let receipt_log = dir.join(format!("kernel-{id}-receipts.jsonl"));
            let _ = std::fs::remove_file(&receipt_log);
            // The seed stays out of the config file: a key file, created 0600 (the node
            // refuses one anyone else can read).
            let key_file = dir.join(format!("kernel-{id}.key"));
            let _ = std::fs::remove_file(&key_file);
            tally_kernel::key_file::write_key_file(&key_file, key)
                .with_context(|| format!("write {}", key_file.display()))?;
            let config = KernelNodeConfig {
                listen_addr: listen,
                // The run's `kernel-server` certificate, for the workload's `agent` one.
                tls_dir: cluster_tls_dir.to_owned(),
                metrics_addr: None,
                key_file: Some(key_file),
                trusted_issuers: vec![issuer.public_key().to_base64()],
                trusted_kernel_keys: kernel_keys
                    .iter()
                    .filter(|k| **k != key.public_key())
                    .map(PublicKey::to_base64)
                    .collect(),
                cluster_endpoints: cluster_endpoints.clone(),
                // The run's `kernel` certificate (every namespace), also shown to the rail.
                cluster_tls_dir: cluster_tls_dir.to_owned(),
                rail: RailSettings {
                    kind: "remote".to_owned(),
                    endpoint: Some(rail_server.endpoint()),
                    call_timeout_ms: 3_000,
                    ..KernelNodeConfig::default().rail
                },
                tool_servers: vec![ToolServerSettings {
                    id: TOOL_SERVER.to_owned(),
                    url: format!("http://{tool_addr}/call"),
                    tools: vec![TOOL.to_owned()],
                }],
                dispatch_deadline_ms: 3_000,
                client_attempt_timeout_ms: 1_500,
                client_retry_for_ms: 5_000,
                client_resolve_for_ms: 5_000,
                receipt_log: Some(receipt_log.clone()),
                ..KernelNodeConfig::default()
            };
            config
                .validate()
                .map_err(|e| anyhow::anyhow!("kernel {id} config: {e}"))?;
            let config_file = dir.join(format!("kernel-{id}.toml"));
            std::fs::write(&config_file, toml::to_string(&config)?)?;
            let mut process = KernelProcess {
                id,
                binary: binary.to_owned(),
                config_file,
                log_file: dir.join(format!("kernel-{id}.log")),
                listen,
                receipt_log: receipt_log.clone(),
                public_key: key.public_key(),
                child: None,
                starts: 0,
            };
            let _ = std::fs::remove_file(&process.log_file);
            process.start()?;
            endpoints.insert(id, listen.to_string());
            receipt_logs.push(receipt_log);
            processes.insert(id, process);
        }
        for process in processes.values() {
            process.wait_listening(KERNEL_START).await?;
        }
        Ok((
            Self {
                rail,
                faulty,
                rail_server: Some(rail_server),
                tools,
                tool_task,
                issuer,
                agent,
                kernel_keys,
                endpoints: KernelEndpoints {
                    transport: agent_transport,
                    addresses: endpoints,
                },
                receipt_logs,
                rail_faults,
            },
            processes,
        ))
    }

    /// (authorizations, captures) per request id, from the rail's own counters.
    pub fn payments<'a>(
        &self,
        request_ids: impl IntoIterator<Item = &'a String>,
    ) -> BTreeMap<String, (u32, u32)> {
        request_ids
            .into_iter()
            .map(|id| {
                let counts = self.rail.counts(id);
                (id.clone(), (counts.authorizations, counts.captures))
            })
            .collect()
    }

    pub async fn shutdown(mut self) {
        self.tool_task.abort();
        if let Some(server) = self.rail_server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await;
        }
    }
}

impl Drop for KernelFleet {
    fn drop(&mut self) {
        self.tool_task.abort();
    }
}
