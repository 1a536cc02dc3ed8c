//! The checker against real ledger states (built with `tally_ledger::Family`), first clean,
//! then deliberately broken: every violation it exists to find must be reported.

use tally_ledger::{
    AccountKey, ApplyCtx, ClientCommand, ClusterParams, Command, CommandHeader, Decision, Family,
    GrantLimits, HoldFilter, LogPosition, Operation,
};

use super::*;
use crate::history::{Op, OpResult, Resolution, Settlement};

pub(crate) const FAMILY: &str = "fam-1";

fn limits() -> GrantLimits {
    GrantLimits::monetary(Some(3), Some(500), Some(1_000), "USD")
}

pub(crate) struct Sim {
    family: Family,
    log: u64,
    history: Vec<Op>,
}

impl Sim {
    fn new() -> Self {
        Self {
            family: Family::new(FAMILY.into()),
            log: 0,
            history: Vec::new(),
        }
    }

    fn command(event_id: &str, op: Operation) -> ClientCommand {
        ClientCommand {
            header: CommandHeader {
                family_id: FAMILY.into(),
                capability_id: "cap-root".into(),
                grant_index: 0,
                event_id: event_id.into(),
                not_after_ms: 1_000_000,
            },
            op,
        }
    }

    /// Applies one command in its own log entry and records the call as `result`.
    fn apply(&mut self, process: u32, command: ClientCommand) -> Decision {
        self.log += 1;
        let ctx = ApplyCtx {
            log_id: LogPosition {
                term: 1,
                index: self.log,
            },
            command_position: 0,
            now_ms: 10_000 + self.log,
            params: ClusterParams::default(),
            no_space: false,
        };
        let decision = self
            .family
            .apply(&Command::Apply(command.clone()), &ctx)
            .expect("the scenario's commands apply");
        self.record(
            process,
            command,
            OpResult::Ok {
                decision: decision.clone(),
            },
        );
        decision
    }

    fn record(&mut self, process: u32, command: ClientCommand, result: OpResult) {
        let index = self.history.len() as u64;
        self.history.push(Op {
            index,
            process,
            event_id: command.header.event_id.to_string(),
            family: FAMILY.to_owned(),
            kind: command.op.name(),
            command,
            invoked_ms: index * 10,
            completed_ms: index * 10 + 5,
            result,
        });
    }

    fn authorize(&mut self, process: u32, hold: &str, units: u64) -> Decision {
        let cmd = Self::command(
            &format!("{hold}:authorize"),
            Operation::AuthorizeHold {
                hold_id: hold.into(),
                requested_exposure_units: units,
                limits: limits(),
                ancestors: Vec::new(),
                hold_timeout_ms: None,
            },
        );
        self.apply(process, cmd)
    }

    fn capture_command(hold: &str, attempt: &str) -> ClientCommand {
        Self::command(
            &format!("{hold}:capture"),
            Operation::CaptureInvocation {
                hold_id: hold.into(),
                attempt_id: attempt.into(),
            },
        )
    }

    pub(crate) fn replica(&self, node_id: u64) -> ReplicaState {
        let state = FamilyState {
            family: FAMILY.to_owned(),
            events: self.family.list_events(None, None, None, 10_000),
            usages: self.family.list_usages(None, None, 10_000),
            holds: self.family.list_holds(&HoldFilter::default(), 10_000),
            compacted_events: false,
        };
        ReplicaState {
            node_id,
            applied_index: self.log,
            digest: "d1".to_owned(),
            families: [(FAMILY.to_owned(), state)].into_iter().collect(),
        }
    }
}

/// Two holds: one captured by process 1 (process 2's identical twin is told it is owned) and
/// reconciled; one authorized and reversed.
pub(crate) fn clean() -> Sim {
    let mut sim = Sim::new();
    sim.authorize(1, "h1", 400);
    sim.apply(1, Sim::capture_command("h1", "attempt-a"));
    sim.apply(2, Sim::capture_command("h1", "attempt-b"));
    sim.apply(
        1,
        Sim::command(
            "h1:reconcile",
            Operation::ReconcileHold {
                hold_id: "h1".into(),
                exposed_cost_units: 400,
                realized_spend_units: 300,
            },
        ),
    );
    sim.authorize(3, "h2", 200);
    sim.apply(
        3,
        Sim::command(
            "h2:reverse",
            Operation::ReverseHold {
                hold_id: "h2".into(),
                exposure_units: 200,
            },
        ),
    );
    sim
}

