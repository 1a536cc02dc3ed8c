//! Proof of possession (docs/spec.md §9, "Proof of possession"). A capability token is a
//! bearer credential until its holder proves it holds the token's subject key: every call that
//! spends or settles budget (`EvaluateToolCall`, `Admit`, `Complete`, `Abort`, and the Rust-only
//! `DispatchAdmitted`) carries an ed25519 signature by that key over the exact canonical bytes
//! below, with a timestamp the node checks against its clock. A token or ticket copied off the
//! wire or out of a log is then useless without the key, and a signature is good for one
//! method, one request and a short window only.
//!
//! The signed bytes, defined here and nowhere else:
//!
//! ```text
//! DOMAIN   = "tally.kernel.v1.pop" 0x00
//! signed   = DOMAIN || field(method) || u64be(signed_at_ms) || fields of the method
//! field(x) = u32be(byte length of x) || x
//! opt(x)   = 0x00                      when absent
//!          | 0x01 || field(x)          when present
//! flag(b)  = 0x00 | 0x01
//!
//! EvaluateToolCall, Admit:
//!   field(request_id) field(capability) field(server) field(tool) field(arguments_json)
//!   opt(execution_nonce)
//! Complete:         field(ticket) then 0x00 (no actual_cost)
//!                                   | 0x01 || u64be(units) || field(currency)
//! Abort:            field(ticket) flag(before_dispatch)
//! DispatchAdmitted: field(ticket) field(arguments_json)
//! ```
//!
//! `method` is the gRPC method name in ASCII. Strings are their UTF-8 bytes. `capability` is
//! the token's binary encoding (the bytes whose URL-safe base64 is `capability_token`),
//! `arguments_json` the arguments text exactly as sent (blank included), `execution_nonce` and
//! `ticket` the msgpack bytes exactly as the kernel handed them out. Tokens, nonces and tickets
//! are decoded strictly (one encoding each), so the node re-encodes what it decoded and gets
//! the very bytes the caller signed.

use crate::keys::{KeyPair, PublicKey, Signature};

/// Prepended to the signed bytes so a proof never verifies as a token, ticket, nonce or
/// receipt signature, nor they as a proof (the same key may sign several of them).
pub const POSSESSION_DOMAIN: &[u8] = b"tally.kernel.v1.pop\0";
/// How far `signed_at_ms` may lie from the node's clock, either side, unless configured.
pub const DEFAULT_POSSESSION_SKEW_MS: u64 = 60_000;
/// The widest window a node may be configured with: a proof is a short-lived thing.
pub const MAX_POSSESSION_SKEW_MS: u64 = 600_000;
/// Longest single field: a kernel message is at most 4 MiB, so no honest field is longer.
pub const MAX_SIGNED_FIELD_BYTES: usize = 4 * 1024 * 1024;

/// The call a proof is good for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    EvaluateToolCall,
    Admit,
    Complete,
    Abort,
    /// [`Kernel::dispatch_admitted`](super::Kernel::dispatch_admitted); not on the wire.
    DispatchAdmitted,
}

impl Method {
    pub const fn name(self) -> &'static str {
        match self {
            Self::EvaluateToolCall => "EvaluateToolCall",
            Self::Admit => "Admit",
            Self::Complete => "Complete",
            Self::Abort => "Abort",
            Self::DispatchAdmitted => "DispatchAdmitted",
        }
    }
}

/// A holder's proof: when it signed, and its signature over the canonical bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Possession {
    pub signed_at_ms: u64,
    pub signature: Signature,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PossessionError {
    #[error("{method} carries no proof of possession; sign it with the capability's subject key")]
    Missing { method: &'static str },
    #[error(
        "proof of possession signed at {signed_at_ms} ms is stale: this node's clock reads \
         {now_ms} ms and allows {max_skew_ms} ms either side; sign again"
    )]
    Stale {
        signed_at_ms: u64,
        now_ms: u64,
        max_skew_ms: u64,
    },
    #[error("{method} proof of possession does not verify against the holder key {holder}")]
    BadSignature {
        method: &'static str,
        holder: PublicKey,
    },
    #[error("{field} is {bytes} bytes; at most {max} can be signed")]
    TooLarge {
        field: &'static str,
        bytes: usize,
        max: usize,
    },
    #[error("request cannot be encoded for its proof of possession: {0}")]
    Encode(String),
}

