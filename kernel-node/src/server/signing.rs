//! Signing wire requests, for the kernel service's Rust callers (tests, the chaos harness,
//! clients). Each request is first read exactly as the node will read it, then signed, so the
//! bytes a caller signs are by construction the bytes the node verifies.

use super::convert::{abort_from_pb, complete_from_pb, possession_to_pb, request_from_pb};
use super::pb;
use crate::keys::KeyPair;
use crate::pipeline::possession::{self, Method, PossessionError, Signable};

#[derive(Debug, thiserror::Error)]
pub enum SignRequestError {
    /// The node would answer `INVALID_ARGUMENT` before looking at any signature.
    #[error("a kernel node could not read this request: {0}")]
    Unreadable(String),
    #[error(transparent)]
    Possession(#[from] PossessionError),
}

fn unreadable(status: tonic::Status) -> SignRequestError {
    SignRequestError::Unreadable(status.message().to_owned())
}

fn proof(
    holder: &KeyPair,
    method: Method,
    signed_at_ms: u64,
    request: &dyn Signable,
) -> Result<Option<pb::Possession>, SignRequestError> {
    let proof = possession::sign(holder, method, signed_at_ms, request)?;
    Ok(Some(possession_to_pb(&proof)))
}

/// Signs `call` for `method` (`EvaluateToolCall` or `Admit`) as `holder`, the capability's
/// subject, dated `signed_at_ms`. Any field changed afterwards voids the signature.
pub fn sign_tool_call(
    call: &mut pb::ToolCall,
    method: Method,
    holder: &KeyPair,
    signed_at_ms: u64,
) -> Result<(), SignRequestError> {
    let request = request_from_pb(pb::ToolCall {
        possession: None,
        ..call.clone()
    })
    .map_err(unreadable)?;
    call.possession = proof(holder, method, signed_at_ms, &request)?;
    Ok(())
}

/// Signs `request` as `holder`, the key the ticket was issued to.
pub fn sign_complete(
    request: &mut pb::CompleteRequest,
    holder: &KeyPair,
    signed_at_ms: u64,
) -> Result<(), SignRequestError> {
    let call = complete_from_pb(pb::CompleteRequest {
        possession: None,
        ..request.clone()
    })
    .map_err(unreadable)?;
    request.possession = proof(holder, Method::Complete, signed_at_ms, &call)?;
    Ok(())
}

/// Signs `request` as `holder`, the key the ticket was issued to.
pub fn sign_abort(
    request: &mut pb::AbortRequest,
    holder: &KeyPair,
    signed_at_ms: u64,
) -> Result<(), SignRequestError> {
    let call = abort_from_pb(pb::AbortRequest {
        possession: None,
        ..request.clone()
    })
    .map_err(unreadable)?;
    request.possession = proof(holder, Method::Abort, signed_at_ms, &call)?;
    Ok(())
}
