//! The seed's dispatch scenarios against a real 3-node cluster: failures after dispatch keep
//! everything, a captured request never falls through to another grant, and of two identical
//! concurrent calls exactly one pays and dispatches.

mod support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use support::{admit_request, assert_capture_metadata, request, request_as, resign, Env};
use tally_kernel::money::Money;
use tally_kernel::payment::{
    Authorization, Capture, InMemoryRail, PaymentAdapter, PaymentError, Refund, ReleaseStatus,
    SettlementRecord,
};
use tally_kernel::pipeline::{wall_clock_ms, DispatchCall, KernelConfig, Method, TicketCall};
use tally_kernel::tool::testing::{Behavior, ScriptedServer};
use tally_kernel::{CapabilityToken, Grant, KeyPair, Verdict};

const FAILURES: [(&str, Behavior); 5] = [
    ("cancellation", Behavior::CancelAfterSideEffect),
    ("deadline", Behavior::Hang),
    ("incomplete", Behavior::IncompleteAfterSideEffect),
    ("generic", Behavior::FailAfterSideEffect),
    (
        "tool-not-registered",
        Behavior::ToolNotRegisteredAfterDispatch,
    ),
];

struct Case {
    rail: Arc<InMemoryRail>,
    executions: Arc<AtomicU64>,
    kernel: tally_kernel::pipeline::Kernel,
}

fn case(env: &Env, behavior: &Behavior) -> Case {
    let rail = Arc::new(InMemoryRail::new());
    let executions = Arc::new(AtomicU64::new(0));
    let kernel = env
        .kernel(rail.clone())
        .with_config(KernelConfig {
            dispatch_deadline: Duration::from_millis(200),
            ..KernelConfig::default()
        })
        .with_tool_server(Arc::new(
            ScriptedServer::new("cost-srv", &["compute"], behavior.clone())
                .with_counter(Arc::clone(&executions)),
        ));
    Case {
        rail,
        executions,
        kernel,
    }
}

impl Case {
    /// The seed's `assert_retained`, on every account named.
    async fn assert_retained(
        &self,
        env: &Env,
        accounts: &[(&CapabilityToken, &str)],
        request_id: &str,
    ) {
        for (token, cap) in accounts {
            assert_eq!(
                env.usage_of(&token.family_id(), cap, 0).await,
                Some((1, 100)),
                "account {cap} retains the call"
            );
        }
        let counts = self.rail.counts(request_id);
        assert_eq!(counts.authorizations, 1);
        assert_eq!(counts.releases, 0);
        assert_eq!(counts.refunds, 0);
        assert_eq!(self.rail.total_authorizations(), 1);
        assert_eq!(self.executions.load(Ordering::SeqCst), 1);
    }
}

/// Seed: `non_durable_monetary_terminal_failures_retain_top_level_funds`, same assertions for
/// all five post-dispatch failures (the deadline is the kernel's, 200 ms). The fresh retry is
/// denied by the cluster's invocation quota, so nothing more is authorized or dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_durable_monetary_terminal_failures_retain_top_level_funds() {
    let env = Env::start().await;
    for (label, behavior) in FAILURES {
        let case = case(&env, &behavior);
        let token = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )
        .with_max_invocations(1)]);
        let request = request(
            &format!("req-monetary-top-level-{label}"),
            &token,
            "cost-srv",
            "compute",
        );
        let first = case.kernel.evaluate(&request).await.expect("evaluate");
        assert_eq!(first.verdict, Verdict::Deny, "{label}");
        assert_capture_metadata(&first.receipt, token.id().as_str(), &request.request_id);
        let cap = token.id().to_string();
        case.assert_retained(&env, &[(&token, &cap)], &request.request_id)
            .await;
        let mut fresh = request.clone();
        fresh.request_id = format!("{}-fresh", request.request_id);
        let fresh = resign(fresh);
        let retry = case.kernel.evaluate(&fresh).await.expect("evaluate");
        assert_eq!(retry.verdict, Verdict::Deny, "{label}");
        case.assert_retained(&env, &[(&token, &cap)], &request.request_id)
            .await;
    }
}

