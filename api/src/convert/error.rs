//! Errors (docs/spec.md §10): `LedgerError` → `ErrorDetail` for the status details and batch
//! results, and back, for the client. Errors that are not the ledger's (no leader, lost
//! outcome, node fault) have their own constructors and come back as [`RemoteError`].

use tally_ledger::{ConflictReason, EventId, LedgerError, PreconditionCode};

use crate::error::WireError;
use crate::pb;
use crate::pb::ErrorKind;

/// `reason` codes of the non-precondition kinds.
const EVENT_IDENTITY: &str = "event_identity";
const HOLD_REUSED: &str = "hold_reused";
const INVALID_ARGUMENT: &str = "invalid_argument";
const OVERFLOW: &str = "overflow";
const UNAVAILABLE: &str = "unavailable";
const UNKNOWN: &str = "unknown";
const INTERNAL: &str = "internal";
const UNAUTHENTICATED: &str = "unauthenticated";
const PERMISSION_DENIED: &str = "permission_denied";
const NO_SPACE: &str = "no_space";

/// Every precondition code, so a wire code parses back. `precondition_index` below fails to
/// compile when the ledger adds a code, which points here.
const PRECONDITION_CODES: [PreconditionCode; 22] = [
    PreconditionCode::UnknownHold,
    PreconditionCode::HoldOnOtherAccount,
    PreconditionCode::HoldExpired,
    PreconditionCode::HoldNotAuthorized,
    PreconditionCode::HoldNotCaptured,
    PreconditionCode::DispatchFenceCrossed,
    PreconditionCode::NoRemainingExposure,
    PreconditionCode::ExposureMismatch,
    PreconditionCode::ReleaseExceedsRemaining,
    PreconditionCode::AlreadyReconciled,
    PreconditionCode::PartiallyReleased,
    PreconditionCode::TerminallyReversed,
    PreconditionCode::Superseded,
    PreconditionCode::EventAborted,
    PreconditionCode::CommandExpired,
    PreconditionCode::NoAccount,
    PreconditionCode::LegacyBucketShort,
    PreconditionCode::NonceReplayed,
    PreconditionCode::NonceExpired,
    PreconditionCode::NonceLifetimeTooLong,
    PreconditionCode::FamilyFull,
    PreconditionCode::HoldArchived,
];

/// Exhaustive on purpose: a new ledger code is a compile error here until it is listed above.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn precondition_index(code: PreconditionCode) -> usize {
    use PreconditionCode::*;
    match code {
        UnknownHold => 0,
        HoldOnOtherAccount => 1,
        HoldExpired => 2,
        HoldNotAuthorized => 3,
        HoldNotCaptured => 4,
        DispatchFenceCrossed => 5,
        NoRemainingExposure => 6,
        ExposureMismatch => 7,
        ReleaseExceedsRemaining => 8,
        AlreadyReconciled => 9,
        PartiallyReleased => 10,
        TerminallyReversed => 11,
        Superseded => 12,
        EventAborted => 13,
        CommandExpired => 14,
        NoAccount => 15,
        LegacyBucketShort => 16,
        NonceReplayed => 17,
        NonceExpired => 18,
        NonceLifetimeTooLong => 19,
        FamilyFull => 20,
        HoldArchived => 21,
    }
}

#[cfg(test)]
pub(crate) const PRECONDITION_CODES_FOR_TESTS: [PreconditionCode; 22] = PRECONDITION_CODES;

/// Parses `PreconditionCode::as_str()` back.
pub fn precondition_code(code: &str) -> Option<PreconditionCode> {
    PRECONDITION_CODES.into_iter().find(|c| c.as_str() == code)
}

fn detail(kind: ErrorKind, reason: &str, message: impl Into<String>) -> pb::ErrorDetail {
    pb::ErrorDetail {
        kind: kind.into(),
        reason: reason.to_owned(),
        message: message.into(),
        ..pb::ErrorDetail::default()
    }
}

