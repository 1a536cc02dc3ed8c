//! One monetary tool call's budget steps, with the `tally-client` library (docs/spec.md §9):
//!
//! 1. authorize a hold: reserve one call slot and the call's exposure on the grant's account;
//! 2. capture it, *before* paying anyone: the dispatch fence;
//! 3. (pay and run the tool: pretended here);
//! 4. reconcile with the realized cost, which frees the unspent part of the exposure;
//! 5. read the account's usage back;
//! 6. retry commands with the same event id, as a client does when an acknowledgement is lost:
//!    the cluster answers the original decision and applies nothing twice.
//!
//! Every answer is checked: on anything unexpected the program exits 1 with the reason, so CI
//! (`scripts/examples`) catches regressions. Start a cluster first (`tally-node dev`), then:
//!
//! ```text
//! cargo run -p tally-client --example tool_call -- --endpoint 127.0.0.1:7401
//! ```
//!
//! Amounts are integer units of the grant's currency; here a unit is a US cent.

use anyhow::{bail, ensure, Context};
use clap::Parser;
use rand::Rng;
use tally_client::{ids, wall_clock_ms, ClientConfig, Outcome, TallyClient, Transport};
use tally_ledger::{
    AccountKey, AttemptId, CapabilityId, ClientCommand, CommandHeader, Decision, EventId, FamilyId,
    GrantLimits, Operation, Outcome as Answer,
};

/// Runs one tool call's budget steps (authorize, capture, reconcile) against a Tally cluster,
/// reads the usage back and shows that retries with the same event id are deduplicated.
#[derive(Debug, Parser)]
#[command(name = "tool_call")]
struct Args {
    /// Cluster endpoints (host:port), comma separated or repeated; any member will do, the
    /// client finds the leader.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7401")]
    endpoint: Vec<String>,
    /// The cost the tool call turns out to have, in cents (at most the $100.00 authorized).
    #[arg(long, default_value_t = 4_250)]
    realized_cents: u64,
    /// The cluster's CA and a `kernel` client certificate (`tally-node dev` writes them).
    #[arg(long, env = "TALLY_TLS_DIR", default_value = "./tally-data/tls")]
    tls_dir: std::path::PathBuf,
    /// Plaintext, for a cluster started with --insecure.
    #[arg(long)]
    insecure: bool,
}

/// The grant's limits: 50 calls, $100.00 a call, $1,000.00 in all, in US cents. The first
/// allowed command pins them on the account; every later command must name the same ones.
fn limits() -> GrantLimits {
    GrantLimits::monetary(Some(50), Some(10_000), Some(100_000), "USD")
}

