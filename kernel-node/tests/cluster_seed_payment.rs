//! The seed's payment scenarios against a real 3-node cluster: the budget store is the
//! cluster, the rail an `InMemoryRail` (behind a scripted `FaultyRail` where the seed used a
//! failing adapter), and lost budget acknowledgements are replies lost on the wire after commit.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use support::{assert_capture_metadata, is_cancel, request, Env, Loss};
use tally_kernel::payment::{Fault, FaultyRail, InMemoryRail, PaymentError, RailOp};
use tally_kernel::pipeline::{reasons, KernelError};
use tally_kernel::receipt::read_receipts;
use tally_kernel::tool::testing::{Behavior, ScriptedServer};
use tally_kernel::{Grant, ReceiptLog, Verdict};
use tally_ledger::EventKind;

fn server(behavior: Behavior, counter: &Arc<AtomicU64>) -> Arc<ScriptedServer> {
    Arc::new(
        ScriptedServer::new("cost-srv", &["compute"], behavior).with_counter(Arc::clone(counter)),
    )
}

fn succeed() -> Behavior {
    Behavior::Succeed { cost: None }
}

/// Seed: `payment_authorization_errors_cancel_capture_only_for_definite_denials`, same
/// assertions. The failing adapter is a `FaultyRail`: declines and outages fail before the rail,
/// and the seed's "lost acknowledgement" (`RailError`) really authorizes on the rail and then
/// reports the error, so the retained authorization is a real one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_authorization_errors_cancel_capture_only_for_definite_denials() {
    let env = Env::start().await;
    let cases = [
        (
            "declined",
            Fault::Fail(PaymentError::Declined("test decline".into())),
            true,
        ),
        (
            "insufficient-funds",
            Fault::Fail(PaymentError::InsufficientFunds),
            true,
        ),
        (
            "unavailable",
            Fault::Fail(PaymentError::Unavailable("test unavailable".into())),
            false,
        ),
        (
            "lost-ack",
            Fault::LoseAck(PaymentError::RailError("test lost acknowledgement".into())),
            false,
        ),
    ];
    for (label, fault, definite) in cases {
        let rail = Arc::new(FaultyRail::new(Arc::new(InMemoryRail::new())));
        rail.push(RailOp::Authorize, fault);
        let invocations = Arc::new(AtomicU64::new(0));
        let kernel = env
            .kernel(rail.clone())
            .with_tool_server(server(succeed(), &invocations));
        let token = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )]);
        let request = request(
            &format!("req-payment-{label}"),
            &token,
            "cost-srv",
            "compute",
        );
        let response = kernel.evaluate(&request).await.expect("evaluate");
        assert_eq!(response.verdict, Verdict::Deny, "{label}");
        assert_capture_metadata(&response.receipt, token.id().as_str(), &request.request_id);
        let usage = env.usage(&token, 0).await.expect("payment failure usage");
        if definite {
            assert_eq!(
                usage,
                (0, 0),
                "{label}: a definite decline frees the budget"
            );
            assert!(env
                .events(&token)
                .await
                .iter()
                .any(|e| e.kind == EventKind::CancelCapturedBeforeDispatch));
        } else {
            assert_eq!(usage, (1, 100), "{label}: an ambiguous failure retains");
            assert_eq!(
                response.receipt.metadata["financial"]["payment_authorization_ambiguous"].as_bool(),
                Some(true)
            );
            assert_eq!(
                response.receipt.metadata["financial"]["payment_authorization_retained"].as_bool(),
                Some(true)
            );
        }
        assert_eq!(rail.calls(RailOp::Authorize), 1, "{label}");
        assert_eq!(invocations.load(Ordering::SeqCst), 0, "{label}");
    }
}

