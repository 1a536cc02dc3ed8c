//! The receipt and its signature. The signature covers a msgpack encoding of every field but
//! itself, with the metadata as canonical JSON, so a receipt read back from a JSON log (any key
//! order, any whitespace) still verifies.

use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use tally_ledger::{CapabilityId, FamilyId};

use super::canonical::canonical_json;
use super::{MAX_NAME_BYTES, MAX_REASON_BYTES, RECEIPT_SIGNING_DOMAIN};
use crate::keys::{KeyPair, PublicKey, Signature};
use crate::payment::MAX_REFERENCE_BYTES;
use crate::token::{TrustList, VerifiedCapability};

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ReceiptError {
    #[error("receipt {receipt_id}: signature does not verify")]
    BadSignature { receipt_id: String },
    #[error("receipt {receipt_id} is signed by {key}, which is not a trusted kernel key")]
    UntrustedKernel { receipt_id: String, key: PublicKey },
    #[error("{what} is {bytes} bytes; at most {max} allowed")]
    TooLarge {
        what: &'static str,
        bytes: usize,
        max: usize,
    },
    #[error("receipt metadata: {0}")]
    Metadata(String),
    #[error("receipt encoding: {0}")]
    Encode(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Deny,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub receipt_id: String,
    pub request_id: String,
    /// `None` when the request was refused before its token could be read.
    pub capability_id: Option<CapabilityId>,
    pub family_id: Option<FamilyId>,
    pub tool: String,
    pub server: String,
    pub verdict: Verdict,
    pub reason: Option<String>,
    pub issued_at_ms: u64,
    pub kernel_key: PublicKey,
    pub metadata: serde_json::Value,
    pub signature: Signature,
}

/// A receipt before signing; [`ReceiptDraft::sign`] checks the limits and signs.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceiptDraft {
    pub receipt_id: String,
    pub request_id: String,
    pub capability_id: Option<CapabilityId>,
    pub family_id: Option<FamilyId>,
    pub tool: String,
    pub server: String,
    pub verdict: Verdict,
    pub reason: Option<String>,
    pub issued_at_ms: u64,
    pub metadata: serde_json::Value,
}

/// Exactly what is signed: every receipt field but the signature, metadata canonicalized.
#[derive(Serialize)]
struct SignedFields<'a> {
    receipt_id: &'a str,
    request_id: &'a str,
    capability_id: Option<&'a str>,
    family_id: Option<&'a str>,
    tool: &'a str,
    server: &'a str,
    verdict: Verdict,
    reason: Option<&'a str>,
    issued_at_ms: u64,
    kernel_key: PublicKey,
    metadata: String,
}

impl ReceiptDraft {
    /// A draft with a fresh random receipt id and empty metadata.
    pub fn new(
        request_id: &str,
        server: &str,
        tool: &str,
        verdict: Verdict,
        issued_at_ms: u64,
    ) -> Self {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        Self {
            receipt_id: format!(
                "rcpt-{}",
                bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
            ),
            request_id: request_id.to_owned(),
            capability_id: None,
            family_id: None,
            tool: tool.to_owned(),
            server: server.to_owned(),
            verdict,
            reason: None,
            issued_at_ms,
            metadata: serde_json::Value::Object(serde_json::Map::new()),
        }
    }

    pub fn with_capability(mut self, capability: &VerifiedCapability) -> Self {
        self.capability_id = Some(capability.capability_id().clone());
        self.family_id = Some(capability.family_id().clone());
        self
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    pub fn with_metadata(mut self, metadata: serde_json::Value) -> Self {
        self.metadata = metadata;
        self
    }

    pub fn sign(self, kernel: &KeyPair) -> Result<Receipt, ReceiptError> {
        let mut receipt = Receipt {
            receipt_id: self.receipt_id,
            request_id: self.request_id,
            capability_id: self.capability_id,
            family_id: self.family_id,
            tool: self.tool,
            server: self.server,
            verdict: self.verdict,
            reason: self.reason,
            issued_at_ms: self.issued_at_ms,
            kernel_key: kernel.public_key(),
            metadata: self.metadata,
            signature: Signature([0; crate::keys::SIGNATURE_BYTES]),
        };
        let bytes = receipt.signing_bytes()?;
        receipt.signature = kernel.sign(RECEIPT_SIGNING_DOMAIN, &bytes);
        Ok(receipt)
    }
}

fn bounded(what: &'static str, value: &str, max: usize) -> Result<(), ReceiptError> {
    if value.len() > max {
        return Err(ReceiptError::TooLarge {
            what,
            bytes: value.len(),
            max,
        });
    }
    Ok(())
}

impl Receipt {
    /// The bytes the signature covers. Also enforces every size limit, so an oversized
    /// receipt can neither be signed nor verified.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, ReceiptError> {
        bounded("receipt_id", &self.receipt_id, MAX_REFERENCE_BYTES)?;
        bounded("request_id", &self.request_id, MAX_REFERENCE_BYTES)?;
        bounded("tool", &self.tool, MAX_NAME_BYTES)?;
        bounded("server", &self.server, MAX_NAME_BYTES)?;
        if let Some(reason) = &self.reason {
            bounded("reason", reason, MAX_REASON_BYTES)?;
        }
        let fields = SignedFields {
            receipt_id: &self.receipt_id,
            request_id: &self.request_id,
            capability_id: self.capability_id.as_ref().map(CapabilityId::as_str),
            family_id: self.family_id.as_ref().map(FamilyId::as_str),
            tool: &self.tool,
            server: &self.server,
            verdict: self.verdict,
            reason: self.reason.as_deref(),
            issued_at_ms: self.issued_at_ms,
            kernel_key: self.kernel_key,
            metadata: canonical_json(&self.metadata)?,
        };
        rmp_serde::to_vec(&fields).map_err(|e| ReceiptError::Encode(e.to_string()))
    }
}

