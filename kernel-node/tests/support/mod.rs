//! Shared fixtures for the cluster tests: a real in-process 3-node Tally cluster, kernels in
//! front of it, tokens, and a fault layer between a kernel and the cluster that loses a reply
//! on the wire after commit (and, optionally, makes the cluster unreachable before the kernel's
//! client can learn the answer).
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tally_authority::faults::NetworkFaults;
use tally_authority::faults::ServiceFaults;
use tally_authority::testing::TestCluster;
use tally_client::{ClientConfig, ClientError, HoldPage, Outcome, TallyClient};
use tally_kernel::payment::PaymentAdapter;
use tally_kernel::pipeline::{
    wall_clock_ms, BudgetLedger, Kernel, KernelConfig, Method, ToolCallRequest,
};
use tally_kernel::receipt::Receipt;
use tally_kernel::{CapabilityToken, Grant, KeyPair, TrustList};
use tally_ledger::{
    AccountKey, ClientCommand, EventId, EventRecord, FamilyId, HoldFilter, HoldId, HoldView,
};

pub struct Env {
    pub cluster: TestCluster,
    pub client: Arc<TallyClient>,
    pub issuer: KeyPair,
    pub agent: KeyPair,
}

pub fn client_config(cluster: &TestCluster) -> ClientConfig {
    let endpoints = cluster
        .configs
        .keys()
        .map(|id| cluster.address(*id))
        .collect();
    let mut config = ClientConfig::new(endpoints, cluster.transport("kernel"));
    config.attempt_timeout = Duration::from_secs(2);
    config.retry_for = Duration::from_secs(5);
    config.resolve_for = Duration::from_secs(5);
    config
}

impl Env {
    pub async fn start() -> Self {
        let cluster = TestCluster::start(3).await;
        let client = Arc::new(TallyClient::new(client_config(&cluster)).expect("client"));
        Self {
            cluster,
            client,
            issuer: KeyPair::generate(),
            agent: agent(),
        }
    }

    /// A kernel node with its own key and client, trusting this env's token issuer.
    pub fn kernel(&self, payments: Arc<dyn PaymentAdapter>) -> Kernel {
        self.kernel_with(
            Arc::new(TallyClient::new(client_config(&self.cluster)).expect("client")),
            payments,
        )
    }

    pub fn kernel_with(
        &self,
        ledger: Arc<dyn BudgetLedger>,
        payments: Arc<dyn PaymentAdapter>,
    ) -> Kernel {
        Kernel::new(
            KeyPair::generate(),
            TrustList::new([self.issuer.public_key()]),
            ledger,
            payments,
        )
        .with_config(KernelConfig {
            dispatch_deadline: Duration::from_millis(500),
            ..KernelConfig::default()
        })
    }

    pub fn token(&self, grants: Vec<Grant>) -> CapabilityToken {
        let now = wall_clock_ms();
        CapabilityToken::issue(
            &self.issuer,
            self.agent.public_key(),
            grants,
            now - 1_000,
            now + 3_600_000,
        )
        .expect("issue")
    }

    /// `(invocation_count, committed_cost_units)` of one account, `None` if it has no row.
    pub async fn usage(&self, token: &CapabilityToken, grant: u32) -> Option<(u32, u64)> {
        self.usage_of(&token.family_id(), token.id().as_str(), grant)
            .await
    }

    pub async fn usage_of(&self, family: &FamilyId, cap: &str, grant: u32) -> Option<(u32, u64)> {
        self.client
            .get_usage(family, &AccountKey::new(cap, grant))
            .await
            .expect("usage read")
            .map(|row| {
                (
                    row.account.invocation_count,
                    row.account.committed_cost_units().expect("no overflow"),
                )
            })
    }

    pub async fn events(&self, token: &CapabilityToken) -> Vec<EventRecord> {
        self.client
            .list_events(
                &token.family_id(),
                Some(token.id().as_str()),
                None,
                None,
                1_000,
            )
            .await
            .expect("events read")
    }

