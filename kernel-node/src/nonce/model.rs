//! The nonce, its binding and its signature. Verification is pure: signature by a trusted
//! kernel key, not expired, and bound to exactly the request presenting it.

use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tally_ledger::NonceId;

use super::{MAX_NONCE_TTL_MS, NONCE_SIGNING_DOMAIN};
use crate::keys::{KeyPair, PublicKey, Signature};
use crate::receipt::canonical_json;
use crate::token::TrustList;

/// What a nonce is good for: one request, by one subject, on one tool, with these arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NonceBinding {
    pub subject: PublicKey,
    pub request_id: String,
    /// The budget family: capability ids are unique only within an issuer's namespace, so the
    /// family is what makes the capability unambiguous.
    pub family_id: String,
    pub capability_id: String,
    pub server: String,
    pub tool: String,
    /// Hex SHA-256 of the canonical JSON of the arguments.
    pub parameter_hash: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionNonce {
    pub nonce_id: NonceId,
    pub bound_to: NonceBinding,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedExecutionNonce {
    pub nonce: ExecutionNonce,
    pub kernel_key: PublicKey,
    pub signature: Signature,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NonceError {
    #[error("execution nonce {0}: signature does not verify")]
    BadSignature(String),
    #[error("execution nonce {0} was minted by an untrusted kernel key")]
    UntrustedKernel(String),
    #[error("execution nonce {id} expired at {expires_at_ms} ms")]
    Expired { id: String, expires_at_ms: u64 },
    #[error("execution nonce {id} is bound to another {field}")]
    BindingMismatch { id: String, field: &'static str },
    #[error("execution nonce encoding: {0}")]
    Encode(String),
    #[error("arguments cannot be hashed: {0}")]
    Arguments(String),
}

/// Hex SHA-256 of the arguments' canonical JSON (key order and whitespace do not matter).
pub fn parameter_hash(arguments: &Value) -> Result<String, NonceError> {
    let canonical = canonical_json(arguments).map_err(|e| NonceError::Arguments(e.to_string()))?;
    let digest = Sha256::digest(canonical.as_bytes());
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

fn signing_bytes(nonce: &ExecutionNonce) -> Result<Vec<u8>, NonceError> {
    rmp_serde::to_vec(nonce).map_err(|e| NonceError::Encode(e.to_string()))
}

/// Mints a fresh nonce for `binding`, valid for `ttl_ms` (capped at [`MAX_NONCE_TTL_MS`]).
pub fn mint(
    kernel: &KeyPair,
    binding: NonceBinding,
    ttl_ms: u64,
    now_ms: u64,
) -> Result<SignedExecutionNonce, NonceError> {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let nonce = ExecutionNonce {
        nonce_id: NonceId::new(format!("nonce-{id}")),
        bound_to: binding,
        issued_at_ms: now_ms,
        expires_at_ms: now_ms.saturating_add(ttl_ms.clamp(1, MAX_NONCE_TTL_MS)),
    };
    let signature = kernel.sign(NONCE_SIGNING_DOMAIN, &signing_bytes(&nonce)?);
    Ok(SignedExecutionNonce {
        nonce,
        kernel_key: kernel.public_key(),
        signature,
    })
}

/// Checks `signed` for the request described by `expected` at `now_ms`. Does not spend it:
/// spending is the cluster's job (`ConsumeNonce`).
pub fn verify(
    signed: &SignedExecutionNonce,
    kernel_keys: &TrustList,
    expected: &NonceBinding,
    now_ms: u64,
) -> Result<(), NonceError> {
    let id = signed.nonce.nonce_id.to_string();
    if !kernel_keys.contains(&signed.kernel_key) {
        return Err(NonceError::UntrustedKernel(id));
    }
    signed
        .kernel_key
        .verify(
            NONCE_SIGNING_DOMAIN,
            &signing_bytes(&signed.nonce)?,
            &signed.signature,
        )
        .map_err(|_| NonceError::BadSignature(id.clone()))?;
    if now_ms >= signed.nonce.expires_at_ms {
        return Err(NonceError::Expired {
            id,
            expires_at_ms: signed.nonce.expires_at_ms,
        });
    }
    let bound = &signed.nonce.bound_to;
    let field = if bound.request_id != expected.request_id {
        Some("request_id")
    } else if bound.subject != expected.subject {
        Some("subject")
    } else if bound.family_id != expected.family_id {
        Some("family_id")
    } else if bound.capability_id != expected.capability_id {
        Some("capability_id")
    } else if bound.server != expected.server || bound.tool != expected.tool {
        Some("tool")
    } else if bound.parameter_hash != expected.parameter_hash {
        Some("parameter_hash")
    } else {
        None
    };
    match field {
        Some(field) => Err(NonceError::BindingMismatch { id, field }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn binding(request_id: &str) -> NonceBinding {
        NonceBinding {
            subject: KeyPair::from_seed(&[1; 32]).public_key(),
            request_id: request_id.into(),
            family_id: "fam:cap".into(),
            capability_id: "cap".into(),
            server: "srv".into(),
            tool: "t".into(),
            parameter_hash: parameter_hash(&json!({"b": 1, "a": 2})).expect("hash"),
        }
    }

    #[test]
    fn a_nonce_verifies_only_for_its_own_request() {
        let kernel = KeyPair::from_seed(&[2; 32]);
        let trust = TrustList::new([kernel.public_key()]);
        let nonce = mint(&kernel, binding("req-1"), 30_000, 1_000).expect("mint");
        assert_eq!(verify(&nonce, &trust, &binding("req-1"), 2_000), Ok(()));
        assert!(matches!(
            verify(&nonce, &trust, &binding("req-2"), 2_000),
            Err(NonceError::BindingMismatch {
                field: "request_id",
                ..
            })
        ));
        assert!(matches!(
            verify(&nonce, &trust, &binding("req-1"), 31_000),
            Err(NonceError::Expired { .. })
        ));
        let stranger = TrustList::new([KeyPair::from_seed(&[3; 32]).public_key()]);
        assert!(matches!(
            verify(&nonce, &stranger, &binding("req-1"), 2_000),
            Err(NonceError::UntrustedKernel(_))
        ));
        let mut forged = nonce.clone();
        forged.nonce.expires_at_ms += 1;
        assert!(matches!(
            verify(&forged, &trust, &binding("req-1"), 2_000),
            Err(NonceError::BadSignature(_))
        ));
    }

    #[test]
    fn parameter_hash_ignores_key_order() {
        assert_eq!(
            parameter_hash(&json!({"a": 1, "b": [1, 2]})).expect("hash"),
            parameter_hash(&json!({"b": [1, 2], "a": 1})).expect("hash")
        );
    }
}
