//! Identifier types. Ids are cheap to clone (shared, immutable strings) because the same
//! id is stored in the journal, the dedupe table and the hold it names.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::LedgerError;
use crate::limits::{MAX_ID_BYTES, RESERVED_EVENT_ID_PREFIX};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        ///
        /// Equal ids are often one shared string (a hold's id in its table row, its expiry
        /// entry and its records), so comparisons look at the pointer before the bytes.
        #[derive(Clone, PartialEq, Eq, Hash)]
        pub struct $name(Arc<str>);

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                if Arc::ptr_eq(&self.0, &other.0) {
                    std::cmp::Ordering::Equal
                } else {
                    self.0.cmp(&other.0)
                }
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl $name {
            /// Wraps any string; `validate` decides whether a client may use it.
            pub fn new(value: impl Into<Arc<str>>) -> Self {
                Self(value.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Non-empty and at most `MAX_ID_BYTES` long.
            pub fn validate(&self) -> Result<(), LedgerError> {
                validate_id($field, &self.0)
            }
        }

        impl $crate::tables::id_map::IdBytes for $name {
            fn id_bytes(&self) -> &[u8] {
                self.0.as_bytes()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::new(value)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self::new(value)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(IdVisitor).map(Self)
            }
        }
    };
}

/// Decodes an id's text into its string, shared with equal ids of the same decode
/// (`id_sharing.rs`); a borrowed text (`rmp_serde::from_slice`) is copied once, not twice.
struct IdVisitor;

impl<'de> serde::de::Visitor<'de> for IdVisitor {
    type Value = Arc<str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an id string")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(crate::id_sharing::shared(text))
    }
}

id_type!(
    /// The root capability of a delegation chain: the unit of placement and linearization.
    FamilyId,
    "family_id"
);
id_type!(
    /// A capability token's id.
    CapabilityId,
    "capability_id"
);
id_type!(
    /// A two-phase reservation, chosen by the kernel as a pure function of the request.
    HoldId,
    "hold_id"
);
id_type!(
    /// The dedupe key of a command (docs/spec.md §5).
    EventId,
    "event_id"
);
id_type!(
    /// One evaluation by one kernel; tells a kernel's own capture from its twin's.
    AttemptId,
    "attempt_id"
);
id_type!(
    /// An execution nonce consumed once per family.
    NonceId,
    "nonce_id"
);

impl EventId {
    /// Client ids may not start with the reserved `auto:` prefix.
    pub fn validate_client(&self) -> Result<(), LedgerError> {
        self.validate()?;
        if self.0.starts_with(RESERVED_EVENT_ID_PREFIX) {
            return Err(LedgerError::invalid(
                "event_id",
                format!(
                    "ids starting with {RESERVED_EVENT_ID_PREFIX:?} are reserved for the cluster"
                ),
            ));
        }
        Ok(())
    }

    /// The id of the `expire_hold` event the cluster appends for `hold_id`.
    pub fn for_expiry(hold_id: &HoldId) -> Self {
        Self::new(format!("{RESERVED_EVENT_ID_PREFIX}expire:{hold_id}"))
    }

    pub fn is_reserved(&self) -> bool {
        self.0.starts_with(RESERVED_EVENT_ID_PREFIX)
    }
}

/// Inlined: every command checks four or five ids, and the check is two comparisons; the
/// error is built out of line.
#[inline]
fn validate_id(field: &'static str, value: &str) -> Result<(), LedgerError> {
    if value.is_empty() || value.len() > MAX_ID_BYTES {
        return Err(invalid_id(field, value.len()));
    }
    Ok(())
}

#[cold]
fn invalid_id(field: &'static str, len: usize) -> LedgerError {
    if len == 0 {
        LedgerError::invalid(field, "must not be empty")
    } else {
        LedgerError::invalid(
            field,
            format!("is {len} bytes, at most {MAX_ID_BYTES} allowed"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_empty_oversized_and_reserved() {
        assert!(HoldId::from("").validate().is_err());
        assert!(HoldId::from("x".repeat(MAX_ID_BYTES)).validate().is_ok());
        assert!(HoldId::from("x".repeat(MAX_ID_BYTES + 1))
            .validate()
            .is_err());
        assert!(EventId::from("auto:x").validate_client().is_err());
        assert!(EventId::from("automatic").validate_client().is_ok());
    }

    #[test]
    fn ids_serialize_as_plain_strings() {
        let bytes = rmp_serde::to_vec(&FamilyId::from("fam")).expect("encode");
        let plain = rmp_serde::to_vec("fam").expect("encode");
        assert_eq!(bytes, plain);
        let back: FamilyId = rmp_serde::from_slice(&bytes).expect("decode");
        assert_eq!(back, FamilyId::from("fam"));
    }
}
