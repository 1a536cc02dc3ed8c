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
        let (usages, next) = wire_page(rows, limit, pb::UsageRecord::of_family, |f, row| {
            (&UsagePosition::of(f, row)).into()
        });
        Self { usages, next }
    }

    pub fn into_page(self) -> Result<UsagePage, WireError> {
        Ok(UsagePage {
            rows: rows_of_families(self.usages, "usages", |row| &row.family_id)?,
            next: optional_into(self.next, "next")?,
        })
    }
}

impl pb::ListHoldsReply {
    /// A page of `limit` holds at most: `next` is set when it holds `limit` holds.
    pub fn from_holds(holds: &[(FamilyId, Hold)], limit: usize) -> Self {
        let (holds, next) = wire_page(holds, limit, pb::Hold::of_family, |f, hold| {
            (&HoldPosition::of(f, hold)).into()
        });
        Self { holds, next }
    }

    pub fn into_page(self) -> Result<HoldPage, WireError> {
        Ok(HoldPage {
            holds: rows_of_families(self.holds, "holds", |hold| &hold.family_id)?,
            next: self.next.map(Into::into),
        })
    }
}

/// Each row on the wire, and the position of the last one when the page is full.
fn wire_page<T, W, P>(
    rows: &[(FamilyId, T)],
    limit: usize,
    wire: impl Fn(&FamilyId, &T) -> W,
    position: impl Fn(&FamilyId, &T) -> P,
) -> (Vec<W>, Option<P>) {
    let next = (rows.len() >= limit)
        .then(|| rows.last())
        .flatten()
        .map(|(family_id, row)| position(family_id, row));
    let wired = rows
        .iter()
        .map(|(family_id, row)| wire(family_id, row))
        .collect();
    (wired, next)
}

/// Each wire row decoded with the family it names; an error names the row (`field[i]`).
fn rows_of_families<W, T>(
    rows: Vec<W>,
    field: &str,
    family_of: impl Fn(&W) -> &String,
) -> Result<Vec<(FamilyId, T)>, WireError>
where
    T: TryFrom<W, Error = WireError>,
{
    rows.into_iter()
        .enumerate()
        .map(|(i, row)| {
            let at = |e: WireError| e.at(&format!("{field}[{i}]"));
            let family_id = family_of_row(family_of(&row)).map_err(at)?;
            Ok((family_id, T::try_from(row).map_err(at)?))
        })
        .collect()
}

/// A list row names its family: without it a row of a cross-family list cannot be addressed.
fn family_of_row(family_id: &str) -> Result<FamilyId, WireError> {
    if family_id.is_empty() {
        return Err(WireError::missing("family_id"));
    }
    Ok(FamilyId::from(family_id))
}
