//! docs/spec.md §5.5: after `not_after_ms + retention_ms` full events and final holds leave memory,
//! and every replay, conflict check and late command is still answered exactly.

mod support;

use support::*;
use tally_ledger::*;

fn short_retention() -> Harness {
    let mut h = Harness::new();
    h.params.retention_ms = 1_000;
    h
}

#[test]
fn events_and_final_holds_compact_and_replays_stay_exact() {
    let mut h = short_retention();
    let authorize = h.authorize("h1", 40);
    let capture = h.capture("h1", "a");
    let reconcile = h.reconcile("h1", 40, 25);
    let a = h.ok(authorize.clone());
    let c = h.ok(capture.clone());
    let r = h.ok(reconcile.clone());
    let full_size = h.family.to_snapshot_bytes().len();
    assert_eq!(h.family.journal_len(), 3);

    // Past not_after (60 s) + retention (1 s): any command triggers compaction.
    h.advance(62_000);
    h.ok(h.expire(h.now_ms));
    assert_eq!(h.family.journal_len(), 0, "full events left memory");
    assert!(matches!(
        h.cold.get_hold(&h.family, &"h1".into()),
        Some(HoldView::Archived { .. })
    ));
    assert!(h.family.to_snapshot_bytes().len() < full_size);
    assert_eq!(
        h.counts(CAP, 0),
        (1, 25),
        "account rows keep their folded totals"
    );

    let ra = h.ok(authorize.clone());
    assert!(
        matches!(&ra.outcome, Outcome::AlreadyCaptured { owner_attempt_id, capture_commit_index, .. }
        if owner_attempt_id.as_str() == "a" && Some(*capture_commit_index) == c.commit_index)
    );
    assert_eq!(ra.commit_index, a.commit_index);
    let rc = h.ok(capture);
    assert!(matches!(rc.outcome, Outcome::AlreadyCaptured { .. }));
    let rr = h.ok(reconcile.clone());
    assert_eq!(
        (rr.outcome, rr.commit_index, rr.log_id),
        (r.outcome, r.commit_index, r.log_id)
    );
    let EventLookup::Applied { decision, record } =
        h.cold.get_event(&h.family, &"h1:reconcile".into())
    else {
        panic!()
    };
    assert_eq!(decision.commit_index, r.commit_index);
    assert!(
        record.is_none(),
        "the full record is gone; the compact answer remains"
    );

    // A conflicting command under a compacted id is still refused, naming the digest.
    let mut other = h.reconcile("h1", 40, 24);
    if let Command::Apply(c) = &mut other {
        c.header.event_id = "h1:reconcile".into();
    }
    assert_eq!(
        h.err_unchanged(other),
        LedgerError::conflict_fields(vec!["identity".into()])
    );
    // A new command on the archived hold gets a definite answer.
    let late = h.on(
        h.header("h1:late-release"),
        Operation::ReleaseHold {
            hold_id: "h1".into(),
            released_exposure_units: 1,
        },
    );
    assert_eq!(
        code(&h.err_unchanged(late)),
        PreconditionCode::HoldNotAuthorized
    );
    let resolve = h.ok(h.resolve(&reconcile));
    assert!(matches!(
        resolve.outcome,
        Outcome::Resolved(Resolution::Applied(_))
    ));
}

#[test]
fn archived_reversed_holds_still_answer_reverse_and_authorize_replays() {
    let mut h = short_retention();
    let authorize = h.authorize_with("h1", 40, limits(), vec![], Some(500));
    h.ok(authorize.clone());
    h.advance(1_000);
    h.ok(h.expire(h.now_ms));
    h.advance(62_000);
    h.ok(h.expire(h.now_ms));
    assert!(matches!(
        h.cold.get_hold(&h.family, &"h1".into()),
        Some(HoldView::Archived { .. })
    ));
    assert_eq!(
        code(&h.err_unchanged(authorize)),
        PreconditionCode::TerminallyReversed
    );
    let d = h.ok(h.reverse("h1", 40));
    assert!(
        matches!(d.outcome, Outcome::AlreadyReversed { by_event_id, .. } if by_event_id.as_str() == "auto:expire:h1")
    );
}

