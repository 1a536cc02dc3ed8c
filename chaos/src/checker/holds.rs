//! Invariants 3 (no double capture, one owner attempt), 4 (one terminal state, never back to
//! Authorized) and 5 (conservation per hold; the journal folds into every row).

use std::collections::{BTreeMap, BTreeSet};

use tally_ledger::{EventKind, EventRecord, HoldStates, InvocationState, MonetaryState, Outcome};

use super::{CheckReport, FamilyState};
use crate::history::{Op, OpResult};

pub(super) fn check_holds(family: &FamilyState, history: &[Op], report: &mut CheckReport) {
    let name = family.family.as_str();
    let mut by_hold: BTreeMap<&str, Vec<&EventRecord>> = BTreeMap::new();
    for event in &family.events {
        if let Some(hold) = &event.hold_id {
            by_hold.entry(hold.as_str()).or_default().push(event);
        }
    }
    let ops = ops_by_hold(name, history);
    for (hold, events) in &by_hold {
        let ops = ops.get(hold).map_or(&[][..], Vec::as_slice);
        check_captures(name, hold, events, ops, report);
        check_transitions(name, hold, events, report);
    }
    for hold in &family.holds {
        let parts = [
            hold.realized_units,
            hold.unspent_units,
            hold.released_units,
            hold.reversed_units,
            hold.remaining_exposure_units,
        ];
        let sum = parts.iter().try_fold(0u64, |a, p| a.checked_add(*p));
        if sum != Some(hold.authorized_exposure_units) {
            report.report(
                5,
                Some(name),
                format!(
                    "hold {}: realized+unspent+released+reversed+remaining = {parts:?} \
                     does not sum to authorized {}",
                    hold.hold_id, hold.authorized_exposure_units
                ),
            );
        }
    }
    check_fold(family, report);
}

