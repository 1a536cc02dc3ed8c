//! Several stateless kernel nodes sharing one real 3-node cluster: races between nodes,
//! refused tokens, a node killed mid-call whose work another node's reconciler finishes, and
//! the two-phase API across nodes.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{admit_request, request, Env};
use tally_kernel::money::Money;
use tally_kernel::payment::InMemoryRail;
use tally_kernel::pipeline::{
    wall_clock_ms, AbortCall, CompleteCall, Kernel, KernelConfig, TicketCall,
};
use tally_kernel::reconciler::{Reconciler, ReconcilerConfig};
use tally_kernel::tool::testing::{Behavior, ScriptedServer};
use tally_kernel::{CapabilityToken, Grant, KeyPair, TokenBody, Verdict};
use tally_ledger::{HoldView, InvocationState, MonetaryState};

fn counting(invocations: &Arc<AtomicU64>, behavior: Behavior) -> Arc<ScriptedServer> {
    Arc::new(
        ScriptedServer::new("cost-srv", &["compute"], behavior)
            .with_counter(Arc::clone(invocations)),
    )
}

/// Two kernel nodes (own keys, own cluster clients) evaluate the same request at once. The
/// cluster's capture picks one attempt: exactly one `Allow`, one payment authorization (the
/// loser never reaches the rail), one dispatch, and the budget charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_kernel_nodes_evaluating_the_same_request_allow_exactly_once() {
    let env = Env::start().await;
    for round in 0..3 {
        let rail = Arc::new(InMemoryRail::new());
        let invocations = Arc::new(AtomicU64::new(0));
        let node = || {
            Arc::new(
                env.kernel(rail.clone())
                    .with_tool_server(counting(&invocations, Behavior::Succeed { cost: None })),
            )
        };
        let (a, b) = (node(), node());
        let token = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )]);
        let request = request(
            &format!("req-two-nodes-{round}"),
            &token,
            "cost-srv",
            "compute",
        );
        let run = |kernel: Arc<Kernel>, request: tally_kernel::pipeline::ToolCallRequest| {
            tokio::spawn(async move { kernel.evaluate(&request).await })
        };
        let (first, second) = (run(a, request.clone()), run(b, request.clone()));
        let responses = [
            first.await.expect("join").expect("evaluate"),
            second.await.expect("join").expect("evaluate"),
        ];
        let allowed = responses
            .iter()
            .filter(|r| r.verdict == Verdict::Allow)
            .count();
        assert_eq!(
            allowed,
            1,
            "{:?}",
            responses.iter().map(|r| &r.reason).collect::<Vec<_>>()
        );
        let counts = rail.counts(&request.request_id);
        assert_eq!(
            counts.authorize_calls, 1,
            "the capture loser never calls the rail"
        );
        assert_eq!(counts.authorizations, 1);
        assert_eq!(counts.captures, 1);
        assert_eq!(invocations.load(Ordering::SeqCst), 1);
        assert_eq!(env.usage(&token, 0).await, Some((1, 100)));
    }
}

/// Tokens with a bad signature, past their expiry, widening their parent's grant, or from an
/// issuer nobody trusts (and a request id over 128 bytes): each is denied with a reason naming
/// the problem, and the cluster holds nothing for any of them (no account row, no event), the
/// rail and tool untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_denied_with_a_clear_reason_and_nothing_is_written() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let kernel = env
        .kernel(rail.clone())
        .with_tool_server(counting(&invocations, Behavior::Succeed { cost: None }));
    let now = wall_clock_ms();
    let grant = || Grant::monetary("cost-srv", "compute", 100, 1000, "USD");

    let mut bad_signature = env.token(vec![grant()]);
    bad_signature.body.grants[0].max_invocations = Some(99);
    let expired = CapabilityToken::issue(
        &env.issuer,
        env.agent.public_key(),
        vec![grant()],
        now - 20_000,
        now - 10_000,
    )
    .expect("issue");
    let parent = env.token(vec![grant()]);
    let widened = CapabilityToken::sign_body(
        TokenBody {
            id: "cap-widened-child".into(),
            issuer: env.agent.public_key(),
            subject: KeyPair::generate().public_key(),
            issued_at_ms: now - 1_000,
            expires_at_ms: now + 3_600_000,
            grants: vec![Grant::monetary("cost-srv", "compute", 500, 1000, "USD").narrowing(0)],
            parent: Some(Box::new(parent)),
        },
        &env.agent,
    )
    .expect("sign");
    let unknown_issuer = CapabilityToken::issue(
        &KeyPair::generate(),
        env.agent.public_key(),
        vec![grant()],
        now - 1_000,
        now + 3_600_000,
    )
    .expect("issue");
    for (label, token, expected) in [
        ("bad signature", bad_signature, "signature does not verify"),
        ("expired", expired, "expired"),
        ("widened delegation", widened, "widens its parent grant"),
        ("unknown issuer", unknown_issuer, "not in the trust list"),
    ] {
        let response = kernel
            .evaluate(&request(
                &format!("req-bad-token-{label}"),
                &token,
                "cost-srv",
                "compute",
            ))
            .await
            .expect("evaluate");
        assert_eq!(response.verdict, Verdict::Deny, "{label}");
        let reason = response.reason.clone().unwrap_or_default();
        assert!(
            reason.starts_with("capability rejected") && reason.contains(expected),
            "{label}: {reason}"
        );
        assert!(
            response.receipt.capability_id.is_none(),
            "{label}: unverified tokens are not named"
        );
        assert!(
            env.events(&token).await.is_empty(),
            "{label}: nothing journaled"
        );
    }
    let rows = env
        .client
        .list_usages(None, None, None, 100)
        .await
        .expect("usages")
        .rows;
    assert!(rows.is_empty(), "no account rows: {rows:?}");
    assert_eq!(rail.total_authorizations(), 0);
    assert_eq!(invocations.load(Ordering::SeqCst), 0);
}

