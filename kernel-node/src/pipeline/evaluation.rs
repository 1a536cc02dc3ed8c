//! One evaluation's working state and its end: everything learned on the way goes into the
//! receipt's metadata, and the receipt is signed whatever the verdict.

use std::collections::BTreeMap;

use rand::RngCore as _;
use serde_json::{Map, Value};
use tally_api::text::bounded;
use tally_ledger::{
    AttemptId, BudgetCommitIndex, ClientCommand, CommandHeader, EventId, GrantLimits, HoldId,
    Operation,
};

use super::kernel::Kernel;
use super::possession::{self, Method};
use super::reasons;
use super::request::{KernelError, Response, ToolCallRequest};
use super::wall_clock_ms;
use crate::money::Money;
use crate::nonce::SignedExecutionNonce;
use crate::receipt::{
    BudgetAuthorityMetadata, ExecutionNonceMetadata, FinancialMetadata, ReceiptDraft,
    ReceiptMetadata, Verdict, MAX_NAME_BYTES, MAX_REASON_BYTES,
};
use crate::token::VerifiedCapability;
use crate::tool::ToolOutput;

/// Why an evaluation stopped short of `Allow`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    Deny(String),
    /// Budget and payment were released; the caller gets the server's message.
    UrlElicitation {
        message: String,
    },
}

pub(super) type Step<T> = Result<T, Stop>;

pub(super) fn deny<T>(reason: impl Into<String>) -> Step<T> {
    Err(Stop::Deny(reason.into()))
}

/// The hold this evaluation authorized.
#[derive(Clone, Debug)]
pub(super) struct Held {
    pub hold_id: HoldId,
    pub header: CommandHeader,
    pub authorize_index: BudgetCommitIndex,
    pub exposure: u64,
    pub limits: GrantLimits,
}

impl Held {
    pub fn command(&self, event_id: EventId, op: Operation) -> ClientCommand {
        let mut header = self.header.clone();
        header.event_id = event_id;
        ClientCommand { header, op }
    }
}

pub(super) struct Evaluation<'k> {
    pub kernel: &'k Kernel,
    pub request: &'k ToolCallRequest,
    pub now_ms: u64,
    pub attempt_id: AttemptId,
    pub capability: Option<VerifiedCapability>,
    pub budget: Option<BudgetAuthorityMetadata>,
    /// Keys under `budget_authority` beyond the per-step records (the seed's `cleanup_*`).
    pub budget_extra: Map<String, Value>,
    pub financial: Option<FinancialMetadata>,
    /// Keys under `financial` beyond [`FinancialMetadata`]'s (the seed's release keys).
    pub financial_extra: Map<String, Value>,
    pub nonce: Option<ExecutionNonceMetadata>,
    pub extra: BTreeMap<String, Value>,
    pub minted_nonce: Option<SignedExecutionNonce>,
}

