//! Errors of the client library itself (not command outcomes, see `outcome.rs`).

use tally_api::RemoteError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("client configuration: {0}")]
    Config(String),
    /// A read or admin call that no node answered.
    #[error("no node answered: {0}")]
    Unreachable(String),
    /// A node answered with an error.
    #[error("{0}")]
    Remote(#[from] RemoteError),
    #[error("malformed reply: {0}")]
    Wire(#[from] tally_api::WireError),
}
