//! What rails answer, and how they fail. Only a definite "no" ([`PaymentError::Declined`],
//! [`PaymentError::InsufficientFunds`]) lets the kernel free budget (docs/spec.md §9); every other
//! failure may hide an authorization that happened.

use serde::{Deserialize, Serialize};

use crate::money::Money;

/// References are request ids, which kernels refuse over 128 bytes (docs/spec.md §9).
pub const MAX_REFERENCE_BYTES: usize = 128;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PaymentError {
    #[error("payment declined: {0}")]
    Declined(String),
    #[error("insufficient funds")]
    InsufficientFunds,
    #[error("payment rail unavailable: {0}")]
    Unavailable(String),
    #[error("payment rail error: {0}")]
    RailError(String),
}

impl PaymentError {
    /// True only when the rail definitely did not (and will not) authorize: the one case in
    /// which the kernel may cancel its budget capture.
    pub fn is_definite_denial(&self) -> bool {
        matches!(self, Self::Declined(_) | Self::InsufficientFunds)
    }
}

pub fn validate_reference(reference: &str) -> Result<(), PaymentError> {
    if reference.is_empty() || reference.len() > MAX_REFERENCE_BYTES {
        return Err(PaymentError::RailError(format!(
            "payment reference must be 1-{MAX_REFERENCE_BYTES} bytes, got {}",
            reference.len()
        )));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authorization {
    pub reference: String,
    pub authorization_id: String,
    pub amount: Money,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capture {
    pub reference: String,
    pub transaction_id: String,
    pub amount: Money,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub reference: String,
    pub refund_id: String,
    pub amount: Money,
}

/// The answer to a release. `Unconfirmed` means the rail took the request but has not said
/// the funds are free: the kernel must keep treating them as held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseStatus {
    Released,
    AlreadyReleased,
    NotFound,
    Unconfirmed,
}

impl ReleaseStatus {
    /// The funds are certainly not held under this reference any more.
    pub fn is_confirmed(self) -> bool {
        !matches!(self, Self::Unconfirmed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::AlreadyReleased => "already_released",
            Self::NotFound => "not_found",
            Self::Unconfirmed => "unconfirmed",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettlementStatus {
    Authorized,
    Captured,
    Released,
    Refunded,
}

impl SettlementStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Authorized => "authorized",
            Self::Captured => "captured",
            Self::Released => "released",
            Self::Refunded => "refunded",
        }
    }
}

/// What the rail knows about one reference: how a reconciler finds out what happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettlementRecord {
    pub reference: String,
    pub status: SettlementStatus,
    pub authorized: Money,
    pub captured_units: u64,
    pub refunded_units: u64,
}
