//! ed25519 keys and signatures as plain byte values, so tokens and receipts carry them in
//! msgpack (raw bytes) and JSON (base64 text) without exposing ed25519-dalek types.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use rand::RngCore as _;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub const PUBLIC_KEY_BYTES: usize = 32;
pub const SIGNATURE_BYTES: usize = 64;
const SEED_BYTES: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("{what} must be {expected} bytes, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{what} is not valid base64: {detail}")]
    Base64 { what: &'static str, detail: String },
    #[error("public key is not a valid ed25519 point")]
    InvalidPublicKey,
    #[error("signature does not verify")]
    BadSignature,
}

/// An ed25519 public key. Compared and ordered by bytes so it can sit in trust lists.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey(pub [u8; PUBLIC_KEY_BYTES]);

/// An ed25519 signature.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(pub [u8; SIGNATURE_BYTES]);

impl PublicKey {
    pub fn from_slice(bytes: &[u8]) -> Result<Self, KeyError> {
        to_array("public key", bytes).map(Self)
    }

    pub fn as_bytes(&self) -> &[u8; PUBLIC_KEY_BYTES] {
        &self.0
    }

    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0)
    }

    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        Self::from_slice(&decode_base64("public key", text, PUBLIC_KEY_BYTES)?)
    }

    /// Checks `signature` over `domain || message`. The domain keeps a token signature from
    /// ever being accepted as a receipt signature (a kernel key may issue both).
    ///
    /// Strict (RFC 8032 with ed25519-dalek's `verify_strict`): weak (small-order) public keys
    /// and non-canonical signature points are refused, so no signature verifies for more than
    /// one message under a key nobody holds the secret of, and every verifier in this crate
    /// (tokens, tickets, receipts, nonces, proofs of possession) agrees on what is valid.
    pub fn verify(
        &self,
        domain: &[u8],
        message: &[u8],
        signature: &Signature,
    ) -> Result<(), KeyError> {
        let key = VerifyingKey::from_bytes(&self.0).map_err(|_| KeyError::InvalidPublicKey)?;
        let signature = ed25519_dalek::Signature::from_bytes(&signature.0);
        key.verify_strict(&framed(domain, message), &signature)
            .map_err(|_| KeyError::BadSignature)
    }
}

impl Signature {
    pub fn from_slice(bytes: &[u8]) -> Result<Self, KeyError> {
        to_array("signature", bytes).map(Self)
    }
}

/// A signing key. Its `Debug` never prints the secret.
#[derive(Clone)]
pub struct KeyPair {
    signing: SigningKey,
}

impl KeyPair {
    /// A fresh key from the operating system's randomness.
    pub fn generate() -> Self {
        let mut seed = [0u8; SEED_BYTES];
        rand::rng().fill_bytes(&mut seed);
        Self::from_seed(&seed)
    }

    pub fn from_seed(seed: &[u8; SEED_BYTES]) -> Self {
        Self {
            signing: SigningKey::from_bytes(seed),
        }
    }

    /// The seed as base64, for a key file or a config value.
    pub fn seed_base64(&self) -> String {
        BASE64.encode(self.signing.to_bytes())
    }

    pub fn from_seed_base64(text: &str) -> Result<Self, KeyError> {
        let bytes = decode_base64("key seed", text, SEED_BYTES)?;
        Ok(Self::from_seed(&to_array("key seed", &bytes)?))
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key().to_bytes())
    }

    /// Signs `domain || message` (see [`PublicKey::verify`]).
    pub fn sign(&self, domain: &[u8], message: &[u8]) -> Signature {
        Signature(self.signing.sign(&framed(domain, message)).to_bytes())
    }
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair({:?})", self.public_key())
    }
}

fn framed(domain: &[u8], message: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(domain.len() + message.len());
    bytes.extend_from_slice(domain);
    bytes.extend_from_slice(message);
    bytes
}

fn to_array<const N: usize>(what: &'static str, bytes: &[u8]) -> Result<[u8; N], KeyError> {
    bytes.try_into().map_err(|_| KeyError::Length {
        what,
        expected: N,
        got: bytes.len(),
    })
}

