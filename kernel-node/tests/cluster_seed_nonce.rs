//! The seed's execution-nonce scenarios against a real 3-node cluster. Nonces are minted and
//! signed by a kernel node, bound to one request, and spent in the cluster (`ConsumeNonce`)
//! before the capture, so a nonce spent on one kernel node is spent for all.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{is_reverse, request, resign, Env, Loss};
use tally_client::Outcome;
use tally_kernel::nonce::{self, consume_command, NonceBinding, SignedExecutionNonce};
use tally_kernel::payment::InMemoryRail;
use tally_kernel::pipeline::{reasons, wall_clock_ms, Kernel, KernelConfig};
use tally_kernel::tool::testing::{Behavior, ScriptedServer};
use tally_kernel::{CapabilityToken, Grant, Verdict};
use tally_ledger::{CommandHeader, EventKind};

fn nonce_kernel(
    env: &Env,
    ledger: Arc<dyn tally_kernel::pipeline::BudgetLedger>,
    rail: Arc<InMemoryRail>,
    invocations: &Arc<AtomicU64>,
) -> Kernel {
    nonce_kernel_with_preflight(env, ledger, rail, invocations, 30_000)
}

fn nonce_kernel_with_preflight(
    env: &Env,
    ledger: Arc<dyn tally_kernel::pipeline::BudgetLedger>,
    rail: Arc<InMemoryRail>,
    invocations: &Arc<AtomicU64>,
    preflight_hold_timeout_ms: u64,
) -> Kernel {
    env.kernel_with(ledger, rail)
        .with_config(KernelConfig {
            require_nonce: true,
            preflight_hold_timeout_ms,
            dispatch_deadline: Duration::from_secs(2),
            ..KernelConfig::default()
        })
        .with_tool_server(Arc::new(
            ScriptedServer::new("srv-a", &["read_file"], Behavior::Succeed { cost: None })
                .with_counter(Arc::clone(invocations)),
        ))
        .with_tool_server(Arc::new(
            ScriptedServer::new("cost-srv", &["compute"], Behavior::Succeed { cost: None })
                .with_counter(Arc::clone(invocations)),
        ))
}

/// The seed's `signed_nonce_for_request`: a nonce this kernel minted for `request_id`.
fn nonce_for(
    kernel: &Kernel,
    token: &CapabilityToken,
    request_id: &str,
    server: &str,
    tool: &str,
) -> SignedExecutionNonce {
    let binding = NonceBinding {
        subject: token.body.subject,
        request_id: request_id.to_owned(),
        family_id: token.family_id().to_string(),
        capability_id: token.id().to_string(),
        server: server.to_owned(),
        tool: tool.to_owned(),
        parameter_hash: nonce::parameter_hash(&serde_json::json!({})).expect("hash"),
    };
    nonce::mint(kernel.keypair(), binding, 30_000, wall_clock_ms()).expect("mint")
}

