//! The kernel node's evaluator: keys, trust, the cluster, the rail and the tool servers. It
//! holds no per-request state; everything an evaluation learns lives in the cluster, on the
//! rail, or in the signed receipt it returns.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument as _;

use super::evaluation::Evaluation;
use super::ledger::BudgetLedger;
use super::possession::{Method, DEFAULT_POSSESSION_SKEW_MS};
use super::receipt_gate::ReceiptGate;
use super::request::{KernelError, Response, ToolCallRequest};
use crate::keys::KeyPair;
use crate::payment::PaymentAdapter;
use crate::receipt::ReceiptLog;
use crate::token::TrustList;
use crate::tool::{ToolRegistry, ToolServer};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// How long a dispatched tool call may take; past it the call counts as entered.
    pub dispatch_deadline: Duration,
    /// `not_after_ms = now + this` on every command (docs/spec.md §5.5).
    pub command_lifetime_ms: u64,
    /// Authorized holds the kernel abandons (a crash before capture) expire after this.
    pub hold_timeout_ms: u64,
    /// Preflight holds live only long enough to be reversed.
    pub preflight_hold_timeout_ms: u64,
    /// Refuse calls without an execution nonce, minting one on a preflight instead.
    pub require_nonce: bool,
    pub nonce_ttl_ms: u64,
    /// How far a proof of possession's `signed_at_ms` may lie from this node's clock, either
    /// side: long enough for honest clock skew and queueing, short enough that a recorded
    /// request soon stops being replayable.
    pub possession_max_skew_ms: u64,
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            dispatch_deadline: Duration::from_secs(30),
            command_lifetime_ms: 60_000,
            hold_timeout_ms: 300_000,
            preflight_hold_timeout_ms: 30_000,
            require_nonce: false,
            nonce_ttl_ms: 30_000,
            possession_max_skew_ms: DEFAULT_POSSESSION_SKEW_MS,
        }
    }
}

pub struct Kernel {
    pub(super) keypair: KeyPair,
    /// Root issuers whose capability tokens this node accepts.
    pub(super) token_issuers: TrustList,
    /// Kernel keys whose nonces this node accepts (its own and its peers').
    pub(super) kernel_keys: TrustList,
    pub(super) ledger: Arc<dyn BudgetLedger>,
    pub(super) payments: Arc<dyn PaymentAdapter>,
    pub(super) tools: ToolRegistry,
    pub(super) receipts: Option<Arc<ReceiptLog>>,
    /// Closed by the first failed receipt append; then no new call is taken.
    pub(super) receipt_gate: ReceiptGate,
    pub(super) config: KernelConfig,
}

impl Kernel {
    pub fn new(
        keypair: KeyPair,
        token_issuers: TrustList,
        ledger: Arc<dyn BudgetLedger>,
        payments: Arc<dyn PaymentAdapter>,
    ) -> Self {
        let kernel_keys = TrustList::new([keypair.public_key()]);
        Self {
            keypair,
            token_issuers,
            kernel_keys,
            ledger,
            payments,
            tools: ToolRegistry::new(),
            receipts: None,
            receipt_gate: ReceiptGate::default(),
            config: KernelConfig::default(),
        }
    }

    pub fn with_config(mut self, config: KernelConfig) -> Self {
        self.config = config;
        self
    }

    pub fn with_tool_server(mut self, server: Arc<dyn ToolServer>) -> Self {
        self.tools.register(server);
        self
    }

    pub fn with_tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = tools;
        self
    }

    pub fn with_receipt_log(mut self, log: Arc<ReceiptLog>) -> Self {
        self.receipts = Some(log);
        self
    }

    /// Also accept nonces minted by a peer kernel node.
    pub fn trust_kernel_key(mut self, key: crate::keys::PublicKey) -> Self {
        self.kernel_keys.trust(key);
        self
    }

    pub fn keypair(&self) -> &KeyPair {
        &self.keypair
    }

    pub fn config(&self) -> &KernelConfig {
        &self.config
    }

    /// Why this node takes no new calls, once its receipt log failed (see [`ReceiptGate`]).
    pub fn receipt_log_failure(&self) -> Option<String> {
        self.receipt_gate.failure()
    }

    /// Changes to [`Self::receipt_log_failure`], for health reporting.
    pub fn watch_receipt_log(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.receipt_gate.subscribe()
    }

    /// Refuses a new call once the receipt log has failed, before anything else happens.
    pub(super) fn check_receipt_gate(&self) -> Result<(), KernelError> {
        match self.receipt_gate.failure() {
            Some(failure) => Err(KernelError::ReceiptLogUnavailable(failure)),
            None => Ok(()),
        }
    }

    /// docs/spec.md §9 for one tool call. A fresh random attempt id per call: two identical calls
    /// (here or on another node) are told apart by the cluster at capture.
    pub async fn evaluate(&self, request: &ToolCallRequest) -> Result<Response, KernelError> {
        self.check_receipt_gate()?;
        let mut evaluation = Evaluation::new(self, request);
        let span = tracing::info_span!(
            "evaluate",
            request_id = %request.request_id,
            attempt_id = %evaluation.attempt_id,
            server = %request.server,
            tool = %request.tool,
        );
        let result = evaluation
            .run(Method::EvaluateToolCall)
            .instrument(span)
            .await;
        evaluation.finish(result)
    }
}
