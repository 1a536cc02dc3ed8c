//! docs/spec.md §4: every command's checks, in order, and its effect on accounts, holds and the
//! journal. Each test names the row it covers.

mod support;

use support::*;
use tally_ledger::*;

#[test]
fn authorize_reserves_a_slot_and_exposure_and_journals_reserve_invocation() {
    let mut h = Harness::new();
    let d = h.ok(h.authorize("h1", 40));
    assert_eq!(
        d.outcome,
        Outcome::Authorized {
            hold_id: "h1".into(),
            exposure_units: 40
        }
    );
    assert_eq!(d.commit_index, Some(BudgetCommitIndex::new(1, 0, 0)));
    let account = h.usage(CAP, 0);
    assert_eq!(
        (account.invocation_count, account.reserved_invocations),
        (1, 1)
    );
    assert_eq!(account.total_cost_exposed_units, 40);
    assert_eq!(account.seq, BudgetCommitIndex::new(1, 0, 0));
    let hold = h.hold("h1");
    assert_eq!(
        hold.states(),
        HoldStates {
            invocation: InvocationState::Authorized,
            monetary: MonetaryState::Exposed
        }
    );
    assert_eq!(h.kinds(), vec!["reserve_invocation"]);
    let event = &h.events()[0];
    assert!(event.allowed);
    assert_eq!(event.after_images[0].account.total_cost_exposed_units, 40);
    assert_eq!(event.limits, Some(limits()));
}

#[test]
fn authorize_without_quota_journals_authorize_exposure_and_zero_amount_has_no_monetary_state() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h1", 0, usd(None, Some(100), None), vec![], None));
    assert_eq!(h.kinds(), vec!["authorize_exposure"]);
    assert_eq!(h.hold("h1").monetary_state, MonetaryState::None);
}

#[test]
fn authorize_denials_follow_quota_then_per_call_then_total_and_create_no_row() {
    let mut h = Harness::new();
    let d = h.ok(h.authorize_with("h1", 500, usd(Some(0), Some(100), Some(100)), vec![], None));
    assert!(matches!(
        d.outcome,
        Outcome::Denied {
            reason: DenyReason {
                rule: DenyRule::InvocationLimit,
                ..
            }
        }
    ));
    assert!(
        h.family.get_usage(&AccountKey::new(CAP, 0)).is_none(),
        "a denied first command leaves no row"
    );
    let d = h.ok(h.authorize_with("h2", 500, usd(Some(1), Some(100), Some(100)), vec![], None));
    assert!(matches!(
        d.outcome,
        Outcome::Denied {
            reason: DenyReason {
                rule: DenyRule::PerInvocationCostLimit,
                ..
            }
        }
    ));
    let d = h.ok(h.authorize_with("h3", 100, usd(Some(1), Some(100), Some(99)), vec![], None));
    assert!(matches!(
        d.outcome,
        Outcome::Denied {
            reason: DenyReason {
                rule: DenyRule::TotalCostLimit,
                ..
            }
        }
    ));
    assert!(
        d.commit_index.is_some(),
        "denials are journaled with a commit index"
    );
    let events = h.events();
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| !e.allowed && e.deny_reason.is_some()));
    assert!(matches!(
        h.cold.get_hold(&h.family, &"h1".into()),
        Some(HoldView::Denied { .. })
    ));
}

#[test]
fn a_denied_first_command_pins_nothing() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h1", 500, usd(Some(1), Some(100), None), vec![], None));
    // Other limits on the same account are accepted: the denial pinned nothing.
    let d = h.ok(h.authorize_with("h2", 500, usd(Some(1), Some(1_000), None), vec![], None));
    assert!(matches!(d.outcome, Outcome::Authorized { .. }));
}

#[test]
fn limits_are_pinned_by_the_first_allowed_command() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 10));
    let err =
        h.err_unchanged(h.authorize_with("h2", 10, usd(Some(10), Some(100), None), vec![], None));
    assert!(
        matches!(&err, LedgerError::InvalidArgument { reason, .. } if reason.contains("limits changed")),
        "{err}"
    );
    let mut other_currency = limits();
    other_currency.currency = Some("EUR".into());
    h.err_unchanged(h.authorize_with("h3", 10, other_currency, vec![], None));
}