/// Seed: `lost_cancellation_acknowledgement_records_ambiguity_and_blocks_dispatch`. The seed's
/// store commits the cancel and loses its acknowledgement. Here the cancel's reply is lost on
/// the wire after commit. With the cluster reachable the client's retry resolves it to the
/// committed cancel, so the kernel denies with the decline as the reason and the receipt
/// carries the cancel's commit index (stronger than the seed). With the cluster unreachable
/// after the commit, the seed's outcome is asserted: the ambiguous deny naming the exact event.
/// The seed's nested variant has no counterpart (Tally has no sessions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_cancellation_acknowledgement_records_ambiguity_and_blocks_dispatch() {
    let env = Env::start().await;
    for mode in [
        Loss::ReplyAfterCommit,
        Loss::ReplyAfterCommitThenUnreachable,
    ] {
        let rail = Arc::new(FaultyRail::new(Arc::new(InMemoryRail::new())));
        rail.fail_next(
            RailOp::Authorize,
            1,
            PaymentError::Declined("test decline".into()),
        );
        let invocations = Arc::new(AtomicU64::new(0));
        let ledger = env.lossy(mode, is_cancel);
        let kernel = env
            .kernel_with(ledger.clone(), rail.clone())
            .with_tool_server(server(succeed(), &invocations));
        let token = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )]);
        let request = request(
            &format!("req-cancellation-lost-ack-{mode:?}"),
            &token,
            "cost-srv",
            "compute",
        );
        let first = kernel.evaluate(&request).await.expect("evaluate");
        env.heal().await;
        assert_eq!(first.verdict, Verdict::Deny);
        let cancellation =
            &first.receipt.metadata["budget_authority"]["cancel_captured_before_dispatch"];
        let journal = env
            .events(&token)
            .await
            .into_iter()
            .find(|e| e.kind == EventKind::CancelCapturedBeforeDispatch)
            .expect("durable cancellation event");
        assert_eq!(ledger.lost().as_ref(), Some(&journal.event_id));
        assert_eq!(
            cancellation["event_id"].as_str(),
            Some(journal.event_id.as_str())
        );
        match mode {
            Loss::ReplyAfterCommit => {
                assert!(first
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("payment authorization denied")));
                assert_eq!(
                    cancellation["budget_commit_index"].as_u64(),
                    Some(journal.commit_index.0)
                );
            }
            _ => {
                assert_eq!(first.reason.as_deref(), Some(reasons::CANCEL_UNCONFIRMED));
                assert_eq!(cancellation["cancellation_ambiguous"].as_bool(), Some(true));
                assert!(cancellation.get("budget_commit_index").is_none());
            }
        }
        assert_eq!(rail.calls(RailOp::Authorize), 1);
        assert_eq!(invocations.load(Ordering::SeqCst), 0);
        assert_eq!(env.usage(&token, 0).await, Some((0, 0)));
    }
}

