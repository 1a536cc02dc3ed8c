//! The budget row of one `(capability_id, grant_index)` (docs/spec.md §2) and its admission checks.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::commit_index::BudgetCommitIndex;
use crate::decision::{DenyReason, DenyRule};
use crate::error::{checked_add, checked_add_u32, LedgerError};
use crate::ids::CapabilityId;
use crate::limits::{MAX_CURRENCY_BYTES, MAX_GRANT_INDEX};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AccountKey {
    pub capability_id: CapabilityId,
    pub grant_index: u32,
}

impl AccountKey {
    pub fn new(capability_id: impl Into<CapabilityId>, grant_index: u32) -> Self {
        Self {
            capability_id: capability_id.into(),
            grant_index,
        }
    }

    pub fn validate(&self) -> Result<(), LedgerError> {
        self.capability_id.validate()?;
        validate_grant_index(self.grant_index)
    }
}

pub(crate) fn validate_grant_index(grant_index: u32) -> Result<(), LedgerError> {
    if grant_index > MAX_GRANT_INDEX {
        return Err(LedgerError::invalid(
            "grant_index",
            format!("is {grant_index}, at most {MAX_GRANT_INDEX} allowed"),
        ));
    }
    Ok(())
}

/// A grant's limits. Pinned by the first allowed command on the account: they come from the
/// immutable grant, so a later command naming other values is a bug in the caller.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GrantLimits {
    pub max_invocations: Option<u32>,
    pub max_cost_per_invocation_units: Option<u64>,
    pub max_total_cost_units: Option<u64>,
    /// Every monetary grant has exactly one currency; a grant with no cost limits may have none.
    pub currency: Option<Arc<str>>,
}

impl GrantLimits {
    pub fn invocations(max_invocations: u32) -> Self {
        Self {
            max_invocations: Some(max_invocations),
            ..Self::default()
        }
    }

    pub fn monetary(
        max_invocations: Option<u32>,
        max_cost_per_invocation_units: Option<u64>,
        max_total_cost_units: Option<u64>,
        currency: &str,
    ) -> Self {
        Self {
            max_invocations,
            max_cost_per_invocation_units,
            max_total_cost_units,
            currency: Some(currency.into()),
        }
    }

    pub fn is_monetary(&self) -> bool {
        self.max_cost_per_invocation_units.is_some() || self.max_total_cost_units.is_some()
    }

    pub fn validate(&self, field: &str) -> Result<(), LedgerError> {
        if let Some(currency) = &self.currency {
            let ok = !currency.is_empty()
                && currency.len() <= MAX_CURRENCY_BYTES
                && currency.bytes().all(|b| b.is_ascii_alphanumeric());
            if !ok {
                return Err(LedgerError::invalid(
                    field,
                    format!("currency {currency:?} must be 1-{MAX_CURRENCY_BYTES} ASCII letters or digits"),
                ));
            }
        } else if self.is_monetary() {
            return Err(LedgerError::invalid(field, "cost limits need a currency"));
        }
        Ok(())
    }
}

/// What legacy commands without a hold added; only legacy undos take from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyUnheld {
    pub count: u32,
    pub exposed_units: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub limits: GrantLimits,
    /// reserved + captured + legacy increments.
    pub invocation_count: u32,
    pub reserved_invocations: u32,
    pub captured_invocations: u32,
    pub legacy_unheld: LegacyUnheld,
    pub total_cost_exposed_units: u64,
    pub total_cost_realized_spend_units: u64,
    /// Commit index of the last event that changed this row.
    pub seq: BudgetCommitIndex,
    pub updated_at_ms: u64,
}

impl Account {
    pub fn new(limits: GrantLimits) -> Self {
        Self {
            limits,
            invocation_count: 0,
            reserved_invocations: 0,
            captured_invocations: 0,
            legacy_unheld: LegacyUnheld::default(),
            total_cost_exposed_units: 0,
            total_cost_realized_spend_units: 0,
            seq: BudgetCommitIndex(0),
            updated_at_ms: 0,
        }
    }

    /// `exposed + realized`: every limit check compares against this.
    pub fn committed_cost_units(&self) -> Result<u64, LedgerError> {
        checked_add(
            self.total_cost_exposed_units,
            self.total_cost_realized_spend_units,
            "committed cost",
        )
    }

    /// Pinned limits must match exactly (`None` vs `Some` included).
    pub fn check_pinned(&self, limits: &GrantLimits) -> Result<(), LedgerError> {
        if &self.limits != limits {
            return Err(LedgerError::invalid(
                "limits",
                format!(
                    "limits changed: the account pinned {:?}, the command names {limits:?}",
                    self.limits
                ),
            ));
        }
        Ok(())
    }

    /// The admission checks of `AuthorizeHold`/`TryChargeCost` in docs/spec.md order: quota, per
    /// call cost, total cost. `Ok(Some)` is a denial; `Err` is an overflow.
    pub fn admit(
        &self,
        key: &AccountKey,
        requested_units: u64,
        check_cost: bool,
    ) -> Result<Option<DenyReason>, LedgerError> {
        let deny = |rule| {
            Ok(Some(DenyReason {
                rule,
                account: key.clone(),
            }))
        };
        if let Some(max) = self.limits.max_invocations {
            if self.invocation_count >= max {
                return deny(DenyRule::InvocationLimit);
            }
        }
        if !check_cost {
            return Ok(None);
        }
        if let Some(max) = self.limits.max_cost_per_invocation_units {
            if requested_units > max {
                return deny(DenyRule::PerInvocationCostLimit);
            }
        }
        if let Some(max) = self.limits.max_total_cost_units {
            if checked_add(
                self.committed_cost_units()?,
                requested_units,
                "committed + requested",
            )? > max
            {
                return deny(DenyRule::TotalCostLimit);
            }
        }
        Ok(None)
    }

