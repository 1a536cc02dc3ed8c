//! Accounts (docs/spec.md §2): keys, grant limits, rows and `GetUsage`/`ListUsages` records.

use tally_ledger::{
    Account, AccountKey, BudgetCommitIndex, FamilyId, GrantLimits, LegacyUnheld, UsageRecord,
};

use super::{required, required_into};
use crate::error::WireError;
use crate::pb;

impl From<&GrantLimits> for pb::GrantLimits {
    fn from(limits: &GrantLimits) -> Self {
        Self {
            max_invocations: limits.max_invocations,
            max_cost_per_invocation_units: limits.max_cost_per_invocation_units,
            max_total_cost_units: limits.max_total_cost_units,
            currency: limits.currency.as_deref().map(str::to_owned),
        }
    }
}

/// Infallible: every field is optional on both sides, and presence carries over exactly
/// (pinning tells `None` from `Some`).
impl From<pb::GrantLimits> for GrantLimits {
    fn from(limits: pb::GrantLimits) -> Self {
        Self {
            max_invocations: limits.max_invocations,
            max_cost_per_invocation_units: limits.max_cost_per_invocation_units,
            max_total_cost_units: limits.max_total_cost_units,
            currency: limits.currency.map(Into::into),
        }
    }
}

impl From<&AccountKey> for pb::AccountKey {
    fn from(key: &AccountKey) -> Self {
        Self {
            capability_id: key.capability_id.to_string(),
            grant_index: key.grant_index,
        }
    }
}

impl From<pb::AccountKey> for AccountKey {
    fn from(key: pb::AccountKey) -> Self {
        AccountKey::new(key.capability_id, key.grant_index)
    }
}

impl From<&Account> for pb::Account {
    fn from(account: &Account) -> Self {
        Self {
            limits: Some((&account.limits).into()),
            invocation_count: account.invocation_count,
            reserved_invocations: account.reserved_invocations,
            captured_invocations: account.captured_invocations,
            legacy_unheld: Some(pb::LegacyUnheld {
                count: account.legacy_unheld.count,
                exposed_units: account.legacy_unheld.exposed_units,
            }),
            total_cost_exposed_units: account.total_cost_exposed_units,
            total_cost_realized_spend_units: account.total_cost_realized_spend_units,
            seq: account.seq.0,
            updated_at_ms: account.updated_at_ms,
        }
    }
}

impl TryFrom<pb::Account> for Account {
    type Error = WireError;

    fn try_from(account: pb::Account) -> Result<Self, WireError> {
        let limits = required(account.limits, "limits")?.into();
        let legacy = required(account.legacy_unheld, "legacy_unheld")?;
        Ok(Self {
            limits,
            invocation_count: account.invocation_count,
            reserved_invocations: account.reserved_invocations,
            captured_invocations: account.captured_invocations,
            legacy_unheld: LegacyUnheld {
                count: legacy.count,
                exposed_units: legacy.exposed_units,
            },
            total_cost_exposed_units: account.total_cost_exposed_units,
            total_cost_realized_spend_units: account.total_cost_realized_spend_units,
            seq: BudgetCommitIndex(account.seq),
            updated_at_ms: account.updated_at_ms,
        })
    }
}

impl pb::UsageRecord {
    /// The row of an account of `family_id`.
    pub fn of_family(family_id: &FamilyId, record: &UsageRecord) -> Self {
        Self {
            key: Some((&record.key).into()),
            account: Some((&record.account).into()),
            family_id: family_id.to_string(),
        }
    }
}

impl TryFrom<pb::UsageRecord> for UsageRecord {
    type Error = WireError;

    fn try_from(record: pb::UsageRecord) -> Result<Self, WireError> {
        Ok(Self {
            key: required(record.key, "key")?.into(),
            account: required_into(record.account, "account")?,
        })
    }
}

impl pb::GetUsageReply {
    pub fn from_record(family_id: &FamilyId, record: Option<&UsageRecord>) -> Self {
        Self {
            usage: record.map(|record| pb::UsageRecord::of_family(family_id, record)),
        }
    }

    pub fn into_record(self) -> Result<Option<UsageRecord>, WireError> {
        super::optional_into(self.usage, "usage")
    }
}