#[test]
fn capture_moves_reserved_to_captured_and_records_the_attempt() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    let d = h.ok(h.capture("h1", "attempt-a"));
    assert_eq!(
        d.outcome,
        Outcome::Captured {
            hold_id: "h1".into(),
            attempt_id: "attempt-a".into()
        }
    );
    let account = h.usage(CAP, 0);
    assert_eq!(
        (
            account.reserved_invocations,
            account.captured_invocations,
            account.invocation_count
        ),
        (0, 1, 1)
    );
    assert_eq!(
        account.total_cost_exposed_units, 40,
        "capture leaves totals unchanged"
    );
    let hold = h.hold("h1");
    assert_eq!(hold.invocation_state, InvocationState::Captured);
    assert_eq!(hold.capture_attempt_id, Some("attempt-a".into()));
    assert_eq!(h.kinds(), vec!["reserve_invocation", "capture_invocation"]);
}

#[test]
fn capture_checks_hold_existence_account_state_and_remaining_exposure() {
    let mut h = Harness::new();
    assert_eq!(
        code(&h.err_unchanged(h.capture("nope", "a"))),
        PreconditionCode::UnknownHold
    );
    h.ok(h.authorize("h1", 40));
    let wrong_account = h.on(
        h.header_on("cap-2", 0, "h1:capture-other"),
        Operation::CaptureInvocation {
            hold_id: "h1".into(),
            attempt_id: "a".into(),
        },
    );
    assert_eq!(
        code(&h.err_unchanged(wrong_account)),
        PreconditionCode::HoldOnOtherAccount
    );
    h.ok(h.release("h1", "h1:release", 40));
    assert_eq!(
        code(&h.err_unchanged(h.capture("h1", "a"))),
        PreconditionCode::NoRemainingExposure
    );
    h.ok(h.authorize("h2", 40));
    h.ok(h.capture("h2", "a"));
    let again = h.on(
        h.header("h2:capture-2"),
        Operation::CaptureInvocation {
            hold_id: "h2".into(),
            attempt_id: "b".into(),
        },
    );
    assert_eq!(
        code(&h.err_unchanged(again)),
        PreconditionCode::HoldNotAuthorized
    );
}

#[test]
fn cancel_captured_before_dispatch_returns_slot_and_exposure() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    assert_eq!(
        code(&h.err_unchanged(h.cancel("h1"))),
        PreconditionCode::HoldNotCaptured
    );
    h.ok(h.capture("h1", "a"));
    let d = h.ok(h.cancel("h1"));
    assert_eq!(
        d.outcome,
        Outcome::Cancelled {
            hold_id: "h1".into(),
            exposure_units: 40
        }
    );
    assert_eq!(h.counts(CAP, 0), (0, 0));
    assert_eq!(h.usage(CAP, 0).captured_invocations, 0);
    let hold = h.hold("h1");
    assert_eq!(
        hold.states(),
        HoldStates {
            invocation: InvocationState::Reversed,
            monetary: MonetaryState::Reversed
        }
    );
    assert_eq!(hold.reversed_units, 40);
    assert_eq!(h.kinds().last(), Some(&"cancel_captured_before_dispatch"));
}

#[test]
fn cancel_is_refused_after_partial_release_or_reconcile() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    h.ok(h.release("h1", "h1:release", 10));
    h.ok(h.capture("h1", "a"));
    assert_eq!(
        code(&h.err_unchanged(h.cancel("h1"))),
        PreconditionCode::PartiallyReleased
    );
    h.ok(h.authorize("h2", 40));
    h.ok(h.capture("h2", "a"));
    h.ok(h.reconcile("h2", 40, 40));
    assert_eq!(
        code(&h.err_unchanged(h.cancel("h2"))),
        PreconditionCode::AlreadyReconciled
    );
}

#[test]
fn reverse_frees_an_authorized_hold_and_requires_the_exact_remaining_exposure() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    assert_eq!(
        code(&h.err_unchanged(h.reverse("h1", 39))),
        PreconditionCode::ExposureMismatch
    );
    let d = h.ok(h.reverse("h1", 40));
    assert_eq!(
        d.outcome,
        Outcome::Reversed {
            hold_id: "h1".into(),
            exposure_units: 40
        }
    );
    assert_eq!(h.counts(CAP, 0), (0, 0));
    assert_eq!(h.kinds().last(), Some(&"reverse_invocation"));
}

#[test]
fn reverse_without_quota_journals_reverse_exposure() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h1", 5, usd(None, Some(100), None), vec![], None));
    h.ok(h.reverse("h1", 5));
    assert_eq!(h.kinds(), vec!["authorize_exposure", "reverse_exposure"]);
}

