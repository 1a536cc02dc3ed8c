//! `tally-demo`: the demo services of the container deployment (deploy/compose/), and the
//! driver its test uses. `tally-kernel demo` runs a tool server and a payment rail inside its
//! own process; a deployment needs them as services that several kernel containers share, and
//! a client that sends signed tool calls to those kernels from outside. Nothing here is for
//! production: the tool answers every call with a fixed cost and the rail keeps its money in
//! memory.
//!
//! - `tool-server`: an HTTP JSON tool server (`POST /call`), counting dispatches per request
//!   (`GET /stats`: a request dispatched twice would show up as a duplicate).
//! - `rail`: the `tally.rail.v1` payment rail over an in-memory ledger of payments (mutual TLS
//!   with a server certificate naming `tally-rail`, kernels only), with its count of
//!   authorizations on `GET /stats` (a second port, plain HTTP).
//! - `drive`: issues capability tokens from the issuer's key (`--tokens`, one budget family
//!   each), sends signed `EvaluateToolCall` requests to the kernel nodes (retrying the same request id through failures, as an agent
//!   would) and writes one line per acknowledged decision.
//! - `check`: reads those lines back from the cluster: every acknowledged Allow must have its
//!   hold captured in the journal, each capability's call count must match, and the tool
//!   server and rail must have seen one dispatch and one authorization per Allow.
//! - `server-cert`: issues a kernel node's or a rail's server certificate from the cluster CA
//!   (`tally-node certs` issues node and client certificates only, so far).
//!
//! Built as a binary of the `tally-tests` package (tests/Cargo.toml), so `cargo build` and the
//! test suite build it next to `tally-node`, `tally` and `tally-kernel`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use tally_client::{ClientConfig, TallyClient, Transport};
use tally_kernel::money::Money;
use tally_kernel::payment::remote::RailServer;
use tally_kernel::payment::InMemoryRail;
use tally_kernel::pipeline::{wall_clock_ms, Method};
use tally_kernel::port::ServerTls;
use tally_kernel::server::pb::kernel_client::KernelClient;
use tally_kernel::server::pb::{self, Verdict};
use tally_kernel::server::sign_tool_call;
use tally_kernel::{CapabilityToken, Grant, KeyPair};
use tally_ledger::{AccountKey, CapabilityId, FamilyId, HoldId, HoldView, InvocationState};
use tally_tls::issue::{CertAuthority, KERNEL_SERVER_NAME, RAIL_SERVER_NAME};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The tool server's id and tool, as the kernels' configuration names them.
const TOOL_SERVER: &str = "demo-tools";
const TOOL: &str = "compute";
/// The most one HTTP request to the demo servers may carry.
const MAX_HTTP_BYTES: usize = 1 << 20;

#[derive(Parser)]
#[command(
    name = "tally-demo",
    version,
    about = "Demo tool server, payment rail and tool-call driver for deploy/compose"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the demo tool (`POST /call`, any path but /stats) and its counters (`GET /stats`).
    ToolServer {
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// What every call reports it cost, in cents.
        #[arg(long, default_value_t = 37)]
        cost_units: u64,
    },
    /// Serve the `tally.rail.v1` payment rail (in memory) and its counters on a second port.
    Rail {
        #[arg(long, default_value = "0.0.0.0:9090")]
        listen: SocketAddr,
        #[arg(long, default_value = "0.0.0.0:9091")]
        stats_listen: SocketAddr,
        #[command(flatten)]
        server: ServerCredentials,
    },
    /// Issue a server certificate (`<dir>/<name>.pem`/`.key`) from the CA in --dir, naming
    /// `tally-kernel` (--for kernel) or `tally-rail` (--for rail) and every --host.
    ServerCert {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long = "for", value_parser = ["kernel", "rail"])]
        role: String,
        #[arg(long = "host")]
        hosts: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
    /// Send signed tool calls to kernel nodes; write each acknowledged decision to --out.
    Drive(DriveArgs),
    /// Check acknowledged decisions (files written by `drive`) against the cluster and the
    /// demo services.
    Check {
        /// Cluster endpoints, comma separated.
        #[arg(long, env = "TALLY_ENDPOINTS", value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        #[arg(long, env = "TALLY_TLS_DIR", default_value = "/etc/tally/tls")]
        tls_dir: PathBuf,
        /// The certificate presented: `reader` is enough.
        #[arg(long, default_value = "reader")]
        identity: String,
        /// `http://host:port/stats` of the tool server.
        #[arg(long)]
        tool_stats: Option<String>,
        /// `http://host:port/stats` of the rail.
        #[arg(long)]
        rail_stats: Option<String>,
        /// Files written by `drive`.
        #[arg(required = true)]
        acks: Vec<PathBuf>,
    },
}