/// The canonical bytes under construction (see the module docs for the layout).
#[derive(Debug)]
pub struct SignedFields {
    bytes: Vec<u8>,
}

impl SignedFields {
    fn new(method: Method, signed_at_ms: u64) -> Self {
        let mut fields = Self { bytes: Vec::new() };
        let name = method.name().as_bytes();
        fields.put_len(name.len());
        fields.bytes.extend_from_slice(name);
        fields.u64(signed_at_ms);
        fields
    }

    fn put_len(&mut self, len: usize) {
        assert!(
            len <= MAX_SIGNED_FIELD_BYTES,
            "field lengths are checked against MAX_SIGNED_FIELD_BYTES before encoding"
        );
        // MAX_SIGNED_FIELD_BYTES fits in u32, so the length prefix is exact.
        self.bytes
            .extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    }

    /// `field(value)`.
    pub fn field(&mut self, name: &'static str, value: &[u8]) -> Result<(), PossessionError> {
        if value.len() > MAX_SIGNED_FIELD_BYTES {
            return Err(PossessionError::TooLarge {
                field: name,
                bytes: value.len(),
                max: MAX_SIGNED_FIELD_BYTES,
            });
        }
        self.put_len(value.len());
        self.bytes.extend_from_slice(value);
        Ok(())
    }

    /// `opt(value)`.
    pub fn optional(
        &mut self,
        name: &'static str,
        value: Option<&[u8]>,
    ) -> Result<(), PossessionError> {
        self.flag(value.is_some());
        match value {
            Some(value) => self.field(name, value),
            None => Ok(()),
        }
    }

    /// `flag(b)`.
    pub fn flag(&mut self, value: bool) {
        self.bytes.push(u8::from(value));
    }

    /// `u64be(n)`.
    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_be_bytes());
    }
}

/// A request a proof of possession covers: it writes its method's fields, in order.
pub trait Signable {
    fn write_fields(&self, out: &mut SignedFields) -> Result<(), PossessionError>;
}

/// What follows [`POSSESSION_DOMAIN`] in the signed bytes.
fn message(
    method: Method,
    signed_at_ms: u64,
    request: &dyn Signable,
) -> Result<Vec<u8>, PossessionError> {
    let mut fields = SignedFields::new(method, signed_at_ms);
    request.write_fields(&mut fields)?;
    Ok(fields.bytes)
}

/// The exact bytes a proof for `request` as `method` at `signed_at_ms` signs, domain included.
pub fn signed_bytes(
    method: Method,
    signed_at_ms: u64,
    request: &dyn Signable,
) -> Result<Vec<u8>, PossessionError> {
    let mut bytes = POSSESSION_DOMAIN.to_vec();
    bytes.extend(message(method, signed_at_ms, request)?);
    Ok(bytes)
}

/// The holder's proof for `request` as `method`, dated `signed_at_ms`.
pub fn sign(
    holder: &KeyPair,
    method: Method,
    signed_at_ms: u64,
    request: &dyn Signable,
) -> Result<Possession, PossessionError> {
    let message = message(method, signed_at_ms, request)?;
    Ok(Possession {
        signed_at_ms,
        signature: holder.sign(POSSESSION_DOMAIN, &message),
    })
}

