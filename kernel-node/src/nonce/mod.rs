//! Execution nonces: a kernel-signed, single-use permission bound to one exact request
//! (subject, request id, family and capability, server, tool, argument hash). Spending it is a
//! cluster command (`ConsumeNonce`, docs/spec.md §4), so a nonce used on one kernel node is
//! spent for all.

mod consume;
mod model;

pub use consume::{consume_command, consume_event_id};
pub use model::{
    mint, parameter_hash, verify, ExecutionNonce, NonceBinding, NonceError, SignedExecutionNonce,
};

/// Longest nonce lifetime a kernel mints (the ledger refuses longer ones).
pub const MAX_NONCE_TTL_MS: u64 = tally_ledger::limits::MAX_NONCE_TTL_MS;

/// Prepended to the signed bytes so a nonce signature never verifies as a token or receipt.
pub(crate) const NONCE_SIGNING_DOMAIN: &[u8] = b"tally-execution-nonce-v1\0";