/// Seed: `nonce_cleanup_signs_release_then_cancellation_lost_ack`. The seed reaches its
/// post-payment, pre-dispatch unwind through a consumed nonce; docs/spec.md §9 spends nonces in the
/// cluster before the capture (a failure there reverses the hold, see `cluster_seed_nonce`), so
/// here the unwind comes from the other pre-dispatch failure, a tool not registered at lookup.
/// The payment release is confirmed, then the cancel's reply is lost after commit: resolved
/// (reachable) to the committed cancel and a freed budget, or (unreachable) the seed's signed
/// `cancellation_ambiguous` with the exact event id and the capture retained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonce_cleanup_signs_release_then_cancellation_lost_ack() {
    let env = Env::start().await;
    for mode in [
        Loss::ReplyAfterCommit,
        Loss::ReplyAfterCommitThenUnreachable,
    ] {
        let rail = Arc::new(InMemoryRail::new());
        let ledger = env.lossy(mode, is_cancel);
        let kernel = env.kernel_with(ledger.clone(), rail.clone());
        let token = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )]);
        let request = request(
            &format!("req-nonce-cancel-unconfirmed-{mode:?}"),
            &token,
            "cost-srv",
            "compute",
        );
        let response = kernel.evaluate(&request).await.expect("evaluate");
        env.heal().await;
        assert_eq!(response.verdict, Verdict::Deny);
        let metadata = &response.receipt.metadata;
        assert_eq!(
            metadata["financial"]["payment_release_confirmed"].as_bool(),
            Some(true)
        );
        assert!(metadata["financial"]["payment_release_reference"]
            .as_str()
            .is_some());
        assert_eq!(rail.counts(&request.request_id).releases, 1);
        let cancellation = env
            .events(&token)
            .await
            .into_iter()
            .find(|e| e.kind == EventKind::CancelCapturedBeforeDispatch)
            .expect("durable cancellation event");
        let cancel = &metadata["budget_authority"]["cancel_captured_before_dispatch"];
        assert_eq!(
            cancel["event_id"].as_str(),
            Some(cancellation.event_id.as_str())
        );
        match mode {
            Loss::ReplyAfterCommit => {
                assert_eq!(
                    cancel["budget_commit_index"].as_u64(),
                    Some(cancellation.commit_index.0)
                );
                assert!(response
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.contains("not registered")));
            }
            _ => {
                assert_eq!(cancel["cancellation_ambiguous"].as_bool(), Some(true));
                assert_eq!(
                    metadata["budget_authority"]["invocation_capture"]["admission_retained"]
                        .as_bool(),
                    Some(true)
                );
            }
        }
        assert_eq!(
            env.usage(&token, 0).await,
            Some((0, 0)),
            "the cancel did commit"
        );
    }
}

/// Seed: `nonce_cleanup_retains_payment_and_capture_when_release_is_unconfirmed`. As above,
/// the pre-dispatch unwind comes from a tool not registered at lookup rather than a consumed
/// nonce. The release fails (`RailError`) or answers `Unconfirmed` (this rail's "pending"; it
/// has no separate release reference, so the seed's `release_pending_reference` check becomes
/// `payment_release_status == "unconfirmed"`). Everything else is the seed's: payment and
/// capture retained, the attempt's reference signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonce_cleanup_retains_payment_and_capture_when_release_is_unconfirmed() {
    let env = Env::start().await;
    for (label, fault) in [
        (
            "error",
            Fault::Fail(PaymentError::RailError(
                "release acknowledgement lost".into(),
            )),
        ),
        ("pending", Fault::Pending),
    ] {
        let inner = Arc::new(InMemoryRail::new());
        let rail = Arc::new(FaultyRail::new(inner.clone()));
        rail.push(RailOp::Release, fault);
        let kernel = env.kernel(rail.clone());
        let token = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )]);
        let request = request(
            &format!("req-nonce-release-unconfirmed-{label}"),
            &token,
            "cost-srv",
            "compute",
        );
        let response = kernel.evaluate(&request).await.expect("evaluate");
        assert_eq!(response.verdict, Verdict::Deny);
        let metadata = &response.receipt.metadata;
        assert_eq!(
            metadata["financial"]["payment_release_unconfirmed"].as_bool(),
            Some(true)
        );
        assert_eq!(
            metadata["financial"]["payment_authorization_retained"].as_bool(),
            Some(true)
        );
        assert_eq!(
            metadata["financial"]["payment_release_attempt_reference"].as_str(),
            Some(request.request_id.as_str())
        );
        assert_eq!(
            metadata["budget_authority"]["invocation_capture"]["admission_retained"].as_bool(),
            Some(true)
        );
        if label == "pending" {
            assert_eq!(
                metadata["financial"]["payment_release_status"].as_str(),
                Some("unconfirmed")
            );
        }
        assert_eq!(env.usage(&token, 0).await, Some((1, 100)));
        assert_eq!(inner.counts(&request.request_id).authorizations, 1);
        assert_eq!(inner.counts(&request.request_id).releases, 0);
    }
}