/// The certificate a caller presents: `<tls-dir>/ca.pem` and `<tls-dir>/<identity>.pem`/`.key`.
#[derive(clap::Args)]
struct ClientCredentials {
    #[arg(long, default_value = "/etc/tally/tls")]
    tls_dir: PathBuf,
    /// The certificate presented to kernel nodes: an `agent` one.
    #[arg(long, default_value = "agent")]
    identity: String,
    /// Plaintext, to a port configured insecure.
    #[arg(long)]
    insecure: bool,
}

impl ClientCredentials {
    fn transport(&self) -> anyhow::Result<Transport> {
        Ok(Transport::from_dir(
            &self.tls_dir,
            &self.identity,
            self.insecure,
        )?)
    }
}

/// A server's own certificate: `<tls-dir>/ca.pem` and `<tls-dir>/<identity>.pem`/`.key`.
#[derive(clap::Args)]
struct ServerCredentials {
    #[arg(long, default_value = "/etc/tally/tls")]
    tls_dir: PathBuf,
    #[arg(long, default_value = "rail")]
    identity: String,
    /// Plaintext, and no caller checked.
    #[arg(long)]
    insecure: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::ToolServer { listen, cost_units } => tool_server(listen, cost_units).await,
        Command::Rail {
            listen,
            stats_listen,
            server,
        } => rail(listen, stats_listen, &server).await,
        Command::ServerCert {
            dir,
            name,
            role,
            hosts,
            days,
        } => server_cert(&dir, &name, &role, &hosts, days),
        Command::Drive(args) => drive(args).await,
        Command::Check {
            endpoints,
            tls_dir,
            identity,
            tool_stats,
            rail_stats,
            acks,
        } => {
            check(
                endpoints, &tls_dir, &identity, tool_stats, rail_stats, &acks,
            )
            .await
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tally-demo: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// SIGINT or SIGTERM (a container's stop signal).
async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

// ---------------------------------------------------------------------------------------
// HTTP: the least a tool server and a stats page need (one request per connection).

struct HttpRequest {
    method: String,
    path: String,
    body: Vec<u8>,
}

async fn read_request(stream: &mut TcpStream) -> anyhow::Result<Option<HttpRequest>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        ensure!(buffer.len() <= MAX_HTTP_BYTES, "request head too large");
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = std::str::from_utf8(&buffer[..head_end]).context("head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split_whitespace();
    let method = request_line.next().unwrap_or_default().to_owned();
    let path = request_line.next().unwrap_or_default().to_owned();
    let length = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.trim().parse::<usize>())
        .transpose()
        .context("bad Content-Length")?
        .unwrap_or(0);
    ensure!(length <= MAX_HTTP_BYTES, "request body too large");
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            bail!("connection closed inside the body");
        }
        body.extend_from_slice(&chunk[..read]);
    }
    body.truncate(length);
    Ok(Some(HttpRequest { method, path, body }))
}

async fn write_json(stream: &mut TcpStream, status: u16, value: &Value) -> std::io::Result<()> {
    let body = value.to_string();
    let reason = if status == 200 { "OK" } else { "Error" };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Serves `answer` on `listener` until a stop signal.
async fn serve_http<F>(listener: TcpListener, answer: F)
where
    F: Fn(HttpRequest) -> (u16, Value) + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    let accept = async {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let reply = match read_request(&mut stream).await {
                    Ok(Some(request)) => answer(request),
                    Ok(None) => return,
                    Err(error) => (
                        400,
                        json!({ "error": { "kind": "failed", "message": error.to_string() } }),
                    ),
                };
                let _ = write_json(&mut stream, reply.0, &reply.1).await;
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = stop_signal() => {}
    }
}