/// Seed: `nonce_preflight_cleanup_lost_ack_denies_without_minting_nonce`. The preflight hold
/// (`nonce-preflight-budget-hold:…`) is reversed and the reverse's reply lost after commit.
/// - Reachable (stronger): the client resolves the reverse, so the kernel mints the nonce
///   (deny with "execution nonce required" and the nonce attached), and the same request
///   presented with it is allowed and dispatched once.
/// - Unreachable: the seed's deny ("execution nonce preflight cleanup could not be confirmed"),
///   no nonce, `execution_nonce.cleanup_unconfirmed`, and the `cleanup_*` keys naming the
///   exact rollback event.
///
/// In both, the journal holds the preflight's reserve and reverse and no legacy increment, and
/// an exact replay of the preflight is denied without a nonce and appends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonce_preflight_cleanup_lost_ack_denies_without_minting_nonce() {
    let env = Env::start().await;
    for mode in [
        Loss::ReplyAfterCommit,
        Loss::ReplyAfterCommitThenUnreachable,
    ] {
        let invocations = Arc::new(AtomicU64::new(0));
        let ledger = env.lossy(mode, is_reverse);
        let kernel = nonce_kernel(
            &env,
            ledger.clone(),
            Arc::new(InMemoryRail::new()),
            &invocations,
        );
        let token = env.token(vec![
            Grant::tool("srv-a", "read_file").with_max_invocations(1)
        ]);
        let request = request(
            &format!("req-preflight-cleanup-{mode:?}"),
            &token,
            "srv-a",
            "read_file",
        );
        let response = kernel.evaluate(&request).await.expect("evaluate");
        env.heal().await;
        assert_eq!(response.verdict, Verdict::Deny);
        let hold_id = format!(
            "nonce-preflight-budget-hold:{}:{}:0",
            request.request_id,
            token.id()
        );
        let budget = &response.receipt.metadata["budget_authority"];
        assert_eq!(budget["cleanup_mutation_kind"].as_str(), Some("invocation"));
        assert_eq!(budget["cleanup_hold_id"].as_str(), Some(hold_id.as_str()));
        assert!(budget["cleanup_attempt_event_id"]
            .as_str()
            .is_some_and(|id| {
                id.starts_with(&format!("{hold_id}:authorize:")) && id.contains(":rollback:")
            }));
        assert_eq!(
            budget["cleanup_attempt_event_id_available"].as_bool(),
            Some(true)
        );
        assert_eq!(
            ledger.lost().map(|e| e.to_string()).as_deref(),
            budget["cleanup_attempt_event_id"].as_str()
        );
        let events = env.events(&token).await;
        assert!(events.iter().any(|e| e.kind == EventKind::ReserveInvocation
            && e.hold_id.as_ref().map(|h| h.as_str()) == Some(hold_id.as_str())));
        assert!(events.iter().any(|e| e.kind == EventKind::ReverseInvocation
            && e.hold_id.as_ref().map(|h| h.as_str()) == Some(hold_id.as_str())));
        assert!(!events
            .iter()
            .any(|e| e.kind == EventKind::IncrementInvocation));
        let minted = response.execution_nonce.clone();
        if mode == Loss::ReplyAfterCommit {
            assert_eq!(response.reason.as_deref(), Some(reasons::NONCE_REQUIRED));
            assert!(minted.is_some());
        } else {
            assert!(minted.is_none());
            assert_eq!(
                response.reason.as_deref(),
                Some(reasons::PREFLIGHT_CLEANUP_UNCONFIRMED)
            );
            assert_eq!(
                response.receipt.metadata["execution_nonce"]["cleanup_unconfirmed"].as_bool(),
                Some(true)
            );
        }
        let replay = kernel.evaluate(&request).await.expect("replay");
        assert_eq!(replay.verdict, Verdict::Deny);
        assert!(replay.execution_nonce.is_none());
        assert_eq!(env.events(&token).await.len(), events.len());
        if let Some(minted) = minted {
            let mut with_nonce = request.clone();
            with_nonce.execution_nonce = Some(minted);
            let with_nonce = resign(with_nonce);
            let allowed = kernel.evaluate(&with_nonce).await.expect("evaluate");
            assert_eq!(allowed.verdict, Verdict::Allow, "{:?}", allowed.reason);
            assert!(
                allowed.receipt.metadata["execution_nonce"]["budget_commit_index"]
                    .as_u64()
                    .is_some()
            );
            assert_eq!(invocations.load(Ordering::SeqCst), 1);
        }
    }
}