    /// count+1, exposure+=units, and either reserved+1 (a hold) or the legacy bucket.
    pub fn admitted(&self, units: u64, legacy: bool) -> Result<Self, LedgerError> {
        let mut next = self.clone();
        next.invocation_count = checked_add_u32(next.invocation_count, 1, "invocation_count")?;
        next.total_cost_exposed_units =
            checked_add(next.total_cost_exposed_units, units, "total_cost_exposed")?;
        if legacy {
            next.legacy_unheld.count =
                checked_add_u32(next.legacy_unheld.count, 1, "legacy count")?;
            next.legacy_unheld.exposed_units =
                checked_add(next.legacy_unheld.exposed_units, units, "legacy exposed")?;
        } else {
            next.reserved_invocations =
                checked_add_u32(next.reserved_invocations, 1, "reserved_invocations")?;
        }
        Ok(next)
    }

    /// Takes `next`'s totals. The limits are pinned when the row is created and never change,
    /// so they are checked, not copied: a copy would update the reference count of the shared
    /// currency string twice for every account every command changes.
    pub(crate) fn take_totals(&mut self, next: &Account) {
        assert!(
            self.limits == next.limits,
            "an account's pinned limits changed from {:?} to {:?}",
            self.limits,
            next.limits
        );
        let Account {
            limits: _,
            invocation_count,
            reserved_invocations,
            captured_invocations,
            legacy_unheld,
            total_cost_exposed_units,
            total_cost_realized_spend_units,
            seq,
            updated_at_ms,
        } = next;
        self.invocation_count = *invocation_count;
        self.reserved_invocations = *reserved_invocations;
        self.captured_invocations = *captured_invocations;
        self.legacy_unheld = *legacy_unheld;
        self.total_cost_exposed_units = *total_cost_exposed_units;
        self.total_cost_realized_spend_units = *total_cost_realized_spend_units;
        self.seq = *seq;
        self.updated_at_ms = *updated_at_ms;
    }

    /// The row's own consistency, asserted after every change.
    pub fn assert_consistent(&self, key: &AccountKey) {
        let slots = u64::from(self.reserved_invocations)
            + u64::from(self.captured_invocations)
            + u64::from(self.legacy_unheld.count);
        assert_eq!(
            u64::from(self.invocation_count),
            slots,
            "account {key:?}: invocation_count must equal reserved + captured + legacy"
        );
        assert!(
            self.legacy_unheld.exposed_units <= self.total_cost_exposed_units,
            "account {key:?}: legacy exposure exceeds total exposure"
        );
    }
}

/// A read of one account (docs/spec.md §7).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    pub key: AccountKey,
    pub account: Account,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AccountKey {
        AccountKey::new("cap", 0)
    }

    #[test]
    fn admission_checks_quota_then_per_call_then_total() {
        let mut account = Account::new(GrantLimits::monetary(Some(1), Some(100), Some(150), "USD"));
        assert_eq!(account.admit(&key(), 100, true), Ok(None));
        let rule = |a: &Account, units| {
            a.admit(&key(), units, true)
                .expect("no overflow")
                .map(|d| d.rule)
        };
        assert_eq!(rule(&account, 101), Some(DenyRule::PerInvocationCostLimit));
        account.total_cost_realized_spend_units = 100;
        assert_eq!(rule(&account, 60), Some(DenyRule::TotalCostLimit));
        account.invocation_count = 1;
        account.captured_invocations = 1;
        assert_eq!(rule(&account, 500), Some(DenyRule::InvocationLimit));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let mut account = Account::new(GrantLimits::monetary(None, None, Some(u64::MAX), "USD"));
        account.total_cost_exposed_units = u64::MAX;
        assert!(matches!(
            account.admit(&key(), 1, true),
            Err(LedgerError::Overflow { .. })
        ));
        assert!(matches!(
            account.admitted(1, false),
            Err(LedgerError::Overflow { .. })
        ));
    }

    #[test]
    fn pinned_limits_distinguish_none_from_some() {
        let account = Account::new(GrantLimits::monetary(None, Some(5), None, "USD"));
        let mut other = account.limits.clone();
        other.max_total_cost_units = Some(u64::MAX);
        assert!(account.check_pinned(&other).is_err());
        assert!(account.check_pinned(&account.limits.clone()).is_ok());
    }

    #[test]
    fn currency_is_validated() {
        assert!(GrantLimits::monetary(None, Some(1), None, "")
            .validate("limits")
            .is_err());
        assert!(GrantLimits::monetary(None, Some(1), None, "US D")
            .validate("limits")
            .is_err());
        let no_currency = GrantLimits {
            max_total_cost_units: Some(1),
            ..GrantLimits::default()
        };
        assert!(no_currency.validate("limits").is_err());
        assert!(GrantLimits::invocations(3).validate("limits").is_ok());
    }
}