    /// A fault layer for one kernel (see [`LossyLedger`]).
    pub fn lossy(&self, mode: Loss, matches: fn(&EventId) -> bool) -> Arc<LossyLedger> {
        let mut blind = client_config(&self.cluster);
        blind.attempt_timeout = Duration::from_millis(300);
        blind.resolve_for = Duration::from_secs(1);
        let mut inner = client_config(&self.cluster);
        inner.retry_for = Duration::from_secs(1);
        Arc::new(LossyLedger {
            inner: Arc::new(TallyClient::new(inner).expect("client")),
            blind: Arc::new(TallyClient::new(blind).expect("client")),
            service: self
                .cluster
                .nodes
                .values()
                .map(|n| Arc::clone(&n.service_faults))
                .collect(),
            network: Arc::clone(&self.cluster.faults),
            node_ids: self.cluster.nodes.keys().copied().collect(),
            rule: Mutex::new(Some((mode, matches))),
            lost: Mutex::new(None),
        })
    }

    /// Ends every network fault and waits for a serving leader.
    pub async fn heal(&self) {
        self.cluster.faults.heal();
        for node in self.cluster.nodes.values() {
            node.service_faults.heal();
        }
        self.cluster.wait_leader().await;
    }
}

/// The key every [`Env::token`] is issued to. Fixed, so the free request helpers below can sign
/// as the holder without an `Env` at hand.
pub fn agent() -> KeyPair {
    KeyPair::from_seed(&[0xa6; 32])
}

/// A request for `token` (held by [`agent`]), signed by it for `EvaluateToolCall`.
pub fn request(id: &str, token: &CapabilityToken, server: &str, tool: &str) -> ToolCallRequest {
    request_as(id, token, server, tool, &agent())
}

/// [`request`] for a token held by `holder`.
pub fn request_as(
    id: &str,
    token: &CapabilityToken,
    server: &str,
    tool: &str,
    holder: &KeyPair,
) -> ToolCallRequest {
    unsigned(id, token, server, tool)
        .signed(Method::EvaluateToolCall, holder)
        .expect("sign")
}

/// [`request`], signed for `Admit` instead.
pub fn admit_request(
    id: &str,
    token: &CapabilityToken,
    server: &str,
    tool: &str,
) -> ToolCallRequest {
    unsigned(id, token, server, tool)
        .signed(Method::Admit, &agent())
        .expect("sign")
}

/// What a thief who copied the token would send: no proof of possession.
pub fn unsigned(id: &str, token: &CapabilityToken, server: &str, tool: &str) -> ToolCallRequest {
    ToolCallRequest {
        request_id: id.to_owned(),
        capability: token.clone(),
        server: server.to_owned(),
        tool: tool.to_owned(),
        arguments: serde_json::json!({}).into(),
        execution_nonce: None,
        possession: None,
    }
}

/// Signs `request` again for `EvaluateToolCall` as [`agent`], after a test changed a field.
pub fn resign(mut request: ToolCallRequest) -> ToolCallRequest {
    request
        .sign(Method::EvaluateToolCall, &agent())
        .expect("sign");
    request
}

/// What happens to the first command whose event id matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The reply is lost on the wire after commit; the kernel's client recovers on its own
    /// (same-id retry, then `ResolveEvent`).
    ReplyAfterCommit,
    /// The reply is lost after commit and then every node is partitioned from every other
    /// before the kernel hears anything: its client's `ResolveEvent` finds no quorum and the
    /// outcome is `Unknown` (the seed's lost acknowledgement). The answer the test-side client
    /// got for the lost command is thrown away: from the kernel's view it never arrived.
    ReplyAfterCommitThenUnreachable,
    /// Every copy of the command is lost before it is proposed; the client's `ResolveEvent`
    /// then tombstones it: definitely not applied, and it never will be.
    RequestBeforeProposing,
}

/// Which command to lose, and how.
type Rule = (Loss, fn(&EventId) -> bool);