#[test]
fn reverse_after_capture_crossed_the_fence() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    h.ok(h.capture("h1", "a"));
    assert_eq!(
        code(&h.err_unchanged(h.reverse("h1", 40))),
        PreconditionCode::DispatchFenceCrossed
    );
}

#[test]
fn release_is_partial_then_full_and_refused_after_capture() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    let zero = h.release("h1", "h1:release-0", 0);
    assert!(matches!(
        h.err_unchanged(zero),
        LedgerError::InvalidArgument { .. }
    ));
    assert_eq!(
        code(&h.err_unchanged(h.release("h1", "h1:release-big", 41))),
        PreconditionCode::ReleaseExceedsRemaining
    );
    let d = h.ok(h.release("h1", "h1:release-1", 15));
    assert_eq!(
        d.outcome,
        Outcome::Released {
            hold_id: "h1".into(),
            released_units: 15,
            remaining_units: 25
        }
    );
    assert_eq!(h.hold("h1").monetary_state, MonetaryState::Exposed);
    h.ok(h.release("h1", "h1:release-2", 25));
    assert_eq!(h.hold("h1").monetary_state, MonetaryState::Released);
    assert_eq!(
        h.counts(CAP, 0),
        (1, 0),
        "release frees exposure, not the slot"
    );
    h.ok(h.authorize("h2", 40));
    h.ok(h.capture("h2", "a"));
    let err = h.err_unchanged(h.release("h2", "h2:release", 1));
    assert_eq!(code(&err), PreconditionCode::DispatchFenceCrossed);
    assert!(err
        .to_string()
        .contains("crossed the dispatch commitment fence"));
}

#[test]
fn reconcile_makes_spend_final_and_returns_the_unspent_part() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 100));
    assert_eq!(
        code(&h.err_unchanged(h.reconcile("h1", 100, 60))),
        PreconditionCode::HoldNotCaptured
    );
    h.ok(h.capture("h1", "a"));
    assert_eq!(
        code(&h.err_unchanged(h.reconcile("h1", 90, 60))),
        PreconditionCode::ExposureMismatch
    );
    assert!(matches!(
        h.err_unchanged(h.reconcile("h1", 100, 101)),
        LedgerError::InvalidArgument { .. }
    ));
    let d = h.ok(h.reconcile("h1", 100, 60));
    assert_eq!(
        d.outcome,
        Outcome::Reconciled {
            hold_id: "h1".into(),
            realized_units: 60,
            unspent_units: 40
        }
    );
    let account = h.usage(CAP, 0);
    assert_eq!(
        (
            account.total_cost_exposed_units,
            account.total_cost_realized_spend_units
        ),
        (0, 60)
    );
    assert_eq!(account.invocation_count, 1);
    let hold = h.hold("h1");
    assert_eq!(hold.monetary_state, MonetaryState::Reconciled);
    assert_eq!((hold.realized_units, hold.unspent_units), (60, 40));
    let again = h.on(
        h.header("h1:reconcile-again"),
        Operation::ReconcileHold {
            hold_id: "h1".into(),
            exposed_cost_units: 100,
            realized_spend_units: 1,
        },
    );
    assert_eq!(
        code(&h.err_unchanged(again)),
        PreconditionCode::AlreadyReconciled
    );
}

#[test]
fn legacy_increment_and_charge_use_the_legacy_bucket() {
    let mut h = Harness::new();
    let inc = h.on(
        h.header("inc-1"),
        Operation::TryIncrement {
            limits: usd(Some(2), None, None),
        },
    );
    assert_eq!(h.ok(inc).outcome, Outcome::Incremented);
    let inc = h.on(
        h.header("inc-2"),
        Operation::TryIncrement {
            limits: usd(Some(2), None, None),
        },
    );
    h.ok(inc);
    let inc = h.on(
        h.header("inc-3"),
        Operation::TryIncrement {
            limits: usd(Some(2), None, None),
        },
    );
    assert!(h.ok(inc).outcome.is_denied());
    assert_eq!(
        h.usage(CAP, 0).legacy_unheld,
        LegacyUnheld {
            count: 2,
            exposed_units: 0
        }
    );
    assert_eq!(h.kinds(), vec!["increment_invocation"; 3]);

    let charge = |h: &Harness, id: &str, cost| {
        h.on(
            h.header_on("cap-2", 0, id),
            Operation::TryChargeCost {
                cost_units: cost,
                limits: limits(),
            },
        )
    };
    assert_eq!(
        h.ok(charge(&h, "c1", 60)).outcome,
        Outcome::Charged { cost_units: 60 }
    );
    assert!(h.ok(charge(&h, "c2", 101)).outcome.is_denied());
    assert_eq!(
        h.usage("cap-2", 0).legacy_unheld,
        LegacyUnheld {
            count: 1,
            exposed_units: 60
        }
    );
}

