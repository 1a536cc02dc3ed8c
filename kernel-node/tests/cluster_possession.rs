//! Credentials bound to their holder, against a real 3-node cluster: a token or ticket is
//! worth nothing without a fresh signature by the key it was issued to, and nothing reaches
//! the cluster before that signature checks out; families are namespaced by their root issuer;
//! and a node whose receipt log fails stops taking new calls.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use support::{admit_request, request, unsigned, Env};
use tally_kernel::money::Money;
use tally_kernel::payment::InMemoryRail;
use tally_kernel::pipeline::{
    reasons, wall_clock_ms, AbortCall, CompleteCall, Kernel, KernelError, Method, TicketCall,
    ToolCallRequest,
};
use tally_kernel::receipt::ReceiptLog;
use tally_kernel::tool::testing::{Behavior, ScriptedServer};
use tally_kernel::{CapabilityToken, Grant, KeyPair, TrustList, Verdict};
use tally_ledger::{HoldView, InvocationState, MonetaryState};

fn counting_kernel(env: &Env, rail: &Arc<InMemoryRail>, invocations: &Arc<AtomicU64>) -> Kernel {
    env.kernel(rail.clone()).with_tool_server(Arc::new(
        ScriptedServer::new("cost-srv", &["compute"], Behavior::Succeed { cost: None })
            .with_counter(Arc::clone(invocations)),
    ))
}

fn monetary() -> Grant {
    Grant::monetary("cost-srv", "compute", 100, 1000, "USD")
}

fn assert_possession_denied(response: &tally_kernel::pipeline::Response, label: &str) {
    assert_eq!(response.verdict, Verdict::Deny, "{label}");
    assert!(
        response
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(reasons::POSSESSION_REJECTED)),
        "{label}: {:?}",
        response.reason
    );
}

/// A thief with a copy of the token (but not its subject key) tries: no proof at all, a proof
/// by its own key, the holder's genuine proof lifted from another request, and the holder's
/// proof for `Admit` presented to `EvaluateToolCall`. Each is denied as a possession failure,
/// and the cluster shows nothing: no event, no account row, no hold; the rail and the tool are
/// untouched. The holder's own signed request then goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_token_without_the_subject_keys_signature_is_refused_and_nothing_is_written() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let kernel = counting_kernel(&env, &rail, &invocations);
    let token = env.token(vec![monetary()]);
    let thief = KeyPair::generate();

    let no_proof = unsigned("req-stolen-unsigned", &token, "cost-srv", "compute");
    let thiefs_proof = unsigned("req-stolen-thief", &token, "cost-srv", "compute")
        .signed(Method::EvaluateToolCall, &thief)
        .expect("sign");
    let mut lifted = request("req-stolen-original", &token, "cost-srv", "compute");
    lifted.request_id = "req-stolen-lifted".into();
    let wrong_method = admit_request("req-stolen-admit-proof", &token, "cost-srv", "compute");
    for (label, attempt) in [
        ("no proof", no_proof),
        ("the thief's own key", thiefs_proof),
        ("a proof lifted from another request", lifted),
        ("a proof for another method", wrong_method),
    ] {
        let response = kernel.evaluate(&attempt).await.expect("evaluate");
        assert_possession_denied(&response, label);
        assert!(
            response.receipt.capability_id.is_none(),
            "{label}: an unproven caller's capability is not named"
        );
        let hold = tally_client::ids::hold_id(&attempt.request_id, token.id(), 0).expect("id");
        assert_eq!(
            env.client
                .get_hold(&token.family_id(), &hold)
                .await
                .expect("read"),
            None,
            "{label}: no hold"
        );
    }
    assert!(env.events(&token).await.is_empty(), "nothing journaled");
    let rows = env
        .client
        .list_usages(None, None, None, 100)
        .await
        .expect("usages")
        .rows;
    assert!(rows.is_empty(), "no account rows: {rows:?}");
    assert_eq!(rail.total_authorizations(), 0);
    assert_eq!(invocations.load(Ordering::SeqCst), 0);

    let genuine = request("req-stolen-genuine", &token, "cost-srv", "compute");
    let response = kernel.evaluate(&genuine).await.expect("evaluate");
    assert_eq!(response.verdict, Verdict::Allow, "{:?}", response.reason);
    assert_eq!(invocations.load(Ordering::SeqCst), 1);
}