#[test]
fn tombstones_and_nonces_are_forgotten_only_when_no_copy_can_apply() {
    let mut h = short_retention();
    let lost = h.authorize("h1", 40);
    h.ok(h.resolve(&lost));
    h.ok(h.nonce("n:consume", "n", T0 + 5_000));
    h.advance(30_000);
    h.ok(h.expire(h.now_ms));
    assert_eq!(
        h.cold.get_event(&h.family, &"h1:authorize".into()),
        EventLookup::Tombstoned
    );
    assert_eq!(
        code(&h.err_unchanged(h.nonce("n:again", "n", T0 + 5_000))),
        PreconditionCode::NonceExpired
    );
    h.advance(32_000);
    h.ok(h.expire(h.now_ms));
    assert_eq!(
        h.cold.get_event(&h.family, &"h1:authorize".into()),
        EventLookup::Unknown
    );
    // The forgotten command still cannot apply: its not_after has passed.
    assert_eq!(
        code(&h.err_unchanged(lost.clone())),
        PreconditionCode::CommandExpired
    );
    assert_eq!(
        h.ok(h.resolve(&lost)).outcome,
        Outcome::Resolved(Resolution::NotApplied)
    );
}

/// Rules version 3 (docs/spec.md §5.5): an item waiting for compaction falls due at its
/// keep-until time plus the retention in force, so lowering the retention compacts what was
/// queued under the old one, raising it keeps what is not yet compacted longer, and a nonce
/// is still kept until it expires, whatever the retention.
#[test]
fn from_rules_version_3_a_retention_change_moves_what_was_queued_before_it() {
    let mut h = Harness::new();
    h.params = h.params.at_rules(3);
    h.ok(h.authorize("h1", 40));
    h.ok(h.capture("h1", "a"));
    h.ok(h.reconcile("h1", 40, 30));
    h.ok(h.nonce("n:consume", "n", T0 + 600_000));
    h.ok(h.authorize("h2", 40));
    // Queued under 24 h; two minutes later the retention goes to 1 s, then back up to 24 h for
    // a moment: the raise keeps h1 and h2's events, the lowering frees them at once.
    h.advance(120_000);
    h.params.retention_ms = 24 * 3_600_000;
    h.ok(h.expire(h.now_ms));
    let h1 = EventId::from("h1:authorize");
    assert!(matches!(
        h.cold.get_event(&h.family, &h1),
        EventLookup::Applied {
            record: Some(_),
            ..
        }
    ));
    h.params.retention_ms = 1_000;
    h.ok(h.expire(h.now_ms));
    for event in ["h1:authorize", "h1:capture", "h1:reconcile", "h2:authorize"] {
        let lookup = h.cold.get_event(&h.family, &event.into());
        assert!(
            matches!(lookup, EventLookup::Applied { record: None, .. }),
            "{event}: {lookup:?}"
        );
    }
    assert!(matches!(
        h.cold.get_hold(&h.family, &"h1".into()),
        Some(HoldView::Archived { .. })
    ));
    // h2 expired unreconciled at its deadline; its expiry's event leaves as well.
    assert!(h.family.journal_len() <= 1, "{}", h.family.journal_len());
    // The nonce expires in ten minutes: the lowered retention popped it early, and it is
    // still consumed until then, forgotten after.
    assert_eq!(
        code(&h.err_unchanged(h.nonce("n:again", "n", T0 + 600_000))),
        PreconditionCode::NonceReplayed
    );
    h.advance(T0 + 600_001 - h.now_ms);
    h.ok(h.expire(h.now_ms));
    assert_eq!(h.family.next_compaction_ms(&h.params), None);
    assert_eq!(
        code(&h.err_unchanged(h.nonce("n:late", "n", T0 + 600_000))),
        PreconditionCode::NonceExpired
    );
    assert!(h.family.invariant_violations().is_empty());
}

#[test]
fn a_captured_call_without_exposure_is_archived_and_can_no_longer_be_cancelled() {
    let mut h = short_retention();
    h.ok(h.authorize_with("h1", 0, GrantLimits::invocations(3), vec![], None));
    h.ok(h.capture("h1", "a"));
    h.advance(62_000);
    h.ok(h.expire(h.now_ms));
    assert!(matches!(
        h.cold.get_hold(&h.family, &"h1".into()),
        Some(HoldView::Archived { .. })
    ));
    assert_eq!(
        code(&h.err_unchanged(h.cancel("h1"))),
        PreconditionCode::HoldArchived
    );
    assert_eq!(h.usage(CAP, 0).captured_invocations, 1);
}