/// A kernel node is killed (its task aborted) while the tool runs: after capture and payment,
/// before reconcile. Its hold stays Captured (captured holds never expire), and another node's
/// reconciler finds it with `ListHolds`, tombstones any lost cancel with `ResolveEvent`,
/// reconciles at `realized = authorized` and captures the authorized payment. A second pass
/// finds nothing left to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_killed_between_capture_and_reconcile_is_finished_by_another_nodes_reconciler() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let doomed = Arc::new(
        env.kernel(rail.clone())
            .with_config(KernelConfig {
                dispatch_deadline: Duration::from_secs(600),
                ..KernelConfig::default()
            })
            .with_tool_server(counting(&invocations, Behavior::Hang)),
    );
    let token = env.token(vec![Grant::monetary(
        "cost-srv", "compute", 100, 1000, "USD",
    )]);
    let request = request("req-killed-mid-call", &token, "cost-srv", "compute");
    let running = {
        let (kernel, request) = (Arc::clone(&doomed), request.clone());
        tokio::spawn(async move { kernel.evaluate(&request).await })
    };
    tokio::time::timeout(Duration::from_secs(30), async {
        while invocations.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the tool was entered");
    running.abort();
    assert!(running.await.is_err(), "the kernel node was killed");
    drop(doomed);

    let hold_id = tally_client::ids::hold_id(&request.request_id, token.id(), 0).expect("id");
    let view = env
        .client
        .get_hold(&token.family_id(), &hold_id)
        .await
        .expect("read");
    let Some(HoldView::Live(hold)) = view else {
        panic!("hold missing: {view:?}")
    };
    assert_eq!(hold.invocation_state, InvocationState::Captured);
    assert_eq!(hold.monetary_state, MonetaryState::Exposed);
    assert_eq!(rail.counts(&request.request_id).authorizations, 1);

    let survivor_client = Arc::new(
        tally_client::TallyClient::new(support::client_config(&env.cluster)).expect("client"),
    );
    let reconciler = Reconciler::new(
        survivor_client,
        rail.clone(),
        ReconcilerConfig {
            stale_after_ms: 0,
            ..ReconcilerConfig::default()
        },
    );
    let report = reconciler.run_once().await.expect("pass");
    assert_eq!(
        (report.reconciled, report.payments_captured),
        (1, 1),
        "{report:?}"
    );
    let view = env
        .client
        .get_hold(&token.family_id(), &hold_id)
        .await
        .expect("read");
    let realized = match view {
        Some(HoldView::Live(hold)) => {
            assert_eq!(hold.monetary_state, MonetaryState::Reconciled);
            hold.realized_units
        }
        other => panic!("hold after reconcile: {other:?}"),
    };
    assert_eq!(realized, 100, "realized = authorized");
    assert_eq!(env.usage(&token, 0).await, Some((1, 100)));
    let counts = rail.counts(&request.request_id);
    assert_eq!((counts.authorizations, counts.captures), (1, 1));
    let again = reconciler.run_once().await.expect("pass");
    assert_eq!(again.reconciled, 0, "{again:?}");
    assert_eq!(rail.counts(&request.request_id).captures, 1);
}

/// The two-phase API across nodes: node A admits (hold, capture, payment, signed ticket),
/// the caller runs the tool itself, node B completes at the actual cost (40 of 100): the
/// cluster realizes 40 and the rail captures 40. A second admission aborted before dispatch on
/// node B releases the payment and cancels the capture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_phase_admit_on_one_node_complete_or_abort_on_another() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let a = env.kernel(rail.clone());
    let b = env
        .kernel(rail.clone())
        .trust_kernel_key(a.keypair().public_key());
    let token = env.token(vec![Grant::monetary(
        "cost-srv", "compute", 100, 1000, "USD",
    )]);

    let admitted = a
        .admit(&admit_request(
            "req-two-phase-complete",
            &token,
            "cost-srv",
            "compute",
        ))
        .await
        .expect("admit");
    assert_eq!(
        admitted.response.verdict,
        Verdict::Allow,
        "{:?}",
        admitted.response.reason
    );
    let ticket = admitted.ticket.expect("ticket");
    let ticket = tally_kernel::pipeline::SignedTicket::from_text(&ticket.to_text().expect("text"))
        .expect("round trip");
    let complete = CompleteCall::new(ticket, Some(Money::new(40, "USD")))
        .signed(&env.agent)
        .expect("sign");
    let completed = b.complete(&complete).await.expect("complete");
    assert_eq!(completed.verdict, Verdict::Allow, "{:?}", completed.reason);
    assert!(
        completed.receipt.metadata["budget_authority"]["reconcile"]["budget_commit_index"]
            .as_u64()
            .is_some()
    );
    assert_eq!(env.usage(&token, 0).await, Some((1, 40)));
    let counts = rail.counts("req-two-phase-complete");
    assert_eq!((counts.authorizations, counts.captures), (1, 1));

    let admitted = a
        .admit(&admit_request(
            "req-two-phase-abort",
            &token,
            "cost-srv",
            "compute",
        ))
        .await
        .expect("admit");
    let ticket = admitted.ticket.expect("ticket");
    let abort = AbortCall::new(ticket, true)
        .signed(&env.agent)
        .expect("sign");
    let aborted = b.abort(&abort).await.expect("abort");
    assert_eq!(aborted.verdict, Verdict::Deny);
    assert_eq!(
        env.usage(&token, 0).await,
        Some((1, 40)),
        "the aborted call is free"
    );
    assert_eq!(rail.counts("req-two-phase-abort").releases, 1);
}
