//! How records become bytes: rmp-serde with field names.
//!
//! Field names cost a few bytes per record but keep old files readable when openraft adds an
//! optional field; the format marker in the meta table covers every other change.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::StoreError;

/// Encodes `value`; `what` names the record in the error.
pub(crate) fn encode<T: Serialize>(
    value: &T,
    what: impl FnOnce() -> String,
) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(value).map_err(|source| StoreError::Encode {
        what: what(),
        source,
    })
}

/// Decodes a stored record; `what` names the record in the error.
pub(crate) fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    what: impl FnOnce() -> String,
) -> Result<T, StoreError> {
    rmp_serde::from_slice(bytes).map_err(|source| StoreError::Decode {
        what: what(),
        source,
    })
}