/// A recorded request replayed after the freshness window (or one dated too far ahead) is
/// refused as stale, with the window in the reason, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_proof_is_refused_before_anything_is_written() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let kernel = counting_kernel(&env, &rail, &invocations);
    let skew = kernel.config().possession_max_skew_ms;
    let token = env.token(vec![monetary()]);
    let now = wall_clock_ms();
    for (label, signed_at) in [("old", now - 2 * skew), ("future", now + 2 * skew)] {
        let mut stale = unsigned(&format!("req-stale-{label}"), &token, "cost-srv", "compute");
        stale
            .sign_at(Method::EvaluateToolCall, &env.agent, signed_at)
            .expect("sign");
        let response = kernel.evaluate(&stale).await.expect("evaluate");
        assert_possession_denied(&response, label);
        let reason = response.reason.unwrap_or_default();
        assert!(
            reason.contains("stale") && reason.contains(&format!("{skew} ms")),
            "{label}: {reason}"
        );
    }
    assert!(env.events(&token).await.is_empty(), "nothing journaled");
    assert_eq!(env.usage(&token, 0).await, None);
    assert_eq!(rail.total_authorizations(), 0);
    assert_eq!(invocations.load(Ordering::SeqCst), 0);
}

/// The state of an admitted call's hold: `(invocation, monetary)`.
async fn hold_state(
    env: &Env,
    token: &CapabilityToken,
    request_id: &str,
) -> (InvocationState, MonetaryState) {
    let hold = tally_client::ids::hold_id(request_id, token.id(), 0).expect("id");
    match env
        .client
        .get_hold(&token.family_id(), &hold)
        .await
        .expect("read")
    {
        Some(HoldView::Live(hold)) => (hold.invocation_state, hold.monetary_state),
        other => panic!("hold {hold}: {other:?}"),
    }
}

/// A ticket is bound to the key that admitted it. Copied by a thief, it completes and aborts
/// nothing: unsigned, signed by another key, signed by the holder for another method, or with
/// its holder rewritten to the thief's key (the kernel's ticket signature then fails). The hold
/// stays captured and exposed, the rail neither captures nor releases, and the budget is
/// unchanged, until the holder itself completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_ticket_needs_its_holders_signature_to_complete_or_abort() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let a = env.kernel(rail.clone());
    let b = env
        .kernel(rail.clone())
        .trust_kernel_key(a.keypair().public_key());
    let token = env.token(vec![monetary()]);
    let request_id = "req-stolen-ticket";
    let admitted = a
        .admit(&admit_request(request_id, &token, "cost-srv", "compute"))
        .await
        .expect("admit");
    assert_eq!(
        admitted.response.verdict,
        Verdict::Allow,
        "{:?}",
        admitted.response.reason
    );
    let ticket = admitted.ticket.expect("ticket");
    assert_eq!(ticket.ticket.holder, env.agent.public_key());
    let thief = KeyPair::generate();
    let cost = Some(Money::new(40, "USD"));
    let before = env.usage(&token, 0).await;
    assert_eq!(before, Some((1, 100)));

    let complete = || CompleteCall::new(ticket.clone(), cost.clone());
    let abort = || AbortCall::new(ticket.clone(), true);
    let mut holders_abort_proof = complete();
    holders_abort_proof.possession = abort().signed(&env.agent).expect("sign").possession;
    let mut rewritten = ticket.clone();
    rewritten.ticket.holder = thief.public_key();
    let completions = [
        ("unsigned", complete()),
        (
            "signed by another key",
            complete().signed(&thief).expect("sign"),
        ),
        ("the holder's proof for Abort", holders_abort_proof),
        (
            "holder rewritten to the thief",
            CompleteCall::new(rewritten.clone(), cost.clone())
                .signed(&thief)
                .expect("sign"),
        ),
    ];
    for (label, call) in completions {
        let response = b.complete(&call).await.expect("complete");
        assert_eq!(response.verdict, Verdict::Deny, "{label}");
        let reason = response.reason.unwrap_or_default();
        let expected = if label.starts_with("holder rewritten") {
            "capture proof rejected"
        } else {
            reasons::POSSESSION_REJECTED
        };
        assert!(reason.starts_with(expected), "{label}: {reason}");
    }
    for (label, call) in [
        ("unsigned", abort()),
        (
            "signed by another key",
            abort().signed(&thief).expect("sign"),
        ),
    ] {
        let response = b.abort(&call).await.expect("abort");
        assert_possession_denied(&response, label);
    }
    assert_eq!(
        hold_state(&env, &token, request_id).await,
        (InvocationState::Captured, MonetaryState::Exposed),
        "neither settled nor freed"
    );
    assert_eq!(env.usage(&token, 0).await, before);
    let counts = rail.counts(request_id);
    assert_eq!(
        (counts.authorizations, counts.captures, counts.releases),
        (1, 0, 0)
    );

    let completed = b
        .complete(&complete().signed(&env.agent).expect("sign"))
        .await
        .expect("complete");
    assert_eq!(completed.verdict, Verdict::Allow, "{:?}", completed.reason);
    assert_eq!(env.usage(&token, 0).await, Some((1, 40)));
    assert_eq!(rail.counts(request_id).captures, 1);
}

