//! Wire forms of a token: msgpack bytes, and URL-safe base64 of them for CLI arguments and
//! HTTP headers. Decoding is bounded and strict: one token has exactly one encoding.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::de::DeserializeOwned;

use super::error::TokenError;
use super::model::CapabilityToken;
use super::{MAX_TOKEN_BYTES, MAX_TOKEN_NESTING_LEVELS};

/// Longest text form: base64 of [`MAX_TOKEN_BYTES`].
pub const MAX_TOKEN_TEXT_BYTES: usize = MAX_TOKEN_BYTES.div_ceil(3) * 4;

impl CapabilityToken {
    pub fn to_bytes(&self) -> Result<Vec<u8>, TokenError> {
        let bytes =
            rmp_serde::to_vec(self).map_err(|e| TokenError::malformed(format!("encode: {e}")))?;
        if bytes.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLarge {
                bytes: bytes.len(),
                max: MAX_TOKEN_BYTES,
            });
        }
        Ok(bytes)
    }

    /// Refuses oversized input before parsing, and any encoding that is not the canonical
    /// one (so equal tokens are equal bytes, and a hash of a token names it).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TokenError> {
        if bytes.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLarge {
                bytes: bytes.len(),
                max: MAX_TOKEN_BYTES,
            });
        }
        let token: Self =
            from_msgpack_nested_at_most(bytes, MAX_TOKEN_NESTING_LEVELS).map_err(|e| match e {
                rmp_serde::decode::Error::DepthLimitExceeded => TokenError::TooDeeplyNested {
                    max_levels: MAX_TOKEN_NESTING_LEVELS,
                },
                e => TokenError::malformed(format!("decode: {e}")),
            })?;
        if token.to_bytes()? != bytes {
            return Err(TokenError::malformed("not the canonical encoding"));
        }
        Ok(token)
    }

    pub fn to_text(&self) -> Result<String, TokenError> {
        Ok(URL_SAFE_NO_PAD.encode(self.to_bytes()?))
    }

    pub fn from_text(text: &str) -> Result<Self, TokenError> {
        let text = text.trim();
        if text.len() > MAX_TOKEN_TEXT_BYTES {
            return Err(TokenError::TooLarge {
                bytes: text.len() / 4 * 3,
                max: MAX_TOKEN_BYTES,
            });
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|e| TokenError::malformed(format!("base64: {e}")))?;
        Self::from_bytes(&bytes)
    }
}

/// `rmp_serde::from_slice`, refusing with `DepthLimitExceeded` as soon as arrays and maps nest
/// deeper than `max_levels`: the decoder recurses once per level, so this bounds its stack use
/// (and that of everything that later walks the value) by the shape a valid value can have,
/// not by the input size. Used for every msgpack structure that embeds a token.
pub(crate) fn from_msgpack_nested_at_most<T: DeserializeOwned>(
    bytes: &[u8],
    max_levels: usize,
) -> Result<T, rmp_serde::decode::Error> {
    let mut decoder = rmp_serde::Deserializer::from_read_ref(bytes);
    // rmp-serde counts down from its limit and fails on reaching zero, so a limit of n
    // admits n - 1 levels.
    decoder.set_max_depth(max_levels + 1);
    T::deserialize(&mut decoder)
}
