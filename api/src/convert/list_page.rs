//! Pages of the cross-family list reads (`ListUsages`, `ListHolds`): each row with its family,
//! and where the page ended when it came back full.

use tally_ledger::{FamilyId, Hold, HoldPosition, UsagePosition, UsageRecord};

use super::{optional_into, required};
use crate::error::WireError;
use crate::pb;

/// One page of `ListUsages`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsagePage {
    pub rows: Vec<(FamilyId, UsageRecord)>,
    /// Set when the page is full: pass it as `after` for the next page.
    pub next: Option<UsagePosition>,
}

/// One page of `ListHolds`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldPage {
    pub holds: Vec<(FamilyId, Hold)>,
    /// Set when the page is full: pass it as `HoldFilter::after` for the next page.
    pub next: Option<HoldPosition>,
}

impl From<&UsagePosition> for pb::UsagePosition {
    fn from(position: &UsagePosition) -> Self {
        Self {
            updated_at_ms: position.updated_at_ms,
            account: Some((&position.key).into()),
            family_id: position.family_id.to_string(),
        }
    }
}

impl TryFrom<pb::UsagePosition> for UsagePosition {
    type Error = WireError;

    fn try_from(position: pb::UsagePosition) -> Result<Self, WireError> {
        Ok(Self {
            updated_at_ms: position.updated_at_ms,
            key: required(position.account, "account")?.into(),
            family_id: position.family_id.into(),
        })
    }
}

impl From<&HoldPosition> for pb::HoldPosition {
    fn from(position: &HoldPosition) -> Self {
        Self {
            created_at_ms: position.created_at_ms,
            family_id: position.family_id.to_string(),
            hold_id: position.hold_id.to_string(),
        }
    }
}

impl From<pb::HoldPosition> for HoldPosition {
    fn from(position: pb::HoldPosition) -> Self {
        Self {
            created_at_ms: position.created_at_ms,
            family_id: position.family_id.into(),
            hold_id: position.hold_id.into(),
        }
    }
}

impl pb::ListUsagesReply {
    /// A page of `limit` rows at most: `next` is set when it holds `limit` rows.
    pub fn from_rows(rows: &[(FamilyId, UsageRecord)], limit: usize) -> Self {
        let next = (rows.len() >= limit)
            .then(|| rows.last())
            .flatten()
            .map(|(family_id, row)| (&UsagePosition::of(family_id, row)).into());
        Self {
            usages: rows
                .iter()
                .map(|(family_id, row)| pb::UsageRecord::of_family(family_id, row))
                .collect(),
            next,
        }
    }

    pub fn into_page(self) -> Result<UsagePage, WireError> {
        let rows = self
            .usages
            .into_iter()
            .enumerate()
            .map(|(i, row)| {
                let at = |e: WireError| e.at(&format!("usages[{i}]"));
                let family_id = family_of_row(&row.family_id).map_err(at)?;
                Ok((family_id, UsageRecord::try_from(row).map_err(at)?))
            })
            .collect::<Result<_, WireError>>()?;
        Ok(UsagePage {
            rows,
            next: optional_into(self.next, "next")?,
        })
    }
}

impl pb::ListHoldsReply {
    /// A page of `limit` holds at most: `next` is set when it holds `limit` holds.
    pub fn from_holds(holds: &[(FamilyId, Hold)], limit: usize) -> Self {
        let next = (holds.len() >= limit)
            .then(|| holds.last())
            .flatten()
            .map(|(family_id, hold)| (&HoldPosition::of(family_id, hold)).into());
        Self {
            holds: holds
                .iter()
                .map(|(family_id, hold)| pb::Hold::of_family(family_id, hold))
                .collect(),
            next,
        }
    }

    pub fn into_page(self) -> Result<HoldPage, WireError> {
        let holds = self
            .holds
            .into_iter()
            .enumerate()
            .map(|(i, hold)| {
                let at = |e: WireError| e.at(&format!("holds[{i}]"));
                let family_id = family_of_row(&hold.family_id).map_err(at)?;
                Ok((family_id, Hold::try_from(hold).map_err(at)?))
            })
            .collect::<Result<_, WireError>>()?;
        Ok(HoldPage {
            holds,
            next: self.next.map(Into::into),
        })
    }
}

/// A list row names its family: without it a row of a cross-family list cannot be addressed.
fn family_of_row(family_id: &str) -> Result<FamilyId, WireError> {
    if family_id.is_empty() {
        return Err(WireError::missing("family_id"));
    }
    Ok(FamilyId::from(family_id))
}
