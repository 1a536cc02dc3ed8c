//! The pipeline's input and output.

use serde_json::Value;

use super::possession::{self, Method, Possession, PossessionError, Signable, SignedFields};
use super::wall_clock_ms;
use crate::keys::KeyPair;
use crate::nonce::SignedExecutionNonce;
use crate::receipt::{Receipt, ReceiptError, Verdict};
use crate::token::CapabilityToken;

/// A tool call's arguments: the JSON text exactly as the caller sent it (what its proof of
/// possession signs) and the value parsed from it. Neither can change without the other, so
/// what was signed is what the tool gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arguments {
    text: String,
    value: Value,
}

impl Arguments {
    /// Parses `text`; blank text means `{}` (proto3 cannot tell an unset string from "").
    pub fn from_json(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        let text = text.into();
        let value = if text.trim().is_empty() {
            Value::Object(serde_json::Map::new())
        } else {
            serde_json::from_str(&text)?
        };
        Ok(Self { text, value })
    }

    /// `value` as compact JSON text.
    pub fn from_value(value: Value) -> Self {
        Self {
            text: value.to_string(),
            value,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn value(&self) -> &Value {
        &self.value
    }
}

impl From<Value> for Arguments {
    fn from(value: Value) -> Self {
        Self::from_value(value)
    }
}

#[derive(Clone, Debug)]
pub struct ToolCallRequest {
    /// The caller's idempotency key: hold ids, event ids and the payment reference derive
    /// from it, so a retry with the same id can never pay or dispatch twice. At most 128 bytes.
    pub request_id: String,
    pub capability: CapabilityToken,
    pub server: String,
    pub tool: String,
    pub arguments: Arguments,
    pub execution_nonce: Option<SignedExecutionNonce>,
    /// The capability holder's signature over this request (see [`possession`]); a request
    /// without a valid one is refused before anything is written to the cluster.
    pub possession: Option<Possession>,
}

impl ToolCallRequest {
    /// Signs the request as it stands, for `method` (`EvaluateToolCall` or `Admit`), now.
    /// Sign last: any later change to a field voids the proof.
    pub fn sign(&mut self, method: Method, holder: &KeyPair) -> Result<(), PossessionError> {
        self.sign_at(method, holder, wall_clock_ms())
    }

    pub fn sign_at(
        &mut self,
        method: Method,
        holder: &KeyPair,
        signed_at_ms: u64,
    ) -> Result<(), PossessionError> {
        self.possession = Some(possession::sign(holder, method, signed_at_ms, self)?);
        Ok(())
    }

    /// [`Self::sign`], by value.
    pub fn signed(mut self, method: Method, holder: &KeyPair) -> Result<Self, PossessionError> {
        self.sign(method, holder)?;
        Ok(self)
    }
}

impl Signable for ToolCallRequest {
    fn write_fields(&self, out: &mut SignedFields) -> Result<(), PossessionError> {
        let token = self
            .capability
            .to_bytes()
            .map_err(|e| PossessionError::Encode(format!("capability: {e}")))?;
        let nonce = self
            .execution_nonce
            .as_ref()
            .map(rmp_serde::to_vec)
            .transpose()
            .map_err(|e| PossessionError::Encode(format!("execution_nonce: {e}")))?;
        out.field("request_id", self.request_id.as_bytes())?;
        out.field("capability", &token)?;
        out.field("server", self.server.as_bytes())?;
        out.field("tool", self.tool.as_bytes())?;
        out.field("arguments_json", self.arguments.text().as_bytes())?;
        out.optional("execution_nonce", nonce.as_deref())
    }
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
    /// The node's receipt log failed earlier, so it takes no new calls (fail closed): nothing
    /// was held, written or paid for this one. Another node can take it.
    #[error(
        "this kernel node admits no new calls: its receipt log failed ({0}); nothing was held \
         for this call; send it to another kernel node"
    )]
    ReceiptLogUnavailable(String),
}
