//! The kernel workload: `EvaluateToolCall` over gRPC to the kernel processes, for monetary
//! calls on a few capabilities (two roots and a delegated child sharing its parent's budget).
//! Some requests are sent to both kernels at once (identical request ids: exactly one may be
//! allowed, pay and dispatch), some are retried later on either kernel, a few ask the tool to
//! fail after its side effect. Every call is signed by its capability's holder (the kernel
//! refuses a bare token), afresh on each send. Bounded in operations; every call has a
//! deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tally_kernel::pipeline::{wall_clock_ms, Method};
use tally_kernel::server::pb::kernel_client::KernelClient;
use tally_kernel::server::pb::{self, Verdict};
use tally_kernel::server::sign_tool_call;
use tally_kernel::{CapabilityToken, Grant, KeyPair};
use tonic::transport::Channel;

use crate::kernel::{KernelEndpoints, TOOL, TOOL_SERVER};

/// One call's deadline (the kernel's own client gives up well before).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Clone, Debug)]
pub struct KernelWorkloadConfig {
    pub workers: usize,
    /// Evaluations in all (twins count twice).
    pub max_evaluations: usize,
    pub think_ms: u64,
}

impl Default for KernelWorkloadConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            max_evaluations: 1_000,
            think_ms: 150,
        }
    }
}

/// One evaluation as the harness saw it.
#[derive(Clone, Debug, Serialize)]
pub struct KernelOp {
    pub request_id: String,
    pub kernel: u64,
    pub capability: String,
    /// Sent to both kernels at once.
    pub twin: bool,
    pub start_ms: u64,
    pub end_ms: u64,
    /// `allow`, `deny` or `error` (no answer: a killed kernel, a deadline).
    pub outcome: String,
    pub reason: Option<String>,
}

#[derive(Clone, Default)]
pub struct KernelHistory(Arc<Mutex<Vec<KernelOp>>>);

impl KernelHistory {
    fn push(&self, op: KernelOp) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(op);
    }

    pub fn snapshot(&self) -> Vec<KernelOp> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// One capability the workload spends: its name in the history, its token text, and the key
/// it was issued to (which signs every call on it).
#[derive(Clone, Debug)]
pub struct WorkloadCapability {
    pub name: String,
    pub token: String,
    holder: KeyPair,
}

impl WorkloadCapability {
    fn new(name: &str, token: &CapabilityToken, holder: &KeyPair) -> anyhow::Result<Self> {
        Ok(Self {
            name: name.to_owned(),
            token: token.to_text()?,
            holder: holder.clone(),
        })
    }
}

/// The capabilities the workload spends.
pub fn capabilities(
    issuer: &KeyPair,
    agent: &KeyPair,
    seed: u64,
) -> anyhow::Result<Vec<WorkloadCapability>> {
    let now = wall_clock_ms();
    let until = now + 6 * 3_600_000;
    let a = CapabilityToken::issue(
        issuer,
        agent.public_key(),
        vec![Grant::monetary(TOOL_SERVER, TOOL, 100, 60_000, "USD").with_max_invocations(1_000)],
        now,
        until,
    )?;
    // A small budget: it runs out during the run, so budget denials happen too.
    let b = CapabilityToken::issue(
        issuer,
        agent.public_key(),
        vec![Grant::monetary(TOOL_SERVER, TOOL, 100, 2_500, "USD").with_max_invocations(1_000)],
        now,
        until,
    )?;
    let sub = KeyPair::from_seed(&[(seed % 251) as u8; 32]);
    let child = a.delegate(
        agent,
        sub.public_key(),
        vec![Grant::monetary(TOOL_SERVER, TOOL, 100, 20_000, "USD")
            .with_max_invocations(400)
            .narrowing(0)],
        now,
        until,
    )?;
    Ok(vec![
        WorkloadCapability::new("root-a", &a, agent)?,
        WorkloadCapability::new("root-b", &b, agent)?,
        WorkloadCapability::new("child-of-a", &child, &sub)?,
    ])
}

fn client(
    transport: &tally_client::Transport,
    address: &str,
) -> anyhow::Result<KernelClient<Channel>> {
    let channel = transport
        .endpoint_to(address, tally_tls::issue::KERNEL_SERVER_NAME)?
        .connect_timeout(Duration::from_secs(1))
        .timeout(CALL_TIMEOUT)
        .connect_lazy();
    Ok(KernelClient::new(channel))
}

