//! docs/spec.md §5: replays, conflicts, hold reuse and `ResolveEvent` tombstones. Every replay
//! must append nothing and answer with the original commit index.

mod support;

use support::*;
use tally_ledger::*;

/// Applies `cmd` twice and checks the second is a pure replay of the first.
fn replay_is_pure(h: &mut Harness, cmd: Command) -> (Decision, Decision) {
    let first = h.ok(cmd.clone());
    let digest = h.family.digest();
    let journal = h.family.journal_len();
    let second = h.ok(cmd);
    assert!(second.replayed, "the second answer is a replay");
    assert_eq!(
        second.commit_index, first.commit_index,
        "replays carry the original index"
    );
    assert_eq!(
        second.log_id, first.log_id,
        "replays carry the original log id"
    );
    assert_eq!(h.family.journal_len(), journal, "a replay appends nothing");
    assert_eq!(h.family.digest(), digest, "a replay changes nothing");
    (first, second)
}

macro_rules! replay {
    ($h:ident, $cmd:expr) => {{
        let cmd = $cmd;
        replay_is_pure(&mut $h, cmd)
    }};
}

#[test]
fn every_kind_replays_its_original_decision() {
    let mut h = Harness::new();
    let (a, b) = replay!(h, h.authorize("h1", 40));
    assert_eq!(a.outcome, b.outcome);
    replay!(h, h.release("h1", "h1:release", 10));
    let (a, b) = replay!(h, h.reverse("h1", 30));
    assert_eq!(a.outcome, b.outcome);
    h.ok(h.authorize("h2", 40));
    h.ok(h.capture("h2", "a"));
    let (a, b) = replay!(h, h.cancel("h2"));
    assert_eq!(
        a.outcome, b.outcome,
        "AlreadyCancelled carries the original outcome"
    );
    h.ok(h.authorize("h3", 40));
    h.ok(h.capture("h3", "a"));
    replay!(h, h.reconcile("h3", 40, 5));
    replay!(
        h,
        h.on(
            h.header("inc"),
            Operation::TryIncrement { limits: limits() }
        )
    );
    let on2 = |h: &Harness, id: &str, op| h.on(h.header_on("cap-2", 0, id), op);
    replay!(
        h,
        on2(
            &h,
            "charge",
            Operation::TryChargeCost {
                cost_units: 30,
                limits: limits()
            }
        )
    );
    replay!(
        h,
        on2(&h, "reduce", Operation::ReduceChargeCost { cost_units: 5 })
    );
    replay!(
        h,
        on2(
            &h,
            "settle",
            Operation::SettleChargeCost {
                exposed_cost_units: 5,
                realized_spend_units: 5
            }
        )
    );
    replay!(
        h,
        on2(&h, "rev", Operation::ReverseChargeCost { cost_units: 20 })
    );
    replay!(h, h.nonce("n", "n", T0 + 1_000));
}

#[test]
fn a_replay_rechecks_no_limit_and_survives_later_spending() {
    let mut h = Harness::new();
    let cmd = h.authorize_with("h1", 100, usd(Some(1), Some(100), Some(100)), vec![], None);
    let first = h.ok(cmd.clone());
    // The account is now full; a fresh check would deny. A replay answers the original.
    let again = h.ok(cmd);
    assert_eq!(again.outcome, first.outcome);
}

#[test]
fn authorize_replay_after_capture_answers_already_captured_with_the_owner() {
    let mut h = Harness::new();
    let authorize = h.authorize("h1", 40);
    h.ok(authorize.clone());
    let capture = h.ok(h.capture("h1", "attempt-a"));
    let replay = h.ok(authorize);
    assert_eq!(
        replay.outcome,
        Outcome::AlreadyCaptured {
            hold_id: "h1".into(),
            owner_attempt_id: "attempt-a".into(),
            capture_event_id: "h1:capture".into(),
            capture_commit_index: capture.commit_index.expect("indexed"),
        }
    );
    assert_eq!(
        replay.commit_index,
        Some(BudgetCommitIndex::new(1, 0, 0)),
        "the authorize's own index"
    );
}

