//! The seed's lost capture acknowledgement against a real 3-node cluster.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use support::{assert_capture_metadata, is_capture, request, Env, Loss};
use tally_kernel::payment::InMemoryRail;
use tally_kernel::pipeline::reasons;
use tally_kernel::reconciler::{Reconciler, ReconcilerConfig};
use tally_kernel::tool::testing::{Behavior, ScriptedServer};
use tally_kernel::{Grant, Verdict};
use tally_ledger::EventKind;

/// Seed: `lost_capture_acknowledgement_records_ambiguity_and_blocks_replay`. The seed's store
/// commits the capture and loses its acknowledgement; here the capture's reply is lost on the
/// wire after commit.
/// - Cluster reachable (stronger than the seed): the client's same-id retry answers
///   `AlreadyCaptured` with this attempt as the owner, so the kernel proceeds as the owner:
///   one payment, one dispatch, `Allow`, and the receipt carries the capture's commit index.
/// - Cluster unreachable after the commit (every node partitioned before the client hears
///   back): the seed's outcome. Deny with "budget invocation capture could not be confirmed",
///   `invocation_capture_ambiguous` and `admission_retained` on the exact committed event id,
///   no commit index, no payment, no dispatch; once healed, the exact replay is denied (the
///   capture belongs to the lost attempt) and the budget stays held. Beyond the seed, a
///   reconciler then finishes the retained hold at `realized = authorized`.
///
/// The seed's nested variant has no counterpart (Tally has no sessions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_capture_acknowledgement_records_ambiguity_and_blocks_replay() {
    let env = Env::start().await;
    for mode in [
        Loss::ReplyAfterCommit,
        Loss::ReplyAfterCommitThenUnreachable,
    ] {
        let rail = Arc::new(InMemoryRail::new());
        let invocations = Arc::new(AtomicU64::new(0));
        let ledger = env.lossy(mode, is_capture);
        let kernel = env
            .kernel_with(ledger.clone(), rail.clone())
            .with_tool_server(Arc::new(
                ScriptedServer::new("cost-srv", &["compute"], Behavior::Succeed { cost: None })
                    .with_counter(Arc::clone(&invocations)),
            ));
        let token = env.token(vec![Grant::monetary(
            "cost-srv", "compute", 100, 1000, "USD",
        )]);
        let request = request(
            &format!("req-capture-lost-ack-{mode:?}"),
            &token,
            "cost-srv",
            "compute",
        );
        let first = kernel.evaluate(&request).await.expect("evaluate");
        env.heal().await;
        let capture_event = env
            .events(&token)
            .await
            .into_iter()
            .find(|e| e.kind == EventKind::CaptureInvocation)
            .expect("durable capture event");
        assert_eq!(ledger.lost().as_ref(), Some(&capture_event.event_id));
        let capture = &first.receipt.metadata["budget_authority"]["invocation_capture"];
        assert_eq!(
            capture["event_id"].as_str(),
            Some(capture_event.event_id.as_str())
        );
        if mode == Loss::ReplyAfterCommit {
            assert_eq!(first.verdict, Verdict::Allow, "{:?}", first.reason);
            assert_capture_metadata(&first.receipt, token.id().as_str(), &request.request_id);
            assert_eq!(
                capture["budget_commit_index"].as_u64(),
                Some(capture_event.commit_index.0)
            );
            assert_eq!(rail.counts(&request.request_id).authorizations, 1);
            assert_eq!(rail.counts(&request.request_id).captures, 1);
            assert_eq!(invocations.load(Ordering::SeqCst), 1);
            assert_eq!(env.usage(&token, 0).await, Some((1, 100)));
            continue;
        }
        assert_eq!(first.verdict, Verdict::Deny);
        assert_eq!(first.reason.as_deref(), Some(reasons::CAPTURE_UNCONFIRMED));
        assert!(!first
            .reason
            .as_deref()
            .is_some_and(|reason| reason.contains("acknowledgement lost")));
        assert_eq!(
            capture["invocation_capture_ambiguous"].as_bool(),
            Some(true)
        );
        assert_eq!(capture["admission_retained"].as_bool(), Some(true));
        assert!(capture.get("budget_commit_index").is_none());

        let replay = kernel.evaluate(&request).await.expect("replay");
        assert_eq!(replay.verdict, Verdict::Deny);
        assert_eq!(env.usage(&token, 0).await, Some((1, 100)));
        assert_eq!(rail.total_authorizations(), 0);
        assert_eq!(invocations.load(Ordering::SeqCst), 0);

        // Beyond the seed: the ambiguous capture is resolvable. Any node's reconciler finds the
        // retained Captured hold and finishes it at realized = authorized; no money moved, so
        // there is no payment to capture.
        let reconciler = Reconciler::new(
            env.client.clone(),
            rail.clone(),
            ReconcilerConfig {
                stale_after_ms: 0,
                ..ReconcilerConfig::default()
            },
        );
        let report = reconciler.run_once().await.expect("pass");
        assert_eq!(
            (report.reconciled, report.payments_captured),
            (1, 0),
            "{report:?}"
        );
        assert!(env
            .events(&token)
            .await
            .iter()
            .any(|e| e.kind == EventKind::ReconcileSpend && e.realized_units == 100));
        assert_eq!(env.usage(&token, 0).await, Some((1, 100)));
    }
}