impl From<&LedgerError> for pb::ErrorDetail {
    fn from(error: &LedgerError) -> Self {
        match error {
            LedgerError::InvalidArgument { field, reason } => pb::ErrorDetail {
                field: field.clone(),
                ..detail(ErrorKind::InvalidArgument, INVALID_ARGUMENT, reason.clone())
            },
            LedgerError::Conflict(ConflictReason::EventIdentity { differing_fields }) => {
                pb::ErrorDetail {
                    differing_fields: differing_fields.clone(),
                    ..detail(
                        ErrorKind::Conflict,
                        EVENT_IDENTITY,
                        format!(
                            "event id names another command: {}",
                            differing_fields.join(", ")
                        ),
                    )
                }
            }
            LedgerError::Conflict(ConflictReason::HoldReused { hold_id }) => pb::ErrorDetail {
                hold_id: hold_id.clone(),
                ..detail(
                    ErrorKind::Conflict,
                    HOLD_REUSED,
                    format!("hold {hold_id:?} is claimed"),
                )
            },
            LedgerError::FailedPrecondition { code, message } => detail(
                ErrorKind::FailedPrecondition,
                code.as_str(),
                message.clone(),
            ),
            LedgerError::Overflow { what } => detail(ErrorKind::Overflow, OVERFLOW, what.clone()),
            LedgerError::NoSpace { message } => {
                detail(ErrorKind::NoSpace, NO_SPACE, message.clone())
            }
        }
    }
}

impl From<LedgerError> for pb::ErrorDetail {
    fn from(error: LedgerError) -> Self {
        Self::from(&error)
    }
}

/// A malformed request is an invalid argument (definite: it was never proposed).
impl From<&WireError> for pb::ErrorDetail {
    fn from(error: &WireError) -> Self {
        Self::from(LedgerError::from(error.clone()))
    }
}

impl pb::ErrorDetail {
    /// Ties the error to the command it answers (UNKNOWN needs it to be resolved).
    pub fn with_event_id(mut self, event_id: &EventId) -> Self {
        self.event_id = event_id.to_string();
        self
    }

    /// No leader, or not the leader and forwarding impossible, before proposing: definite.
    pub fn unavailable(
        leader_id: Option<u64>,
        leader_address: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        pb::ErrorDetail {
            leader_id,
            leader_address: leader_address.unwrap_or_default().to_owned(),
            ..detail(ErrorKind::Unavailable, UNAVAILABLE, message)
        }
    }

    /// Proposed (or forwarded) but the outcome was lost: NOT definite, resolve `event_id`.
    pub fn unknown(event_id: &EventId, message: impl Into<String>) -> Self {
        detail(ErrorKind::Unknown, UNKNOWN, message).with_event_id(event_id)
    }

    /// A node fault (storage, fatal): not definite.
    pub fn internal(message: impl Into<String>) -> Self {
        detail(ErrorKind::Internal, INTERNAL, message)
    }

    /// No valid client certificate: refused before anything was read, definite.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        detail(ErrorKind::Unauthenticated, UNAUTHENTICATED, message)
    }

    /// The caller's role or namespaces do not allow the call: refused before proposing,
    /// definite.
    pub fn permission_denied(message: impl Into<String>) -> Self {
        detail(ErrorKind::PermissionDenied, PERMISSION_DENIED, message)
    }

    /// Whether the command certainly did not apply (docs/spec.md §10). Unknown kinds count as
    /// not definite: only a definite "no" may free funds.
    pub fn is_definite(&self) -> bool {
        matches!(
            ErrorKind::try_from(self.kind),
            Ok(ErrorKind::InvalidArgument
                | ErrorKind::Conflict
                | ErrorKind::FailedPrecondition
                | ErrorKind::Overflow
                | ErrorKind::Unavailable
                | ErrorKind::Unauthenticated
                | ErrorKind::PermissionDenied
                | ErrorKind::NoSpace)
        )
    }
}