/// Two issuers that both trust-chain into one kernel pick the same token id. Their families
/// are different ids (each under its issuer's key) and their budgets are independent: each
/// token's one allowed call succeeds, and each account shows exactly its own call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_issuers_with_the_same_token_id_get_separate_families_and_budgets() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let other_issuer = KeyPair::generate();
    let kernel = Kernel::new(
        KeyPair::generate(),
        TrustList::new([env.issuer.public_key(), other_issuer.public_key()]),
        Arc::new(
            tally_client::TallyClient::new(support::client_config(&env.cluster)).expect("client"),
        ),
        rail.clone(),
    )
    .with_tool_server(Arc::new(
        ScriptedServer::new("cost-srv", &["compute"], Behavior::Succeed { cost: None })
            .with_counter(Arc::clone(&invocations)),
    ));
    let now = wall_clock_ms();
    let issue = |issuer: &KeyPair| {
        CapabilityToken::issue_with_id(
            issuer,
            "cap-shared-id".into(),
            env.agent.public_key(),
            vec![monetary().with_max_invocations(1)],
            now - 1_000,
            now + 3_600_000,
        )
        .expect("issue")
    };
    let (ours, theirs) = (issue(&env.issuer), issue(&other_issuer));
    assert_eq!(ours.id(), theirs.id());
    assert_ne!(ours.family_id(), theirs.family_id());
    for (label, token) in [("ours", &ours), ("theirs", &theirs)] {
        let response = kernel
            .evaluate(&request(
                &format!("req-shared-id-{label}"),
                token,
                "cost-srv",
                "compute",
            ))
            .await
            .expect("evaluate");
        assert_eq!(
            response.verdict,
            Verdict::Allow,
            "{label}: {:?}",
            response.reason
        );
        assert_eq!(
            response.receipt.family_id.as_ref(),
            Some(&token.family_id()),
            "{label}"
        );
    }
    assert_eq!(env.usage(&ours, 0).await, Some((1, 100)));
    assert_eq!(env.usage(&theirs, 0).await, Some((1, 100)));
    assert_eq!(invocations.load(Ordering::SeqCst), 2);
    // Each family's budget is its own: one more call on either is over its limit of one.
    let again = kernel
        .evaluate(&request(
            "req-shared-id-again",
            &ours,
            "cost-srv",
            "compute",
        ))
        .await
        .expect("evaluate");
    assert_eq!(again.verdict, Verdict::Deny);
    assert_eq!(env.usage(&theirs, 0).await, Some((1, 100)));
}

/// A receipt log that cannot be written (`/dev/full`: every write fails with ENOSPC). The call
/// that finds out is answered as decided (its tool ran; nothing is unwound) and an admitted
/// call can still be completed, but every new call is then refused with a definite error
/// before anything is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_receipt_log_closes_the_node_to_new_calls_without_unwinding() {
    let env = Env::start().await;
    let rail = Arc::new(InMemoryRail::new());
    let invocations = Arc::new(AtomicU64::new(0));
    let log = ReceiptLog::open("/dev/full").expect("/dev/full opens (Linux)");
    let kernel = counting_kernel(&env, &rail, &invocations).with_receipt_log(Arc::new(log));
    let token = env.token(vec![monetary()]);
    assert_eq!(kernel.receipt_log_failure(), None);

    let admitted = kernel
        .admit(&admit_request(
            "req-log-admitted",
            &token,
            "cost-srv",
            "compute",
        ))
        .await
        .expect("admit");
    assert_eq!(admitted.response.verdict, Verdict::Allow);
    let failure = kernel.receipt_log_failure().expect("the append failed");
    assert!(failure.contains("/dev/full"), "{failure}");

    let refused: [(&str, ToolCallRequest); 2] = [
        (
            "evaluate",
            request("req-log-refused", &token, "cost-srv", "compute"),
        ),
        (
            "admit",
            admit_request("req-log-refused-admit", &token, "cost-srv", "compute"),
        ),
    ];
    for (label, call) in refused {
        let result = if label == "evaluate" {
            kernel.evaluate(&call).await.map(|_| ())
        } else {
            kernel.admit(&call).await.map(|_| ())
        };
        assert!(
            matches!(result, Err(KernelError::ReceiptLogUnavailable(_))),
            "{label}: {result:?}"
        );
        let hold = tally_client::ids::hold_id(&call.request_id, token.id(), 0).expect("id");
        assert_eq!(
            env.client
                .get_hold(&token.family_id(), &hold)
                .await
                .expect("read"),
            None,
            "{label}: nothing held"
        );
    }
    assert_eq!(
        rail.total_authorizations(),
        1,
        "only the admitted call paid"
    );

    // The admitted call already happened: it settles.
    let completed = kernel
        .complete(
            &CompleteCall::new(
                admitted.ticket.expect("ticket"),
                Some(Money::new(30, "USD")),
            )
            .signed(&env.agent)
            .expect("sign"),
        )
        .await
        .expect("complete");
    assert_eq!(completed.verdict, Verdict::Allow, "{:?}", completed.reason);
    assert_eq!(env.usage(&token, 0).await, Some((1, 30)));
}