#[test]
fn a_compacted_family_with_one_reconciled_hold_is_small() {
    let mut h = short_retention();
    let hold = "budget-hold:req-0123456789abcdef:cap-0123456789abcdef:0";
    h.ok(h.authorize(hold, 40));
    h.ok(h.capture(hold, "attempt-0123456789abcdef0123456789abcdef"));
    h.ok(h.reconcile(hold, 40, 40));
    h.advance(62_000);
    h.ok(h.expire(h.now_ms));
    let bytes = h.family.to_snapshot_bytes().len();
    assert!(
        bytes <= 2_048,
        "a compacted family takes {bytes} bytes, the budget is 2 KiB"
    );
}

/// The family's encoding is fixed: snapshots written by one build are read by the next, and
/// replicas compare digests. This state has applied rows retained and moved out of memory
/// (counted in its cold meta), a tombstone, a hold moved out, live ones and a denied one. Its digest is pinned, so a change to how a
/// table lays its rows out in memory must leave the bytes as they are.
#[test]
fn the_family_encoding_is_fixed() {
    fn hex(digest: [u8; 32]) -> String {
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
    let mut h = short_retention();
    h.ok(h.authorize("h1", 40));
    h.ok(h.capture("h1", "a"));
    h.ok(h.reconcile("h1", 40, 25));
    h.advance(62_000);
    h.ok(h.authorize("h2", 30));
    let never_applied = h.capture("h3", "b");
    h.ok(h.resolve(&never_applied));
    let denied = h.ok(h.authorize("h4", 500));
    assert!(
        matches!(denied.outcome, Outcome::Denied { .. }),
        "{denied:?}"
    );
    // Applied last, encoded first: a decoded family stores its rows in another order than
    // the family that applied them, and the two must still be equal.
    h.ok(h.authorize("h0", 10));
    let bytes = h.family.to_snapshot_bytes();
    let restored = Family::from_snapshot_bytes(&bytes).expect("decodes");
    assert_eq!(restored, h.family);
    assert_eq!(restored.to_snapshot_bytes(), bytes);
    assert_eq!(
        hex(h.family.digest()),
        "e2d780c88afb7131f5d07b18f09f2a52640a848d9e9ddb2f2d607c6536f6633d"
    );
}

/// docs/spec.md §5.5 and §11.10: the dedupe rows and holds are kept for ever, so a family's two
/// tables grow past the size where they split into shards (`tables/id_table.rs`, 65,536 rows). A
/// replica restored from the snapshot (its tables rebuilt row by row, splitting at another
/// moment) holds the same bytes, digest and answers as the one that applied the commands.
#[test]
fn a_family_past_its_tables_split_restores_alike_and_answers_alike() {
    const HOLDS: usize = 65_536 + 100;
    let mut h = Harness::new();
    // No invocation or total limit: every hold stays open, one command each.
    let open = |h: &Harness, n: usize| {
        h.authorize_with(
            &format!("h{n}"),
            1,
            usd(None, Some(100), None),
            vec![],
            None,
        )
    };
    for n in 0..HOLDS {
        // Applied directly: the harness's invariant sweep after every command would make
        // this quadratic.
        let command = open(&h, n);
        let ctx = h.ctx();
        let decision = h.apply_at(&command, &ctx);
        assert!(decision.is_ok(), "{n}: {decision:?}");
    }
    assert!(h.family.invariant_violations().is_empty());
    let bytes = h.family.to_snapshot_bytes();
    let mut restored = Family::from_snapshot_bytes(&bytes).expect("decodes");
    let mut restored_cold = h.cold.clone();
    assert_eq!(
        restored.to_snapshot_bytes(),
        bytes,
        "restored byte-identical"
    );
    assert_eq!(restored.digest(), h.family.digest());

    // Rows filed before, at and after the split are found on both replicas alike.
    for n in [0, 32_768, 65_535, 65_536, HOLDS - 1] {
        let replay = open(&h, n);
        let ctx = h.ctx();
        let applied = h.apply_at(&replay, &ctx).expect("replays");
        let again = (restored_cold.apply(&mut restored, &replay, &ctx)).expect("replays");
        assert!(applied.replayed, "{n}: a replay, not a new command");
        assert_eq!(applied, again, "{n}");
        // A new event id for a claimed hold: the hold is found in either table.
        let Command::Apply(first) = replay else {
            unreachable!("a client command")
        };
        let reused = h.on(h.header(&format!("h{n}:again")), first.op);
        let ctx = h.ctx();
        let on_applied = h.apply_at(&reused, &ctx).expect_err("hold reused");
        let on_restored =
            (restored_cold.apply(&mut restored, &reused, &ctx)).expect_err("hold reused");
        assert!(
            matches!(
                on_applied,
                LedgerError::Conflict(ConflictReason::HoldReused { .. })
            ),
            "{n}: {on_applied:?}"
        );
        assert_eq!(on_applied, on_restored);
    }
    assert_eq!(restored.digest(), h.family.digest());
}

/// Rules version 2 (docs/spec.md §5.5): a denied authorize claims its `hold_id` for ever but
/// opens no hold, so the claim leaves memory with its command's compact row; every answer
/// naming it is the same wherever it is: the replay, a reuse of the id under another event,
/// a capture of it, a read. Under the legacy rules the claim stays in memory (the pinned
/// encoding above is the legacy one), so a replica switches only when the log says.
#[test]
fn a_denied_claim_leaves_memory_with_its_command_from_rules_version_2() {
    for rules_version in [LEGACY_RULES, CURRENT_RULES] {
        let mut h = short_retention();
        h.params = h.params.at_rules(rules_version);
        let authorize = h.authorize("h1", 500);
        let denied = h.ok(authorize.clone());
        assert!(
            matches!(denied.outcome, Outcome::Denied { .. }),
            "{denied:?}"
        );
        h.advance(62_000);
        h.ok(h.expire(h.now_ms));
        assert_eq!(h.family.journal_len(), 0, "the denied event left memory");
        // One more batch: the rows the last one moved out stay readable until the next.
        h.ok(h.expire(h.now_ms));
        let claim = ColdKey::Hold("h1".into());
        let moved = rules_version >= 2;
        assert_eq!(
            h.family.get_hold(&"h1".into()).is_none(),
            moved,
            "rules {rules_version}: the claim is in memory only under the legacy rules"
        );
        assert_eq!(h.cold.get(&claim).is_some(), moved);
        assert_eq!(
            h.cold.get_hold(&h.family, &"h1".into()),
            Some(HoldView::Denied {
                hold_id: "h1".into(),
                event_id: "h1:authorize".into(),
            }),
            "rules {rules_version}: a read finds the claim"
        );

        let replay = h.ok(authorize.clone());
        assert_eq!(
            (&replay.outcome, replay.commit_index, replay.log_id),
            (&denied.outcome, denied.commit_index, denied.log_id),
            "rules {rules_version}: the replay answers the original denial"
        );
        let Command::Apply(first) = authorize else {
            unreachable!("a client command")
        };
        let reused = h.on(h.header("h1:again"), first.op);
        assert!(
            matches!(
                h.err_unchanged(reused),
                LedgerError::Conflict(ConflictReason::HoldReused { .. })
            ),
            "rules {rules_version}: the id stays claimed"
        );
        assert_eq!(
            code(&h.err_unchanged(h.capture("h1", "a"))),
            PreconditionCode::UnknownHold,
            "rules {rules_version}: a denied claim is no hold to capture"
        );
    }
}

/// Rows out of memory are counted and digested by the family, every id a command names is
/// looked up before it applies, and a node that forgot to look one up stops the apply
/// rather than take "not found" for an answer.
#[test]
fn rows_out_of_memory_are_counted_and_a_lookup_the_node_skipped_stops_the_apply() {
    let mut h = short_retention();
    let authorize = h.authorize("h1", 40);
    h.ok(authorize.clone());
    h.ok(h.capture("h1", "a"));
    h.ok(h.reconcile("h1", 40, 25));
    h.advance(62_000);
    h.ok(h.expire(h.now_ms));
    let meta = h.family.cold_meta();
    assert_eq!(meta.rows, 4, "three commands' rows and the archived hold");
    assert_eq!(h.cold.meta(), meta);
    assert!(!h.family.to_snapshot_bytes().is_empty());
    assert_eq!(
        ColdMeta::of_family_bytes(&h.family.to_snapshot_bytes()).expect("peeks"),
        meta
    );

    let ctx = h.ctx();
    h.family.start_batch(ColdFetch::default());
    let skipped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.family.apply(&authorize, &ctx)
    }));
    let message = skipped.expect_err("a replay with no lookup must not apply");
    let message = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.contains("was not looked up"), "{message}");

    // "Not stored" names one id (by its key's hash): another id's answer does not cover it.
    let other = h.authorize("h2", 40);
    let mut fetch = ColdFetch::absent([&other]);
    fetch
        .record(ColdKey::Event(EventId::from("unrelated")), None)
        .expect("records");
    h.family.start_batch(fetch);
    let skipped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        h.family.apply(&authorize, &ctx)
    }));
    assert!(
        skipped.is_err(),
        "a replay looked up under other ids must not apply"
    );
}