/// `GET url` (`http://host:port/path`), parsed as JSON.
async fn get_json(url: &str) -> anyhow::Result<Value> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{url}: only http:// URLs"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut stream = TcpStream::connect(authority)
        .await
        .with_context(|| format!("connect {authority}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("{url}: no HTTP response"))?;
    serde_json::from_slice(&raw[split + 4..]).with_context(|| format!("{url}: not JSON"))
}

// ---------------------------------------------------------------------------------------
// tool-server and rail

async fn tool_server(listen: SocketAddr, cost_units: u64) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let cost = serde_json::to_value(Money::new(cost_units, "USD"))?;
    // Dispatches per request id (the driver puts it in the arguments).
    let seen: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let dispatches = Arc::new(AtomicU64::new(0));
    println!("tally-demo tool server on {listen}: {TOOL_SERVER}/{TOOL}, {cost_units} cents a call");
    serve_http(listener, move |request| {
        if request.method == "GET" && request.path == "/stats" {
            let seen = seen.lock().expect("stats lock");
            let duplicates: Vec<&String> = seen
                .iter()
                .filter(|(_, count)| **count > 1)
                .map(|(id, _)| id)
                .collect();
            return (
                200,
                json!({
                    "dispatches": dispatches.load(Ordering::SeqCst),
                    "distinct_requests": seen.len(),
                    "duplicates": duplicates,
                }),
            );
        }
        let call: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        dispatches.fetch_add(1, Ordering::SeqCst);
        if let Some(id) = call
            .pointer("/arguments/request_id")
            .and_then(Value::as_str)
        {
            *seen
                .lock()
                .expect("stats lock")
                .entry(id.to_owned())
                .or_default() += 1;
        }
        (200, json!({ "content": call, "cost": cost }))
    })
    .await;
    Ok(())
}

async fn rail(
    listen: SocketAddr,
    stats_listen: SocketAddr,
    credentials: &ServerCredentials,
) -> anyhow::Result<()> {
    let tls = ServerTls::from_dir(
        &credentials.tls_dir,
        &credentials.identity,
        RAIL_SERVER_NAME,
        credentials.insecure,
    )?;
    let memory = Arc::new(InMemoryRail::new());
    let server = RailServer::start(memory.clone(), listen, tls)
        .await
        .with_context(|| format!("start the rail on {listen}"))?;
    let stats = TcpListener::bind(stats_listen)
        .await
        .with_context(|| format!("bind {stats_listen}"))?;
    println!(
        "tally-demo rail: tally.rail.v1 on {}, counters on http://{stats_listen}/stats",
        server.local_addr()
    );
    serve_http(stats, move |_| {
        (
            200,
            json!({ "authorizations": memory.total_authorizations() }),
        )
    })
    .await;
    server.shutdown().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// drive

fn server_cert(
    dir: &Path,
    name: &str,
    role: &str,
    hosts: &[String],
    days: u32,
) -> anyhow::Result<()> {
    let server_name = if role == "rail" {
        RAIL_SERVER_NAME
    } else {
        KERNEL_SERVER_NAME
    };
    CertAuthority::load(dir)?
        .issue_server(name, server_name, hosts, days)?
        .write(dir, name)?;
    println!(
        "{role} server {name} ({server_name}): {0}/{name}.pem and {name}.key",
        dir.display()
    );
    Ok(())
}

/// The most capability tokens (so families) one `drive` spreads its calls over.
const MAX_TOKENS: u32 = 4_096;
/// The most calls one `drive` keeps in flight.
const MAX_CONCURRENCY: u64 = 4_096;

#[derive(clap::Args)]
struct DriveArgs {
    /// Kernel nodes (`host:port`), comma separated; calls go round robin, and a retry goes
    /// to the next one.
    #[arg(long, value_delimiter = ',', required = true)]
    kernels: Vec<String>,
    #[command(flatten)]
    client: ClientCredentials,
    /// The token issuer's key file (`tally-kernel keygen --out`); the kernels trust its
    /// public key.
    #[arg(long)]
    issuer_key: PathBuf,
    /// Prefix of every request id (unique per run).
    #[arg(long)]
    run_id: String,
    /// Calls to make; SIGTERM or SIGINT stops issuing new ones earlier (in-flight calls
    /// still get their answers), so a test can drive load until its faults are done.
    #[arg(long, default_value_t = 200)]
    calls: u64,
    /// Stop issuing new calls after this many seconds (in-flight calls still get their
    /// answers), whichever of --calls and this comes first.
    #[arg(long)]
    duration_s: Option<u64>,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=MAX_CONCURRENCY))]
    concurrency: u64,
    /// Capability tokens to issue (each its own budget family); call i uses token i mod N,
    /// so the load spreads over N families as many agents' would.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_TOKENS as i64))]
    tokens: u32,
    /// Give up on one request after retrying it this long.
    #[arg(long, default_value_t = 120_000)]
    retry_for_ms: u64,
    /// JSON lines, one per acknowledged decision (appended).
    #[arg(long)]
    out: PathBuf,
    /// Print the run's figures as one JSON object on the last line of standard output.
    #[arg(long)]
    summary_json: bool,
}