/// A [`BudgetLedger`] that passes everything to a real client, except the first command
/// matching its rule, which it loses as [`Loss`] says.
pub struct LossyLedger {
    inner: Arc<TallyClient>,
    blind: Arc<TallyClient>,
    service: Vec<Arc<ServiceFaults>>,
    network: Arc<NetworkFaults>,
    node_ids: Vec<u64>,
    rule: Mutex<Option<Rule>>,
    lost: Mutex<Option<EventId>>,
}

impl LossyLedger {
    /// The event id whose reply was lost, once it happened.
    pub fn lost(&self) -> Option<EventId> {
        self.lost.lock().expect("lock").clone()
    }
}

#[async_trait]
impl BudgetLedger for LossyLedger {
    async fn submit(&self, command: ClientCommand) -> Outcome {
        let event_id = command.header.event_id.clone();
        let mode = {
            let mut rule = self.rule.lock().expect("lock");
            match *rule {
                Some((mode, matches)) if matches(&event_id) => {
                    *rule = None;
                    Some(mode)
                }
                _ => None,
            }
        };
        let Some(mode) = mode else {
            return self.inner.submit(command).await;
        };
        *self.lost.lock().expect("lock") = Some(event_id.clone());
        if mode == Loss::RequestBeforeProposing {
            for faults in &self.service {
                faults.drop_requests_for(event_id.clone());
            }
            let outcome = self.inner.submit(command).await;
            for faults in &self.service {
                faults.heal();
            }
            return outcome;
        }
        for faults in &self.service {
            faults.drop_reply_after_commit(event_id.clone());
        }
        let recovered = self.inner.submit(command.clone()).await;
        match mode {
            Loss::ReplyAfterCommit | Loss::RequestBeforeProposing => recovered,
            Loss::ReplyAfterCommitThenUnreachable => {
                assert!(
                    matches!(recovered, Outcome::Decided(_)),
                    "the lost command committed: {recovered:?}"
                );
                for id in &self.node_ids {
                    self.network.isolate(*id);
                }
                self.blind.resolve(command).await
            }
        }
    }

    async fn resolve(&self, command: ClientCommand) -> Outcome {
        self.inner.resolve(command).await
    }

    async fn list_holds(
        &self,
        family: Option<&FamilyId>,
        filter: &HoldFilter,
        limit: u32,
    ) -> Result<HoldPage, ClientError> {
        self.inner.list_holds(family, filter, limit).await
    }

    async fn get_hold(
        &self,
        family: &FamilyId,
        hold_id: &HoldId,
    ) -> Result<Option<HoldView>, ClientError> {
        self.inner.get_hold(family, hold_id).await
    }

    fn cluster_id(&self) -> Option<String> {
        self.inner.cluster_id()
    }
}

pub fn is_capture(event_id: &EventId) -> bool {
    event_id.as_str().contains(":capture-invocation:")
}

pub fn is_cancel(event_id: &EventId) -> bool {
    event_id.as_str().contains(":cancel-captured:")
}

pub fn is_reverse(event_id: &EventId) -> bool {
    event_id.as_str().contains(":rollback:")
}

/// The seed's `assert_monetary_capture_receipt_metadata`: the receipt names the hold, the
/// authorize event with its commit index, and the capture event derived from that index.
pub fn assert_capture_metadata(receipt: &Receipt, capability_id: &str, request_id: &str) {
    let hold_id = format!("budget-hold:{request_id}:{capability_id}:0");
    let budget = &receipt.metadata["budget_authority"];
    assert_eq!(
        budget["hold_id"].as_str(),
        Some(hold_id.as_str()),
        "{budget}"
    );
    assert_eq!(
        budget["authorize"]["event_id"].as_str(),
        Some(format!("{hold_id}:authorize").as_str())
    );
    let authorize_index = budget["authorize"]["budget_commit_index"]
        .as_u64()
        .expect("authorize commit index");
    assert_eq!(
        budget["invocation_capture"]["event_id"].as_str(),
        Some(format!("{hold_id}:capture-invocation:{authorize_index}").as_str())
    );
    assert!(
        budget["invocation_capture"]["budget_commit_index"]
            .as_u64()
            .is_some(),
        "capture commit index missing from signed receipt: {budget}"
    );
}