#[test]
fn twin_captures_with_different_attempts_have_exactly_one_owner() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    let mine = h.ok(h.capture("h1", "attempt-a"));
    assert!(matches!(mine.outcome, Outcome::Captured { .. }));
    let twin = h.ok(h.capture("h1", "attempt-b"));
    let Outcome::AlreadyCaptured {
        owner_attempt_id, ..
    } = twin.outcome
    else {
        panic!("{twin:?}")
    };
    assert_eq!(
        owner_attempt_id.as_str(),
        "attempt-a",
        "the twin learns it is not the owner"
    );
    assert_eq!(
        h.kinds()
            .iter()
            .filter(|k| **k == "capture_invocation")
            .count(),
        1
    );
    // The owner's own retry is AlreadyCaptured naming itself: it may proceed.
    let retry = h.ok(h.capture("h1", "attempt-a"));
    assert!(
        matches!(retry.outcome, Outcome::AlreadyCaptured { owner_attempt_id, .. } if owner_attempt_id.as_str() == "attempt-a")
    );
}

#[test]
fn authorize_replay_after_any_reversal_is_terminally_reversed() {
    for end in ["reverse", "cancel", "expire"] {
        let mut h = Harness::new();
        let authorize = h.authorize_with("h1", 40, limits(), vec![], Some(1_000));
        h.ok(authorize.clone());
        match end {
            "reverse" => drop(h.ok(h.reverse("h1", 40))),
            "cancel" => {
                h.ok(h.capture("h1", "a"));
                h.ok(h.cancel("h1"));
            }
            _ => {
                h.advance(1_000);
                h.ok(h.expire(h.now_ms));
            }
        }
        let err = h.err_unchanged(authorize);
        assert_eq!(
            code(&err),
            PreconditionCode::TerminallyReversed,
            "after {end}"
        );
        assert!(err.to_string().contains("terminally reversed hold"));
    }
}

#[test]
fn authorize_replay_of_a_due_hold_reports_expiry_without_appending() {
    let mut h = Harness::new();
    let authorize = h.authorize_with("h1", 40, limits(), vec![], Some(1_000));
    h.ok(authorize.clone());
    h.advance(1_000);
    assert_eq!(
        code(&h.err_unchanged(authorize)),
        PreconditionCode::HoldExpired
    );
}

#[test]
fn capture_replay_after_cancel_is_superseded() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    let capture = h.capture("h1", "a");
    h.ok(capture.clone());
    h.ok(h.cancel("h1"));
    let err = h.err_unchanged(capture);
    assert_eq!(code(&err), PreconditionCode::Superseded);
}

#[test]
fn denials_are_sticky_under_replay() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h0", 100, usd(Some(1), Some(100), Some(100)), vec![], None));
    let cmd = h.authorize_with("h1", 100, usd(Some(1), Some(100), Some(100)), vec![], None);
    let denied = h.ok(cmd.clone());
    assert!(denied.outcome.is_denied());
    h.ok(h.reverse("h0", 100));
    let replay = h.ok(cmd);
    assert!(
        replay.outcome.is_denied(),
        "a fresh try needs a fresh event_id"
    );
    assert_eq!(replay.commit_index, denied.commit_index);
}

#[test]
fn a_conflict_names_every_differing_field() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    let mut other = h.authorize_with("h2", 41, usd(Some(10), Some(100), None), vec![], None);
    if let Command::Apply(c) = &mut other {
        c.header.event_id = "h1:authorize".into();
    }
    let err = h.err_unchanged(other.clone());
    let LedgerError::Conflict(ConflictReason::EventIdentity { differing_fields }) = err else {
        panic!("{err:?}")
    };
    assert_eq!(
        differing_fields,
        vec!["hold_id", "requested_exposure_units", "limits"]
    );
    // A replica restored from a snapshot keeps only the field hashes (the applying one keeps
    // short fields as bytes): it names the same fields (docs/spec.md §5.3, §11 invariant 10).
    h.family = Family::from_snapshot_bytes(&h.family.to_snapshot_bytes()).expect("decodes");
    assert_eq!(
        h.err_unchanged(other),
        LedgerError::conflict_fields(
            ["hold_id", "requested_exposure_units", "limits"]
                .map(String::from)
                .to_vec()
        )
    );
    // A different kind under the same id.
    let mut kind = h.reverse("h1", 40);
    if let Command::Apply(c) = &mut kind {
        c.header.event_id = "h1:authorize".into();
    }
    let err = h.err_unchanged(kind);
    assert_eq!(err, LedgerError::conflict_fields(vec!["kind".into()]));
}