/// A `drive` run's figures (`--summary-json`).
#[derive(serde::Serialize)]
struct DriveSummary {
    kernels: usize,
    concurrency: u64,
    tokens: u32,
    allowed: u64,
    seconds: f64,
    calls_per_s: f64,
    retried_attempts: u64,
    p50_ms: u64,
    p99_ms: u64,
    max_ms: u64,
    /// This process's CPU time (user + system, all threads) over the run, so a measurement
    /// can tell the driver's share of the machine from the kernels' and the nodes'.
    cpu_s: Option<f64>,
}

/// CPU time (user + system, all threads) this process has used, from /proc/self/stat (fields
/// 14 and 15, in the kernel's fixed USER_HZ of 100 ticks a second); None off Linux.
fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index)?.parse::<u64>().ok();
    // After the name come field 3 (state) onwards: utime is field 14, stime field 15.
    Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
}

/// One acknowledged decision, as `drive` writes it and `check` reads it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Ack {
    request_id: String,
    family: String,
    capability: String,
    hold: String,
    verdict: String,
    kernel: String,
    attempts: u32,
    latency_ms: u64,
}

/// One issued capability: its token text and the family and capability its calls count in.
struct IssuedToken {
    text: String,
    family: FamilyId,
    capability: CapabilityId,
}