/// What the call may cost at most: the exposure the hold reserves ($100.00).
const EXPOSURE_CENTS: u64 = 10_000;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => {
            println!("\ntool_call example: all checks passed");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("\ntool_call example FAILED: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    ensure!(
        args.realized_cents <= EXPOSURE_CENTS,
        "--realized-cents must be at most the exposure, {EXPOSURE_CENTS}"
    );
    // The client finds the leader, retries a command whose outcome is unknown with the same
    // event id, and calls ResolveEvent when retrying runs out (ClientConfig's timeouts).
    // Budget commands need a `kernel` client certificate of the cluster's CA.
    let transport = Transport::from_dir(&args.tls_dir, "kernel", args.insecure)?;
    let client = TallyClient::new(ClientConfig::new(args.endpoint.clone(), transport))
        .context("building the client")?;

    // A family is the root capability of a delegation chain (the unit the cluster
    // linearizes); the account is (capability, grant index). Fresh ids per run, so the
    // example can run again against the same cluster.
    let run_id = format!("{}-{:08x}", wall_clock_ms(), rand::rng().random::<u32>());
    let family = FamilyId::from(format!("example-family-{run_id}"));
    let capability = CapabilityId::from(format!("example-cap-{run_id}"));
    let grant_index = 0;
    // docs/spec.md §9: ids are pure functions of the request, so every retry (and every
    // kernel node evaluating the same request) names the same hold and the same events.
    let request_id = format!("req-{run_id}");
    let hold = ids::hold_id(&request_id, &capability, grant_index)?;
    println!("endpoints {:?}", args.endpoint);
    println!("family {family}, capability {capability}, grant {grant_index}");
    println!("hold {hold}");

    // Every command names its account, its event id (the dedupe key) and a deadline after
    // which it must not apply. A retry reuses the whole command, deadline included.
    let not_after_ms = wall_clock_ms() + 60_000;
    let command = |event_id: EventId, op: Operation| ClientCommand {
        header: CommandHeader {
            family_id: family.clone(),
            capability_id: capability.clone(),
            grant_index,
            event_id,
            not_after_ms,
        },
        op,
    };

    // 1. Authorize: one call slot and $100.00 of exposure.
    let authorize = command(
        ids::authorize_event(&hold),
        Operation::AuthorizeHold {
            hold_id: hold.clone(),
            requested_exposure_units: EXPOSURE_CENTS,
            limits: limits(),
            ancestors: vec![],
            hold_timeout_ms: Some(60_000),
        },
    );
    let authorized = decided("authorize", client.submit(authorize.clone()).await)?;
    expect(
        "authorize",
        &authorized,
        &Answer::Authorized {
            hold_id: hold.clone(),
            exposure_units: EXPOSURE_CENTS,
        },
    )?;
    let authorize_index = authorized
        .commit_index
        .context("an authorize decision has a commit index")?;
    println!(
        "1. authorized {} at commit index {}",
        cents(EXPOSURE_CENTS),
        authorize_index.0
    );

    // 2. Capture before paying: of two identical concurrent evaluations exactly one owns
    //    the capture (told apart by the random attempt id); only the owner may pay.
    let attempt = AttemptId::from(format!("attempt-{:016x}", rand::rng().random::<u64>()));
    let capture = command(
        ids::capture_event(&hold, authorize_index),
        Operation::CaptureInvocation {
            hold_id: hold.clone(),
            attempt_id: attempt.clone(),
        },
    );
    let captured = decided("capture", client.submit(capture).await)?;
    expect(
        "capture",
        &captured,
        &Answer::Captured {
            hold_id: hold.clone(),
            attempt_id: attempt.clone(),
        },
    )?;
    println!("2. captured by {attempt}: this evaluation owns the call");

    // 3. Here a kernel would authorize the payment and dispatch the tool.
    println!(
        "3. (pay and run the tool: it cost {})",
        cents(args.realized_cents)
    );

    // 4. Reconcile: the whole remaining exposure, and what was really spent.
    let reconcile = command(
        ids::reconcile_event(&hold),
        Operation::ReconcileHold {
            hold_id: hold.clone(),
            exposed_cost_units: EXPOSURE_CENTS,
            realized_spend_units: args.realized_cents,
        },
    );
    let reconciled = decided("reconcile", client.submit(reconcile.clone()).await)?;
    expect(
        "reconcile",
        &reconciled,
        &Answer::Reconciled {
            hold_id: hold.clone(),
            realized_units: args.realized_cents,
            unspent_units: EXPOSURE_CENTS - args.realized_cents,
        },
    )?;
    println!(
        "4. reconciled: {} spent, {} given back",
        cents(args.realized_cents),
        cents(EXPOSURE_CENTS - args.realized_cents)
    );

    // 5. Read the account back (a linearizable read: it sees every acknowledged write).
    let usage = client
        .get_usage(&family, &AccountKey::new(capability.clone(), grant_index))
        .await
        .context("reading the usage")?
        .context("the account has no usage row after an allowed authorize")?;
    let account = &usage.account;
    println!(
        "5. usage: {} call(s) ({} reserved, {} captured), {} exposed, {} realized",
        account.invocation_count,
        account.reserved_invocations,
        account.captured_invocations,
        cents(account.total_cost_exposed_units),
        cents(account.total_cost_realized_spend_units),
    );
    let max_calls = account.limits.max_invocations.map(u64::from);
    println!(
        "   pinned limits: {} calls, {} a call, {} in all, currency {}",
        limit(max_calls, |n| n.to_string()),
        limit(account.limits.max_cost_per_invocation_units, cents),
        limit(account.limits.max_total_cost_units, cents),
        account.limits.currency.as_deref().unwrap_or("none"),
    );
    ensure!(account.limits == limits(), "pinned limits differ");
    ensure!(
        (
            account.invocation_count,
            account.reserved_invocations,
            account.captured_invocations
        ) == (1, 0, 1),
        "expected 1 call, captured; got {account:?}"
    );
    ensure!(
        account.total_cost_exposed_units == 0
            && account.total_cost_realized_spend_units == args.realized_cents,
        "expected nothing exposed and {} realized; got {account:?}",
        args.realized_cents
    );

    // 6. Lost acknowledgements. Say the reconcile's reply never arrived: the client sends
    //    the same command again (same event id). The cluster answers from the stored
    //    outcome: the same decision and commit index, flagged `replayed`; nothing is
    //    appended and no limit is checked again. (`TallyClient::submit` does this on its
    //    own when an attempt's outcome is unknown.)
    let again = decided("reconcile retry", client.submit(reconcile.clone()).await)?;
    ensure!(
        again.replayed,
        "a retry of the reconcile was not a replay: {again:?}"
    );
    ensure!(
        Decision {
            replayed: reconciled.replayed,
            ..again.clone()
        } == reconciled,
        "the retry answered another decision: first {reconciled:?}, retry {again:?}"
    );
    println!(
        "6. reconcile retried with the same event id: the original decision (commit index {}), replayed",
        commit(&again)
    );

    // A retried authorize, once the hold is captured, says who owns the capture: the caller
    // proceeds only if that is its own attempt (docs/spec.md §5.2), and never pays twice.
    let again = decided("authorize retry", client.submit(authorize.clone()).await)?;
    match &again.outcome {
        Answer::AlreadyCaptured {
            owner_attempt_id, ..
        } if *owner_attempt_id == attempt && again.replayed => println!(
            "   authorize retried: already captured by {owner_attempt_id} (ours), nothing reserved twice"
        ),
        other => bail!("authorize retry: expected AlreadyCaptured by {attempt}, got {other:?}"),
    }

    // ResolveEvent turns "was it applied?" into a final answer: here the original decision.
    match client.resolve(reconcile).await {
        Outcome::Decided(decision) if decision.commit_index == reconciled.commit_index => {
            println!(
                "   ResolveEvent of the reconcile: applied, commit index {}",
                commit(&decision)
            )
        }
        other => {
            bail!("ResolveEvent of the applied reconcile: expected its decision, got {other:?}")
        }
    }

    // Still one call and one realized charge, however many tries.
    let after = client
        .get_usage(&family, &AccountKey::new(capability, grant_index))
        .await?
        .context("the usage row disappeared")?;
    ensure!(
        after.account == usage.account,
        "retries changed the account: before {:?}, after {:?}",
        usage.account,
        after.account
    );
    println!("   usage unchanged by the retries");
    Ok(())
}

/// The decision of a command (an allowed or denied answer); a refusal, "not applied" or
/// "unknown" is an error here.
fn decided(step: &str, outcome: Outcome) -> anyhow::Result<Decision> {
    match outcome {
        Outcome::Decided(decision) => Ok(decision),
        other => bail!("{step}: expected a decision, the cluster answered {other:?}"),
    }
}

/// Checks that `decision` answers `want`. It may be `replayed` even on a first call: when an
/// attempt's reply is lost, the client's retry gets the stored answer.
fn expect(step: &str, decision: &Decision, want: &Answer) -> anyhow::Result<()> {
    ensure!(
        &decision.outcome == want,
        "{step}: expected {want:?}, got {decision:?}"
    );
    if decision.replayed {
        println!("   ({step}: an attempt's reply was lost; the retry got the stored answer)");
    }
    Ok(())
}

fn commit(decision: &Decision) -> u64 {
    decision.commit_index.map(|c| c.0).unwrap_or_default()
}

/// A limit for people: "no limit" when absent.
fn limit(value: Option<u64>, show: fn(u64) -> String) -> String {
    value.map_or_else(|| "no limit".to_owned(), show)
}

fn cents(units: u64) -> String {
    format!("${}.{:02}", units / 100, units % 100)
}
