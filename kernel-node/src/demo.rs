//! `tally-kernel demo`: one kernel node in front of a running Tally cluster (the README's
//! `tally-node dev`), evaluating one monetary tool call end to end: a capability token is
//! issued, an HTTP JSON tool server and an in-memory payment rail are started in-process. The
//! token sent alone, without its holder's signature, is denied before anything is written;
//! signed by the holder, the kernel authorizes a hold, captures it, pays, dispatches,
//! reconciles and signs a receipt. It then evaluates the same request again (a retry: no second
//! payment or dispatch) and shows the cluster's journal for the family.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tally_client::{ClientConfig, TallyClient};
use tally_ledger::{AccountKey, FamilyId};

use crate::money::Money;
use crate::payment::InMemoryRail;
use crate::pipeline::{wall_clock_ms, BudgetLedger, Kernel, Method, ToolCallRequest};
use crate::tool::testing::{spawn_http_tool_server, Behavior};
use crate::tool::HttpToolServer;
use crate::{CapabilityToken, Grant, KeyPair, TrustList};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("the cluster did not answer: {0}")]
    Cluster(String),
}

fn setup<E: std::fmt::Display>(error: E) -> DemoError {
    DemoError::Setup(error.to_string())
}

/// Runs the demo against `endpoints`; prints what happens.
pub async fn run(
    endpoints: Vec<String>,
    transport: tally_client::Transport,
    cost_units: u64,
) -> Result<(), DemoError> {
    let client =
        Arc::new(TallyClient::new(ClientConfig::new(endpoints.clone(), transport)).map_err(setup)?);
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
    let tool = HttpToolServer::new(
        "cost-srv",
        vec!["compute".to_owned()],
        &format!("http://{address}/call"),
    )
    .map_err(setup)?;
    let rail = Arc::new(InMemoryRail::new());
    let ledger: Arc<dyn BudgetLedger> = client.clone();
    let kernel = Kernel::new(
        KeyPair::generate(),
        TrustList::new([issuer.public_key()]),
        ledger,
        rail.clone(),
    )
    .with_tool_server(Arc::new(tool));

    let mut request = ToolCallRequest {
        request_id: format!("demo-{now}"),
        capability: token.clone(),
        server: "cost-srv".to_owned(),
        tool: "compute".to_owned(),
        arguments: serde_json::json!({ "question": "6 * 7" }).into(),
        execution_nonce: None,
        possession: None,
    };
    // The agent proves it holds the token's subject key; the token alone is not enough.
    let stolen = kernel.evaluate(&request).await.map_err(setup)?;
    println!(
        "\nthe token alone, unsigned (as a thief would send it): {:?} ({})",
        stolen.verdict,
        stolen.reason.unwrap_or_default()
    );
    for attempt in ["first call", "retry of the same request"] {
        // Each send is signed afresh: a proof is good for a short window only.
        request
            .sign(Method::EvaluateToolCall, &agent)
            .map_err(setup)?;
        let response = kernel.evaluate(&request).await.map_err(setup)?;
        println!(
            "\n{attempt}: {:?}{}",
            response.verdict,
            response
                .reason
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
        if let Some(output) = &response.output {
            println!("  tool output: {output}");
        }
        let receipt = serde_json::to_string_pretty(&response.receipt).map_err(setup)?;
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
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