#[test]
fn legacy_undos_take_only_from_the_legacy_bucket() {
    let mut h = Harness::new();
    let on2 = |h: &Harness, id: &str, op| h.on(h.header_on("cap-2", 0, id), op);
    // A hold's exposure is not in the legacy bucket: undos without a hold cannot take it.
    h.ok(h.on(
        h.header_on("cap-2", 0, "hold:authorize"),
        Operation::AuthorizeHold {
            hold_id: "hold".into(),
            requested_exposure_units: 50,
            limits: limits(),
            ancestors: vec![],
            hold_timeout_ms: None,
        },
    ));
    let reverse = on2(&h, "r0", Operation::ReverseChargeCost { cost_units: 10 });
    assert_eq!(
        code(&h.err_unchanged(reverse)),
        PreconditionCode::LegacyBucketShort
    );
    let missing = h.on(
        h.header_on("cap-9", 0, "r9"),
        Operation::ReverseChargeCost { cost_units: 1 },
    );
    assert_eq!(code(&h.err_unchanged(missing)), PreconditionCode::NoAccount);

    h.ok(on2(
        &h,
        "c1",
        Operation::TryChargeCost {
            cost_units: 80,
            limits: limits(),
        },
    ));
    h.ok(on2(
        &h,
        "c2",
        Operation::TryChargeCost {
            cost_units: 20,
            limits: limits(),
        },
    ));
    let d = h.ok(on2(
        &h,
        "reduce",
        Operation::ReduceChargeCost { cost_units: 30 },
    ));
    assert_eq!(d.outcome, Outcome::ChargeReduced { cost_units: 30 });
    let d = h.ok(on2(
        &h,
        "settle",
        Operation::SettleChargeCost {
            exposed_cost_units: 50,
            realized_spend_units: 45,
        },
    ));
    assert_eq!(
        d.outcome,
        Outcome::ChargeSettled {
            exposed_cost_units: 50,
            realized_spend_units: 45
        }
    );
    let d = h.ok(on2(
        &h,
        "reverse",
        Operation::ReverseChargeCost { cost_units: 20 },
    ));
    assert_eq!(d.outcome, Outcome::ChargeReversed { cost_units: 20 });
    let account = h.usage("cap-2", 0);
    assert_eq!(
        account.legacy_unheld,
        LegacyUnheld {
            count: 1,
            exposed_units: 0
        }
    );
    assert_eq!(
        account.total_cost_exposed_units, 50,
        "the hold's exposure is untouched"
    );
    assert_eq!(account.total_cost_realized_spend_units, 45);
    assert_eq!(account.invocation_count, 2);
    let kinds: Vec<_> = h.kinds().into_iter().skip(3).collect();
    assert_eq!(
        kinds,
        vec!["release_exposure", "reconcile_spend", "reverse_exposure"]
    );
}

#[test]
fn nonces_are_consumed_once_and_refused_when_expired_or_too_long_lived() {
    let mut h = Harness::new();
    let d = h.ok(h.nonce("n1:consume", "n1", T0 + 1_000));
    assert_eq!(
        d.outcome,
        Outcome::NonceConsumed {
            nonce_id: "n1".into()
        }
    );
    assert_eq!(
        code(&h.err_unchanged(h.nonce("n1:again", "n1", T0 + 1_000))),
        PreconditionCode::NonceReplayed
    );
    assert_eq!(
        code(&h.err_unchanged(h.nonce("n2:consume", "n2", T0))),
        PreconditionCode::NonceExpired
    );
    let far = T0 + limits::MAX_NONCE_TTL_MS + 1;
    assert_eq!(
        code(&h.err_unchanged(h.nonce("n3:consume", "n3", far))),
        PreconditionCode::NonceLifetimeTooLong
    );
    assert_eq!(h.kinds(), vec!["consume_nonce"]);
}

