//! Wire ↔ domain conversions, one file per type. Domain → wire is `From` (every domain value
//! has a wire form); wire → domain is `TryFrom` with a [`WireError`] naming the field path,
//! because a protobuf message may lack any field. Semantic checks (id lengths, limits) stay
//! in the ledger's `validate`, so the wire layer never second-guesses the rules.

pub mod command;
pub mod decision;
pub mod error;
pub mod event;
pub mod hold;
pub mod list_page;
pub mod params;
pub mod usage;

#[cfg(test)]
mod tests;

use crate::error::WireError;

/// A message field proto3 makes optional but the domain requires.
pub(crate) fn required<T>(value: Option<T>, field: &str) -> Result<T, WireError> {
    value.ok_or_else(|| WireError::missing(field))
}

/// A required message field, converted, with errors placed under `field`.
pub(crate) fn required_into<W, D>(value: Option<W>, field: &str) -> Result<D, WireError>
where
    D: TryFrom<W, Error = WireError>,
{
    D::try_from(required(value, field)?).map_err(|e| e.at(field))
}

/// An optional message field, converted, with errors placed under `field`.
pub(crate) fn optional_into<W, D>(value: Option<W>, field: &str) -> Result<Option<D>, WireError>
where
    D: TryFrom<W, Error = WireError>,
{
    value.map(D::try_from).transpose().map_err(|e| e.at(field))
}

/// A repeated message field, converted, with errors placed under `field[i]`.
pub(crate) fn repeated_into<W, D, C>(values: Vec<W>, field: &str) -> Result<C, WireError>
where
    D: TryFrom<W, Error = WireError>,
    C: FromIterator<D>,
{
    values
        .into_iter()
        .enumerate()
        .map(|(i, value)| D::try_from(value).map_err(|e| e.at(&format!("{field}[{i}]"))))
        .collect()
}

/// A protobuf enum field: unknown numbers and `UNSPECIFIED` (0) are refused, because every
/// domain enum is total and a default would silently pick a meaning.
pub(crate) fn enum_field<E>(raw: i32, field: &str) -> Result<E, WireError>
where
    E: TryFrom<i32>,
{
    if raw == 0 {
        return Err(WireError::missing(field));
    }
    E::try_from(raw).map_err(|_| WireError::invalid(field, format!("unknown enum value {raw}")))
}
