//! Invariants 1 (no overspend) and 2 (no over-admission), at every committed state the
//! journal shows (each event's after-images) and in the final rows and holds.

use std::collections::BTreeMap;

use tally_ledger::{Account, AccountKey};

use super::{CheckReport, FamilyState};

pub(super) fn check_limits(family: &FamilyState, report: &mut CheckReport) {
    let name = family.family.as_str();
    for event in &family.events {
        for image in &event.after_images {
            let at = format!("after event {} ({})", event.event_id, event.commit_index.0);
            check_account(name, &image.key, &image.account, &at, report);
        }
    }
    let mut limits = BTreeMap::new();
    for usage in &family.usages {
        check_account(name, &usage.key, &usage.account, "final row", report);
        limits.insert(usage.key.clone(), usage.account.limits.clone());
    }
    for hold in &family.holds {
        if hold.realized_units > hold.authorized_exposure_units {
            report.report(
                1,
                Some(name),
                format!(
                    "hold {}: realized {} > authorized {}",
                    hold.hold_id, hold.realized_units, hold.authorized_exposure_units
                ),
            );
        }
        for key in &hold.accounts {
            let per_call = limits
                .get(key)
                .and_then(|l| l.max_cost_per_invocation_units);
            if let Some(max) = per_call {
                if hold.authorized_exposure_units > max {
                    report.report(
                        1,
                        Some(name),
                        format!(
                            "hold {}: exposure {} > max_cost_per_invocation {max} of {key:?}",
                            hold.hold_id, hold.authorized_exposure_units
                        ),
                    );
                }
            }
        }
    }
}

fn check_account(
    family: &str,
    key: &AccountKey,
    account: &Account,
    at: &str,
    report: &mut CheckReport,
) {
    let committed = account
        .total_cost_exposed_units
        .checked_add(account.total_cost_realized_spend_units);
    match (committed, account.limits.max_total_cost_units) {
        (None, _) => report.report(
            1,
            Some(family),
            format!("{key:?} {at}: committed cost overflows"),
        ),
        (Some(committed), Some(max)) if committed > max => report.report(
            1,
            Some(family),
            format!("{key:?} {at}: committed {committed} > max_total_cost {max} (overspend)"),
        ),
        _ => {}
    }
    if let Some(max) = account.limits.max_invocations {
        let used = u64::from(account.reserved_invocations)
            + u64::from(account.captured_invocations)
            + u64::from(account.legacy_unheld.count);
        if used > u64::from(max) {
            report.report(
                2,
                Some(family),
                format!("{key:?} {at}: {used} slots in use > max_invocations {max}"),
            );
        }
    }
}
