//! docs/spec.md §5.6: while the `NoSpace` alarm is raised, fresh commands that open new
//! exposure are refused (definite: nothing applied, nothing recorded), everything on existing
//! holds and charges, `ExpireHolds`, `ResolveEvent` and replays still apply. One test per row
//! of the table.

mod support;

use support::*;
use tally_ledger::*;

fn on2(h: &Harness, id: &str, op: Operation) -> Command {
    h.on(h.header_on("cap-2", 0, id), op)
}

/// The four commands that open new exposure, each with its own event id.
fn openers(h: &Harness) -> Vec<Command> {
    vec![
        h.authorize("h-new", 10),
        h.on(
            h.header("inc-new"),
            Operation::TryIncrement { limits: limits() },
        ),
        on2(
            h,
            "charge-new",
            Operation::TryChargeCost {
                cost_units: 10,
                limits: limits(),
            },
        ),
        h.nonce("nonce-new", "n-new", T0 + 30_000),
    ]
}

#[test]
fn fresh_commands_that_open_exposure_are_refused_and_apply_once_cleared() {
    let mut h = Harness::new();
    h.no_space = true;
    let commands = openers(&h);
    let journal = h.family.journal_len();
    for command in &commands {
        let error = h.err_unchanged(command.clone());
        assert!(
            matches!(error, LedgerError::NoSpace { .. }),
            "{}: {error:?}",
            command.name()
        );
        assert!(error.to_string().contains("NoSpace"), "{error}");
    }
    assert_eq!(h.family.journal_len(), journal, "nothing appended");
    // Not recorded as applied: a resolve of a refused command would tombstone it, so check
    // the dedupe table through the same id applying fresh once the alarm is cleared.
    h.no_space = false;
    for command in commands {
        let name = command.name();
        let decision = h.ok(command);
        assert!(!decision.replayed, "{name}: applied fresh after the clear");
    }
}

#[test]
fn commands_on_existing_holds_and_charges_still_apply() {
    let mut h = Harness::new();
    for hold in ["cap", "can", "rev", "rel", "rec"] {
        h.ok(h.authorize(hold, 40));
    }
    h.ok(h.capture("can", "a"));
    h.ok(h.capture("rec", "a"));
    h.ok(on2(
        &h,
        "charge",
        Operation::TryChargeCost {
            cost_units: 30,
            limits: limits(),
        },
    ));
    h.no_space = true;
    h.ok(h.capture("cap", "a"));
    h.ok(h.cancel("can"));
    h.ok(h.reverse("rev", 40));
    h.ok(h.release("rel", "rel:release", 10));
    h.ok(h.reconcile("rec", 40, 5));
    h.ok(on2(
        &h,
        "reduce",
        Operation::ReduceChargeCost { cost_units: 5 },
    ));
    h.ok(on2(
        &h,
        "settle",
        Operation::SettleChargeCost {
            exposed_cost_units: 5,
            realized_spend_units: 5,
        },
    ));
    h.ok(on2(
        &h,
        "rev-charge",
        Operation::ReverseChargeCost { cost_units: 20 },
    ));
}

#[test]
fn expiry_and_resolve_still_apply() {
    let mut h = Harness::new();
    h.ok(h.authorize_with("h1", 40, limits(), vec![], Some(1_000)));
    let applied = h.authorize("h2", 10);
    h.ok(applied.clone());
    h.no_space = true;
    h.advance(5_000);
    let expired = h.ok(h.expire(h.now_ms));
    assert!(
        matches!(expired.outcome, Outcome::HoldsExpired { ref hold_ids, .. } if hold_ids.len() == 1),
        "{expired:?}"
    );
    // An applied command resolves to its answer; a never-applied opener is tombstoned, so a
    // lost acknowledgement stays resolvable while the alarm is raised.
    let resolved = h.ok(h.resolve(&applied));
    assert!(
        matches!(resolved.outcome, Outcome::Resolved(Resolution::Applied(_))),
        "{resolved:?}"
    );
    let never = h.authorize("h3", 10);
    let resolved = h.ok(h.resolve(&never));
    assert_eq!(resolved.outcome, Outcome::Resolved(Resolution::NotApplied));
    h.no_space = false;
    assert_eq!(
        code(&h.err(never)),
        PreconditionCode::EventAborted,
        "the tombstone holds after the clear"
    );
}

#[test]
fn replays_of_every_kind_answer_their_recorded_decision() {
    let mut h = Harness::new();
    let commands = openers(&h);
    let first: Vec<Decision> = commands.iter().map(|c| h.ok(c.clone())).collect();
    // A denied authorize replays its denial too.
    let denied = h.authorize("h-denied", 500);
    let denial = h.ok(denied.clone());
    assert!(
        matches!(denial.outcome, Outcome::Denied { .. }),
        "{denial:?}"
    );
    h.no_space = true;
    for (command, first) in commands.into_iter().zip(first).chain([(denied, denial)]) {
        let digest = h.family.digest();
        let again = h.ok(command);
        assert!(again.replayed, "a replay");
        assert_eq!(again.outcome, first.outcome);
        assert_eq!(again.commit_index, first.commit_index);
        assert_eq!(h.family.digest(), digest, "a replay changes nothing");
    }
}