/// The family's operations by the hold they name, in the command or in the answer, in history
/// order: built once, so checking a hold reads its own operations, not the whole history (a
/// soak records operations on so many holds that a scan per hold would be quadratic).
fn ops_by_hold<'h>(family: &str, history: &'h [Op]) -> BTreeMap<&'h str, Vec<&'h Op>> {
    let mut by_hold: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history.iter().filter(|op| op.family == family) {
        let named = op.command.op.hold_id().map(|hold| hold.as_str());
        let answered = match &op.result {
            OpResult::Ok { decision } => match &decision.outcome {
                Outcome::Captured { hold_id, .. } | Outcome::AlreadyCaptured { hold_id, .. } => {
                    Some(hold_id.as_str())
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(hold) = named {
            by_hold.entry(hold).or_default().push(op);
        }
        if let Some(hold) = answered.filter(|answered| Some(*answered) != named) {
            by_hold.entry(hold).or_default().push(op);
        }
    }
    by_hold
}

/// At most one `capture_invocation` per hold; every answer names the same owner attempt;
/// only the owner's process went on past the capture. `ops` are the family's operations that
/// name `hold` (see `ops_by_hold`).
fn check_captures(
    family: &str,
    hold: &str,
    events: &[&EventRecord],
    ops: &[&Op],
    report: &mut CheckReport,
) {
    let captures: Vec<&&EventRecord> = events
        .iter()
        .filter(|e| e.kind == EventKind::CaptureInvocation)
        .collect();
    if captures.len() > 1 {
        report.report(
            3,
            Some(family),
            format!(
                "hold {hold}: {} capture_invocation events ({})",
                captures.len(),
                captures
                    .iter()
                    .map(|e| e.event_id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        return;
    }
    let owner = captures.first().and_then(|e| e.attempt_id.clone());
    let mut owners = BTreeSet::new();
    for op in ops {
        let OpResult::Ok { decision } = &op.result else {
            continue;
        };
        let named = match &decision.outcome {
            Outcome::Captured {
                hold_id,
                attempt_id,
            } if hold_id.as_str() == hold => Some(attempt_id.to_string()),
            Outcome::AlreadyCaptured {
                hold_id,
                owner_attempt_id,
                ..
            } if hold_id.as_str() == hold => Some(owner_attempt_id.to_string()),
            _ => None,
        };
        if let Some(named) = named {
            owners.insert(named);
        }
    }
    if owners.len() > 1 {
        report.report(
            3,
            Some(family),
            format!("hold {hold}: clients were told of several owner attempts {owners:?}"),
        );
    }
    if let (Some(owner), Some(told)) = (&owner, owners.iter().next()) {
        if owner.as_str() != told {
            report.report(
                3,
                Some(family),
                format!("hold {hold}: journal owner {owner} but clients were told {told}"),
            );
        }
    }
    // Which processes sent the owner attempt; only they may go on past the capture.
    let owner_processes: BTreeSet<u32> = ops
        .iter()
        .filter(|op| op.kind == "capture_invocation")
        .filter(|op| matches!(&op.command.op, tally_ledger::Operation::CaptureInvocation { hold_id, attempt_id }
            if hold_id.as_str() == hold && Some(attempt_id.to_string()) == owner.as_ref().map(ToString::to_string)))
        .map(|op| op.process)
        .collect();
    for op in ops {
        let after_capture = matches!(
            op.kind,
            "reconcile_hold" | "cancel_captured_before_dispatch"
        );
        let on_hold = op.command.op.hold_id().is_some_and(|h| h.as_str() == hold);
        if after_capture && on_hold && !owner_processes.contains(&op.process) {
            report.report(
                3,
                Some(family),
                format!(
                    "hold {hold}: process {} sent {} without owning the capture",
                    op.process, op.kind
                ),
            );
        }
    }
}

fn is_terminal(states: &HoldStates) -> bool {
    states.invocation == InvocationState::Reversed || states.monetary == MonetaryState::Reconciled
}

/// In commit order: never back to Authorized, at most one transition into a terminal
/// state, and nothing moves a terminal hold.
fn check_transitions(family: &str, hold: &str, events: &[&EventRecord], report: &mut CheckReport) {
    let mut terminal_entries = 0;
    for event in events {
        let (Some(before), Some(after)) = (&event.hold_before, &event.hold_after) else {
            continue;
        };
        if before.invocation != InvocationState::Authorized
            && after.invocation == InvocationState::Authorized
        {
            report.report(
                4,
                Some(family),
                format!(
                    "hold {hold}: event {} moved it from {before:?} back to Authorized",
                    event.event_id
                ),
            );
        }
        if is_terminal(before) && before != after {
            report.report(
                4,
                Some(family),
                format!(
                    "hold {hold}: event {} moved a terminal hold {before:?} -> {after:?}",
                    event.event_id
                ),
            );
        }
        if !is_terminal(before) && is_terminal(after) {
            terminal_entries += 1;
        }
    }
    if terminal_entries > 1 {
        report.report(
            4,
            Some(family),
            format!("hold {hold}: entered a terminal state {terminal_entries} times"),
        );
    }
}

/// Folding the journal reproduces every row: each account's last after-image equals its row,
/// and its reserved slots are exactly its Authorized holds. Where events were compacted
/// before the final read, a row changed last by an event no read reached is counted as
/// unobserved (`rows_unobserved`); a row whose last change is known must match it.
fn check_fold(family: &FamilyState, report: &mut CheckReport) {
    let name = family.family.as_str();
    let mut last_image = BTreeMap::new();
    for event in &family.events {
        for image in &event.after_images {
            last_image.insert(image.key.clone(), &image.account);
        }
    }
    for usage in &family.usages {
        if let Some(image) = last_image.get(&usage.key) {
            if family.compacted_events && image.seq != usage.account.seq {
                report.rows_unobserved += 1;
            } else if **image != usage.account {
                report.report(
                    5,
                    Some(name),
                    format!(
                        "{:?}: the journal folds to {image:?} but the row is {:?}",
                        usage.key, usage.account
                    ),
                );
            }
        }
        let authorized = family
            .holds
            .iter()
            .filter(|h| {
                h.invocation_state == InvocationState::Authorized && h.accounts.contains(&usage.key)
            })
            .count() as u64;
        if authorized != u64::from(usage.account.reserved_invocations) {
            report.report(
                5,
                Some(name),
                format!(
                    "{:?}: {} reserved slots but {authorized} Authorized holds",
                    usage.key, usage.account.reserved_invocations
                ),
            );
        }
    }
}
