//! Wire ↔ pipeline conversions. A request the node cannot read (bad token text, arguments
//! that are not JSON, an undecodable nonce or ticket) is `INVALID_ARGUMENT`; everything the
//! pipeline decides travels as an `Evaluation` with its signed receipt.

use serde_json::Value;
use tonic::Status;

use super::pb;
use crate::money::Money;
use crate::nonce::SignedExecutionNonce;
use crate::pipeline::{KernelError, Response, SignedTicket, ToolCallRequest};
use crate::receipt::{Receipt, Verdict};
use crate::token::CapabilityToken;

/// Largest nonce accepted on the wire.
const MAX_NONCE_BYTES: usize = 8 * 1024;

pub fn request_from_pb(call: pb::ToolCall) -> Result<ToolCallRequest, Status> {
    let capability = CapabilityToken::from_text(&call.capability_token)
        .map_err(|e| Status::invalid_argument(format!("capability_token: {e}")))?;
    let arguments: Value = if call.arguments_json.trim().is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        serde_json::from_str(&call.arguments_json)
            .map_err(|e| Status::invalid_argument(format!("arguments_json: {e}")))?
    };
    let execution_nonce = match call.execution_nonce {
        Some(bytes) if bytes.len() > MAX_NONCE_BYTES => {
            return Err(Status::invalid_argument("execution_nonce is too large"))
        }
        Some(bytes) => Some(
            rmp_serde::from_slice::<SignedExecutionNonce>(&bytes)
                .map_err(|e| Status::invalid_argument(format!("execution_nonce: {e}")))?,
        ),
        None => None,
    };
    Ok(ToolCallRequest {
        request_id: call.request_id,
        capability,
        server: call.server,
        tool: call.tool,
        arguments,
        execution_nonce,
    })
}

pub fn ticket_from_pb(bytes: &[u8]) -> Result<SignedTicket, Status> {
    SignedTicket::from_bytes(bytes).map_err(|e| Status::invalid_argument(format!("ticket: {e}")))
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
        Err(error @ KernelError::Receipt(_)) => Err(Status::internal(error.to_string())),
    }
}