fn decode_base64(what: &'static str, text: &str, expected: usize) -> Result<Vec<u8>, KeyError> {
    // Bound the work before decoding: base64 of N bytes is at most 4 * ceil(N / 3) chars.
    let max_chars = expected.div_ceil(3) * 4;
    if text.len() > max_chars {
        return Err(KeyError::Length {
            what,
            expected,
            got: text.len() / 4 * 3,
        });
    }
    BASE64.decode(text).map_err(|e| KeyError::Base64 {
        what,
        detail: e.to_string(),
    })
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({})", BASE64.encode(self.0))
    }
}

/// Raw bytes in binary formats (msgpack), base64 text in human-readable ones (JSON).
fn serialize_bytes<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    if serializer.is_human_readable() {
        serializer.serialize_str(&BASE64.encode(bytes))
    } else {
        serializer.serialize_bytes(bytes)
    }
}

fn deserialize_bytes<'de, D: Deserializer<'de>>(
    deserializer: D,
    what: &'static str,
    expected: usize,
) -> Result<Vec<u8>, D::Error> {
    if deserializer.is_human_readable() {
        let text = String::deserialize(deserializer)?;
        decode_base64(what, &text, expected).map_err(D::Error::custom)
    } else {
        Ok(serde_bytes::ByteBuf::deserialize(deserializer)?.into_vec())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_bytes(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserialize_bytes(deserializer, "public key", PUBLIC_KEY_BYTES)?;
        Self::from_slice(&bytes).map_err(D::Error::custom)
    }
}

impl Serialize for Signature {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_bytes(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for Signature {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserialize_bytes(deserializer, "signature", SIGNATURE_BYTES)?;
        Self::from_slice(&bytes).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::Verifier as _;

    use super::*;

    #[test]
    fn sign_verify_and_domain_separation() {
        let key = KeyPair::from_seed(&[7; 32]);
        let signature = key.sign(b"a", b"message");
        assert_eq!(
            key.public_key().verify(b"a", b"message", &signature),
            Ok(())
        );
        assert_eq!(
            key.public_key().verify(b"b", b"message", &signature),
            Err(KeyError::BadSignature)
        );
        assert_eq!(
            key.public_key().verify(b"a", b"messagf", &signature),
            Err(KeyError::BadSignature)
        );
    }

    #[test]
    fn keys_round_trip_through_json_and_msgpack() {
        let key = KeyPair::generate();
        let public = key.public_key();
        let json = serde_json::to_string(&public).expect("json");
        assert_eq!(json, format!("\"{}\"", public.to_base64()));
        assert_eq!(
            serde_json::from_str::<PublicKey>(&json).expect("back"),
            public
        );
        let packed = rmp_serde::to_vec(&public).expect("msgpack");
        assert_eq!(
            packed.len(),
            2 + PUBLIC_KEY_BYTES,
            "raw bin8, not an int array"
        );
        assert_eq!(
            rmp_serde::from_slice::<PublicKey>(&packed).expect("back"),
            public
        );
        let restored = KeyPair::from_seed_base64(&key.seed_base64()).expect("seed");
        assert_eq!(restored.public_key(), public);
        assert!(!format!("{key:?}").contains(&key.seed_base64()));
    }

    /// The identity point is a weak (small-order) key: with `R` = identity and `S` = 0 the
    /// cofactorless check `[S]B = R + [k]A` holds for every message. Plain `verify` accepts
    /// that forgery; `verify_strict` must not.
    #[test]
    fn a_weak_key_forgery_is_refused() {
        let mut identity = [0u8; PUBLIC_KEY_BYTES];
        identity[0] = 1;
        let weak = PublicKey(identity);
        let mut forged = [0u8; SIGNATURE_BYTES];
        forged[0] = 1;
        let forged = Signature(forged);
        let dalek_key = VerifyingKey::from_bytes(&identity).expect("the identity decodes");
        assert!(
            dalek_key
                .verify(
                    &framed(b"d", b"any message"),
                    &ed25519_dalek::Signature::from_bytes(&forged.0)
                )
                .is_ok(),
            "the forgery passes the lax check, so this test exercises strictness"
        );
        assert_eq!(
            weak.verify(b"d", b"any message", &forged),
            Err(KeyError::BadSignature)
        );
    }

    #[test]
    fn wrong_lengths_are_refused() {
        assert!(matches!(
            PublicKey::from_slice(&[0; 31]),
            Err(KeyError::Length { got: 31, .. })
        ));
        assert!(PublicKey::from_base64(&"A".repeat(400)).is_err());
    }
}