fn input(sim: &Sim, replicas: Vec<ReplicaState>) -> CheckInput {
    CheckInput {
        history: sim.history.clone(),
        resolutions: Vec::new(),
        replicas,
        kernels: None,
        followed: Default::default(),
        compacted: Default::default(),
    }
}

/// `report` holds a violation of `invariant` whose message says `text`.
fn assert_reported(report: &CheckReport, invariant: u8, text: &str) {
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.invariant == invariant && v.message.contains(text)),
        "no violation of invariant {invariant} saying {text:?}: {:#?}",
        report.violations
    );
}

fn family_mut(replica: &mut ReplicaState) -> &mut FamilyState {
    replica.families.get_mut(FAMILY).expect("the family")
}

#[test]
fn a_clean_history_passes() {
    let sim = clean();
    let report = check(&input(
        &sim,
        vec![sim.replica(1), sim.replica(2), sim.replica(3)],
    ));
    assert!(report.is_ok(), "{:#?}", report.violations);
    assert_eq!(report.ops_checked, 6);
    assert_eq!(
        report.events_checked, 5,
        "the twin capture is a replay: no event"
    );
    assert_eq!(report.replicas_compared, 3);
}

#[test]
fn an_acknowledged_event_missing_from_the_state_is_reported() {
    let sim = clean();
    let mut replica = sim.replica(1);
    family_mut(&mut replica)
        .events
        .retain(|e| e.event_id.as_str() != "h2:reverse");
    let report = check(&input(&sim, vec![replica]));
    assert!(report.violated().contains(&6), "{:#?}", report.violations);
}

/// An event compacted before the final read: followed during the run, or found by `GetEvent`
/// as a compact record, it is committed; at another commit index, or nowhere, it is lost.
#[test]
fn a_compacted_event_counts_where_it_was_followed_or_looked_up_and_only_there() {
    let sim = clean();
    let full = sim.replica(1);
    let reversed = full.families[FAMILY]
        .events
        .iter()
        .find(|e| e.event_id.as_str() == "h2:reverse")
        .cloned()
        .expect("the reverse is in the journal");
    let mut compacted_away = full.clone();
    family_mut(&mut compacted_away)
        .events
        .retain(|e| e.event_id.as_str() != "h2:reverse");

    let mut followed = input(&sim, vec![compacted_away.clone()]);
    followed
        .followed
        .entry(FAMILY.to_owned())
        .or_default()
        .insert(reversed.commit_index.0, reversed.clone());
    let report = check(&followed);
    assert!(report.is_ok(), "followed: {:#?}", report.violations);
    assert_eq!(
        (report.events_checked, report.events_followed_only),
        (full.families[FAMILY].events.len(), 1),
        "the followed event is checked with the rest"
    );

    let mut looked_up = input(&sim, vec![compacted_away.clone()]);
    looked_up
        .compacted
        .entry(FAMILY.to_owned())
        .or_default()
        .insert("h2:reverse".to_owned(), reversed.commit_index);
    let report = check(&looked_up);
    assert!(
        !report.violated().contains(&6),
        "looked up: {:#?}",
        report.violations
    );

    let mut elsewhere = looked_up;
    elsewhere.compacted.get_mut(FAMILY).expect("family").insert(
        "h2:reverse".to_owned(),
        tally_ledger::BudgetCommitIndex(reversed.commit_index.0 + 3),
    );
    assert_reported(&check(&elsewhere), 6, "acknowledged at commit index");

    let nowhere = input(&sim, vec![compacted_away]);
    assert_reported(&check(&nowhere), 6, "is not in the committed state");
}

#[test]
fn an_acknowledgement_with_another_commit_index_is_reported() {
    let mut sim = clean();
    if let OpResult::Ok { decision } = &mut sim.history[0].result {
        decision.commit_index = decision
            .commit_index
            .map(|i| tally_ledger::BudgetCommitIndex(i.0 + 7));
    }
    let report = check(&input(&sim, vec![sim.replica(1)]));
    assert!(report.violated().contains(&6), "{:#?}", report.violations);
}

