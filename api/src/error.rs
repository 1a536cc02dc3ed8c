//! Malformed wire input: what a protobuf message or Raft payload lacked or got wrong, named by
//! a field path a caller can act on (`commands[3].authorize_hold.limits`).

use tally_ledger::LedgerError;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A required message or oneof was absent.
    #[error("missing field {field}")]
    Missing { field: String },
    /// A field was present but cannot be represented in the domain (unknown enum value,
    /// unknown code, a nested ResolveEvent, ...).
    #[error("invalid field {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// A Raft payload from a node speaking another wire version.
    #[error("raft payload has wire version {found}, this node speaks {expected}")]
    UnknownVersion { found: u8, expected: u8 },
    /// A Raft payload that rmp-serde could not encode or decode.
    #[error("raft payload: {reason}")]
    Payload { reason: String },
}

impl WireError {
    pub fn missing(field: impl Into<String>) -> Self {
        Self::Missing {
            field: field.into(),
        }
    }

    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Prefixes the field path, so an error deep in a message names where it sits in the
    /// request (`prefix.field`).
    pub fn at(self, prefix: &str) -> Self {
        let join = |field: String| {
            if field.is_empty() {
                prefix.to_owned()
            } else if prefix.is_empty() {
                field
            } else {
                format!("{prefix}.{field}")
            }
        };
        match self {
            Self::Missing { field } => Self::Missing { field: join(field) },
            Self::Invalid { field, reason } => Self::Invalid {
                field: join(field),
                reason,
            },
            other => other,
        }
    }

    /// The field path, when the error names one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Missing { field } | Self::Invalid { field, .. } => Some(field),
            Self::UnknownVersion { .. } | Self::Payload { .. } => None,
        }
    }
}

/// A malformed client message is refused before proposing, like any other invalid argument
/// (docs/spec.md §10: `INVALID_ARGUMENT`, definite).
impl From<WireError> for LedgerError {
    fn from(error: WireError) -> Self {
        match error {
            WireError::Missing { field } => LedgerError::invalid(&field, "is required"),
            WireError::Invalid { field, reason } => LedgerError::invalid(&field, reason),
            other => LedgerError::invalid("payload", other.to_string()),
        }
    }
}