/// Checks that `receipt` was signed by one of `trusted_kernel_keys` and not changed since.
pub fn verify_receipt(
    receipt: &Receipt,
    trusted_kernel_keys: &TrustList,
) -> Result<(), ReceiptError> {
    if !trusted_kernel_keys.contains(&receipt.kernel_key) {
        return Err(ReceiptError::UntrustedKernel {
            receipt_id: receipt.receipt_id.clone(),
            key: receipt.kernel_key,
        });
    }
    receipt
        .kernel_key
        .verify(
            RECEIPT_SIGNING_DOMAIN,
            &receipt.signing_bytes()?,
            &receipt.signature,
        )
        .map_err(|_| ReceiptError::BadSignature {
            receipt_id: receipt.receipt_id.clone(),
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn kernel() -> KeyPair {
        KeyPair::from_seed(&[5; 32])
    }

    fn signed() -> Receipt {
        ReceiptDraft::new("req-1", "cost-srv", "compute", Verdict::Deny, 42)
            .with_reason("payment declined")
            .with_metadata(json!({"financial": {"payment_reference": "req-1"}, "a": [1, 2]}))
            .sign(&kernel())
            .expect("sign")
    }

    #[test]
    fn sign_and_verify() {
        let receipt = signed();
        let trusted = TrustList::new([kernel().public_key()]);
        assert_eq!(verify_receipt(&receipt, &trusted), Ok(()));
        assert!(receipt.receipt_id.starts_with("rcpt-"));
        let stranger = TrustList::new([KeyPair::from_seed(&[6; 32]).public_key()]);
        assert!(matches!(
            verify_receipt(&receipt, &stranger),
            Err(ReceiptError::UntrustedKernel { .. })
        ));
    }

    #[test]
    fn tampering_with_any_field_breaks_the_signature() {
        let trusted = TrustList::new([kernel().public_key()]);
        let mut metadata = signed();
        metadata.metadata["financial"]["payment_reference"] = json!("req-2");
        let mut verdict = signed();
        verdict.verdict = Verdict::Allow;
        let mut reason = signed();
        reason.reason = None;
        let mut signature = signed();
        signature.signature.0[0] ^= 1;
        for receipt in [metadata, verdict, reason, signature] {
            assert!(matches!(
                verify_receipt(&receipt, &trusted),
                Err(ReceiptError::BadSignature { .. })
            ));
        }
    }

    #[test]
    fn json_round_trip_in_any_key_order_still_verifies() {
        let receipt = signed();
        let trusted = TrustList::new([kernel().public_key()]);
        let text = serde_json::to_string(&receipt).expect("json");
        let back: Receipt = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, receipt);
        let mut reordered = back.clone();
        reordered.metadata = json!({"a": [1, 2], "financial": {"payment_reference": "req-1"}});
        assert_eq!(verify_receipt(&reordered, &trusted), Ok(()));
    }

    #[test]
    fn limits_apply_when_signing() {
        let long = ReceiptDraft::new(
            &"r".repeat(MAX_REFERENCE_BYTES + 1),
            "s",
            "t",
            Verdict::Deny,
            0,
        )
        .sign(&kernel());
        assert!(matches!(
            long,
            Err(ReceiptError::TooLarge {
                what: "request_id",
                ..
            })
        ));
        let float = ReceiptDraft::new("r", "s", "t", Verdict::Deny, 0)
            .with_metadata(json!({"x": 0.5}))
            .sign(&kernel());
        assert!(matches!(float, Err(ReceiptError::Metadata(_))));
    }
}
