//! docs/spec.md §11 invariants that can be checked on one family's state alone. Tests, the
//! property test and the chaos checker call this after every step.

use std::collections::BTreeMap;

use crate::account::AccountKey;
use crate::family::Family;
use crate::hold::{HoldSlot, InvocationState};

impl Family {
    /// Every violated invariant, described; empty when the state is sound.
    pub fn invariant_violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        let mut exposure: BTreeMap<&AccountKey, u64> = BTreeMap::new();
        let mut reserved: BTreeMap<&AccountKey, u32> = BTreeMap::new();
        let mut live = 0;
        for (hold_id, slot) in self.holds.iter_unordered() {
            let HoldSlot::Live(hold) = slot else { continue };
            live += 1;
            let parts = hold.realized_units as u128
                + hold.unspent_units as u128
                + hold.released_units as u128
                + hold.reversed_units as u128
                + hold.remaining_exposure_units as u128;
            if parts != hold.authorized_exposure_units as u128 {
                violations.push(format!("hold {hold_id}: exposure not conserved"));
            }
            if hold.realized_units > hold.authorized_exposure_units {
                violations.push(format!("hold {hold_id}: realized exceeds authorized"));
            }
            for key in &hold.accounts {
                *exposure.entry(key).or_default() += hold.remaining_exposure_units;
                if hold.invocation_state == InvocationState::Authorized {
                    *reserved.entry(key).or_default() += 1;
                }
                if let Some(max) = self
                    .accounts
                    .get(key)
                    .and_then(|a| a.limits.max_cost_per_invocation_units)
                {
                    if hold.authorized_exposure_units > max {
                        violations.push(format!(
                            "hold {hold_id}: exposure above per-call limit of {key:?}"
                        ));
                    }
                }
            }
        }
        if live != self.live_holds {
            violations.push(format!(
                "live hold count {} but {live} live holds",
                self.live_holds
            ));
        }
        for (key, account) in &self.accounts {
            let committed = account.total_cost_exposed_units as u128
                + account.total_cost_realized_spend_units as u128;
            if let Some(max) = account.limits.max_total_cost_units {
                if committed > max as u128 {
                    violations.push(format!(
                        "account {key:?}: committed {committed} over limit {max}"
                    ));
                }
            }
            let slots = account.reserved_invocations as u64
                + account.captured_invocations as u64
                + account.legacy_unheld.count as u64;
            if slots != account.invocation_count as u64 {
                violations.push(format!(
                    "account {key:?}: invocation_count is not the sum of its slots"
                ));
            }
            if let Some(max) = account.limits.max_invocations {
                if slots > max as u64 {
                    violations.push(format!("account {key:?}: {slots} slots over quota {max}"));
                }
            }
            let held = exposure.get(key).copied().unwrap_or(0) as u128
                + account.legacy_unheld.exposed_units as u128;
            if held != account.total_cost_exposed_units as u128 {
                violations.push(format!(
                    "account {key:?}: exposure {} but holds and legacy fold to {held}",
                    account.total_cost_exposed_units
                ));
            }
            if reserved.get(key).copied().unwrap_or(0) != account.reserved_invocations {
                violations.push(format!(
                    "account {key:?}: reserved count does not fold from holds"
                ));
            }
        }
        violations
    }
}