fn fresh_attempt_id() -> AttemptId {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    AttemptId::new(format!(
        "att-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

impl<'k> Evaluation<'k> {
    pub fn new(kernel: &'k Kernel, request: &'k ToolCallRequest) -> Self {
        Self {
            kernel,
            request,
            now_ms: wall_clock_ms(),
            attempt_id: fresh_attempt_id(),
            capability: None,
            budget: None,
            budget_extra: Map::new(),
            financial: None,
            financial_extra: Map::new(),
            nonce: None,
            extra: BTreeMap::new(),
            minted_nonce: None,
        }
    }

    pub fn not_after_ms(&self) -> u64 {
        self.now_ms
            .saturating_add(self.kernel.config.command_lifetime_ms)
    }

    pub fn budget_mut(&mut self) -> &mut BudgetAuthorityMetadata {
        assert!(
            self.budget.is_some(),
            "budget metadata is recorded only after a hold was named"
        );
        self.budget
            .get_or_insert_with(|| BudgetAuthorityMetadata::new(HoldId::new("none")))
    }

    pub fn financial_mut(&mut self) -> &mut FinancialMetadata {
        let reference = self.request.request_id.clone();
        self.financial
            .get_or_insert_with(|| FinancialMetadata::new(&reference))
    }

    pub async fn run(&mut self, method: Method) -> Step<ToolOutput> {
        let (held, payment) = self.admit(method).await?;
        let request = self.request;
        let Some(server) = self.kernel.tools.lookup(&request.server, &request.tool) else {
            let why = format!(
                "tool {}/{} is not registered on this kernel node",
                request.server, request.tool
            );
            self.unwind_pre_dispatch(&held, payment.as_ref()).await?;
            return deny(why);
        };
        self.dispatch(&held, payment.as_ref(), server).await
    }

    /// Everything before dispatch: request and token checks, the caller's proof of
    /// possession as `method`, the hold, the nonce, the capture (ours) and the payment
    /// authorization.
    pub async fn admit(&mut self, method: Method) -> Step<(Held, Option<Money>)> {
        let request = self.request;
        if request.request_id.is_empty()
            || request.request_id.len() > tally_client::ids::MAX_REQUEST_ID_BYTES
        {
            return deny(format!(
                "request_id must be 1-{} bytes, got {}",
                tally_client::ids::MAX_REQUEST_ID_BYTES,
                request.request_id.len()
            ));
        }
        if request.server.len() > MAX_NAME_BYTES || request.tool.len() > MAX_NAME_BYTES {
            return deny(format!(
                "server and tool names are at most {MAX_NAME_BYTES} bytes"
            ));
        }
        let capability = match crate::token::verify(
            &request.capability,
            &self.kernel.token_issuers,
            self.now_ms,
            None,
        ) {
            Ok(capability) => capability,
            Err(error) => return deny(format!("capability rejected: {error}")),
        };
        // Only after the chain verified is its leaf's subject a key worth checking against.
        if let Err(error) = possession::verify(
            &capability.subject(),
            method,
            request,
            request.possession.as_ref(),
            self.now_ms,
            self.kernel.config.possession_max_skew_ms,
        ) {
            return deny(format!(
                "{} for capability {}: {error}",
                reasons::POSSESSION_REJECTED,
                capability.capability_id()
            ));
        }
        self.capability = Some(capability.clone());
        let grants = capability.matching_grants(&request.server, &request.tool);
        if grants.is_empty() {
            return deny(format!(
                "no grant of capability {} covers {}/{}",
                capability.capability_id(),
                request.server,
                request.tool
            ));
        }
        if request.execution_nonce.is_none() && self.kernel.config.require_nonce {
            return Err(self.preflight(&capability, &grants).await);
        }
        let held = self.authorize(&capability, &grants, false).await?;
        self.check_and_consume_nonce(&capability, &held).await?;
        self.capture(&held).await?;
        let payment = self.authorize_payment(&held).await?;
        Ok((held, payment))
    }

    fn metadata(&self) -> Value {
        let mut extra = self.extra.clone();
        if self.nonce.is_none() && self.request.execution_nonce.is_some() {
            extra.entry("execution_nonce".into()).or_insert_with(|| {
                Value::Object(Map::from_iter([(
                    "presented".to_owned(),
                    Value::Bool(true),
                )]))
            });
        }
        let mut value = ReceiptMetadata {
            budget_authority: self.budget.clone(),
            financial: self.financial.clone(),
            execution_nonce: self.nonce.clone(),
            extra,
        }
        .to_value();
        for (key, fields) in [
            ("budget_authority", &self.budget_extra),
            ("financial", &self.financial_extra),
        ] {
            if fields.is_empty() {
                continue;
            }
            let entry = value
                .as_object_mut()
                .map(|map| map.entry(key).or_insert_with(|| Value::Object(Map::new())));
            if let Some(Value::Object(target)) = entry {
                for (k, v) in fields {
                    target.insert(k.clone(), v.clone());
                }
            }
        }
        value
    }

    /// Signs the receipt for `result` and appends it to the node's receipt log, if any.
    pub fn finish(self, result: Step<ToolOutput>) -> Result<Response, KernelError> {
        let (verdict, reason, output, url_message) = match result {
            Ok(output) => (Verdict::Allow, None, Some(output.content), None),
            Err(Stop::Deny(reason)) => (Verdict::Deny, Some(reason), None, None),
            Err(Stop::UrlElicitation { message }) => (
                Verdict::Deny,
                Some(format!("URL elicitation required: {message}")),
                None,
                Some(message),
            ),
        };
        let request = self.request;
        let mut draft = ReceiptDraft::new(
            bounded(&request.request_id, tally_client::ids::MAX_REQUEST_ID_BYTES),
            bounded(&request.server, MAX_NAME_BYTES),
            bounded(&request.tool, MAX_NAME_BYTES),
            verdict,
            self.now_ms,
        )
        .with_metadata(self.metadata());
        if let Some(capability) = &self.capability {
            draft = draft.with_capability(capability);
        }
        if let Some(reason) = &reason {
            draft = draft.with_reason(bounded(reason, MAX_REASON_BYTES));
        }
        let receipt = draft.sign(&self.kernel.keypair)?;
        if let Some(log) = &self.kernel.receipts {
            if let Err(error) = log.append(&receipt) {
                // This call has run its course (maybe dispatched): answer it as decided, and
                // take no new ones (fail closed; see `receipt_gate`).
                tracing::error!(%error, receipt_id = %receipt.receipt_id, "receipt log append failed; refusing new calls");
                self.kernel.receipt_gate.trip(&error.to_string());
            }
        }
        tracing::info!(
            request_id = %request.request_id,
            verdict = ?verdict,
            reason = reason.as_deref().unwrap_or(""),
            "tool call evaluated"
        );
        if let Some(message) = url_message {
            return Err(KernelError::UrlElicitationRequired {
                message,
                receipt: Box::new(receipt),
            });
        }
        Ok(Response {
            verdict,
            reason,
            receipt,
            output,
            execution_nonce: self.minted_nonce,
        })
    }
}

/// Reason for a denial nobody can act on but an operator.
pub(super) fn unexpected(step: &str, answer: &impl std::fmt::Debug) -> Stop {
    Stop::Deny(format!(
        "{}: unexpected {step} answer {answer:?}",
        reasons::BUDGET_UNAVAILABLE
    ))
}