/// Checks that `possession` is `holder`'s fresh signature over `request` as `method`. Pure and
/// local: a caller runs it before anything reaches the cluster.
pub fn verify(
    holder: &PublicKey,
    method: Method,
    request: &dyn Signable,
    possession: Option<&Possession>,
    now_ms: u64,
    max_skew_ms: u64,
) -> Result<(), PossessionError> {
    let Some(possession) = possession else {
        return Err(PossessionError::Missing {
            method: method.name(),
        });
    };
    if now_ms.abs_diff(possession.signed_at_ms) > max_skew_ms {
        return Err(PossessionError::Stale {
            signed_at_ms: possession.signed_at_ms,
            now_ms,
            max_skew_ms,
        });
    }
    let message = message(method, possession.signed_at_ms, request)?;
    holder
        .verify(POSSESSION_DOMAIN, &message, &possession.signature)
        .map_err(|_| PossessionError::BadSignature {
            method: method.name(),
            holder: *holder,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fields(Vec<(&'static str, Vec<u8>)>, Option<Vec<u8>>, bool, u64);

    impl Signable for Fields {
        fn write_fields(&self, out: &mut SignedFields) -> Result<(), PossessionError> {
            for (name, value) in &self.0 {
                out.field(name, value)?;
            }
            out.optional("opt", self.1.as_deref())?;
            out.flag(self.2);
            out.u64(self.3);
            Ok(())
        }
    }

    fn sample() -> Fields {
        Fields(
            vec![("a", b"ab".to_vec()), ("b", Vec::new())],
            Some(b"z".to_vec()),
            true,
            7,
        )
    }

    /// The layout of the module docs, byte for byte: other-language clients build exactly this.
    #[test]
    fn the_signed_bytes_are_fixed() {
        let bytes = signed_bytes(Method::Abort, 0x0102, &sample()).expect("bytes");
        let mut expected = b"tally.kernel.v1.pop\0".to_vec();
        expected.extend([0, 0, 0, 5]);
        expected.extend(b"Abort");
        expected.extend([0, 0, 0, 0, 0, 0, 1, 2]);
        expected.extend([0, 0, 0, 2, b'a', b'b']);
        expected.extend([0, 0, 0, 0]);
        expected.extend([1, 0, 0, 0, 1, b'z']);
        expected.extend([1]);
        expected.extend([0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(bytes, expected);
        let mut absent = sample();
        absent.1 = None;
        let bytes = signed_bytes(Method::Abort, 0x0102, &absent).expect("bytes");
        assert_eq!(&bytes[bytes.len() - 10..], &[0, 1, 0, 0, 0, 0, 0, 0, 0, 7]);
    }

    #[test]
    fn a_proof_covers_its_key_method_time_and_every_field() {
        let holder = KeyPair::from_seed(&[1; 32]);
        let key = holder.public_key();
        let now = 1_000_000;
        let proof = sign(&holder, Method::Admit, now, &sample()).expect("sign");
        let check = |method, request: &Fields, proof: &Possession| {
            verify(&key, method, request, Some(proof), now, 60_000)
        };
        assert_eq!(check(Method::Admit, &sample(), &proof), Ok(()));
        assert!(matches!(
            check(Method::EvaluateToolCall, &sample(), &proof),
            Err(PossessionError::BadSignature { .. })
        ));
        let mut moved = sample();
        moved.0[0].1 = b"ba".to_vec();
        assert!(check(Method::Admit, &moved, &proof).is_err());
        // Length prefixes keep field boundaries: "ab","" and "a","b" sign differently.
        let mut shifted = sample();
        shifted.0 = vec![("a", b"a".to_vec()), ("b", b"b".to_vec())];
        assert!(check(Method::Admit, &shifted, &proof).is_err());
        let mut redated = proof;
        redated.signed_at_ms += 1;
        assert!(check(Method::Admit, &sample(), &redated).is_err());
        let thief = KeyPair::from_seed(&[2; 32]);
        let stolen = sign(&thief, Method::Admit, now, &sample()).expect("sign");
        assert_eq!(
            check(Method::Admit, &sample(), &stolen),
            Err(PossessionError::BadSignature {
                method: "Admit",
                holder: key
            })
        );
        assert_eq!(
            verify(&key, Method::Admit, &sample(), None, now, 60_000),
            Err(PossessionError::Missing { method: "Admit" })
        );
    }

    #[test]
    fn a_proof_outside_the_window_either_side_is_stale() {
        let holder = KeyPair::from_seed(&[3; 32]);
        let now = 10_000_000;
        for signed_at in [now - 60_001, now + 60_001] {
            let proof = sign(&holder, Method::Complete, signed_at, &sample()).expect("sign");
            assert_eq!(
                verify(
                    &holder.public_key(),
                    Method::Complete,
                    &sample(),
                    Some(&proof),
                    now,
                    60_000
                ),
                Err(PossessionError::Stale {
                    signed_at_ms: signed_at,
                    now_ms: now,
                    max_skew_ms: 60_000
                })
            );
        }
        for signed_at in [now - 60_000, now + 60_000] {
            let proof = sign(&holder, Method::Complete, signed_at, &sample()).expect("sign");
            assert_eq!(
                verify(
                    &holder.public_key(),
                    Method::Complete,
                    &sample(),
                    Some(&proof),
                    now,
                    60_000
                ),
                Ok(())
            );
        }
    }
}
