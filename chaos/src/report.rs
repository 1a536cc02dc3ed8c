//! What a run reports: a one-screen summary for people, a JSON report for tools, and the
//! one-line command that replays the run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::checker::CheckReport;
use crate::history::{Op, OpResult, Resolution, Settlement};
use crate::leader_watch::LeaderSample;
use crate::nemesis::FaultRecord;

#[derive(Clone, Debug, Default, Serialize)]
pub struct OpCounts {
    pub total: usize,
    pub ok: usize,
    pub fail: usize,
    pub info: usize,
    pub denied: usize,
    pub by_kind: BTreeMap<String, usize>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct UnknownCounts {
    pub total: usize,
    pub applied: usize,
    pub not_applied: usize,
    pub refused: usize,
    pub unresolved: usize,
}

/// What the kernel layer did: evaluations as the harness saw them, and what the shared tool
/// server and rail counted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KernelFigures {
    pub kernels: usize,
    pub evaluations: usize,
    pub allows: usize,
    pub denies: usize,
    /// No answer (a killed kernel, a deadline).
    pub errors: usize,
    /// Evaluations sent to every kernel at once with one request id.
    pub twin_evaluations: usize,
    pub request_ids: usize,
    pub dispatches: u64,
    pub payment_authorizations: u64,
    pub payment_captures: u64,
    pub receipts: usize,
    pub kernel_kills: usize,
    pub rail_faults: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub seed: u64,
    pub profile: String,
    pub duration_s: u64,
    pub wall_s: f64,
    pub repro: String,
    pub ops: OpCounts,
    pub faults: Vec<FaultRecord>,
    pub failpoints_fired: usize,
    pub leader_changes: usize,
    /// How the journal follower went (events compacted before the final read are checked
    /// from what it saw).
    pub journal_follower: crate::journal::FollowerStats,
    pub unknowns: UnknownCounts,
    pub liveness: String,
    pub converged_at_index: Option<u64>,
    pub digests: BTreeMap<u64, String>,
    pub check: CheckReport,
    pub out_dir: String,
    pub leader_samples: Vec<LeaderSample>,
    pub kernel: Option<KernelFigures>,
}

impl RunReport {
    pub fn passed(&self) -> bool {
        self.check.is_ok()
    }
}

pub fn count_ops(history: &[Op]) -> OpCounts {
    let mut counts = OpCounts {
        total: history.len(),
        ..OpCounts::default()
    };
    for op in history {
        *counts.by_kind.entry(op.kind.to_owned()).or_default() += 1;
        match &op.result {
            OpResult::Ok { decision } => {
                counts.ok += 1;
                counts.denied += usize::from(decision.outcome.is_denied());
            }
            OpResult::Fail { .. } => counts.fail += 1,
            OpResult::Info { .. } => counts.info += 1,
        }
    }
    counts
}

pub fn count_unknowns(resolutions: &[Resolution]) -> UnknownCounts {
    let mut counts = UnknownCounts {
        total: resolutions.len(),
        ..UnknownCounts::default()
    };
    for r in resolutions {
        match r.settlement {
            Settlement::Applied { .. } => counts.applied += 1,
            Settlement::NotApplied => counts.not_applied += 1,
            Settlement::Refused { .. } => counts.refused += 1,
            Settlement::Unresolved { .. } => counts.unresolved += 1,
        }
    }
    counts
}