struct Call {
    request_id: String,
    capability: WorkloadCapability,
    arguments: String,
    twin: bool,
}

async fn evaluate(
    mut client: KernelClient<Channel>,
    kernel: u64,
    call: Arc<Call>,
    start: Instant,
) -> KernelOp {
    let start_ms = start.elapsed().as_millis() as u64;
    let mut request = pb::ToolCall {
        request_id: call.request_id.clone(),
        capability_token: call.capability.token.clone(),
        server: TOOL_SERVER.to_owned(),
        tool: TOOL.to_owned(),
        arguments_json: call.arguments.clone(),
        execution_nonce: None,
        possession: None,
    };
    let signed = sign_tool_call(
        &mut request,
        Method::EvaluateToolCall,
        &call.capability.holder,
        wall_clock_ms(),
    );
    let (outcome, reason) = match signed {
        Err(error) => ("error", Some(format!("not signed: {error}"))),
        Ok(()) => answer(&mut client, request).await,
    };
    KernelOp {
        request_id: call.request_id.clone(),
        kernel,
        capability: call.capability.name.clone(),
        twin: call.twin,
        start_ms,
        end_ms: start.elapsed().as_millis() as u64,
        outcome: outcome.to_owned(),
        reason,
    }
}

/// `(outcome, reason)` of one signed call.
async fn answer(
    client: &mut KernelClient<Channel>,
    request: pb::ToolCall,
) -> (&'static str, Option<String>) {
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.evaluate_tool_call(request)).await;
    match answer {
        Ok(Ok(reply)) => {
            let reply = reply.into_inner();
            let outcome = if reply.verdict == Verdict::Allow as i32 {
                "allow"
            } else {
                "deny"
            };
            (outcome, reply.reason)
        }
        Ok(Err(status)) => (
            "error",
            Some(format!("{:?}: {}", status.code(), status.message())),
        ),
        Err(_) => ("error", Some(format!("no answer within {CALL_TIMEOUT:?}"))),
    }
}

/// Runs until `stop` or the evaluation budget is spent.
pub async fn run(
    config: KernelWorkloadConfig,
    seed: u64,
    endpoints: KernelEndpoints,
    capabilities: Vec<WorkloadCapability>,
    history: KernelHistory,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    anyhow::ensure!(!endpoints.addresses.is_empty() && !capabilities.is_empty());
    let clients: Vec<(u64, KernelClient<Channel>)> = endpoints
        .addresses
        .iter()
        .map(|(id, address)| Ok((*id, client(&endpoints.transport, address)?)))
        .collect::<anyhow::Result<_>>()?;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..config.workers.max(1) {
        let (clients, capabilities, history, stop, config) = (
            clients.clone(),
            capabilities.clone(),
            history.clone(),
            stop.clone(),
            config.clone(),
        );
        tasks.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ (0x4b45_524e * (worker as u64 + 1)));
            let mut sent: Vec<Arc<Call>> = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && history.len() < config.max_evaluations {
                n += 1;
                let roll = rng.random_range(0..100);
                let call = if roll < 10 && !sent.is_empty() {
                    // A retry of an earlier request, on whichever kernel.
                    sent[rng.random_range(0..sent.len())].clone()
                } else {
                    let capability = capabilities[rng.random_range(0..capabilities.len())].clone();
                    let request_id = format!("k{seed}-w{worker}-r{n}");
                    let arguments = serde_json::json!({
                        "request_id": request_id,
                        "cost": rng.random_range(0..=100u64),
                        "fail": rng.random_range(0..100) < 5,
                    })
                    .to_string();
                    let call = Arc::new(Call {
                        request_id,
                        capability,
                        arguments,
                        twin: (10..40).contains(&roll),
                    });
                    sent.push(call.clone());
                    call
                };
                if call.twin && roll >= 10 {
                    let runs = clients
                        .iter()
                        .map(|(id, c)| evaluate(c.clone(), *id, call.clone(), start));
                    for op in futures_util::future::join_all(runs).await {
                        history.push(op);
                    }
                } else {
                    let (id, c) = &clients[rng.random_range(0..clients.len())];
                    history.push(evaluate(c.clone(), *id, call.clone(), start).await);
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..=config.think_ms)))
                    .await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done?;
    }
    Ok(())
}
