//! Wire ↔ pipeline conversions. A request the node cannot read (bad token text, arguments
//! that are not JSON, an undecodable nonce, ticket or signature) is `INVALID_ARGUMENT`;
//! everything the pipeline decides travels as an `Evaluation` with its signed receipt. A proof
//! of possession that is absent, stale or wrong is the pipeline's to judge (a `DENY`), not
//! unreadable.

use serde_json::Value;
use tally_api::status::Definiteness;
use tonic::Status;

use super::pb;
use crate::keys::Signature;
use crate::money::Money;
use crate::nonce::SignedExecutionNonce;
use crate::pipeline::{
    AbortCall, Arguments, CompleteCall, KernelError, Possession, Response, SignedTicket,
    ToolCallRequest,
};
use crate::receipt::{Receipt, Verdict};
use crate::token::CapabilityToken;

/// Largest nonce accepted on the wire.
const MAX_NONCE_BYTES: usize = 8 * 1024;

pub fn request_from_pb(call: pb::ToolCall) -> Result<ToolCallRequest, Status> {
    let capability = CapabilityToken::from_text(&call.capability_token)
        .map_err(|e| Status::invalid_argument(format!("capability_token: {e}")))?;
    let arguments = Arguments::from_json(call.arguments_json)
        .map_err(|e| Status::invalid_argument(format!("arguments_json: {e}")))?;
    let execution_nonce = match call.execution_nonce {
        Some(bytes) if bytes.len() > MAX_NONCE_BYTES => {
            return Err(Status::invalid_argument("execution_nonce is too large"))
        }
        Some(bytes) => Some(nonce_from_pb(&bytes)?),
        None => None,
    };
    Ok(ToolCallRequest {
        request_id: call.request_id,
        capability,
        server: call.server,
        tool: call.tool,
        arguments,
        execution_nonce,
        possession: possession_from_pb(call.possession)?,
    })
}

/// Strict, like tokens and tickets: only the encoding the kernel itself writes, so the proof
/// of possession over the caller's bytes verifies against the node's re-encoding.
fn nonce_from_pb(bytes: &[u8]) -> Result<SignedExecutionNonce, Status> {
    let nonce = rmp_serde::from_slice::<SignedExecutionNonce>(bytes)
        .map_err(|e| Status::invalid_argument(format!("execution_nonce: {e}")))?;
    let canonical = rmp_serde::to_vec(&nonce)
        .map_err(|e| Status::invalid_argument(format!("execution_nonce: {e}")))?;
    if canonical != bytes {
        return Err(Status::invalid_argument(
            "execution_nonce: not in its canonical encoding",
        ));
    }
    Ok(nonce)
}

/// Absent stays absent (the pipeline denies it); a signature of the wrong length is unreadable.
pub fn possession_from_pb(
    possession: Option<pb::Possession>,
) -> Result<Option<Possession>, Status> {
    possession
        .map(|p| {
            let signature = Signature::from_slice(&p.signature)
                .map_err(|e| Status::invalid_argument(format!("possession.signature: {e}")))?;
            Ok(Possession {
                signed_at_ms: p.signed_at_ms,
                signature,
            })
        })
        .transpose()
}

pub fn possession_to_pb(possession: &Possession) -> pb::Possession {
    pb::Possession {
        signed_at_ms: possession.signed_at_ms,
        signature: possession.signature.0.to_vec(),
    }
}

pub fn ticket_from_pb(bytes: &[u8]) -> Result<SignedTicket, Status> {
    SignedTicket::from_bytes(bytes).map_err(|e| Status::invalid_argument(format!("ticket: {e}")))
}

pub fn complete_from_pb(request: pb::CompleteRequest) -> Result<CompleteCall, Status> {
    Ok(CompleteCall {
        ticket: ticket_from_pb(&request.ticket)?,
        actual_cost: money_from_pb(request.actual_cost)?,
        possession: possession_from_pb(request.possession)?,
    })
}

pub fn abort_from_pb(request: pb::AbortRequest) -> Result<AbortCall, Status> {
    Ok(AbortCall {
        ticket: ticket_from_pb(&request.ticket)?,
        before_dispatch: request.before_dispatch,
        possession: possession_from_pb(request.possession)?,
    })
}

/// A pipeline error that has no `Evaluation`: no receipt, so a status.
pub fn error_to_status(error: KernelError) -> Status {
    match error {
        // Nothing was held or written, and the trailer says so (docs/spec.md §10's
        // `tally-outcome`): the caller may send the call to another kernel node at once.
        error @ KernelError::ReceiptLogUnavailable(_) => {
            let mut status = Status::unavailable(error.to_string());
            Definiteness::Definite.insert_into(status.metadata_mut());
            status
        }
        error => Status::internal(error.to_string()),
    }
}

pub fn money_from_pb(money: Option<pb::Money>) -> Result<Option<Money>, Status> {
    money
        .map(|m| {
            let money = Money::new(m.units, &m.currency);
            money
                .validate()
                .map_err(|e| Status::invalid_argument(format!("actual_cost: {e}")))?;
            Ok(money)
        })
        .transpose()
}

fn receipt_json(receipt: &Receipt) -> Result<String, Status> {
    serde_json::to_string(receipt).map_err(|e| Status::internal(format!("receipt: {e}")))
}

pub fn response_to_pb(response: &Response) -> Result<pb::Evaluation, Status> {
    let execution_nonce = response
        .execution_nonce
        .as_ref()
        .map(rmp_serde::to_vec)
        .transpose()
        .map_err(|e| Status::internal(format!("nonce: {e}")))?;
    Ok(pb::Evaluation {
        verdict: match response.verdict {
            Verdict::Allow => pb::Verdict::Allow,
            Verdict::Deny => pb::Verdict::Deny,
        } as i32,
        reason: response.reason.clone(),
        receipt_json: receipt_json(&response.receipt)?,
        output_json: response.output.as_ref().map(Value::to_string),
        execution_nonce,
        url_elicitation: None,
    })
}

/// The pipeline's answer, whatever it was, as an `Evaluation`.
pub fn result_to_pb(result: Result<Response, KernelError>) -> Result<pb::Evaluation, Status> {
    match result {
        Ok(response) => response_to_pb(&response),
        Err(KernelError::UrlElicitationRequired { message, receipt }) => Ok(pb::Evaluation {
            verdict: pb::Verdict::Deny as i32,
            reason: receipt.reason.clone(),
            receipt_json: receipt_json(&receipt)?,
            output_json: None,
            execution_nonce: None,
            url_elicitation: Some(message),
        }),
        Err(error) => Err(error_to_status(error)),
    }
}
