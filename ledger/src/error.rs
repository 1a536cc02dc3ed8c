//! Errors: a command that errors changes nothing and appends nothing (except the expiry of a
//! hold it touched, docs/spec.md §4). Denials are not errors; they are decisions.

use serde::{Deserialize, Serialize};

/// Why a command could not apply in the current state (docs/spec.md §10: `FAILED_PRECONDITION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreconditionCode {
    UnknownHold,
    HoldOnOtherAccount,
    HoldExpired,
    HoldNotAuthorized,
    HoldNotCaptured,
    DispatchFenceCrossed,
    NoRemainingExposure,
    ExposureMismatch,
    ReleaseExceedsRemaining,
    AlreadyReconciled,
    PartiallyReleased,
    TerminallyReversed,
    Superseded,
    EventAborted,
    CommandExpired,
    NoAccount,
    LegacyBucketShort,
    NonceReplayed,
    NonceExpired,
    NonceLifetimeTooLong,
    FamilyFull,
    HoldArchived,
}

impl PreconditionCode {
    /// Stable snake_case code for the wire and for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownHold => "unknown_hold",
            Self::HoldOnOtherAccount => "hold_on_other_account",
            Self::HoldExpired => "hold_expired",
            Self::HoldNotAuthorized => "hold_not_authorized",
            Self::HoldNotCaptured => "hold_not_captured",
            Self::DispatchFenceCrossed => "dispatch_fence_crossed",
            Self::NoRemainingExposure => "no_remaining_exposure",
            Self::ExposureMismatch => "exposure_mismatch",
            Self::ReleaseExceedsRemaining => "release_exceeds_remaining",
            Self::AlreadyReconciled => "already_reconciled",
            Self::PartiallyReleased => "partially_released",
            Self::TerminallyReversed => "terminally_reversed",
            Self::Superseded => "superseded",
            Self::EventAborted => "event_aborted",
            Self::CommandExpired => "command_expired",
            Self::NoAccount => "no_account",
            Self::LegacyBucketShort => "legacy_bucket_short",
            Self::NonceReplayed => "nonce_replayed",
            Self::NonceExpired => "nonce_expired",
            Self::NonceLifetimeTooLong => "nonce_lifetime_too_long",
            Self::FamilyFull => "family_full",
            Self::HoldArchived => "hold_archived",
        }
    }
}

/// Why an event id names a different command (docs/spec.md §5.3: `ALREADY_EXISTS`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConflictReason {
    /// Same `event_id`, different canonical identity: every differing field, by name. When
    /// the original was compacted only its digest is left, and the field is `identity`.
    EventIdentity { differing_fields: Vec<String> },
    /// A new authorize named a `hold_id` already claimed (even by a denied authorize).
    HoldReused { hold_id: String },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LedgerError {
    #[error("invalid argument: {field} {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("conflict: {0:?}")]
    Conflict(ConflictReason),
    #[error("failed precondition ({}): {message}", code.as_str())]
    FailedPrecondition {
        code: PreconditionCode,
        message: String,
    },
    #[error("arithmetic overflow in {what}")]
    Overflow { what: String },
    /// The `NoSpace` alarm is raised (docs/spec.md §5.6): a command that opens new exposure
    /// is refused, definitely (not applied, not recorded: the same event id applies once the
    /// alarm is cleared). `RESOURCE_EXHAUSTED` on the wire.
    #[error("no space: {message}")]
    NoSpace { message: String },
}

impl LedgerError {
    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    pub fn precondition(code: PreconditionCode, message: impl Into<String>) -> Self {
        Self::FailedPrecondition {
            code,
            message: message.into(),
        }
    }

    pub fn overflow(what: &str) -> Self {
        Self::Overflow {
            what: what.to_owned(),
        }
    }

    /// The refusal of a command that opens new exposure while `NoSpace` is raised.
    pub fn no_space(operation: &str) -> Self {
        Self::NoSpace {
            message: format!(
                "the NoSpace alarm is raised: {operation} opens new exposure and is refused \
                 until an operator clears the alarm (`tally alarm list`)"
            ),
        }
    }

    pub fn conflict_fields(differing_fields: Vec<String>) -> Self {
        assert!(
            !differing_fields.is_empty(),
            "a conflict must name at least one field"
        );
        Self::Conflict(ConflictReason::EventIdentity { differing_fields })
    }

    /// The precondition code, when this is a `FailedPrecondition`.
    pub fn precondition_code(&self) -> Option<PreconditionCode> {
        match self {
            Self::FailedPrecondition { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Checked arithmetic helpers: an overflow is an error and changes nothing.
pub(crate) fn checked_add(a: u64, b: u64, what: &str) -> Result<u64, LedgerError> {
    a.checked_add(b).ok_or_else(|| LedgerError::overflow(what))
}

pub(crate) fn checked_sub(a: u64, b: u64, what: &str) -> Result<u64, LedgerError> {
    a.checked_sub(b).ok_or_else(|| LedgerError::overflow(what))
}

pub(crate) fn checked_add_u32(a: u32, b: u32, what: &str) -> Result<u32, LedgerError> {
    a.checked_add(b).ok_or_else(|| LedgerError::overflow(what))
}

pub(crate) fn checked_sub_u32(a: u32, b: u32, what: &str) -> Result<u32, LedgerError> {
    a.checked_sub(b).ok_or_else(|| LedgerError::overflow(what))
}
