//! Invariants 6 (acknowledged = durable, same commit index), 7 (a retry never changes the
//! answer), 8 (every unknown resolves to applied or not applied, matching the state) and 9
//! (fail-closed: no unknown frees budget).

use std::collections::BTreeMap;

use tally_ledger::{Decision, EventKind, Operation};

use super::state::{Compacted, EventsById};
use super::{CheckReport, ReplicaState};
use crate::history::{Op, OpResult, Resolution, Settlement};

pub(super) fn check_acknowledged(
    reference: &ReplicaState,
    compacted: &Compacted,
    history: &[Op],
    resolutions: &[Resolution],
    report: &mut CheckReport,
) {
    // Every decision any client saw, by (family, event id).
    let mut seen: BTreeMap<(&str, String), Vec<(&Decision, String)>> = BTreeMap::new();
    for op in history {
        if let OpResult::Ok { decision } = &op.result {
            seen.entry((op.family.as_str(), decision.event_id.to_string()))
                .or_default()
                .push((
                    decision,
                    format!("op {} (process {})", op.index, op.process),
                ));
        }
    }
    for resolution in resolutions {
        if let Settlement::Applied { decision } = &resolution.settlement {
            seen.entry((resolution.family.as_str(), decision.event_id.to_string()))
                .or_default()
                .push((
                    decision,
                    format!("resolution of op {}", resolution.op_index),
                ));
        }
    }
    let events = EventsById::new(reference, compacted);
    for ((family, event_id), decisions) in &seen {
        let record = events.get(family, event_id);
        for (decision, source) in decisions {
            let Some(index) = decision.commit_index else {
                continue;
            };
            match record {
                None => report.report(
                    6,
                    Some(family),
                    format!(
                        "{source}: acknowledged event {event_id} (commit index {}) is not in the \
                         committed state",
                        index.0
                    ),
                ),
                Some(committed) if committed != index => report.report(
                    6,
                    Some(family),
                    format!(
                        "{source}: event {event_id} acknowledged at commit index {} but \
                         committed at {}",
                        index.0, committed.0
                    ),
                ),
                Some(_) => {}
            }
        }
        let indexes: Vec<u64> = decisions
            .iter()
            .filter_map(|(d, _)| d.commit_index.map(|i| i.0))
            .collect();
        if indexes.windows(2).any(|w| w[0] != w[1]) {
            report.report(
                7,
                Some(family),
                format!("event {event_id}: answers carried different commit indexes {indexes:?}"),
            );
        }
    }
    check_unknowns(reference, &events, history, resolutions, report);
    check_tombstones(&events, history, report);
    check_no_free_after_unknown(history, report);
}

/// A client whose authorize or capture of a hold ended unknown never frees that hold
/// afterwards (reverse, release, cancel): only a definite "no" frees funds (docs/spec.md §9).
fn check_no_free_after_unknown(history: &[Op], report: &mut CheckReport) {
    let mut unknown_at: BTreeMap<(u32, &str, &str), u64> = BTreeMap::new();
    for op in history {
        let Some(hold) = op.command.op.hold_id() else {
            continue;
        };
        let key = (op.process, op.family.as_str(), hold.as_str());
        let frees = matches!(
            op.kind,
            "reverse_hold" | "release_hold" | "cancel_captured_before_dispatch"
        );
        if frees {
            if let Some(at) = unknown_at.get(&key) {
                if op.invoked_ms >= *at {
                    report.report(
                        9,
                        Some(&op.family),
                        format!(
                            "op {}: process {} sent {} on hold {hold} after an unknown outcome",
                            op.index, op.process, op.kind
                        ),
                    );
                }
            }
        }
        let gates = matches!(op.kind, "authorize_hold" | "capture_invocation");
        if gates && op.is_unknown() {
            unknown_at.entry(key).or_insert(op.completed_ms);
        }
    }
}

/// Every unknown has a settlement, and the settlement matches the state.
fn check_unknowns(
    reference: &ReplicaState,
    events: &EventsById<'_>,
    history: &[Op],
    resolutions: &[Resolution],
    report: &mut CheckReport,
) {
    let by_op: BTreeMap<u64, &Resolution> = resolutions.iter().map(|r| (r.op_index, r)).collect();
    for op in history {
        if !op.is_unknown() {
            continue;
        }
        let family = op.family.as_str();
        let record = events.get(family, &op.event_id);
        match by_op.get(&op.index).map(|r| &r.settlement) {
            None => report.report(
                8,
                Some(family),
                format!(
                    "op {}: unknown {} was never resolved",
                    op.index, op.event_id
                ),
            ),
            Some(Settlement::Unresolved { reason }) => report.report(
                8,
                Some(family),
                format!(
                    "op {}: unknown {} is still unresolved: {reason}",
                    op.index, op.event_id
                ),
            ),
            Some(Settlement::NotApplied) if record.is_some() => report.report(
                8,
                Some(family),
                format!(
                    "op {}: {} resolved as not applied but it is in the state",
                    op.index, op.event_id
                ),
            ),
            Some(Settlement::Applied { .. }) if record.is_none() => report.report(
                8,
                Some(family),
                format!(
                    "op {}: {} resolved as applied but it is not in the state",
                    op.index, op.event_id
                ),
            ),
            Some(Settlement::Applied { .. }) => check_fail_closed(reference, op, report),
            Some(_) => {}
        }
    }
}

/// A capture whose answer was lost and that then turned out applied must not have been
/// cancelled: the tool may have run, so only the owner's proof may free it.
fn check_fail_closed(reference: &ReplicaState, op: &Op, report: &mut CheckReport) {
    let Operation::CaptureInvocation { hold_id, .. } = &op.command.op else {
        return;
    };
    let Some(family) = reference.families.get(&op.family) else {
        return;
    };
    let freed = family.events.iter().find(|e| {
        e.hold_id.as_ref() == Some(hold_id)
            && e.kind == EventKind::CancelCapturedBeforeDispatch
            && e.commit_index.0 > 0
    });
    if let Some(freed) = freed {
        report.report(
            9,
            Some(&op.family),
            format!(
                "hold {hold_id}: its capture was unknown to op {} yet event {} freed it",
                op.index, freed.event_id
            ),
        );
    }
}

/// A tombstoned id can never be in the state.
fn check_tombstones(events: &EventsById<'_>, history: &[Op], report: &mut CheckReport) {
    for op in history {
        let OpResult::Fail {
            tombstoned: true, ..
        } = op.result
        else {
            continue;
        };
        let present = events.get(&op.family, &op.event_id).is_some();
        if present {
            report.report(
                8,
                Some(&op.family),
                format!(
                    "op {}: {} was tombstoned (not applied) but it is in the state",
                    op.index, op.event_id
                ),
            );
        }
    }
}