#[test]
fn fields_outside_identity_do_not_conflict() {
    let mut h = Harness::new();
    let first = h.authorize_with(
        "h1",
        40,
        limits(),
        vec![ancestor("p", 0, limits()), ancestor("o", 1, limits())],
        Some(5_000),
    );
    h.ok(first);
    // Same command with other timeout, deadline and ancestor order: a replay, not a conflict.
    h.advance(10);
    let mut same = h.authorize_with(
        "h1",
        40,
        limits(),
        vec![ancestor("o", 1, limits()), ancestor("p", 0, limits())],
        Some(9_000),
    );
    if let Command::Apply(c) = &mut same {
        c.header.not_after_ms += 1;
    }
    assert!(h.ok(same).replayed);
}

#[test]
fn a_new_authorize_on_a_claimed_hold_id_is_hold_reused() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("denied", 500, usd(Some(1), Some(100), None), vec![], None));
    h.ok(h.authorize("live", 5));
    for hold in ["denied", "live"] {
        let cmd = h.on(
            h.header(&format!("{hold}:authorize-again")),
            Operation::AuthorizeHold {
                hold_id: hold.into(),
                requested_exposure_units: 5,
                limits: limits(),
                ancestors: vec![],
                hold_timeout_ms: None,
            },
        );
        let err = h.err_unchanged(cmd);
        assert!(
            matches!(
                err,
                LedgerError::Conflict(ConflictReason::HoldReused { .. })
            ),
            "{hold}: {err:?}"
        );
    }
}

#[test]
fn resolve_tombstones_an_unknown_event_so_it_can_never_apply() {
    let mut h = Harness::new();
    let lost = h.authorize("h1", 40);
    let d = h.ok(h.resolve(&lost));
    assert_eq!(d.outcome, Outcome::Resolved(Resolution::NotApplied));
    assert_eq!(
        h.cold.get_event(&h.family, &"h1:authorize".into()),
        EventLookup::Tombstoned
    );
    assert!(h.events().is_empty(), "tombstones are not events");
    let err = h.err_unchanged(lost.clone());
    assert_eq!(code(&err), PreconditionCode::EventAborted);
    assert!(err.to_string().contains("event aborted"));
    // Idempotent.
    assert_eq!(
        h.ok(h.resolve(&lost)).outcome,
        Outcome::Resolved(Resolution::NotApplied)
    );
    // Conflicting identity under the tombstoned id.
    let mut other = h.authorize("h9", 1);
    if let Command::Apply(c) = &mut other {
        c.header.event_id = "h1:authorize".into();
    }
    assert!(matches!(
        h.err_unchanged(other.clone()),
        LedgerError::Conflict(_)
    ));
    assert!(matches!(
        h.err_unchanged(h.resolve(&other)),
        LedgerError::Conflict(_)
    ));
}

#[test]
fn resolve_of_an_applied_event_returns_the_original_answer() {
    let mut h = Harness::new();
    let cmd = h.authorize("h1", 40);
    let original = h.ok(cmd.clone());
    h.ok(h.capture("h1", "a"));
    let d = h.ok(h.resolve(&cmd));
    let Outcome::Resolved(Resolution::Applied(answer)) = d.outcome else {
        panic!("{d:?}")
    };
    assert_eq!(answer.outcome, original.outcome);
    assert_eq!(answer.commit_index, original.commit_index);
    let EventLookup::Applied { decision, record } =
        h.cold.get_event(&h.family, &"h1:authorize".into())
    else {
        panic!()
    };
    assert_eq!(decision.commit_index, original.commit_index);
    assert_eq!(record.map(|r| r.kind), Some(EventKind::ReserveInvocation));
    assert_eq!(
        h.cold.get_event(&h.family, &"never".into()),
        EventLookup::Unknown
    );
}
