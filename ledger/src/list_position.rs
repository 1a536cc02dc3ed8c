//! Positions in the orders of the list reads (docs/spec.md §7), across families: where one page
//! ended, so the next starts strictly after it. A list read returns at most
//! `MAX_LIST_LIMIT` rows; with a position, a caller reads every row page by page.
//!
//! Each order ends with the family id (and, for holds, the hold id), so no two rows share a
//! position and a page never repeats or skips a row that stayed where it was. Holds sort by
//! creation time, which never changes; an account that changes between two pages moves to
//! the front of the usage order (most recently updated first), ahead of the position.

use std::cmp::{Ordering, Reverse};

use crate::account::{AccountKey, UsageRecord};
use crate::error::LedgerError;
use crate::hold::Hold;
use crate::ids::{FamilyId, HoldId};

/// A row of `ListUsages`: `(updated_at_ms desc, capability_id, grant_index, family_id)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsagePosition {
    pub updated_at_ms: u64,
    pub key: AccountKey,
    pub family_id: FamilyId,
}

impl UsagePosition {
    /// The position of `row` of `family_id`.
    pub fn of(family_id: &FamilyId, row: &UsageRecord) -> Self {
        Self {
            updated_at_ms: row.account.updated_at_ms,
            key: row.key.clone(),
            family_id: family_id.clone(),
        }
    }

    /// Its ids are valid ids (a reply's `next` holds only such), named as `after.*` fields.
    pub fn validate(&self) -> Result<(), LedgerError> {
        (self.family_id.validate())
            .and_then(|()| self.key.validate())
            .map_err(in_position)
    }

    /// Where `row` of `family_id` sorts relative to this position.
    pub fn compare_row(&self, family_id: &FamilyId, row: &UsageRecord) -> Ordering {
        usage_sort_key(family_id, row).cmp(&(
            Reverse(self.updated_at_ms),
            &self.key,
            &self.family_id,
        ))
    }
}

/// The order of `ListUsages` rows across families.
pub fn usage_order(a: (&FamilyId, &UsageRecord), b: (&FamilyId, &UsageRecord)) -> Ordering {
    usage_sort_key(a.0, a.1).cmp(&usage_sort_key(b.0, b.1))
}

fn usage_sort_key<'r>(
    family_id: &'r FamilyId,
    row: &'r UsageRecord,
) -> (Reverse<u64>, &'r AccountKey, &'r FamilyId) {
    (Reverse(row.account.updated_at_ms), &row.key, family_id)
}

/// A row of `ListHolds`: `(created_at_ms, family_id, hold_id)`, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldPosition {
    pub created_at_ms: u64,
    pub family_id: FamilyId,
    pub hold_id: HoldId,
}

impl HoldPosition {
    /// The position of `hold` of `family_id`.
    pub fn of(family_id: &FamilyId, hold: &Hold) -> Self {
        Self {
            created_at_ms: hold.created_at_ms,
            family_id: family_id.clone(),
            hold_id: hold.hold_id.clone(),
        }
    }

    /// Its ids are valid ids (a reply's `next` holds only such), named as `after.*` fields.
    pub fn validate(&self) -> Result<(), LedgerError> {
        (self.family_id.validate())
            .and_then(|()| self.hold_id.validate())
            .map_err(in_position)
    }

    /// Where `hold` of `family_id` sorts relative to this position.
    pub fn compare_hold(&self, family_id: &FamilyId, hold: &Hold) -> Ordering {
        hold_sort_key(family_id, hold).cmp(&(self.created_at_ms, &self.family_id, &self.hold_id))
    }
}

/// The order of `ListHolds` rows across families.
pub fn hold_order(a: (&FamilyId, &Hold), b: (&FamilyId, &Hold)) -> Ordering {
    hold_sort_key(a.0, a.1).cmp(&hold_sort_key(b.0, b.1))
}

fn hold_sort_key<'h>(family_id: &'h FamilyId, hold: &'h Hold) -> (u64, &'h FamilyId, &'h HoldId) {
    (hold.created_at_ms, family_id, &hold.hold_id)
}

/// An id's error as the error of the position field that holds it.
fn in_position(error: LedgerError) -> LedgerError {
    match error {
        LedgerError::InvalidArgument { field, reason } => LedgerError::InvalidArgument {
            field: format!("after.{field}"),
            reason,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_ID_BYTES;

    fn field_of(error: LedgerError) -> String {
        match error {
            LedgerError::InvalidArgument { field, .. } => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_position_with_an_invalid_id_names_the_position_field() {
        let usage = UsagePosition {
            updated_at_ms: 1,
            key: AccountKey::new("cap", 0),
            family_id: "fam".into(),
        };
        assert_eq!(usage.validate(), Ok(()));
        let bad_family = UsagePosition {
            family_id: "".into(),
            ..usage.clone()
        };
        assert_eq!(
            field_of(bad_family.validate().unwrap_err()),
            "after.family_id"
        );
        let bad_capability = UsagePosition {
            key: AccountKey::new("c".repeat(MAX_ID_BYTES + 1), 0),
            ..usage.clone()
        };
        assert_eq!(
            field_of(bad_capability.validate().unwrap_err()),
            "after.capability_id"
        );
        let bad_grant = UsagePosition {
            key: AccountKey::new("cap", u32::MAX),
            ..usage
        };
        assert_eq!(
            field_of(bad_grant.validate().unwrap_err()),
            "after.grant_index"
        );

        let hold = HoldPosition {
            created_at_ms: 1,
            family_id: "fam".into(),
            hold_id: "h".into(),
        };
        assert_eq!(hold.validate(), Ok(()));
        let bad_hold = HoldPosition {
            hold_id: "".into(),
            ..hold
        };
        assert_eq!(field_of(bad_hold.validate().unwrap_err()), "after.hold_id");
    }
}