/// Seed: `non_durable_monetary_terminal_failures_retain_nested_funds`. Tally has no sessions or
/// nested flows; the nested case here is a delegated child capability (docs/spec.md §8), whose hold
/// also reserves on the parent's grant account. Every failure retains on both accounts, and
/// the fresh retry is denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_durable_monetary_terminal_failures_retain_nested_funds() {
    let env = Env::start().await;
    for (label, behavior) in FAILURES {
        let case = case(&env, &behavior);
        let parent = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )
        .with_max_invocations(1)]);
        let now = wall_clock_ms();
        let holder = KeyPair::generate();
        let child = parent
            .delegate(
                &env.agent,
                holder.public_key(),
                vec![Grant::monetary("cost-srv", "compute", 100, 1000, "USD")
                    .with_max_invocations(1)
                    .narrowing(0)],
                now - 1_000,
                now + 3_600_000,
            )
            .expect("delegate");
        let request = request_as(
            &format!("req-monetary-nested-{label}"),
            &child,
            "cost-srv",
            "compute",
            &holder,
        );
        let first = case.kernel.evaluate(&request).await.expect("evaluate");
        assert_eq!(first.verdict, Verdict::Deny, "{label}");
        assert_capture_metadata(&first.receipt, child.id().as_str(), &request.request_id);
        let (parent_id, child_id) = (parent.id().to_string(), child.id().to_string());
        let accounts = [(&child, parent_id.as_str()), (&child, child_id.as_str())];
        case.assert_retained(&env, &accounts, &request.request_id)
            .await;
        let mut fresh = request.clone();
        fresh.request_id = format!("{}-fresh", request.request_id);
        fresh.sign(Method::EvaluateToolCall, &holder).expect("sign");
        let retry = case.kernel.evaluate(&fresh).await.expect("evaluate");
        assert_eq!(retry.verdict, Verdict::Deny, "{label}");
        case.assert_retained(&env, &accounts, &request.request_id)
            .await;
    }
}

/// Seed: `captured_monetary_replay_cannot_fall_through_to_overlapping_unlimited_grant`, same
/// assertions: the replay's authorize answers `AlreadyCaptured` from the cluster and the kernel
/// denies instead of trying the unlimited grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_monetary_replay_cannot_fall_through_to_overlapping_unlimited_grant() {
    let env = Env::start().await;
    let case = case(&env, &Behavior::Succeed { cost: None });
    let token = env.token(vec![
        Grant::monetary("cost-srv", "compute", 100, 1000, "USD"),
        Grant::tool("cost-srv", "compute"),
    ]);
    let request = request(
        "req-captured-overlapping-grant",
        &token,
        "cost-srv",
        "compute",
    );
    let first = case.kernel.evaluate(&request).await.expect("evaluate");
    assert_eq!(first.verdict, Verdict::Allow, "{:?}", first.reason);
    let replay = case.kernel.evaluate(&request).await.expect("evaluate");
    assert_eq!(replay.verdict, Verdict::Deny, "{:?}", replay.reason);
    assert_eq!(case.rail.total_authorizations(), 1);
    assert_eq!(case.executions.load(Ordering::SeqCst), 1);
    assert_eq!(
        env.usage(&token, 1).await,
        None,
        "the unlimited grant was never tried"
    );
}

/// A rail whose authorizations wait for the test to open a gate (the seed's
/// `BlockingAuthorizationPaymentAdapter`).
struct GatedRail {
    inner: InMemoryRail,
    attempts: AtomicUsize,
    gate: tokio::sync::Semaphore,
}

