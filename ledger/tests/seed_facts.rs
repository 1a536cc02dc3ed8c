//! The store-level facts the original kernel's tests assert (the 16 seed scenarios that
//! docs/spec.md §9 lists), replayed against the ledger alone with docs/spec.md §9's
//! deterministic ids. The kernel ports of the same scenarios run against a real cluster in
//! `kernel-node/`.

mod support;

use support::*;
use tally_ledger::*;

const REQ: &str = "req-payment";

fn hold_id() -> String {
    format!("budget-hold:{REQ}:{CAP}:0")
}

/// The kernel's authorize of the seed's monetary grant (100 a call, 1000 in all, USD).
fn authorize(h: &Harness) -> Command {
    let hold = hold_id();
    h.on(
        h.header(&format!("{hold}:authorize")),
        Operation::AuthorizeHold {
            hold_id: hold.as_str().into(),
            requested_exposure_units: 100,
            limits: usd(None, Some(100), Some(1_000)),
            ancestors: vec![],
            hold_timeout_ms: Some(30_000),
        },
    )
}

fn capture(h: &Harness, authorize_index: BudgetCommitIndex, attempt: &str) -> Command {
    let hold = hold_id();
    h.on(
        h.header(&format!("{hold}:capture-invocation:{authorize_index}")),
        Operation::CaptureInvocation {
            hold_id: hold.as_str().into(),
            attempt_id: attempt.into(),
        },
    )
}

fn cancel(h: &Harness, authorize_index: BudgetCommitIndex) -> Command {
    let hold = hold_id();
    h.on(
        h.header(&format!("{hold}:cancel-captured:{authorize_index}")),
        Operation::CancelCapturedBeforeDispatch {
            hold_id: hold.as_str().into(),
        },
    )
}

fn authorized(h: &mut Harness) -> BudgetCommitIndex {
    let d = h.ok(authorize(h));
    assert!(matches!(d.outcome, Outcome::Authorized { .. }), "{d:?}");
    d.commit_index.expect("an authorize is indexed")
}

/// `payment_authorization_errors_cancel_capture_only_for_definite_denials`, definite branch:
/// capture then cancel leaves usage 0/0 with a `cancel_captured_before_dispatch` event.
#[test]
fn definite_payment_denial_cancels_the_capture_to_zero() {
    let mut h = Harness::new();
    let index = authorized(&mut h);
    h.ok(capture(&h, index, "attempt-1"));
    h.ok(cancel(&h, index));
    assert_eq!(h.counts(CAP, 0), (0, 0));
    let events = h.family.list_events(Some(&CAP.into()), Some(0), None, 10);
    assert!(events
        .iter()
        .any(|e| e.kind.as_str() == "cancel_captured_before_dispatch"));
}

/// Same test, ambiguous branch (Unavailable, lost acknowledgement), and
/// `non_durable_monetary_terminal_failures_retain_*`: a retained capture stays 1/100.
#[test]
fn ambiguous_payment_or_post_dispatch_failure_retains_the_capture() {
    let mut h = Harness::new();
    let index = authorized(&mut h);
    h.ok(capture(&h, index, "attempt-1"));
    assert_eq!(h.counts(CAP, 0), (1, 100));
    // Retained means no cleanup ran: the hold is still Captured and cannot expire.
    h.advance(60_000);
    h.ok(h.expire(h.now_ms));
    assert_eq!(h.counts(CAP, 0), (1, 100));
    assert_eq!(
        h.hold(&hold_id()).invocation_state,
        InvocationState::Captured
    );
}

/// `lost_capture_acknowledgement_records_ambiguity_and_blocks_replay`: the capture committed,
/// so a replayed request sees `AlreadyCaptured` and never re-authorizes or re-captures.
#[test]
fn replay_after_capture_answers_already_captured() {
    let mut h = Harness::new();
    let index = authorized(&mut h);
    h.ok(capture(&h, index, "attempt-1"));
    let replay = h.ok(authorize(&h));
    let Outcome::AlreadyCaptured {
        owner_attempt_id,
        capture_event_id,
        ..
    } = replay.outcome
    else {
        panic!("{replay:?}")
    };
    assert_eq!(owner_attempt_id.as_str(), "attempt-1");
    assert_eq!(
        capture_event_id.to_string(),
        format!("{}:capture-invocation:{index}", hold_id())
    );
    let second = h.ok(capture(&h, index, "attempt-2"));
    assert!(
        matches!(second.outcome, Outcome::AlreadyCaptured { owner_attempt_id, .. } if owner_attempt_id.as_str() == "attempt-1")
    );
    assert_eq!(
        h.kinds()
            .iter()
            .filter(|k| **k == "capture_invocation")
            .count(),
        1
    );
    assert_eq!(h.counts(CAP, 0), (1, 100));
}