/// Seed: `predispatch_unwind_requires_confirmed_payment_release_status`. The seed calls the
/// unwind function directly; here it runs inside the pipeline (tool not registered at lookup,
/// release answering `Unconfirmed`). Same facts: the budget stays held and the journal has no
/// event giving it back (neither a reverse nor a cancel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predispatch_unwind_requires_confirmed_payment_release_status() {
    let env = Env::start().await;
    let rail = Arc::new(FaultyRail::new(Arc::new(InMemoryRail::new())));
    rail.push(RailOp::Release, Fault::Pending);
    let kernel = env.kernel(rail.clone());
    let token = env.token(vec![Grant::monetary(
        "cost-srv", "compute", 100, 1000, "USD",
    )]);
    let request = request(
        "req-predispatch-unwind-pending",
        &token,
        "cost-srv",
        "compute",
    );
    let response = kernel.evaluate(&request).await.expect("evaluate");
    assert_eq!(response.verdict, Verdict::Deny);
    assert_eq!(env.usage(&token, 0).await, Some((1, 100)));
    assert!(!env.events(&token).await.iter().any(|e| matches!(
        e.kind,
        EventKind::ReverseExposure
            | EventKind::ReverseInvocation
            | EventKind::CancelCapturedBeforeDispatch
    )));
    assert_eq!(rail.calls(RailOp::Release), 1);
}

/// Seed: `non_durable_monetary_url_elicitation_releases_admission_for_fresh_retry`, same
/// assertions (the receipt log is the node's JSON-lines file). The exact replay is denied by
/// the cluster (its hold is terminally reversed) before any payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_durable_monetary_url_elicitation_releases_admission_for_fresh_retry() {
    let env = Env::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let log_path = dir.path().join("receipts.jsonl");
    let rail = Arc::new(InMemoryRail::new());
    let side_effects = Arc::new(AtomicU64::new(0));
    let message = "URL elicitation required before dispatch side effect";
    let kernel = env
        .kernel(rail.clone())
        .with_tool_server(server(
            Behavior::UrlElicitation {
                message: message.into(),
            },
            &side_effects,
        ))
        .with_receipt_log(Arc::new(ReceiptLog::open(&log_path).expect("log")));
    let token = env.token(vec![Grant::monetary(
        "cost-srv", "compute", 100, 1000, "USD",
    )
    .with_max_invocations(1)]);
    let request = request("req-monetary-url-ambiguous", &token, "cost-srv", "compute");
    let first = kernel.evaluate(&request).await;
    let Err(KernelError::UrlElicitationRequired {
        message: got,
        receipt,
    }) = first
    else {
        panic!("URL elicitation payload was not preserved: {first:?}");
    };
    assert_eq!(got, message);
    assert_eq!(env.usage(&token, 0).await, Some((0, 0)));
    assert_eq!(rail.counts(&request.request_id).authorizations, 1);
    assert_eq!(rail.counts(&request.request_id).releases, 1);
    assert_eq!(side_effects.load(Ordering::SeqCst), 1);
    let logged = read_receipts(&log_path).expect("read").receipts;
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0], *receipt);
    assert_eq!(logged[0].verdict, Verdict::Deny);
    assert_capture_metadata(&logged[0], token.id().as_str(), &request.request_id);

    let replay = kernel.evaluate(&request).await.expect("replay");
    assert_eq!(replay.verdict, Verdict::Deny);
    assert_eq!(rail.total_authorizations(), 1);
    assert_eq!(side_effects.load(Ordering::SeqCst), 1);

    let mut fresh = request.clone();
    fresh.request_id = "req-monetary-url-ambiguous-fresh".into();
    let fresh = support::resign(fresh);
    assert!(matches!(
        kernel.evaluate(&fresh).await,
        Err(KernelError::UrlElicitationRequired { .. })
    ));
    assert_eq!(rail.total_authorizations(), 2);
    assert_eq!(rail.counts(&fresh.request_id).releases, 1);
    assert_eq!(side_effects.load(Ordering::SeqCst), 2);
}