#[async_trait]
impl PaymentAdapter for GatedRail {
    async fn authorize(
        &self,
        reference: &str,
        amount: &Money,
    ) -> Result<Authorization, PaymentError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let _permit = self
            .gate
            .acquire()
            .await
            .map_err(|_| PaymentError::Unavailable("gate closed".into()))?;
        self.inner.authorize(reference, amount).await
    }
    async fn capture(&self, reference: &str, amount: &Money) -> Result<Capture, PaymentError> {
        self.inner.capture(reference, amount).await
    }
    async fn release(&self, reference: &str) -> Result<ReleaseStatus, PaymentError> {
        self.inner.release(reference).await
    }
    async fn refund(&self, reference: &str, amount: &Money) -> Result<Refund, PaymentError> {
        self.inner.refund(reference, amount).await
    }
    async fn lookup(&self, reference: &str) -> Result<Option<SettlementRecord>, PaymentError> {
        self.inner.lookup(reference).await
    }
}

/// Seed: `concurrent_identical_monetary_requests_capture_before_payment_and_release_loser_leases`.
/// Two evaluations of one request on a delegated child race on one kernel node while the rail
/// blocks. The seed's runtime-admission leases and in-kernel sibling lease have no counterpart:
/// the sibling budget is the parent's account in the cluster (docs/spec.md §8). So "the loser
/// released its lease" becomes: the loser finished (denied at capture) while the winner's
/// payment was still blocked, and afterwards the sibling still fits in the parent's budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_monetary_requests_capture_before_payment_and_release_loser_leases() {
    let env = Env::start().await;
    let rail = Arc::new(GatedRail {
        inner: InMemoryRail::new(),
        attempts: AtomicUsize::new(0),
        gate: tokio::sync::Semaphore::new(0),
    });
    let invocations = Arc::new(AtomicU64::new(0));
    let kernel = Arc::new(
        env.kernel(rail.clone()).with_tool_server(Arc::new(
            ScriptedServer::new("cost-srv", &["compute"], Behavior::Succeed { cost: None })
                .with_counter(Arc::clone(&invocations)),
        )),
    );
    let parent = env.token(vec![Grant::monetary(
        "cost-srv", "compute", 100, 200, "USD",
    )]);
    let now = wall_clock_ms();
    let child = |parent: &CapabilityToken| {
        parent
            .delegate(
                &env.agent,
                env.agent.public_key(),
                vec![Grant::monetary("cost-srv", "compute", 100, 100, "USD").narrowing(0)],
                now - 1_000,
                now + 3_600_000,
            )
            .expect("delegate")
    };
    let (child_a, child_b) = (child(&parent), child(&parent));
    let request = request(
        "req-concurrent-identical-capture",
        &child_a,
        "cost-srv",
        "compute",
    );
    let spawn = |kernel: Arc<tally_kernel::pipeline::Kernel>,
                 request: tally_kernel::pipeline::ToolCallRequest| {
        tokio::spawn(async move { kernel.evaluate(&request).await })
    };
    let first = spawn(Arc::clone(&kernel), request.clone());
    let second = spawn(Arc::clone(&kernel), request.clone());
    tokio::time::timeout(Duration::from_secs(30), async {
        while rail.attempts.load(Ordering::SeqCst) == 0
            || !(first.is_finished() || second.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the capture loser finished while the winner's payment was blocked");
    assert_eq!(
        rail.attempts.load(Ordering::SeqCst),
        1,
        "the loser never reached payment"
    );
    rail.gate.add_permits(16);
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
    assert_eq!(
        responses
            .iter()
            .filter(|r| r.verdict == Verdict::Deny)
            .count(),
        1
    );
    assert_eq!(rail.attempts.load(Ordering::SeqCst), 1);
    assert_eq!(invocations.load(Ordering::SeqCst), 1);
    assert_eq!(
        env.usage_of(&parent.family_id(), parent.id().as_str(), 0)
            .await,
        Some((1, 100))
    );
    let sibling = request_for(&child_b);
    let response = kernel.evaluate(&sibling).await.expect("evaluate");
    assert_eq!(
        response.verdict,
        Verdict::Allow,
        "the loser leaked parent budget: {:?}",
        response.reason
    );
    assert_eq!(
        env.usage_of(&parent.family_id(), parent.id().as_str(), 0)
            .await,
        Some((2, 200))
    );
}

fn request_for(token: &CapabilityToken) -> tally_kernel::pipeline::ToolCallRequest {
    request("req-sibling-after-race", token, "cost-srv", "compute")
}

/// Seed: `direct_monetary_dispatch_without_capture_proof_fails_closed`. The seed's kernel
/// refuses a direct dispatch whether or not the caller claims a capture. Here the only
/// dispatch outside `evaluate` is `dispatch_admitted(ticket)` (on any node), and it needs a
/// capture proof: a ticket signed by a trusted kernel key *and* the cluster's record that the
/// ticket's attempt owns the capture. Three caller claims fail closed with the tool never
/// entered: a ticket forged by an untrusted key, a genuine ticket with its attempt id rewritten
/// (bad signature), and a ticket re-signed by the trusted key for an attempt the cluster never
/// saw capture. The genuine ticket then dispatches exactly once, on another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_monetary_dispatch_without_capture_proof_fails_closed() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let tools = || {
        Arc::new(
            ScriptedServer::new("cost-srv", &["compute"], Behavior::Succeed { cost: None })
                .with_counter(Arc::clone(&invocations)),
        )
    };
    let admitting = env.kernel(rail.clone());
    let other = env
        .kernel(rail.clone())
        .with_tool_server(tools())
        .trust_kernel_key(admitting.keypair().public_key());
    let token = env.token(vec![Grant::monetary(
        "cost-srv", "compute", 100, 1000, "USD",
    )]);
    let admission = admitting
        .admit(&admit_request(
            "req-direct-monetary-dispatch",
            &token,
            "cost-srv",
            "compute",
        ))
        .await
        .expect("admit");
    assert_eq!(
        admission.response.verdict,
        Verdict::Allow,
        "{:?}",
        admission.response.reason
    );
    let genuine = admission.ticket.expect("ticket");

    let forged = genuine
        .ticket
        .clone()
        .sign(&KeyPair::generate())
        .expect("sign");
    let mut rewritten = genuine.clone();
    rewritten.ticket.attempt_id = "att-caller-claims-this".into();
    let mut claimed = genuine.ticket.clone();
    claimed.attempt_id = "att-never-captured".into();
    let resigned = claimed.sign(admitting.keypair()).expect("sign");
    for (label, ticket) in [
        ("forged", forged),
        ("rewritten", rewritten),
        ("unrecorded", resigned),
    ] {
        let call = DispatchCall::new(ticket, serde_json::json!({}))
            .signed(&env.agent)
            .expect("sign");
        let response = other.dispatch_admitted(&call).await.expect("dispatch");
        assert_eq!(response.verdict, Verdict::Deny, "{label}");
        assert!(
            response
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with("capture proof rejected")),
            "{label}: {:?}",
            response.reason
        );
        assert_eq!(invocations.load(Ordering::SeqCst), 0, "{label}");
    }
    assert_eq!(rail.counts("req-direct-monetary-dispatch").captures, 0);
    assert_eq!(
        env.usage(&token, 0).await,
        Some((1, 100)),
        "nothing was freed"
    );

    let call = DispatchCall::new(genuine, serde_json::json!({}))
        .signed(&env.agent)
        .expect("sign");
    let response = other.dispatch_admitted(&call).await.expect("dispatch");
    assert_eq!(response.verdict, Verdict::Allow, "{:?}", response.reason);
    assert_eq!(invocations.load(Ordering::SeqCst), 1);
    assert_eq!(rail.counts("req-direct-monetary-dispatch").captures, 1);
}
