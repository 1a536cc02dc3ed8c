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
use crate::token::{
    from_msgpack_nested_at_most, CapabilityToken, TrustList, MAX_TOKEN_BYTES,
    MAX_TOKEN_NESTING_LEVELS,
};

/// Encoded ticket size: a token plus a few ids.
pub const MAX_TICKET_BYTES: usize = MAX_TOKEN_BYTES + 4 * 1024;
/// Deepest nesting of msgpack arrays and maps a ticket's encoding may use, enforced while
/// decoding: the signed ticket and the ticket are two levels around the token, which is bounded
/// by [`MAX_TOKEN_NESTING_LEVELS`]. Without it a ticket carrying a token that nests its parent
/// 400-odd times (within `MAX_TICKET_BYTES`) overflowed the stack of the task decoding a
/// `Complete` or `Abort` (fuzz/regressions/ticket/deep-nesting).
pub const MAX_TICKET_NESTING_LEVELS: usize = MAX_TOKEN_NESTING_LEVELS + 2;

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
    #[error(
        "ticket nests arrays and maps more than {max_levels} levels deep, more than one carrying \
         a valid token needs; refused while decoding"
    )]
    TooDeeplyNested { max_levels: usize },
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
            from_msgpack_nested_at_most(bytes, MAX_TICKET_NESTING_LEVELS).map_err(|e| match e {
                rmp_serde::decode::Error::DepthLimitExceeded => TicketError::TooDeeplyNested {
                    max_levels: MAX_TICKET_NESTING_LEVELS,
                },
                e => TicketError::Encode(e.to_string()),
            })?;
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

#[cfg(test)]
mod tests {
    use tally_ledger::GrantLimits;

    use super::*;
    use crate::token::tests::{deeply_nested_token_bytes, on_decode_stack};
    use crate::token::{Grant, TokenBody};

    const NOW: u64 = 1_000_000;

    fn kernel() -> KeyPair {
        KeyPair::from_seed(&[7; 32])
    }

    /// A signed ticket carrying `capability`.
    fn ticket(capability: CapabilityToken) -> SignedTicket {
        AdmissionTicket {
            request_id: "req-1".into(),
            server: "cost-srv".into(),
            tool: "compute".into(),
            holder: capability.body.subject,
            family_id: capability.family_id(),
            capability_id: capability.id().clone(),
            capability,
            grant_index: 0,
            hold_id: "budget-hold:req-1:tok-1:0".into(),
            authorize_commit_index: 7,
            capture_event_id: "budget-capture:req-1".into(),
            capture_commit_index: 8,
            attempt_id: "att-1".into(),
            payment_reference: Some("req-1".into()),
            exposure_units: 50,
            limits: GrantLimits::monetary(Some(10), Some(50), Some(500), "USD"),
            issued_at_ms: NOW,
        }
        .sign(&kernel())
        .expect("signs")
    }

    /// A chain of `links` tokens, each signed as is (no depth check, as an attacker's
    /// encoder would), with money amounts at the root.
    fn chain(links: usize) -> CapabilityToken {
        let key = KeyPair::from_seed(&[3; 32]);
        let grant = Grant::monetary("cost-srv", "compute", 10, 100, "USD");
        let mut token =
            CapabilityToken::issue(&key, key.public_key(), vec![grant.clone()], NOW, NOW + 1)
                .expect("root");
        for _ in 1..links {
            let body = TokenBody {
                id: format!("link-{}", token.depth()).into(),
                issuer: key.public_key(),
                subject: key.public_key(),
                issued_at_ms: NOW,
                expires_at_ms: NOW + 1,
                grants: vec![grant.clone().narrowing(0)],
                parent: Some(Box::new(token)),
            };
            token = CapabilityToken::sign_body(body, &key).expect("signs");
        }
        token
    }

    #[test]
    fn a_ticket_carrying_the_longest_chain_round_trips() {
        let signed = ticket(chain(crate::token::MAX_CHAIN_DEPTH));
        let bytes = signed.to_bytes().expect("encodes");
        assert_eq!(SignedTicket::from_bytes(&bytes).as_ref(), Ok(&signed));
        let text = signed.to_text().expect("text");
        assert_eq!(SignedTicket::from_text(&text).as_ref(), Ok(&signed));
        assert_eq!(
            signed.verify(&TrustList::new([kernel().public_key()])),
            Ok(())
        );
    }

    #[test]
    fn a_ticket_nested_past_the_limit_is_refused_while_decoding() {
        let bytes = ticket(chain(crate::token::MAX_CHAIN_DEPTH + 2))
            .to_bytes()
            .expect("encodes");
        assert_eq!(
            SignedTicket::from_bytes(&bytes),
            Err(TicketError::TooDeeplyNested {
                max_levels: MAX_TICKET_NESTING_LEVELS
            })
        );
    }

    #[test]
    fn a_ticket_carrying_a_token_nested_as_deep_as_its_size_allows_is_refused_within_a_bounded_stack(
    ) {
        // The ticket's encoding with its one-link token swapped for the 400-odd-link one (the
        // fuzzers' ticket/deep-nesting regression): a token encodes as one contiguous value.
        let root = chain(1);
        let token_bytes = root.to_bytes().expect("encodes");
        let ticket_bytes = ticket(root).to_bytes().expect("encodes");
        let at = ticket_bytes
            .windows(token_bytes.len())
            .position(|w| w == token_bytes)
            .expect("the ticket holds the token's encoding");
        let deep = [
            &ticket_bytes[..at],
            &deeply_nested_token_bytes(),
            &ticket_bytes[at + token_bytes.len()..],
        ]
        .concat();
        assert!(deep.len() <= MAX_TICKET_BYTES);
        let text = URL_SAFE_NO_PAD.encode(&deep);
        let (from_bytes, from_text) = on_decode_stack(move || {
            (
                SignedTicket::from_bytes(&deep),
                SignedTicket::from_text(&text),
            )
        });
        let refused = Err(TicketError::TooDeeplyNested {
            max_levels: MAX_TICKET_NESTING_LEVELS,
        });
        assert_eq!(from_bytes, refused);
        assert_eq!(from_text, refused);
    }
}
