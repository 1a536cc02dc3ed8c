//! The pipeline's input and output.

use serde_json::Value;

use crate::nonce::SignedExecutionNonce;
use crate::receipt::{Receipt, ReceiptError, Verdict};
use crate::token::CapabilityToken;

#[derive(Clone, Debug)]
pub struct ToolCallRequest {
    /// The caller's idempotency key: hold ids, event ids and the payment reference derive
    /// from it, so a retry with the same id can never pay or dispatch twice. At most 128 bytes.
    pub request_id: String,
    pub capability: CapabilityToken,
    pub server: String,
    pub tool: String,
    pub arguments: Value,
    pub execution_nonce: Option<SignedExecutionNonce>,
}

#[derive(Clone, Debug)]
pub struct Response {
    pub verdict: Verdict,
    pub reason: Option<String>,
    pub receipt: Receipt,
    /// The tool's answer, on `Allow`.
    pub output: Option<Value>,
    /// A nonce minted for the caller to present on its retry (the preflight path).
    pub execution_nonce: Option<SignedExecutionNonce>,
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The server needs a URL visited first; budget and payment were released (the receipt
    /// says so) and a fresh request may try again.
    #[error("{message}")]
    UrlElicitationRequired {
        message: String,
        receipt: Box<Receipt>,
    },
    #[error("receipt could not be signed: {0}")]
    Receipt(#[from] ReceiptError),
}