/// The one-screen summary.
pub fn summary(report: &RunReport) -> String {
    let mut s = String::new();
    let verdict = if report.passed() { "PASS" } else { "FAIL" };
    let _ = writeln!(
        s,
        "tally-chaos {verdict}: profile {} seed {} ({} s of faults, {:.0} s in all)",
        report.profile, report.seed, report.duration_s, report.wall_s
    );
    let o = &report.ops;
    let _ = writeln!(
        s,
        "operations: {} ({} ok incl. {} denied, {} failed definitely, {} unknown)",
        o.total, o.ok, o.denied, o.fail, o.info
    );
    let kinds: Vec<String> = o.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(s, "  by kind: {}", kinds.join(", "));
    let mut by_fault: BTreeMap<String, usize> = BTreeMap::new();
    for f in &report.faults {
        *by_fault
            .entry(
                serde_json::to_string(&f.kind)
                    .unwrap_or_default()
                    .replace('"', ""),
            )
            .or_default() += 1;
    }
    let faults: Vec<String> = by_fault.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let skipped = report
        .faults
        .iter()
        .filter(|f| f.detail.starts_with("skipped") || f.detail.contains("did not fire"))
        .count();
    let _ = writeln!(
        s,
        "faults: {} ({}); {} took no effect; failpoint aborts: {}",
        report.faults.len(),
        faults.join(", "),
        skipped,
        report.failpoints_fired
    );
    let _ = writeln!(s, "leader changes: {}", report.leader_changes);
    let f = &report.journal_follower;
    let _ = writeln!(
        s,
        "journal follower: {} family reads answered, {} unanswered{}",
        f.reads_answered,
        f.reads_unanswered,
        if f.full { ", stopped at its limit" } else { "" }
    );
    if let Some(k) = &report.kernel {
        let _ = writeln!(
            s,
            "kernels: {} processes, {} evaluations ({} allow, {} deny, {} no answer; {} twins) over {} request ids; {} kills",
            k.kernels, k.evaluations, k.allows, k.denies, k.errors, k.twin_evaluations, k.request_ids, k.kernel_kills
        );
        let _ = writeln!(
            s,
            "  tool dispatches {}, payments authorized {}, captured {}, receipts {}",
            k.dispatches, k.payment_authorizations, k.payment_captures, k.receipts
        );
    }
    let u = &report.unknowns;
    let _ = writeln!(
        s,
        "unknowns: {} resolved by ResolveEvent: {} applied, {} not applied, {} refused, {} unresolved",
        u.total, u.applied, u.not_applied, u.refused, u.unresolved
    );
    let _ = writeln!(s, "liveness: {}", report.liveness);
    let distinct: std::collections::BTreeSet<&String> = report.digests.values().collect();
    let _ = writeln!(
        s,
        "replicas: {} at applied index {:?}, {} distinct digest(s)",
        report.digests.len(),
        report.converged_at_index,
        distinct.len()
    );
    let c = &report.check;
    let _ = writeln!(
        s,
        "checked: {} ops, {} events ({} compacted before the final read, followed during the \
         run; {} more by compact record), {} holds, {} accounts ({} whose last change was \
         compacted unseen), {} replicas",
        c.ops_checked,
        c.events_checked,
        c.events_followed_only,
        c.compact_records_checked,
        c.holds_checked,
        c.accounts_checked,
        c.rows_unobserved,
        c.replicas_compared
    );
    if let Some(k) = &c.kernel {
        let _ = writeln!(
            s,
            "  kernel receipts {} (signatures verified), {} events cross-checked with the journal, {} ambiguous left to the reconciler",
            k.receipts_checked, k.events_cross_checked, k.ambiguous_unresolved
        );
    }
    if c.violations.is_empty() {
        let _ = writeln!(
            s,
            "violations: none (docs/spec.md §11 invariants 1-10 hold)"
        );
    } else {
        let _ = writeln!(
            s,
            "violations: {} (invariants {:?})",
            c.violations.len(),
            c.violated()
        );
        for v in c.violations.iter().take(10) {
            let _ = writeln!(s, "  [{}] {}", v.invariant, v.message);
        }
    }
    let _ = writeln!(s, "out: {}", report.out_dir);
    let _ = writeln!(s, "replay: {}", report.repro);
    s
}

/// Writes `report.json`, `summary.txt` and `history.json` into `dir`.
pub fn write_files(
    dir: &Path,
    report: &RunReport,
    history: &[Op],
    resolutions: &[Resolution],
) -> std::io::Result<()> {
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?,
    )?;
    std::fs::write(dir.join("summary.txt"), summary(report))?;
    std::fs::write(
        dir.join("history.json"),
        serde_json::to_vec(&serde_json::json!({
            "ops": history,
            "resolutions": resolutions,
        }))
        .map_err(std::io::Error::other)?,
    )?;
    Ok(())
}
