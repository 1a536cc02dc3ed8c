//! `tally-kernel demo`: one kernel node in front of a running Tally cluster (the README's
//! `tally-node dev`), evaluating one monetary tool call end to end over the same ports a
//! deployment uses. A capability token is issued; an HTTP JSON tool server, a payment rail
//! (`tally.rail.v1` over an in-memory rail) and a kernel node (`tally.kernel.v1`) are started
//! in-process. Every hop is mutual TLS with the certificates `tally-node dev` wrote (the agent
//! calls the node with `agent`, the node reaches the cluster and the rail with `kernel`), or
//! plaintext with `--insecure` against a cluster started `--insecure`. The token sent alone,
//! without its holder's signature, is denied before anything is written; signed by the holder,
//! the kernel authorizes a hold, captures it, pays, dispatches, reconciles and signs a receipt.
//! It then sends the same request again (a retry: no second payment or dispatch) and shows the
//! cluster's journal for the family.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tally_client::{ClientConfig, TallyClient, Transport};
use tally_ledger::{AccountKey, FamilyId};
use tally_tls::issue::{DEV_KERNEL_SERVER, DEV_RAIL_SERVER, KERNEL_SERVER_NAME, RAIL_SERVER_NAME};

use crate::config::{KernelNodeConfig, RailSettings, ReconcilerSettings, ToolServerSettings};
use crate::money::Money;
use crate::payment::{InMemoryRail, RailServer};
use crate::pipeline::{wall_clock_ms, Method};
use crate::port::ServerTls;
use crate::server::pb::kernel_client::KernelClient;
use crate::server::pb::{self, Verdict};
use crate::server::sign_tool_call;
use crate::tool::testing::{spawn_http_tool_server, Behavior};
use crate::{CapabilityToken, Grant, KeyPair};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("the cluster did not answer: {0}")]
    Cluster(String),
    #[error("the kernel node did not answer: {0}")]
    Kernel(String),
}

fn setup<E: std::fmt::Display>(error: E) -> DemoError {
    DemoError::Setup(error.to_string())
}