#[test]
fn a_double_capture_in_the_journal_is_reported() {
    let sim = clean();
    let mut replica = sim.replica(1);
    let family = family_mut(&mut replica);
    let mut twin = family
        .events
        .iter()
        .find(|e| e.kind == tally_ledger::EventKind::CaptureInvocation)
        .cloned()
        .expect("a capture");
    twin.event_id = "h1:capture-again".into();
    twin.attempt_id = Some("attempt-b".into());
    twin.commit_index = tally_ledger::BudgetCommitIndex(twin.commit_index.0 + 1);
    family.events.push(twin);
    let report = check(&input(&sim, vec![replica]));
    assert!(report.violated().contains(&3), "{:#?}", report.violations);
}

#[test]
fn two_clients_told_they_own_the_capture_is_reported() {
    let mut sim = clean();
    // Process 2 is told its own attempt captured, and goes on to reconcile.
    if let OpResult::Ok { decision } = &mut sim.history[2].result {
        decision.outcome = tally_ledger::Outcome::Captured {
            hold_id: "h1".into(),
            attempt_id: "attempt-b".into(),
        };
    }
    let report = check(&input(&sim, vec![sim.replica(1)]));
    assert!(report.violated().contains(&3), "{:#?}", report.violations);
}

#[test]
fn a_reconcile_from_a_process_that_does_not_own_the_capture_is_reported() {
    let mut sim = clean();
    // The reconcile of h1 came from process 2, whose twin capture was told it is not the owner.
    sim.history[3].process = 2;
    let report = check(&input(&sim, vec![sim.replica(1)]));
    assert_reported(&report, 3, "without owning the capture");
}

#[test]
fn overspend_is_reported() {
    let sim = clean();
    let mut replica = sim.replica(1);
    let row = &mut family_mut(&mut replica).usages[0];
    row.account.total_cost_realized_spend_units += 5_000;
    let report = check(&input(&sim, vec![replica]));
    assert!(report.violated().contains(&1), "{:#?}", report.violations);
}

#[test]
fn over_admission_is_reported() {
    let sim = clean();
    let mut replica = sim.replica(1);
    let family = family_mut(&mut replica);
    let event = family
        .events
        .iter_mut()
        .find(|e| !e.after_images.is_empty())
        .expect("an event with an image");
    event.after_images[0].account.reserved_invocations = 9;
    let report = check(&input(&sim, vec![replica]));
    assert!(report.violated().contains(&2), "{:#?}", report.violations);
}

#[test]
fn a_hold_back_to_authorized_and_broken_conservation_are_reported() {
    let sim = clean();
    let mut replica = sim.replica(1);
    let family = family_mut(&mut replica);
    let reverse = family
        .events
        .iter_mut()
        .find(|e| e.event_id.as_str() == "h2:reverse")
        .expect("the reverse");
    reverse.hold_before = reverse.hold_after;
    if let Some(after) = &mut reverse.hold_after {
        after.invocation = tally_ledger::InvocationState::Authorized;
    }
    family.holds[0].released_units += 1;
    let report = check(&input(&sim, vec![replica]));
    assert!(report.violated().contains(&4), "{:#?}", report.violations);
    assert!(report.violated().contains(&5), "{:#?}", report.violations);
}

/// A row whose last change no read saw (compacted unseen) is unobserved only where the family
/// had compacted events; a row that differs from the image of its own last change is always
/// a violation.
#[test]
fn a_row_changed_by_an_unseen_compacted_event_is_unobserved_but_a_wrong_row_is_not() {
    let sim = clean();
    let later = |replica: &mut ReplicaState, compacted: bool| {
        let family = family_mut(replica);
        family.compacted_events = compacted;
        let row = &mut family.usages[0].account;
        row.seq = tally_ledger::BudgetCommitIndex(row.seq.0 + 100);
        row.total_cost_exposed_units += 1;
    };
    let mut unseen = sim.replica(1);
    later(&mut unseen, true);
    let report = check(&input(&sim, vec![unseen]));
    assert!(report.is_ok(), "{:#?}", report.violations);
    assert_eq!(report.rows_unobserved, 1);

    let mut no_compaction = sim.replica(1);
    later(&mut no_compaction, false);
    let report = check(&input(&sim, vec![no_compaction]));
    assert_reported(&report, 5, "the journal folds to");

    let mut wrong = sim.replica(1);
    let family = family_mut(&mut wrong);
    family.compacted_events = true;
    family.usages[0].account.total_cost_exposed_units += 1;
    let report = check(&input(&sim, vec![wrong]));
    assert_reported(&report, 5, "the journal folds to");
}