#[test]
fn a_command_past_not_after_is_refused_as_expired_and_changes_nothing() {
    let mut h = Harness::new();
    let cmd = h.authorize("h1", 10);
    h.advance(60_001);
    assert_eq!(
        code(&h.err_unchanged(cmd)),
        PreconditionCode::CommandExpired
    );
    let mut far = h.authorize("h2", 10);
    if let Command::Apply(c) = &mut far {
        c.header.not_after_ms = h.now_ms + limits::MAX_COMMAND_LIFETIME_MS + 1;
    }
    assert!(matches!(
        h.err_unchanged(far),
        LedgerError::InvalidArgument { .. }
    ));
}

#[test]
fn touching_an_expired_hold_expires_it_first_then_fails() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h1", 40, limits(), vec![], Some(1_000)));
    h.advance(1_000);
    let err = h.err(h.capture("h1", "a"));
    assert_eq!(code(&err), PreconditionCode::HoldExpired);
    assert_eq!(h.kinds(), vec!["reserve_invocation", "expire_hold"]);
    assert_eq!(h.counts(CAP, 0), (0, 0));
    let hold = h.hold("h1");
    assert_eq!(hold.invocation_state, InvocationState::Reversed);
    assert_eq!(
        hold.terminal.as_ref().map(|t| t.event_id.to_string()),
        Some("auto:expire:h1".to_owned())
    );
}

#[test]
fn a_reverse_of_an_expired_hold_confirms_cleanup() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h1", 40, limits(), vec![], Some(1_000)));
    h.ok(h.authorize_with("h2", 40, limits(), vec![], Some(1_000)));
    h.advance(2_000);
    h.ok(h.expire(h.now_ms));
    let d = h.ok(h.reverse("h1", 40));
    assert!(
        matches!(&d.outcome, Outcome::AlreadyReversed { by_event_id, .. } if by_event_id.as_str() == "auto:expire:h1")
    );
    // Still Authorized but due: the reverse expires it and confirms.
    h.ok(h.authorize_with("h3", 40, limits(), vec![], Some(1_000)));
    h.advance(2_000);
    let d = h.ok(h.reverse("h3", 40));
    assert!(matches!(d.outcome, Outcome::AlreadyReversed { .. }));
    assert_eq!(h.kinds().iter().filter(|k| **k == "expire_hold").count(), 3);
}

#[test]
fn expire_holds_goes_in_expiry_order_caps_at_256_and_never_touches_captured_holds() {
    let mut h = Harness::new();
    let mut unlimited = usd(None, Some(100), None);
    unlimited.max_invocations = None;
    for i in 0..300u64 {
        h.ok(h.authorize_with(
            &format!("h{i:03}"),
            1,
            unlimited.clone(),
            vec![],
            Some(1_000 + (300 - i)),
        ));
    }
    h.ok(h.capture("h299", "a"));
    h.advance(10_000);
    let d = h.ok(h.expire(h.now_ms));
    let Outcome::HoldsExpired { hold_ids, more_due } = d.outcome else {
        panic!("{d:?}")
    };
    assert_eq!(hold_ids.len(), 256);
    assert!(more_due);
    assert_eq!(
        hold_ids[0].as_str(),
        "h298",
        "earliest expiry first; the captured h299 never expires"
    );
    let d = h.ok(h.expire(h.now_ms));
    let Outcome::HoldsExpired { hold_ids, more_due } = d.outcome else {
        panic!("{d:?}")
    };
    assert_eq!((hold_ids.len(), more_due), (43, false));
    assert_eq!(h.hold("h299").invocation_state, InvocationState::Captured);
    assert_eq!(h.family.next_expiry_ms(), None);
}

#[test]
fn expire_holds_uses_the_earlier_of_up_to_and_cluster_time() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h1", 1, limits(), vec![], Some(1_000)));
    let d = h.ok(h.expire(h.now_ms + 5_000));
    assert_eq!(
        d.outcome,
        Outcome::HoldsExpired {
            hold_ids: vec![],
            more_due: false
        }
    );
    h.advance(1_000);
    let d = h.ok(h.expire(h.now_ms - 1));
    assert_eq!(
        d.outcome,
        Outcome::HoldsExpired {
            hold_ids: vec![],
            more_due: false
        }
    );
    let d = h.ok(h.expire(h.now_ms));
    assert_eq!(
        d.outcome,
        Outcome::HoldsExpired {
            hold_ids: vec!["h1".into()],
            more_due: false
        }
    );
}

