//! The journal: one record per appended event, with every field a receipt or an auditor needs.

use serde::{Deserialize, Serialize};

use crate::account::{Account, AccountKey, GrantLimits};
use crate::commit_index::{BudgetCommitIndex, LogPosition};
use crate::decision::{Decision, DenyReason};
use crate::hold::HoldStates;
use crate::ids::{AttemptId, CapabilityId, EventId, HoldId, NonceId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EventKind {
    ReserveInvocation,
    AuthorizeExposure,
    CaptureInvocation,
    CancelCapturedBeforeDispatch,
    ReverseInvocation,
    ReverseExposure,
    ReleaseExposure,
    ReconcileSpend,
    IncrementInvocation,
    ExpireHold,
    ConsumeNonce,
}

impl EventKind {
    /// The wire name (docs/spec.md §4).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReserveInvocation => "reserve_invocation",
            Self::AuthorizeExposure => "authorize_exposure",
            Self::CaptureInvocation => "capture_invocation",
            Self::CancelCapturedBeforeDispatch => "cancel_captured_before_dispatch",
            Self::ReverseInvocation => "reverse_invocation",
            Self::ReverseExposure => "reverse_exposure",
            Self::ReleaseExposure => "release_exposure",
            Self::ReconcileSpend => "reconcile_spend",
            Self::IncrementInvocation => "increment_invocation",
            Self::ExpireHold => "expire_hold",
            Self::ConsumeNonce => "consume_nonce",
        }
    }

    pub fn all() -> [EventKind; 11] {
        [
            Self::ReserveInvocation,
            Self::AuthorizeExposure,
            Self::CaptureInvocation,
            Self::CancelCapturedBeforeDispatch,
            Self::ReverseInvocation,
            Self::ReverseExposure,
            Self::ReleaseExposure,
            Self::ReconcileSpend,
            Self::IncrementInvocation,
            Self::ExpireHold,
            Self::ConsumeNonce,
        ]
    }
}

/// An event's account after-images. Nearly every event changes one account (a grant with no
/// ancestors), which sits inline in the record: no allocation per event, and compaction
/// frees no second block.
pub type AfterImages = smallvec::SmallVec<[AccountImage; 1]>;

/// An account's state right after the event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountImage {
    pub key: AccountKey,
    pub account: Account,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub event_id: EventId,
    pub kind: EventKind,
    pub commit_index: BudgetCommitIndex,
    pub log_id: LogPosition,
    /// Cluster time of the event.
    pub at_ms: u64,
    pub capability_id: CapabilityId,
    pub grant_index: u32,
    pub hold_id: Option<HoldId>,
    pub attempt_id: Option<AttemptId>,
    pub nonce_id: Option<NonceId>,
    pub allowed: bool,
    pub deny_reason: Option<DenyReason>,
    /// Exposure added (authorize, charge) or removed (release, reverse, cancel, reconcile).
    pub exposure_units: u64,
    /// Spend made final (reconcile, settle).
    pub realized_units: u64,
    /// The grant account's limits, where the command named them.
    pub limits: Option<GrantLimits>,
    pub hold_before: Option<HoldStates>,
    pub hold_after: Option<HoldStates>,
    pub after_images: AfterImages,
}

/// `GetEvent`'s answer (docs/spec.md §7). `Unknown` is never a no: an in-flight copy may commit.
/// Returned by value once per read and never stored, so the size gap between variants costs
/// nothing worth an extra allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventLookup {
    /// The stored answer, and the full record while it is retained.
    Applied {
        decision: Decision,
        record: Option<EventRecord>,
    },
    Tombstoned,
    Unknown,
}