/// What a client learns from an error reply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The ledger refused the command: definite, nothing applied.
    #[error(transparent)]
    Ledger(LedgerError),
    /// No leader could take the command; it was not proposed: definite.
    #[error("unavailable: {message} (leader {leader_id:?} at {leader_address:?})")]
    Unavailable {
        leader_id: Option<u64>,
        leader_address: Option<String>,
        message: String,
    },
    /// The outcome is unknown: retry the same event id, or resolve it.
    #[error("outcome unknown for event {event_id:?}: {message}")]
    Unknown {
        event_id: Option<EventId>,
        message: String,
    },
    /// A node fault: not definite.
    #[error("internal: {message}")]
    Internal { message: String },
    /// The caller was not let in: no valid certificate (`unauthenticated`), or a role or
    /// namespace that does not allow the call. Definite: nothing was proposed, and retrying
    /// with the same credentials cannot succeed.
    #[error("{}: {message}", if *.unauthenticated { "unauthenticated" } else { "permission denied" })]
    Refused {
        unauthenticated: bool,
        message: String,
    },
    /// A status without a Tally error detail (a transport or proxy error): not definite.
    #[error("transport status {code}: {message}")]
    Transport { code: i32, message: String },
}

impl RemoteError {
    /// Whether the command certainly did not apply. Only a definite "no" frees funds.
    pub fn is_definite(&self) -> bool {
        matches!(
            self,
            Self::Ledger(_) | Self::Unavailable { .. } | Self::Refused { .. }
        )
    }
}

impl TryFrom<pb::ErrorDetail> for RemoteError {
    type Error = WireError;

    fn try_from(detail: pb::ErrorDetail) -> Result<Self, WireError> {
        let kind = super::enum_field::<ErrorKind>(detail.kind, "kind")?;
        let non_empty = |s: String| (!s.is_empty()).then_some(s);
        Ok(match kind {
            ErrorKind::InvalidArgument => Self::Ledger(LedgerError::InvalidArgument {
                field: detail.field,
                reason: detail.message,
            }),
            ErrorKind::Conflict => {
                Self::Ledger(LedgerError::Conflict(match detail.reason.as_str() {
                    EVENT_IDENTITY => ConflictReason::EventIdentity {
                        differing_fields: detail.differing_fields,
                    },
                    HOLD_REUSED => ConflictReason::HoldReused {
                        hold_id: detail.hold_id,
                    },
                    other => {
                        return Err(WireError::invalid(
                            "reason",
                            format!("unknown conflict reason {other:?}"),
                        ))
                    }
                }))
            }
            ErrorKind::FailedPrecondition => {
                let code = precondition_code(&detail.reason).ok_or_else(|| {
                    WireError::invalid(
                        "reason",
                        format!("unknown precondition code {:?}", detail.reason),
                    )
                })?;
                Self::Ledger(LedgerError::FailedPrecondition {
                    code,
                    message: detail.message,
                })
            }
            ErrorKind::Overflow => Self::Ledger(LedgerError::Overflow {
                what: detail.message,
            }),
            ErrorKind::NoSpace => Self::Ledger(LedgerError::NoSpace {
                message: detail.message,
            }),
            ErrorKind::Unavailable => Self::Unavailable {
                leader_id: detail.leader_id,
                leader_address: non_empty(detail.leader_address),
                message: detail.message,
            },
            ErrorKind::Unknown => Self::Unknown {
                event_id: non_empty(detail.event_id).map(EventId::from),
                message: detail.message,
            },
            ErrorKind::Internal => Self::Internal {
                message: detail.message,
            },
            ErrorKind::Unauthenticated | ErrorKind::PermissionDenied => Self::Refused {
                unauthenticated: kind == ErrorKind::Unauthenticated,
                message: detail.message,
            },
            ErrorKind::Unspecified => return Err(WireError::missing("kind")),
        })
    }
}

/// For callers that only expect ledger errors (a batch result, a forwarded write's answer);
/// any other kind is refused with the kind named.
impl TryFrom<pb::ErrorDetail> for LedgerError {
    type Error = WireError;

    fn try_from(detail: pb::ErrorDetail) -> Result<Self, WireError> {
        match RemoteError::try_from(detail)? {
            RemoteError::Ledger(error) => Ok(error),
            other => Err(WireError::invalid(
                "kind",
                format!("not a ledger error: {other}"),
            )),
        }
    }
}