async fn drive(options: DriveArgs) -> anyhow::Result<()> {
    let issuer = tally_kernel::key_file::read_key_file(&options.issuer_key)
        .with_context(|| format!("issuer key {}", options.issuer_key.display()))?;
    let agent = KeyPair::generate();
    let now = wall_clock_ms();
    // Room for every call of a long run: the budget is not what this exercises.
    let grant =
        Grant::monetary(TOOL_SERVER, TOOL, 100, 100_000_000, "USD").with_max_invocations(1_000_000);
    let mut tokens = Vec::new();
    for _ in 0..options.tokens {
        let token = CapabilityToken::issue(
            &issuer,
            agent.public_key(),
            vec![grant.clone()],
            now,
            now + 3_600_000,
        )?;
        tokens.push(IssuedToken {
            text: token.to_text()?,
            family: token.family_id(),
            capability: token.id().clone(),
        });
    }
    let transport = options.client.transport()?;
    let mut clients = Vec::new();
    for kernel in &options.kernels {
        let channel = transport
            .endpoint_to(kernel, KERNEL_SERVER_NAME)?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(15))
            .connect_lazy();
        clients.push((kernel.clone(), KernelClient::new(channel)));
    }
    let out = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&options.out)
            .with_context(|| format!("open {}", options.out.display()))?,
    ));
    let families = if tokens.len() == 1 {
        format!(
            "family {}, capability {}",
            tokens[0].family, tokens[0].capability
        )
    } else {
        format!("{} families", tokens.len())
    };
    let limit = options
        .duration_s
        .map(|s| format!(" or {s} s"))
        .unwrap_or_default();
    println!(
        "driving {} calls{limit} ({} at a time) through {} kernel(s): {families}",
        options.calls,
        options.concurrency,
        clients.len()
    );
    let started = Instant::now();
    let cpu_at_start = process_cpu_s();
    let next = Arc::new(AtomicU64::new(0));
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopper = {
        let stopping = stopping.clone();
        let duration = options.duration_s.map(Duration::from_secs);
        tokio::spawn(async move {
            let deadline = async {
                match duration {
                    Some(duration) => tokio::time::sleep(duration).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop_signal() => println!("stop signal: finishing the calls in flight"),
                () = deadline => {}
            }
            stopping.store(true, Ordering::SeqCst);
        })
    };
    let retried = Arc::new(AtomicU64::new(0));
    let latencies: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut workers = tokio::task::JoinSet::new();
    let shared = Arc::new((clients, agent, tokens));
    for _ in 0..options.concurrency {
        let (stopping, next, retried, latencies, out, shared) = (
            stopping.clone(),
            next.clone(),
            retried.clone(),
            latencies.clone(),
            out.clone(),
            shared.clone(),
        );
        let (calls, run_id) = (options.calls, options.run_id.clone());
        let retry_for = Duration::from_millis(options.retry_for_ms);
        workers.spawn(async move {
            let (clients, agent, tokens) = &*shared;
            loop {
                if stopping.load(Ordering::SeqCst) {
                    return anyhow::Ok(());
                }
                let index = next.fetch_add(1, Ordering::SeqCst);
                if index >= calls {
                    return anyhow::Ok(());
                }
                let token = &tokens[(index % tokens.len() as u64) as usize];
                let request_id = format!("{run_id}-{index}");
                let call = pb::ToolCall {
                    request_id: request_id.clone(),
                    capability_token: token.text.clone(),
                    server: TOOL_SERVER.to_owned(),
                    tool: TOOL.to_owned(),
                    arguments_json: json!({ "request_id": request_id }).to_string(),
                    execution_nonce: None,
                    possession: None,
                };
                let began = Instant::now();
                let mut attempt = 0u32;
                let (kernel, evaluation) = loop {
                    let (name, client) =
                        &clients[(index as usize + attempt as usize) % clients.len()];
                    attempt += 1;
                    // Each send is signed afresh: a proof is good for a short window only.
                    let mut signed = call.clone();
                    sign_tool_call(
                        &mut signed,
                        Method::EvaluateToolCall,
                        agent,
                        wall_clock_ms(),
                    )?;
                    match client.clone().evaluate_tool_call(signed).await {
                        Ok(reply) => break (name.clone(), reply.into_inner()),
                        Err(status) => {
                            retried.fetch_add(1, Ordering::Relaxed);
                            if began.elapsed() > retry_for {
                                bail!("{request_id}: no answer after {attempt} attempts: {status}");
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                };
                let latency_ms = began.elapsed().as_millis() as u64;
                let verdict = match Verdict::try_from(evaluation.verdict) {
                    Ok(Verdict::Allow) => "allow",
                    Ok(Verdict::Deny) => "deny",
                    _ => "unspecified",
                };
                if verdict != "allow" {
                    bail!(
                        "{request_id}: {verdict} ({})",
                        evaluation.reason.unwrap_or_default()
                    );
                }
                let hold = tally_client::ids::hold_id(&request_id, &token.capability, 0)?;
                let ack = Ack {
                    request_id,
                    family: token.family.to_string(),
                    capability: token.capability.to_string(),
                    hold: hold.to_string(),
                    verdict: verdict.to_owned(),
                    kernel,
                    attempts: attempt,
                    latency_ms,
                };
                let line = serde_json::to_string(&ack)?;
                // Written (and flushed) once acknowledged, so a crash of the driver keeps it.
                writeln!(out.lock().expect("out lock"), "{line}")?;
                latencies.lock().expect("latencies lock").push(latency_ms);
            }
        });
    }
    let mut failures = Vec::new();
    while let Some(result) = workers.join_next().await {
        if let Err(error) = result? {
            failures.push(error.to_string());
        }
    }
    stopper.abort();
    let mut latencies = latencies.lock().expect("latencies lock").clone();
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let seconds = started.elapsed().as_secs_f64();
    let summary = DriveSummary {
        kernels: options.kernels.len(),
        concurrency: options.concurrency,
        tokens: options.tokens,
        allowed: latencies.len() as u64,
        seconds,
        calls_per_s: latencies.len() as f64 / seconds.max(0.001),
        retried_attempts: retried.load(Ordering::Relaxed),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: latencies.last().copied().unwrap_or(0),
        cpu_s: process_cpu_s()
            .zip(cpu_at_start)
            .map(|(end, start)| end - start),
    };
    println!(
        "{} calls allowed (of {} at most) in {seconds:.1} s ({:.0} calls/s); {} failed attempts retried; latency p50 {} ms, p99 {} ms, max {} ms",
        summary.allowed,
        options.calls,
        summary.calls_per_s,
        summary.retried_attempts,
        summary.p50_ms,
        summary.p99_ms,
        summary.max_ms
    );
    if !failures.is_empty() {
        bail!(
            "{} request(s) failed: {}",
            failures.len(),
            failures.join("; ")
        );
    }
    if options.summary_json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// check

fn read_acks(files: &[PathBuf]) -> anyhow::Result<Vec<Ack>> {
    let mut acks = Vec::new();
    for file in files {
        let reader = std::io::BufReader::new(
            std::fs::File::open(file).with_context(|| format!("open {}", file.display()))?,
        );
        for line in reader.lines() {
            let line = line?;
            if !line.trim().is_empty() {
                acks.push(
                    serde_json::from_str(&line)
                        .with_context(|| format!("{}: {line}", file.display()))?,
                );
            }
        }
    }
    Ok(acks)
}

async fn check(
    endpoints: Vec<String>,
    tls_dir: &Path,
    identity: &str,
    tool_stats: Option<String>,
    rail_stats: Option<String>,
    files: &[PathBuf],
) -> anyhow::Result<()> {
    let acks = read_acks(files)?;
    ensure!(!acks.is_empty(), "no acknowledged decisions in {files:?}");
    let transport = Transport::from_dir(tls_dir, identity, false)?;
    let client = Arc::new(TallyClient::new(ClientConfig::new(endpoints, transport))?);
    let distinct: BTreeSet<&str> = acks.iter().map(|a| a.request_id.as_str()).collect();
    ensure!(
        distinct.len() == acks.len(),
        "{} acknowledgements but {} request ids: a request was answered twice",
        acks.len(),
        distinct.len()
    );
    let mut per_capability: BTreeMap<(String, String), u64> = BTreeMap::new();
    for ack in &acks {
        *per_capability
            .entry((ack.family.clone(), ack.capability.clone()))
            .or_default() += 1;
    }
    // Each hold read on its own (linearizable) read, 16 at a time.
    let holds: Vec<(String, String, String)> = acks
        .iter()
        .map(|a| (a.request_id.clone(), a.family.clone(), a.hold.clone()))
        .collect();
    let mut readers = tokio::task::JoinSet::new();
    for chunk in holds.chunks(holds.len().div_ceil(16)) {
        let (client, chunk) = (client.clone(), chunk.to_vec());
        readers.spawn(async move {
            let mut missing = Vec::new();
            for (request_id, family, hold) in chunk {
                let view = client
                    .get_hold(&FamilyId::new(family.as_str()), &HoldId::new(hold.as_str()))
                    .await
                    .with_context(|| format!("read hold {hold}"))?;
                let captured = view
                    .as_ref()
                    .and_then(HoldView::states)
                    .is_some_and(|s| s.invocation == InvocationState::Captured);
                if !captured {
                    missing.push(format!("{request_id} (hold {hold}: {view:?})"));
                }
            }
            anyhow::Ok(missing)
        });
    }
    let mut missing = Vec::new();
    while let Some(result) = readers.join_next().await {
        missing.extend(result??);
    }
    ensure!(
        missing.is_empty(),
        "{} acknowledged Allow(s) without a captured hold in the cluster: {}",
        missing.len(),
        missing.join("; ")
    );
    for ((family, capability), allowed) in &per_capability {
        let usage = client
            .get_usage(
                &FamilyId::new(family.as_str()),
                &AccountKey::new(CapabilityId::new(capability.as_str()), 0),
            )
            .await?
            .with_context(|| format!("no account for capability {capability}"))?;
        ensure!(
            u64::from(usage.account.invocation_count) == *allowed,
            "capability {capability}: {allowed} calls acknowledged, the cluster counts {}",
            usage.account.invocation_count
        );
    }
    let allowed = acks.len() as u64;
    let mut counters = Vec::new();
    if let Some(url) = tool_stats {
        let stats = get_json(&url).await?;
        ensure!(
            stats["duplicates"].as_array().is_some_and(Vec::is_empty)
                && stats["dispatches"].as_u64() == stats["distinct_requests"].as_u64(),
            "the tool ran a request more than once: {stats}"
        );
        ensure!(
            stats["distinct_requests"].as_u64() == Some(allowed),
            "{allowed} Allows but the tool saw {stats}"
        );
        counters.push("one tool dispatch");
    }
    if let Some(url) = rail_stats {
        let stats = get_json(&url).await?;
        ensure!(
            stats["authorizations"].as_u64() == Some(allowed),
            "{allowed} Allows but the rail counts {stats}"
        );
        counters.push("one payment");
    }
    let each = if counters.is_empty() {
        String::new()
    } else {
        format!("; {} each", counters.join(" and "))
    };
    println!(
        "ok: {allowed} acknowledged Allows, each with its hold captured in the cluster; call \
         counts match for {} capabilities{each}",
        per_capability.len()
    );
    Ok(())
}