/// Runs the demo against `endpoints`, with the CA and certificates in `tls_dir` (plaintext
/// everywhere when `insecure`); prints what happens.
pub async fn run(
    endpoints: Vec<String>,
    tls_dir: &Path,
    insecure: bool,
    cost_units: u64,
) -> Result<(), DemoError> {
    let kernel_transport = Transport::from_dir(tls_dir, "kernel", insecure).map_err(setup)?;
    let agent_transport = Transport::from_dir(tls_dir, "agent", insecure).map_err(setup)?;
    let client =
        TallyClient::new(ClientConfig::new(endpoints.clone(), kernel_transport)).map_err(setup)?;
    let issuer = KeyPair::generate();
    let agent = KeyPair::generate();
    let now = wall_clock_ms();
    let grant = Grant::monetary("cost-srv", "compute", 100, 1_000, "USD").with_max_invocations(50);
    let token = CapabilityToken::issue(
        &issuer,
        agent.public_key(),
        vec![grant],
        now,
        now + 3_600_000,
    )
    .map_err(setup)?;
    println!("capability {} (family {}): cost-srv/compute, at most 50 calls, $1.00 a call, $10.00 in all", token.id(), token.family_id());

    let (address, dispatches, tool_task) = spawn_http_tool_server(Behavior::Succeed {
        cost: Some(Money::new(cost_units, "USD")),
    })
    .await
    .map_err(setup)?;
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let rail = Arc::new(InMemoryRail::new());
    let rail_tls =
        ServerTls::from_dir(tls_dir, DEV_RAIL_SERVER, RAIL_SERVER_NAME, insecure).map_err(setup)?;
    let rail_server = RailServer::start(rail.clone(), loopback, rail_tls)
        .await
        .map_err(setup)?;
    let config = KernelNodeConfig {
        listen_addr: loopback,
        tls_dir: tls_dir.to_owned(),
        server_identity: DEV_KERNEL_SERVER.to_owned(),
        insecure,
        key_seed: Some(KeyPair::generate().seed_base64()),
        trusted_issuers: vec![issuer.public_key().to_base64()],
        cluster_endpoints: endpoints,
        cluster_tls_dir: tls_dir.to_owned(),
        cluster_insecure: insecure,
        rail: RailSettings {
            kind: "remote".to_owned(),
            endpoint: Some(rail_server.endpoint()),
            insecure,
            ..KernelNodeConfig::default().rail
        },
        tool_servers: vec![ToolServerSettings {
            id: "cost-srv".to_owned(),
            url: format!("http://{address}/call"),
            tools: vec!["compute".to_owned()],
        }],
        // One call, finished in front of you: nothing for a reconciler to finish.
        reconciler: ReconcilerSettings {
            enabled: false,
            ..KernelNodeConfig::default().reconciler
        },
        ..KernelNodeConfig::default()
    };
    let node = crate::server::start(config).await.map_err(setup)?;
    let hops = if insecure { "plaintext" } else { "mutual TLS" };
    println!(
        "kernel node on {}, payment rail on {} ({hops})",
        node.local_addr,
        rail_server.local_addr()
    );
    let channel = agent_transport
        .endpoint_to(&node.local_addr.to_string(), KERNEL_SERVER_NAME)
        .map_err(setup)?
        .connect()
        .await
        .map_err(|e| DemoError::Kernel(e.to_string()))?;
    let mut kernel = KernelClient::new(channel);

    let mut request = pb::ToolCall {
        request_id: format!("demo-{now}"),
        capability_token: token.to_text().map_err(setup)?,
        server: "cost-srv".to_owned(),
        tool: "compute".to_owned(),
        arguments_json: serde_json::json!({ "question": "6 * 7" }).to_string(),
        execution_nonce: None,
        possession: None,
    };
    // The agent proves it holds the token's subject key; the token alone is not enough.
    let stolen = kernel
        .evaluate_tool_call(request.clone())
        .await
        .map_err(|e| DemoError::Kernel(e.to_string()))?
        .into_inner();
    println!(
        "\nthe token alone, unsigned (as a thief would send it): {} ({})",
        verdict(&stolen),
        stolen.reason.unwrap_or_default()
    );
    for attempt in ["first call", "retry of the same request"] {
        // Each send is signed afresh: a proof is good for a short window only.
        sign_tool_call(
            &mut request,
            Method::EvaluateToolCall,
            &agent,
            wall_clock_ms(),
        )
        .map_err(setup)?;
        let response = kernel
            .evaluate_tool_call(request.clone())
            .await
            .map_err(|e| DemoError::Kernel(e.to_string()))?
            .into_inner();
        println!(
            "\n{attempt}: {}{}",
            verdict(&response),
            response
                .reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
        if let Some(output) = &response.output_json {
            println!("  tool output: {output}");
        }
        let receipt: serde_json::Value =
            serde_json::from_str(&response.receipt_json).map_err(setup)?;
        let receipt = serde_json::to_string_pretty(&receipt).map_err(setup)?;
        println!("  signed receipt:\n{}", indent(&receipt));
    }
    println!(
        "\ntool dispatches: {}, payment authorizations: {} (one call, however many tries)",
        dispatches.load(Ordering::SeqCst),
        rail.total_authorizations()
    );

    let family: FamilyId = token.family_id();
    let usage = client
        .get_usage(&family, &AccountKey::new(token.id().clone(), 0))
        .await
        .map_err(|e| DemoError::Cluster(e.to_string()))?;
    if let Some(usage) = usage {
        println!(
            "cluster usage: {} call(s), {} units realized, {} exposed",
            usage.account.invocation_count,
            usage.account.total_cost_realized_spend_units,
            usage.account.total_cost_exposed_units
        );
    }
    println!("cluster journal of family {family}:");
    for event in client
        .list_events(&family, None, None, None, 100)
        .await
        .map_err(|e| DemoError::Cluster(e.to_string()))?
    {
        println!(
            "  {:>14} {:<22} {}",
            event.commit_index.0,
            event.kind.as_str(),
            event.event_id
        );
    }
    tool_task.abort();
    node.shutdown().await.map_err(setup)?;
    rail_server.shutdown().await.map_err(setup)?;
    Ok(())
}

fn verdict(evaluation: &pb::Evaluation) -> &'static str {
    if evaluation.verdict == Verdict::Allow as i32 {
        "Allow"
    } else {
        "Deny"
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