#[test]
fn unresolved_and_wrongly_resolved_unknowns_are_reported() {
    let mut sim = clean();
    // Op 0 (h1's authorize) lost its answer; op 4 (h2's authorize) too.
    for index in [0, 4] {
        sim.history[index].result = OpResult::Info {
            reason: "no reply".to_owned(),
        };
    }
    let mut checked = input(&sim, vec![sim.replica(1)]);
    let report = check(&checked);
    assert_eq!(
        report
            .violations
            .iter()
            .filter(|v| v.invariant == 8)
            .count(),
        2,
        "{:#?}",
        report.violations
    );
    checked.resolutions = vec![Resolution {
        op_index: 0,
        event_id: "h1:authorize".to_owned(),
        family: FAMILY.to_owned(),
        settlement: Settlement::NotApplied,
    }];
    let report = check(&checked);
    assert_reported(&report, 8, "not applied");
}

#[test]
fn a_cancel_after_an_unknown_capture_is_reported() {
    let mut sim = Sim::new();
    sim.authorize(1, "h3", 100);
    let capture = Sim::capture_command("h3", "attempt-c");
    let decision = sim.apply(1, capture);
    let index = sim.history.len() - 1;
    sim.history[index].result = OpResult::Info {
        reason: "leader died".to_owned(),
    };
    sim.apply(
        1,
        Sim::command(
            "h3:cancel",
            Operation::CancelCapturedBeforeDispatch {
                hold_id: "h3".into(),
            },
        ),
    );
    let mut checked = input(&sim, vec![sim.replica(1)]);
    checked.resolutions = vec![Resolution {
        op_index: index as u64,
        event_id: "h3:capture".to_owned(),
        family: FAMILY.to_owned(),
        settlement: Settlement::Applied { decision },
    }];
    let report = check(&checked);
    assert!(report.violated().contains(&9), "{:#?}", report.violations);
}

#[test]
fn freeing_a_hold_after_an_unknown_authorize_is_reported() {
    let mut sim = clean();
    // Process 3's authorize of h2 "lost its answer", yet process 3 went on to reverse it.
    sim.history[4].result = OpResult::Info {
        reason: "timeout".to_owned(),
    };
    let decision = sim.family.get_event(&"h2:authorize".into());
    let tally_ledger::EventLookup::Applied { decision, .. } = decision else {
        panic!("h2 was authorized");
    };
    let mut checked = input(&sim, vec![sim.replica(1)]);
    checked.resolutions = vec![Resolution {
        op_index: 4,
        event_id: "h2:authorize".to_owned(),
        family: FAMILY.to_owned(),
        settlement: Settlement::Applied { decision },
    }];
    let report = check(&checked);
    assert_eq!(report.violated(), vec![9], "{:#?}", report.violations);
}

#[test]
fn diverging_replicas_are_reported() {
    let sim = clean();
    let mut other = sim.replica(2);
    other.digest = "d2".to_owned();
    family_mut(&mut other).usages.clear();
    let report = check(&input(&sim, vec![sim.replica(1), other]));
    assert!(report.violated().contains(&10), "{:#?}", report.violations);
    let lagging = ReplicaState {
        applied_index: 1,
        ..sim.replica(3)
    };
    let report = check(&input(&sim, vec![sim.replica(1), lagging]));
    assert!(report.violated().contains(&10), "{:#?}", report.violations);
}

#[test]
fn violations_are_bounded_per_invariant() {
    let mut report = CheckReport::default();
    for n in 0..(MAX_VIOLATIONS_PER_INVARIANT + 5) {
        report.report(1, None, format!("v{n}"));
    }
    assert_eq!(report.violations.len(), MAX_VIOLATIONS_PER_INVARIANT);
    assert_eq!(report.suppressed[1], 5);
    let _ = AccountKey::new("unused", 0);
}
