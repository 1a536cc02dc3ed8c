//! The two-phase API's admission ticket: what a kernel node learned at `Admit` (hold, commit
//! indexes, attempt id, payment reference), signed by that node so any node trusting its key
//! can `Complete` or `Abort` the call without shared memory. The signature proves which node
//! admitted; the cluster (the hold's recorded capture attempt) proves the capture is real; and
//! the ticket names its `holder`, the key whose proof of possession admitted the call, which
//! must sign every later call on the ticket too.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tally_ledger::{
    AttemptId, BudgetCommitIndex, CapabilityId, CommandHeader, EventId, FamilyId, GrantLimits,
    HoldId,
};

use super::evaluation::Held;
use crate::keys::{KeyPair, PublicKey, Signature};
use crate::money::Money;
use crate::token::{CapabilityToken, TrustList, MAX_TOKEN_BYTES};

/// Encoded ticket size: a token plus a few ids.
pub const MAX_TICKET_BYTES: usize = MAX_TOKEN_BYTES + 4 * 1024;

const TICKET_SIGNING_DOMAIN: &[u8] = b"tally-admission-ticket-v1\0";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionTicket {
    pub request_id: String,
    pub server: String,
    pub tool: String,
    /// The presented token, so the completing node can sign receipts naming it.
    pub capability: CapabilityToken,
    /// The key that proved possession at `Admit` (the token's subject): `Complete`, `Abort`
    /// and `DispatchAdmitted` on this ticket must be signed by it.
    pub holder: PublicKey,
    pub family_id: FamilyId,
    pub capability_id: CapabilityId,
    pub grant_index: u32,
    pub hold_id: HoldId,
    pub authorize_commit_index: u64,
    pub capture_event_id: EventId,
    pub capture_commit_index: u64,
    pub attempt_id: AttemptId,
    /// The rail reference (the `request_id`) when money was authorized.
    pub payment_reference: Option<String>,
    pub exposure_units: u64,
    pub limits: GrantLimits,
    pub issued_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedTicket {
    pub ticket: AdmissionTicket,
    pub kernel_key: PublicKey,
    pub signature: Signature,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("ticket signed by {0}, which is not a trusted kernel key")]
    UntrustedKernel(PublicKey),
    #[error("ticket signature does not verify")]
    BadSignature,
    #[error("ticket encoding: {0}")]
    Encode(String),
    #[error("ticket is {bytes} bytes; at most {max} allowed")]
    TooLarge { bytes: usize, max: usize },
    #[error("ticket is not in its canonical encoding")]
    NotCanonical,
}

fn signing_bytes(ticket: &AdmissionTicket) -> Result<Vec<u8>, TicketError> {
    rmp_serde::to_vec(ticket).map_err(|e| TicketError::Encode(e.to_string()))
}

impl AdmissionTicket {
    pub fn sign(self, kernel: &KeyPair) -> Result<SignedTicket, TicketError> {
        let signature = kernel.sign(TICKET_SIGNING_DOMAIN, &signing_bytes(&self)?);
        Ok(SignedTicket {
            ticket: self,
            kernel_key: kernel.public_key(),
            signature,
        })
    }

    /// The hold as the pipeline's cleanup and settlement steps name it; their commands must
    /// not apply after `not_after_ms`.
    pub(super) fn held(&self, not_after_ms: u64) -> Held {
        Held {
            hold_id: self.hold_id.clone(),
            header: CommandHeader {
                family_id: self.family_id.clone(),
                capability_id: self.capability_id.clone(),
                grant_index: self.grant_index,
                event_id: EventId::new("unset"),
                not_after_ms,
            },
            authorize_index: BudgetCommitIndex(self.authorize_commit_index),
            exposure: self.exposure_units,
            limits: self.limits.clone(),
        }
    }

    pub(super) fn payment(&self) -> Option<Money> {
        let currency = self.limits.currency.as_ref()?;
        self.payment_reference
            .as_ref()
            .map(|_| Money::new(self.exposure_units, currency))
    }
}

impl SignedTicket {
    pub fn verify(&self, trusted_kernels: &TrustList) -> Result<(), TicketError> {
        if !trusted_kernels.contains(&self.kernel_key) {
            return Err(TicketError::UntrustedKernel(self.kernel_key));
        }
        self.kernel_key
            .verify(
                TICKET_SIGNING_DOMAIN,
                &signing_bytes(&self.ticket)?,
                &self.signature,
            )
            .map_err(|_| TicketError::BadSignature)
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>, TicketError> {
        let bytes = rmp_serde::to_vec(self).map_err(|e| TicketError::Encode(e.to_string()))?;
        if bytes.len() > MAX_TICKET_BYTES {
            return Err(TicketError::TooLarge {
                bytes: bytes.len(),
                max: MAX_TICKET_BYTES,
            });
        }
        Ok(bytes)
    }

    /// Strict: only the canonical encoding decodes, so a ticket is exactly one byte string and
    /// a proof of possession over the bytes the caller holds verifies against the re-encoding.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TicketError> {
        if bytes.len() > MAX_TICKET_BYTES {
            return Err(TicketError::TooLarge {
                bytes: bytes.len(),
                max: MAX_TICKET_BYTES,
            });
        }
        let ticket: Self =
            rmp_serde::from_slice(bytes).map_err(|e| TicketError::Encode(e.to_string()))?;
        if ticket.to_bytes()? != bytes {
            return Err(TicketError::NotCanonical);
        }
        Ok(ticket)
    }

    pub fn to_text(&self) -> Result<String, TicketError> {
        Ok(URL_SAFE_NO_PAD.encode(self.to_bytes()?))
    }

    pub fn from_text(text: &str) -> Result<Self, TicketError> {
        let bytes = URL_SAFE_NO_PAD
            .decode(text.trim())
            .map_err(|e| TicketError::Encode(e.to_string()))?;
        Self::from_bytes(&bytes)
    }
}