/// Seed: `nonce_preflight_runtime_release_failure_denies_without_minting_nonce`. Tally has no
/// runtime-admission hook; the reservation whose release fails is the preflight hold itself,
/// and the failure is a definite one: every copy of its reverse is lost before proposing and
/// the client's `ResolveEvent` tombstones it. Same outcome as the seed: deny with "execution
/// nonce preflight cleanup could not be confirmed", no nonce, the reservation signed as
/// retained (`authorize.admission_retained`, `execution_nonce.cleanup_unconfirmed`) with no
/// internal error in the reason. Beyond the seed: the retained preflight hold is returned by
/// the cluster's own expiry (the kernel set a 6 s preflight timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonce_preflight_runtime_release_failure_denies_without_minting_nonce() {
    let env = Env::start().await;
    let invocations = Arc::new(AtomicU64::new(0));
    let ledger = env.lossy(Loss::RequestBeforeProposing, is_reverse);
    let kernel = nonce_kernel_with_preflight(
        &env,
        ledger.clone(),
        Arc::new(InMemoryRail::new()),
        &invocations,
        6_000,
    );
    let token = env.token(vec![
        Grant::tool("srv-a", "read_file").with_max_invocations(1)
    ]);
    let request = request(
        "req-preflight-runtime-release",
        &token,
        "srv-a",
        "read_file",
    );
    let response = kernel.evaluate(&request).await.expect("evaluate");
    assert_eq!(response.verdict, Verdict::Deny);
    assert_eq!(
        response.reason.as_deref(),
        Some(reasons::PREFLIGHT_CLEANUP_UNCONFIRMED)
    );
    assert!(response.execution_nonce.is_none());
    let metadata = &response.receipt.metadata;
    assert_eq!(
        metadata["execution_nonce"]["cleanup_unconfirmed"].as_bool(),
        Some(true)
    );
    assert_eq!(
        metadata["budget_authority"]["authorize"]["admission_retained"].as_bool(),
        Some(true)
    );
    assert!(
        metadata["budget_authority"]["reverse"].is_null(),
        "the reverse never applied"
    );
    assert_eq!(env.usage(&token, 0).await, Some((1, 0)), "retained");
    assert_eq!(invocations.load(Ordering::SeqCst), 0);
    tokio::time::timeout(Duration::from_secs(30), async {
        while env.usage(&token, 0).await != Some((0, 0)) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the cluster expires the retained preflight hold");
    assert!(env
        .events(&token)
        .await
        .iter()
        .any(|e| e.kind == EventKind::ExpireHold));
}

/// Seeds: `nonmonetary_nonce_cleanup_signs_post_commit_reverse_ambiguity` (non-monetary grant)
/// and `nonce_request_id_mismatch_precedes_payment_and_capture_top_and_nested` (monetary).
/// A nonce minted for another request id is presented; the kernel reverses its hold and the
/// reverse's reply is lost after commit.
/// - Reachable (stronger): resolved, so the deny names the real cause ("execution nonce
///   rejected … request_id") and the receipt carries the reverse's commit index.
/// - Unreachable: the seeds' "pre-dispatch cleanup could not be confirmed" with
///   `pre_dispatch_cleanup_unconfirmed` and the `cleanup_*` keys. One difference: the seed signs
///   `cleanup_attempt_event_id_available: false` for the non-monetary case; here the rollback
///   event id is always known (a pure function of the hold and the authorize index), so it is
///   `true` and the id is signed.
///
/// In all cases: no capture, no payment, no dispatch, and the budget is back (the reverse did
/// commit). The nested variants have no counterpart (Tally has no sessions).
async fn nonce_bound_to_another_request(monetary: bool) {
    let env = Env::start().await;
    for mode in [
        Loss::ReplyAfterCommit,
        Loss::ReplyAfterCommitThenUnreachable,
    ] {
        let rail = Arc::new(InMemoryRail::new());
        let invocations = Arc::new(AtomicU64::new(0));
        let ledger = env.lossy(mode, is_reverse);
        let kernel = nonce_kernel(&env, ledger, rail.clone(), &invocations);
        let (grant, server, tool) = if monetary {
            (
                Grant::monetary("cost-srv", "compute", 100, 1000, "USD"),
                "cost-srv",
                "compute",
            )
        } else {
            (
                Grant::tool("srv-a", "read_file").with_max_invocations(1),
                "srv-a",
                "read_file",
            )
        };
        let token = env.token(vec![grant]);
        let original = request("req-nonce-id-bound-original", &token, server, tool);
        let mut changed = original.clone();
        changed.request_id = format!("req-nonce-id-bound-{monetary}-{mode:?}");
        changed.execution_nonce = Some(nonce_for(
            &kernel,
            &token,
            &original.request_id,
            server,
            tool,
        ));
        let changed = resign(changed);
        let response = kernel.evaluate(&changed).await.expect("evaluate");
        env.heal().await;
        assert_eq!(response.verdict, Verdict::Deny);
        let budget = &response.receipt.metadata["budget_authority"];
        assert_eq!(
            budget["cleanup_mutation_kind"].as_str(),
            Some(if monetary { "exposure" } else { "invocation" })
        );
        assert_eq!(
            budget["cleanup_capability_id"].as_str(),
            Some(token.id().as_str())
        );
        assert_eq!(budget["cleanup_grant_index"].as_u64(), Some(0));
        assert_eq!(
            budget["cleanup_attempt_event_id_available"].as_bool(),
            Some(true)
        );
        if mode == Loss::ReplyAfterCommit {
            assert!(
                response.reason.as_deref().is_some_and(
                    |r| r.contains("execution nonce rejected") && r.contains("request_id")
                ),
                "{:?}",
                response.reason
            );
            assert!(budget["reverse"]["budget_commit_index"].as_u64().is_some());
        } else {
            assert_eq!(
                response.reason.as_deref(),
                Some(reasons::PRE_DISPATCH_CLEANUP_UNCONFIRMED)
            );
            assert_eq!(
                budget["pre_dispatch_cleanup_unconfirmed"].as_bool(),
                Some(true)
            );
            assert_eq!(budget["reverse"]["reverse_ambiguous"].as_bool(), Some(true));
        }
        assert_eq!(rail.total_authorizations(), 0);
        assert_eq!(invocations.load(Ordering::SeqCst), 0);
        let events = env.events(&token).await;
        assert!(!events
            .iter()
            .any(|e| e.kind == EventKind::CaptureInvocation));
        assert_eq!(env.usage(&token, 0).await, Some((0, 0)));
    }
}

/// Seed: `nonmonetary_nonce_cleanup_signs_post_commit_reverse_ambiguity` (see
/// [`nonce_bound_to_another_request`] for the differences).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonmonetary_nonce_cleanup_signs_post_commit_reverse_ambiguity() {
    nonce_bound_to_another_request(false).await;
}