#[test]
fn overflow_is_an_error_that_changes_nothing() {
    let mut h = Harness::new();
    let huge = usd(None, None, Some(u64::MAX));
    let charge = |h: &Harness, id: &str, cost| {
        h.on(
            h.header(id),
            Operation::TryChargeCost {
                cost_units: cost,
                limits: huge.clone(),
            },
        )
    };
    h.ok(charge(&h, "c1", u64::MAX));
    assert!(matches!(
        h.err_unchanged(charge(&h, "c2", 1)),
        LedgerError::Overflow { .. }
    ));
}

#[test]
fn validation_rejects_bad_ids_reserved_prefix_and_too_many_ancestors() {
    let mut h = Harness::new();
    let with_header = |h: &Harness, f: &dyn Fn(&mut CommandHeader)| {
        let mut cmd = h.authorize("h1", 1);
        if let Command::Apply(c) = &mut cmd {
            f(&mut c.header);
        }
        cmd
    };
    for bad in [
        with_header(&h, &|hd| hd.event_id = "".into()),
        with_header(&h, &|hd| hd.event_id = "auto:mine".into()),
        with_header(&h, &|hd| hd.capability_id = "x".repeat(513).into()),
        with_header(&h, &|hd| hd.grant_index = limits::MAX_GRANT_INDEX + 1),
    ] {
        assert!(matches!(
            h.err_unchanged(bad),
            LedgerError::InvalidArgument { .. }
        ));
    }
    let ancestors: Vec<_> = (0..8).map(|i| ancestor("parent", i, limits())).collect();
    let cmd = h.authorize_with("h1", 1, limits(), ancestors, None);
    assert!(
        matches!(h.err_unchanged(cmd), LedgerError::InvalidArgument { field, .. } if field == "ancestors")
    );
    // docs/spec.md §8: a hold reserves once on each account of the chain, so an account may not
    // appear twice: not two equal ancestors, and not the grant's own account as an ancestor
    // (either would reserve twice on one account).
    for dup in [
        vec![
            ancestor("parent", 0, limits()),
            ancestor("root", 0, limits()),
            ancestor("parent", 0, limits()),
        ],
        vec![ancestor("parent", 0, limits()), ancestor(CAP, 0, limits())],
    ] {
        let cmd = h.authorize_with("h1", 1, limits(), dup, None);
        let err = h.err_unchanged(cmd);
        assert!(
            matches!(&err, LedgerError::InvalidArgument { field, reason } if field == "ancestors" && reason.contains("appears twice")),
            "{err}"
        );
    }
    let wrong_family = Command::ExpireHolds {
        family_id: "other".into(),
        up_to_ms: 0,
    };
    assert!(matches!(
        h.err_unchanged(wrong_family),
        LedgerError::InvalidArgument { .. }
    ));
}

#[test]
fn delegated_holds_reserve_on_every_ancestor_and_siblings_share_the_parent() {
    let mut h = Harness::new();
    let parent = usd(None, Some(100), Some(150));
    let child = |h: &Harness, cap: &str, hold: &str, units| {
        h.on(
            h.header_on(cap, 0, &format!("{hold}:authorize")),
            Operation::AuthorizeHold {
                hold_id: hold.into(),
                requested_exposure_units: units,
                limits: usd(Some(5), Some(100), Some(1_000)),
                ancestors: vec![ancestor("root", 0, parent.clone())],
                hold_timeout_ms: None,
            },
        )
    };
    h.ok(child(&h, "child-a", "a1", 100));
    assert_eq!(h.counts("root", 0), (1, 100));
    let d = h.ok(child(&h, "child-b", "b1", 60));
    let Outcome::Denied { reason } = d.outcome else {
        panic!("sibling overspent the parent: {d:?}")
    };
    assert_eq!(
        (reason.rule, reason.account),
        (DenyRule::TotalCostLimit, AccountKey::new("root", 0))
    );
    assert!(
        h.family.get_usage(&AccountKey::new("child-b", 0)).is_none(),
        "denial is atomic: no child row"
    );
    h.ok(child(&h, "child-b", "b2", 50));
    assert_eq!(h.counts("root", 0), (2, 150));
    // Capture and cancel move every account of the hold together.
    let capture = h.on(
        h.header_on("child-a", 0, "a1:capture"),
        Operation::CaptureInvocation {
            hold_id: "a1".into(),
            attempt_id: "x".into(),
        },
    );
    h.ok(capture);
    assert_eq!(h.usage("root", 0).captured_invocations, 1);
    let cancel = h.on(
        h.header_on("child-a", 0, "a1:cancel"),
        Operation::CancelCapturedBeforeDispatch {
            hold_id: "a1".into(),
        },
    );
    h.ok(cancel);
    assert_eq!(h.counts("root", 0), (1, 50));
    assert_eq!(h.counts("child-a", 0), (0, 0));
}

