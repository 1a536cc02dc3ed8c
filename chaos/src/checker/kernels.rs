//! The kernel layer's checks (docs/spec.md §9, §11.3 and §11.6 through the kernels): per request
//! id at most one dispatch (the tool server's count), at most one payment authorization and
//! one capture (the rail's counts) and at most one `Allow` across every kernel's receipt log;
//! every receipt's signature verifies against the kernels' keys; every event a receipt names
//! with a commit index is applied in the cluster journal at that index
//! (`tally_kernel::receipt::cross_check`). Pure: the journal answers are fetched beforehand.

use std::collections::BTreeMap;

use serde::Serialize;
use tally_kernel::receipt::{cross_check, event_refs, CrossCheckError, EventClaim};
use tally_kernel::{verify_receipt, PublicKey, Receipt, TrustList, Verdict};
use tally_ledger::{EventId, EventLookup};

use super::CheckReport;

/// Everything the kernel checks need.
#[derive(Clone, Debug, Default)]
pub struct KernelCheckInput {
    /// Every receipt of every kernel's log.
    pub receipts: Vec<Receipt>,
    pub kernel_keys: Vec<PublicKey>,
    /// Tool server entries per request id.
    pub dispatches: BTreeMap<String, u64>,
    /// Rail (authorizations, captures) per request id.
    pub payments: BTreeMap<String, (u32, u32)>,
    /// `GetEvent` answers for the events the receipts name; missing ones are `Unknown`.
    pub journal: BTreeMap<EventId, EventLookup>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelCheckStats {
    pub receipts_checked: usize,
    pub events_cross_checked: usize,
    /// Ambiguous events (`*_ambiguous`, no commit index) the journal does not know yet: the
    /// reconciler's to settle; not a violation.
    pub ambiguous_unresolved: usize,
    pub request_ids: usize,
}

/// The events a receipt names as ambiguous: checked by `cross_check` only once resolvable.
fn ambiguous_events(receipt: &Receipt) -> Vec<EventId> {
    event_refs(&receipt.metadata)
        .map(|refs| {
            refs.into_iter()
                .filter(|r| r.claim == EventClaim::Ambiguous)
                .map(|r| r.event_id)
                .collect()
        })
        .unwrap_or_default()
}

pub fn check_kernels(input: &KernelCheckInput, report: &mut CheckReport) -> KernelCheckStats {
    let mut stats = KernelCheckStats::default();
    let trusted = TrustList::new(input.kernel_keys.iter().copied());
    let mut allows: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ids: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for receipt in &input.receipts {
        stats.receipts_checked += 1;
        ids.insert(&receipt.request_id);
        if let Err(error) = verify_receipt(receipt, &trusted) {
            report.report(
                6,
                receipt.family_id.as_ref().map(|f| f.as_str()),
                format!(
                    "kernel receipt {} (request {}): {error}",
                    receipt.receipt_id, receipt.request_id
                ),
            );
        }
        if receipt.verdict == Verdict::Allow {
            *allows.entry(&receipt.request_id).or_default() += 1;
        }
        // Ambiguous events the journal does not know are counted, then checked as settled
        // so the committed ones still get cross-checked.
        let mut journal = input.journal.clone();
        for event in ambiguous_events(receipt) {
            if !matches!(
                journal.get(&event),
                Some(EventLookup::Applied { .. } | EventLookup::Tombstoned)
            ) {
                stats.ambiguous_unresolved += 1;
                journal.insert(event, EventLookup::Tombstoned);
            }
        }
        match cross_check(receipt, &journal) {
            Ok(checked) => stats.events_cross_checked += checked.len(),
            Err(error) => {
                let invariant = match error {
                    CrossCheckError::Unresolved { .. } => 8,
                    _ => 6,
                };
                report.report(
                    invariant,
                    receipt.family_id.as_ref().map(|f| f.as_str()),
                    format!(
                        "kernel receipt {} (request {}, {:?}) disagrees with the journal: {error}",
                        receipt.receipt_id, receipt.request_id, receipt.verdict
                    ),
                );
            }
        }
    }
    for (request_id, n) in &allows {
        if *n > 1 {
            report.report(
                3,
                None,
                format!("request {request_id}: {n} Allow receipts across the kernels"),
            );
        }
    }
    for (request_id, n) in &input.dispatches {
        ids.insert(request_id);
        if *n > 1 {
            report.report(
                3,
                None,
                format!("request {request_id}: the tool server was entered {n} times"),
            );
        }
    }
    for (request_id, (authorizations, captures)) in &input.payments {
        if *authorizations > 1 || *captures > 1 {
            report.report(
                3,
                None,
                format!(
                    "request {request_id}: {authorizations} payment authorizations and {captures} captures on the rail"
                ),
            );
        }
    }
    stats.request_ids = ids.len();
    stats
}

#[cfg(test)]
mod tests {
    use tally_kernel::receipt::{
        BudgetAuthorityMetadata, BudgetStep, ReceiptDraft, ReceiptMetadata,
    };
    use tally_kernel::KeyPair;
    use tally_ledger::{BudgetCommitIndex, Decision, HoldId, Outcome};

    use super::*;

    fn key() -> KeyPair {
        KeyPair::from_seed(&[9; 32])
    }

    fn applied(event_id: &EventId, index: BudgetCommitIndex) -> EventLookup {
        EventLookup::Applied {
            decision: Decision {
                event_id: event_id.clone(),
                outcome: Outcome::Incremented,
                commit_index: Some(index),
                log_id: None,
                replayed: false,
            },
            record: None,
        }
    }