/// `nonce_preflight_*`: the preflight hold path reserves then reverses (never a legacy
/// increment), and replaying the reversal appends nothing.
#[test]
fn preflight_reversal_replay_appends_nothing() {
    let mut h = Harness::new();
    let hold = format!("nonce-preflight-budget-hold:{REQ}:{CAP}:0");
    let reserve = h.on(
        h.header(&format!("{hold}:authorize")),
        Operation::AuthorizeHold {
            hold_id: hold.as_str().into(),
            requested_exposure_units: 0,
            limits: GrantLimits::invocations(5),
            ancestors: vec![],
            hold_timeout_ms: None,
        },
    );
    let index = h.ok(reserve).commit_index.expect("indexed");
    let rollback = h.on(
        h.header(&format!("{hold}:authorize:rollback:{index}")),
        Operation::ReverseHold {
            hold_id: hold.as_str().into(),
            exposure_units: 0,
        },
    );
    h.ok(rollback.clone());
    let events = h.events().len();
    let replay = h.ok(rollback);
    assert!(replay.replayed);
    assert_eq!(h.events().len(), events);
    assert_eq!(h.kinds(), vec!["reserve_invocation", "reverse_invocation"]);
    assert_eq!(h.usage(CAP, 0).invocation_count, 0);
}

/// `lost_cancellation_acknowledgement_records_ambiguity_and_blocks_dispatch`: the cancel
/// committed; its replay confirms it and the budget is back to 0/0.
#[test]
fn cancel_replay_confirms_the_committed_cancellation() {
    let mut h = Harness::new();
    let index = authorized(&mut h);
    h.ok(capture(&h, index, "attempt-1"));
    let first = h.ok(cancel(&h, index));
    let replay = h.ok(cancel(&h, index));
    assert_eq!(
        (replay.outcome, replay.commit_index),
        (first.outcome, first.commit_index)
    );
    assert_eq!(h.counts(CAP, 0), (0, 0));
}

/// `concurrent_identical_monetary_requests_capture_before_payment_and_release_loser_leases`:
/// two kernels evaluate one request; one capture owner, and the loser's authorize replay
/// (same ids) sees the owner's capture, so only one payment and one dispatch follow.
#[test]
fn identical_concurrent_requests_have_one_capture_owner() {
    let mut h = Harness::new();
    let index = authorized(&mut h);
    let replayed = h.ok(authorize(&h));
    assert!(replayed.replayed && matches!(replayed.outcome, Outcome::Authorized { .. }));
    let a = h.ok(capture(&h, index, "kernel-a"));
    let b = h.ok(capture(&h, index, "kernel-b"));
    assert!(matches!(a.outcome, Outcome::Captured { .. }));
    assert!(
        matches!(b.outcome, Outcome::AlreadyCaptured { owner_attempt_id, .. } if owner_attempt_id.as_str() == "kernel-a")
    );
    assert_eq!(h.counts(CAP, 0), (1, 100));
}

/// `captured_monetary_replay_cannot_fall_through_to_overlapping_unlimited_grant`: the replay
/// answer on grant 0 is `AlreadyCaptured`, a deny for the kernel, and grant 1 is untouched.
#[test]
fn captured_replay_is_not_a_denial_that_falls_through() {
    let mut h = Harness::new();
    let index = authorized(&mut h);
    h.ok(capture(&h, index, "attempt-1"));
    let replay = h.ok(authorize(&h));
    assert!(
        !replay.outcome.is_denied(),
        "AlreadyCaptured must not read as Denied"
    );
    assert!(h.family.get_usage(&AccountKey::new(CAP, 1)).is_none());
}
