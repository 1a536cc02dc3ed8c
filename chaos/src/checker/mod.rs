//! The history checker: docs/spec.md §11 invariants 1–10 over a recorded history and the final
//! state of every replica. Pure: no I/O, no clocks, so it is unit-tested with deliberately
//! broken histories (a checker that cannot fail proves nothing).

mod acks;
mod holds;
mod kernels;
mod limits;
mod replicas;
mod state;
#[cfg(test)]
pub(crate) mod tests;

use serde::Serialize;

use crate::history::{Op, Resolution};
pub use kernels::{check_kernels, KernelCheckInput, KernelCheckStats};
pub use state::{Compacted, FamilyState, ReplicaState};

/// Violations reported per invariant; beyond it they are counted, not listed.
pub const MAX_VIOLATIONS_PER_INVARIANT: usize = 20;

/// One broken invariant, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// docs/spec.md §11 number (1–10).
    pub invariant: u8,
    pub family: Option<String>,
    pub message: String,
}

/// What the checker looked at and found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub violations: Vec<Violation>,
    /// Violations found beyond the listed ones, per invariant (index 0 unused).
    pub suppressed: [u64; 11],
    pub ops_checked: usize,
    pub events_checked: usize,
    /// Of those, events the final read no longer held (compacted): seen by the follower.
    pub events_followed_only: usize,
    /// History events no read saw in full, checked by their compact record (`GetEvent`).
    pub compact_records_checked: usize,
    /// Account rows whose last change was compacted before any read saw it: not folded.
    pub rows_unobserved: usize,
    pub holds_checked: usize,
    pub accounts_checked: usize,
    pub replicas_compared: usize,
    /// The kernel layer's checks, when the run had kernels.
    pub kernel: Option<KernelCheckStats>,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Which invariants were violated, each once, in order.
    pub fn violated(&self) -> Vec<u8> {
        let mut out: Vec<u8> = self.violations.iter().map(|v| v.invariant).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    pub(crate) fn report(&mut self, invariant: u8, family: Option<&str>, message: String) {
        let listed = self
            .violations
            .iter()
            .filter(|v| v.invariant == invariant)
            .count();
        if listed >= MAX_VIOLATIONS_PER_INVARIANT {
            self.suppressed[usize::from(invariant.min(10))] += 1;
            return;
        }
        self.violations.push(Violation {
            invariant,
            family: family.map(str::to_owned),
            message,
        });
    }
}

/// Everything the checker needs.
#[derive(Clone, Debug, Default)]
pub struct CheckInput {
    pub history: Vec<Op>,
    pub resolutions: Vec<Resolution>,
    /// Every replica's final state, read after healing and convergence.
    pub replicas: Vec<ReplicaState>,
    /// The kernels' receipts, the rail's and the tool server's counts, the journal answers.
    pub kernels: Option<KernelCheckInput>,
    /// Events followed while the run went on (`journal.rs`): those compacted before the final
    /// read are checked from here.
    pub followed: crate::journal::Followed,
    /// Compact records of history events no read saw in full.
    pub compacted: Compacted,
}

/// Checks docs/spec.md §11 invariants 1–10. The first replica is the reference for the
/// state-based invariants; invariant 10 compares every replica with it.
pub fn check(input: &CheckInput) -> CheckReport {
    let mut report = CheckReport {
        ops_checked: input.history.len(),
        ..CheckReport::default()
    };
    let Some(reference) = input.replicas.first() else {
        report.report(10, None, "no replica state to check against".to_owned());
        return report;
    };
    replicas::check_convergence(&input.replicas, &mut report);
    let final_events: usize = reference.families.values().map(|f| f.events.len()).sum();
    let reference = &state::with_followed(reference, &input.followed);
    report.compact_records_checked = input.compacted.values().map(|c| c.len()).sum();
    for family in reference.families.values() {
        report.events_checked += family.events.len();
        report.holds_checked += family.holds.len();
        report.accounts_checked += family.usages.len();
        limits::check_limits(family, &mut report);
        holds::check_holds(family, &input.history, &mut report);
    }
    report.events_followed_only = report.events_checked - final_events;
    acks::check_acknowledged(
        reference,
        &input.compacted,
        &input.history,
        &input.resolutions,
        &mut report,
    );
    if let Some(kernels) = &input.kernels {
        report.kernel = Some(kernels::check_kernels(kernels, &mut report));
    }
    report
}