    /// An allowed receipt for `request` naming a committed authorize at `index`.
    fn receipt(request: &str, verdict: Verdict, index: BudgetCommitIndex) -> (Receipt, EventId) {
        let hold = HoldId::new(format!("budget-hold:{request}:cap-1:0"));
        let authorize = EventId::new(format!("{hold}:authorize"));
        let mut budget = BudgetAuthorityMetadata::new(hold);
        budget.committed(BudgetStep::Authorize, authorize.clone(), index);
        let metadata = ReceiptMetadata {
            budget_authority: Some(budget),
            ..ReceiptMetadata::default()
        };
        let receipt = ReceiptDraft::new(request, "chaos-tools", "compute", verdict, 1)
            .with_metadata(metadata.to_value())
            .sign(&key())
            .expect("sign");
        (receipt, authorize)
    }

    fn consistent() -> KernelCheckInput {
        let index = BudgetCommitIndex::new(7, 0, 0);
        let (allow, event) = receipt("req-1", Verdict::Allow, index);
        let (deny, _) = receipt("req-1", Verdict::Deny, index);
        let mut journal = BTreeMap::new();
        journal.insert(event.clone(), applied(&event, index));
        KernelCheckInput {
            receipts: vec![allow, deny],
            kernel_keys: vec![key().public_key()],
            dispatches: BTreeMap::from([("req-1".to_owned(), 1)]),
            payments: BTreeMap::from([("req-1".to_owned(), (1, 1))]),
            journal,
        }
    }

    fn run(input: &KernelCheckInput) -> (CheckReport, KernelCheckStats) {
        let mut report = CheckReport::default();
        let stats = check_kernels(input, &mut report);
        (report, stats)
    }

    #[test]
    fn a_consistent_kernel_history_passes() {
        let (report, stats) = run(&consistent());
        assert!(report.is_ok(), "{:?}", report.violations);
        assert_eq!(stats.receipts_checked, 2);
        assert_eq!(stats.events_cross_checked, 2);
        assert_eq!(stats.request_ids, 1);
    }

    #[test]
    fn double_dispatch_double_payment_and_two_allows_are_reported() {
        let mut input = consistent();
        input.dispatches.insert("req-1".into(), 2);
        input.payments.insert("req-2".into(), (2, 0));
        input.payments.insert("req-3".into(), (1, 2));
        let (second, _) = receipt("req-1", Verdict::Allow, BudgetCommitIndex::new(7, 0, 0));
        input.receipts.push(second);
        let (report, _) = run(&input);
        assert_eq!(report.violated(), vec![3]);
        let messages: Vec<&str> = report
            .violations
            .iter()
            .map(|v| v.message.as_str())
            .collect();
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert!(messages.iter().any(|m| m.contains("2 Allow receipts")));
        assert!(messages.iter().any(|m| m.contains("entered 2 times")));
        assert!(messages.iter().any(|m| m.contains("req-2")));
        assert!(messages.iter().any(|m| m.contains("req-3")));
    }

    #[test]
    fn a_forged_or_foreign_receipt_is_reported() {
        let mut input = consistent();
        input.receipts[0].reason = Some("edited after signing".into());
        let (report, _) = run(&input);
        assert_eq!(report.violated(), vec![6]);
        assert!(report.violations[0].message.contains("signature"));
        let mut input = consistent();
        input.kernel_keys = vec![KeyPair::from_seed(&[1; 32]).public_key()];
        let (report, _) = run(&input);
        assert_eq!(report.violations.len(), 2, "both receipts untrusted");
    }

    #[test]
    fn a_receipt_disagreeing_with_the_journal_is_reported() {
        let mut input = consistent();
        let event = input.journal.keys().next().cloned().expect("event");
        input.journal.insert(
            event.clone(),
            applied(&event, BudgetCommitIndex::new(8, 0, 0)),
        );
        let (report, _) = run(&input);
        assert_eq!(report.violated(), vec![6]);
        assert!(report.violations[0].message.contains("commit index"));
        let mut input = consistent();
        input.journal.clear();
        let (report, _) = run(&input);
        assert_eq!(report.violations.len(), 2, "missing from the journal");
        let mut input = consistent();
        input.journal.insert(event, EventLookup::Tombstoned);
        assert!(
            !run(&input).0.is_ok(),
            "a committed event cannot be tombstoned"
        );
    }

    #[test]
    fn an_unknown_ambiguous_event_is_counted_not_reported() {
        let hold = HoldId::new("budget-hold:req-9:cap-1:0");
        let mut budget = BudgetAuthorityMetadata::new(hold.clone());
        budget.ambiguous(
            BudgetStep::Authorize,
            EventId::new(format!("{hold}:authorize")),
        );
        let metadata = ReceiptMetadata {
            budget_authority: Some(budget),
            ..ReceiptMetadata::default()
        };
        let receipt = ReceiptDraft::new("req-9", "chaos-tools", "compute", Verdict::Deny, 1)
            .with_metadata(metadata.to_value())
            .sign(&key())
            .expect("sign");
        let input = KernelCheckInput {
            receipts: vec![receipt],
            kernel_keys: vec![key().public_key()],
            ..KernelCheckInput::default()
        };
        let (report, stats) = run(&input);
        assert!(report.is_ok(), "{:?}", report.violations);
        assert_eq!(stats.ambiguous_unresolved, 1);
    }
}