/// Seed: `nonce_request_id_mismatch_precedes_payment_and_capture_top_and_nested` (see
/// [`nonce_bound_to_another_request`] for the differences).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonce_request_id_mismatch_precedes_payment_and_capture_top_and_nested() {
    nonce_bound_to_another_request(true).await;
}

/// The seed's consumed-nonce path (`consumed_nonce_for_request`, used by
/// `nonce_cleanup_retains_payment_and_capture_when_release_is_unconfirmed`) under docs/spec.md §9's
/// order: the nonce is spent in the cluster first (as another kernel node would have), so this
/// node's `ConsumeNonce` is refused as replayed before the capture, the hold is reversed, and
/// nothing is paid or dispatched. The seed's release-unconfirmed assertions for a pre-dispatch
/// unwind after payment are in `cluster_seed_payment`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonce_spent_on_another_kernel_node_is_spent_for_all() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let kernel = nonce_kernel(&env, env.client.clone(), rail.clone(), &invocations);
    let token = env.token(vec![Grant::monetary(
        "cost-srv", "compute", 100, 1000, "USD",
    )]);
    let mut request = request(
        "req-nonce-release-unconfirmed",
        &token,
        "cost-srv",
        "compute",
    );
    let nonce = nonce_for(&kernel, &token, &request.request_id, "cost-srv", "compute");
    let header = CommandHeader {
        family_id: token.family_id(),
        capability_id: token.id().clone(),
        grant_index: 0,
        event_id: "unused".into(),
        not_after_ms: wall_clock_ms() + 60_000,
    };
    let spent = env
        .client
        .submit(consume_command(header, &nonce, &"att-other-node".into()))
        .await;
    assert!(matches!(spent, Outcome::Decided(_)), "{spent:?}");
    request.execution_nonce = Some(nonce);
    let request = resign(request);
    let response = kernel.evaluate(&request).await.expect("evaluate");
    assert_eq!(response.verdict, Verdict::Deny);
    assert!(
        response
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("nonce_replayed")),
        "{:?}",
        response.reason
    );
    assert_eq!(rail.total_authorizations(), 0);
    assert_eq!(invocations.load(Ordering::SeqCst), 0);
    assert_eq!(env.usage(&token, 0).await, Some((0, 0)));
    assert!(!env
        .events(&token)
        .await
        .iter()
        .any(|e| e.kind == EventKind::CaptureInvocation));
}