#[test]
fn reads_order_usages_and_page_events() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 10));
    h.advance(10);
    let other = h.on(
        h.header_on("cap-0", 3, "x:authorize"),
        Operation::AuthorizeHold {
            hold_id: "x".into(),
            requested_exposure_units: 10,
            limits: limits(),
            ancestors: vec![],
            hold_timeout_ms: None,
        },
    );
    h.ok(other);
    let usages = h.family.list_usages(None, None, 10);
    assert_eq!(
        usages[0].key,
        AccountKey::new("cap-0", 3),
        "most recently updated first"
    );
    assert_eq!(h.family.list_usages(Some(&CAP.into()), None, 10).len(), 1);
    let first = h.events()[0].commit_index;
    let after = h.family.list_events(None, None, Some(first), 10);
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].hold_id, Some("x".into()));
    assert_eq!(
        h.family
            .list_events(Some(&"cap-0".into()), Some(3), None, 10)
            .len(),
        1
    );
    let open = h.family.list_holds(
        &HoldFilter {
            state: Some(InvocationState::Authorized),
            created_before_ms: None,
            with_remaining_exposure: false,
            after: None,
        },
        10,
    );
    assert_eq!(open.len(), 2);
    let old = h.family.list_holds(
        &HoldFilter {
            state: None,
            created_before_ms: Some(T0 + 1),
            with_remaining_exposure: false,
            after: None,
        },
        10,
    );
    assert_eq!(old.len(), 1);
    // A hold whose exposure is all released is not one a reconciler can finish.
    h.ok(h.release("h1", "h1:release-all", 10));
    let exposed = h.family.list_holds(
        &HoldFilter {
            with_remaining_exposure: true,
            ..HoldFilter::default()
        },
        10,
    );
    assert_eq!(exposed.len(), 1);
    assert_eq!(exposed[0].hold_id.as_str(), "x");
}

#[test]
fn list_pages_return_every_row_once_in_order() {
    let mut h = Harness::new();
    // Seven accounts and seven holds; several share an update time or a creation time, so
    // the pages must break ties by key and hold id.
    for n in 0..7u32 {
        let op = Operation::AuthorizeHold {
            hold_id: format!("h{}", 6 - n).into(),
            requested_exposure_units: 10,
            limits: limits(),
            ancestors: vec![],
            hold_timeout_ms: None,
        };
        h.ok(h.on(
            h.header_on(&format!("cap-{}", n % 4), n / 4, &format!("e{n}")),
            op,
        ));
        if n % 3 == 2 {
            h.advance(5);
        }
    }
    let family = h.family.family_id().clone();
    let all_usages = h.family.list_usages(None, None, 100);
    assert_eq!(all_usages.len(), 7);
    let mut paged = Vec::new();
    let mut after: Option<UsagePosition> = None;
    loop {
        let page = h.family.list_usages(None, after.as_ref(), 3);
        let full = page.len() == 3;
        after = page.last().map(|row| UsagePosition::of(&family, row));
        paged.extend(page);
        if !full {
            break;
        }
    }
    assert_eq!(
        paged, all_usages,
        "pages of usages, joined, are the whole list"
    );

    let all_holds = h.family.list_holds(&HoldFilter::default(), 100);
    assert_eq!(all_holds.len(), 7);
    let mut paged = Vec::new();
    let mut filter = HoldFilter::default();
    loop {
        let page = h.family.list_holds(&filter, 2);
        let full = page.len() == 2;
        filter.after = page.last().map(|hold| HoldPosition::of(&family, hold));
        paged.extend(page);
        if !full {
            break;
        }
    }
    assert_eq!(
        paged, all_holds,
        "pages of holds, joined, are the whole list"
    );
    let order: Vec<_> = paged
        .iter()
        .map(|hold| (hold.created_at_ms, hold.hold_id.as_str()))
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "oldest first, then by hold id");

    // A position in another family: rows of this family sort by where the family id falls.
    let last = all_holds.last().expect("holds");
    let before_us = HoldPosition {
        family_id: "a-family-before".into(),
        ..HoldPosition::of(&family, last)
    };
    let after_us = HoldPosition {
        family_id: "z-family-after".into(),
        ..HoldPosition::of(&family, last)
    };
    let tail = |position: HoldPosition| {
        h.family.list_holds(
            &HoldFilter {
                after: Some(position),
                ..HoldFilter::default()
            },
            100,
        )
    };
    assert_eq!(tail(before_us), vec![last.clone()]);
    assert_eq!(tail(after_us), vec![]);
}

