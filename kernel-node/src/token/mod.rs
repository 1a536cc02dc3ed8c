//! Capability tokens (docs/spec.md §8): ed25519-signed grants of tool access and budget, delegable
//! down a chain of at most [`MAX_CHAIN_DEPTH`] tokens where every link may only narrow.

mod attenuation;
mod encoding;
mod error;
mod family;
mod issue;
mod model;
mod structure;
mod verify;

pub(crate) use encoding::from_msgpack_nested_at_most;
pub use error::TokenError;
pub use family::{family_id, family_namespace, FAMILY_NAMESPACE_CHARS};
pub use model::{CapabilityToken, Grant, TokenBody, WILDCARD};
pub use verify::{verify, TrustList, VerifiedCapability};

/// Tokens in one chain, root included: docs/spec.md §8 allows at most 7 ancestors of a grant.
pub const MAX_CHAIN_DEPTH: usize = tally_ledger::limits::MAX_ANCESTORS + 1;
/// Encoded size of a whole token, chain included (binary form); it travels in HTTP headers.
pub const MAX_TOKEN_BYTES: usize = 64 * 1024;
/// Deepest nesting of msgpack arrays and maps a token's encoding may use, enforced while
/// decoding. `MAX_TOKEN_BYTES` alone lets a token nest its `parent` 400-odd times, and the
/// decoder (then re-encoding, comparing, dropping) recurses once per level: such a token
/// overflowed a 512 KiB stack in release and a tokio worker's 2 MiB in debug, aborting the
/// node before any signature was checked (fuzz/regressions/token/deep-nesting). Each chain
/// link nests two levels (the token, its body) and the innermost grants three more (the
/// list, a grant, a money amount), so a chain of `MAX_CHAIN_DEPTH` tokens fits exactly;
/// `verify` still refuses a chain longer than that by its own count.
pub const MAX_TOKEN_NESTING_LEVELS: usize = 2 * MAX_CHAIN_DEPTH + 3;
/// Grants in one token.
pub const MAX_GRANTS_PER_TOKEN: usize = 64;
/// Token ids appear inside hold and event ids (docs/spec.md §9), which the ledger bounds.
pub const MAX_TOKEN_ID_BYTES: usize = 128;
/// Server and tool names.
pub const MAX_NAME_BYTES: usize = 256;
/// How far a token's `issued_at_ms` may lie ahead of the verifier's clock.
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;

/// Prepended to the signed bytes so a token signature never verifies as anything else.
pub(crate) const TOKEN_SIGNING_DOMAIN: &[u8] = b"tally-capability-token-v1\0";

#[cfg(test)]
pub(crate) mod tests;