#[test]
fn snapshot_round_trips_byte_identically_and_digest_tracks_state() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 10));
    h.ok(h.capture("h1", "a"));
    h.ok(h.nonce("n:consume", "n", T0 + 5_000));
    let bytes = h.family.to_snapshot_bytes();
    let restored = Family::from_snapshot_bytes(&bytes).expect("decodes");
    assert_eq!(restored, h.family);
    assert_eq!(restored.to_snapshot_bytes(), bytes);
    assert_eq!(restored.digest(), h.family.digest());
    let before = h.family.digest();
    h.ok(h.reconcile("h1", 10, 3));
    assert_ne!(before, h.family.digest());
    assert!(Family::from_snapshot_bytes(&bytes[..bytes.len() / 2]).is_err());
}

/// Whether two strings are one: the same bytes in memory, not only equal text.
fn same(a: &str, b: &str) -> bool {
    std::ptr::eq(a.as_ptr(), b.as_ptr())
}

/// Memory (docs/sizing.md): each command arrives with its own copies of the
/// capability id and currency. Once the account exists, a new hold, its after-images and its
/// record keep the account row's strings instead, and a capture's or reconcile's answer keeps
/// the hold's id, so those copies are freed with the command.
#[test]
fn holds_records_and_answers_share_the_strings_already_stored() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    h.ok(h.authorize("h2", 40));
    let (first, second) = (h.hold("h1"), h.hold("h2"));
    assert!(
        same(first.capability_id.as_str(), second.capability_id.as_str()),
        "the second hold keeps its own copy of the capability id"
    );
    assert!(same(
        first.accounts[0].capability_id.as_str(),
        second.accounts[0].capability_id.as_str()
    ));
    let events = h.events();
    let record = &events[1];
    assert!(same(
        record.capability_id.as_str(),
        first.capability_id.as_str()
    ));
    assert!(same(
        record.after_images[0].key.capability_id.as_str(),
        first.capability_id.as_str()
    ));
    let currency = |limits: &Option<GrantLimits>| {
        limits
            .as_ref()
            .and_then(|l| l.currency.clone())
            .expect("monetary limits name a currency")
    };
    assert!(same(
        &currency(&events[0].limits),
        &currency(&record.limits)
    ));

    let captured = h.ok(h.capture("h2", "attempt-1"));
    let Outcome::Captured { hold_id, .. } = &captured.outcome else {
        panic!("capture answered {captured:?}");
    };
    assert!(
        same(hold_id.as_str(), second.hold_id.as_str()),
        "the answer keeps the capture command's copy of the hold id"
    );
}

/// Memory (docs/sizing.md): a family read back from its encoding (the family store, a
/// snapshot) keeps one string per id as the family `apply` built does, not one per row that
/// names it: read back, it takes what its footprint estimate says.
#[test]
fn a_family_read_back_shares_its_strings_like_the_one_built() {
    let mut h = Harness::new();
    h.ok(h.authorize("h1", 40));
    h.ok(h.authorize("h2", 40));
    h.ok(h.capture("h2", "attempt-1"));
    let bytes = h.family.to_snapshot_bytes();
    h.family = Family::from_snapshot_bytes(&bytes).expect("decodes");
    assert_eq!(h.family.to_snapshot_bytes(), bytes, "read back unchanged");
    let (first, second) = (h.hold("h1"), h.hold("h2"));
    assert!(same(
        first.capability_id.as_str(),
        second.capability_id.as_str()
    ));
    let events = h.events();
    let hold_id_of = |at: usize| events[at].hold_id.clone().expect("names its hold");
    assert!(
        same(hold_id_of(1).as_str(), second.hold_id.as_str()),
        "the authorize's record and the hold share the hold id"
    );
    assert!(same(hold_id_of(2).as_str(), second.hold_id.as_str()));
    assert!(same(
        events[2].capability_id.as_str(),
        first.capability_id.as_str()
    ));
    // A second read back shares nothing with the first: each decode starts afresh.
    let again = Family::from_snapshot_bytes(&bytes).expect("decodes");
    let Some(HoldView::Live(other)) = again.get_hold(&HoldId::from("h2")) else {
        panic!("h2 is live");
    };
    assert!(!same(other.hold_id.as_str(), second.hold_id.as_str()));
}
