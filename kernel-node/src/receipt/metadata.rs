//! Builders for the metadata keys receipts carry (the seed's `budget_authority`, `financial`
//! and `execution_nonce`). Each cluster event is named by its exact `event_id`; a committed
//! one carries its `budget_commit_index`, an ambiguous one an `*_ambiguous` flag and no index,
//! so a reconciler knows precisely what to resolve (docs/spec.md §9).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};
use tally_ledger::{AttemptId, BudgetCommitIndex, EventId, HoldId, NonceId};

use crate::payment::{ReleaseStatus, SettlementStatus};

/// One budget event of a tool call, in pipeline order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BudgetStep {
    Authorize,
    InvocationCapture,
    CancelCapturedBeforeDispatch,
    Reverse,
    Release,
    Reconcile,
}

impl BudgetStep {
    /// The key under `budget_authority`.
    pub fn key(self) -> &'static str {
        match self {
            Self::Authorize => "authorize",
            Self::InvocationCapture => "invocation_capture",
            Self::CancelCapturedBeforeDispatch => "cancel_captured_before_dispatch",
            Self::Reverse => "reverse",
            Self::Release => "release",
            Self::Reconcile => "reconcile",
        }
    }

    /// The flag set (to `true`) when the step's acknowledgement was lost and not resolved.
    pub fn ambiguity_flag(self) -> &'static str {
        match self {
            Self::Authorize => "authorize_ambiguous",
            Self::InvocationCapture => "invocation_capture_ambiguous",
            Self::CancelCapturedBeforeDispatch => "cancellation_ambiguous",
            Self::Reverse => "reverse_ambiguous",
            Self::Release => "release_ambiguous",
            Self::Reconcile => "reconcile_ambiguous",
        }
    }
}

/// What the kernel knows about one step's event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    pub event_id: EventId,
    /// `Some` when the cluster answered; `None` means ambiguous.
    pub commit_index: Option<BudgetCommitIndex>,
    /// The budget stays held because of this step (the seed's `admission_retained`).
    pub admission_retained: bool,
    pub attempt_id: Option<AttemptId>,
    /// The cluster's denial rule, when the event was a denial.
    pub deny_rule: Option<String>,
}

/// `metadata.budget_authority`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetAuthorityMetadata {
    pub hold_id: HoldId,
    pub grant_index: Option<u32>,
    pub cluster_id: Option<String>,
    pub term: Option<u64>,
    /// e.g. `linearizable`: what the cluster promised for these answers.
    pub guarantee_level: Option<String>,
    pub steps: BTreeMap<BudgetStep, StepRecord>,
}

impl BudgetAuthorityMetadata {
    pub fn new(hold_id: HoldId) -> Self {
        Self {
            hold_id,
            grant_index: None,
            cluster_id: None,
            term: None,
            guarantee_level: None,
            steps: BTreeMap::new(),
        }
    }

    pub fn grant_index(&mut self, grant_index: u32) -> &mut Self {
        self.grant_index = Some(grant_index);
        self
    }

    pub fn cluster(&mut self, cluster_id: &str, term: u64, guarantee_level: &str) -> &mut Self {
        self.cluster_id = Some(cluster_id.to_owned());
        self.term = Some(term);
        self.guarantee_level = Some(guarantee_level.to_owned());
        self
    }

    /// The cluster answered `step` at `index`.
    pub fn committed(
        &mut self,
        step: BudgetStep,
        event_id: EventId,
        index: BudgetCommitIndex,
    ) -> &mut Self {
        self.steps
            .insert(step, StepRecord::new(event_id, Some(index)));
        self
    }

    /// `step`'s answer was lost and could not be resolved before the deadline.
    pub fn ambiguous(&mut self, step: BudgetStep, event_id: EventId) -> &mut Self {
        self.steps.insert(step, StepRecord::new(event_id, None));
        self
    }

    /// Marks the budget as kept because of `step` (a no-op if the step is not recorded).
    pub fn retained(&mut self, step: BudgetStep) -> &mut Self {
        if let Some(record) = self.steps.get_mut(&step) {
            record.admission_retained = true;
        }
        self
    }

    pub fn attempt(&mut self, step: BudgetStep, attempt_id: AttemptId) -> &mut Self {
        if let Some(record) = self.steps.get_mut(&step) {
            record.attempt_id = Some(attempt_id);
        }
        self
    }

    pub fn denied(&mut self, step: BudgetStep, rule: &str) -> &mut Self {
        if let Some(record) = self.steps.get_mut(&step) {
            record.deny_rule = Some(rule.to_owned());
        }
        self
    }

    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("hold_id".into(), self.hold_id.as_str().into());
        insert_opt(&mut map, "grant_index", self.grant_index.map(Value::from));
        insert_opt(
            &mut map,
            "cluster_id",
            self.cluster_id.clone().map(Value::from),
        );
        insert_opt(&mut map, "term", self.term.map(Value::from));
        insert_opt(
            &mut map,
            "guarantee_level",
            self.guarantee_level.clone().map(Value::from),
        );
        for (step, record) in &self.steps {
            map.insert(step.key().into(), record.to_value(*step));
        }
        Value::Object(map)
    }
}

impl StepRecord {
    fn new(event_id: EventId, commit_index: Option<BudgetCommitIndex>) -> Self {
        Self {
            event_id,
            commit_index,
            admission_retained: false,
            attempt_id: None,
            deny_rule: None,
        }
    }

    fn to_value(&self, step: BudgetStep) -> Value {
        let mut map = Map::new();
        map.insert("event_id".into(), self.event_id.as_str().into());
        match self.commit_index {
            Some(index) => {
                map.insert("budget_commit_index".into(), index.0.into());
            }
            None => {
                map.insert(step.ambiguity_flag().into(), true.into());
            }
        }
        if self.admission_retained {
            map.insert("admission_retained".into(), true.into());
        }
        insert_opt(
            &mut map,
            "attempt_id",
            self.attempt_id.as_ref().map(|a| a.as_str().into()),
        );
        insert_opt(
            &mut map,
            "deny_rule",
            self.deny_rule.clone().map(Value::from),
        );
        Value::Object(map)
    }
}

fn insert_opt(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        map.insert(key.into(), value);
    }
}

/// `metadata.financial`: what happened on the payment rail under `payment_reference`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FinancialMetadata {
    /// The `request_id` (docs/spec.md §9).
    pub payment_reference: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authorized_units: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured_units: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refunded_units: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settlement_status: Option<SettlementStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authorization_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction_id: Option<String>,
    /// The authorization (possibly unknown) is kept for a reconciler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_authorization_retained: Option<bool>,
    /// The rail's answer to authorize was not a definite one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_authorization_ambiguous: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_capture_ambiguous: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_release_status: Option<ReleaseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_release_reference: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_release_confirmed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_error: Option<String>,
}

impl FinancialMetadata {
    pub fn new(payment_reference: &str) -> Self {
        Self {
            payment_reference: payment_reference.to_owned(),
            ..Self::default()
        }
    }

    pub fn to_value(&self) -> Value {
        // A struct of strings, integers, bools and unit enums always serializes.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// `metadata.execution_nonce`: the nonce consumed in the cluster before dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutionNonceMetadata {
    pub nonce_id: NonceId,
    pub event_id: EventId,
    /// `None`: the `ConsumeNonce` answer was lost (ambiguous).
    pub commit_index: Option<BudgetCommitIndex>,
    /// Undoing the hold after a failed nonce step could not be confirmed.
    pub cleanup_unconfirmed: bool,
}

impl ExecutionNonceMetadata {
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("nonce_id".into(), self.nonce_id.as_str().into());
        map.insert("event_id".into(), self.event_id.as_str().into());
        match self.commit_index {
            Some(index) => {
                map.insert("budget_commit_index".into(), index.0.into());
            }
            None => {
                map.insert("consume_ambiguous".into(), true.into());
            }
        }
        if self.cleanup_unconfirmed {
            map.insert("cleanup_unconfirmed".into(), true.into());
        }
        Value::Object(map)
    }
}

/// The whole metadata object of a receipt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReceiptMetadata {
    pub budget_authority: Option<BudgetAuthorityMetadata>,
    pub financial: Option<FinancialMetadata>,
    pub execution_nonce: Option<ExecutionNonceMetadata>,
    /// Anything else a caller wants signed (e.g. the seed's `chio_runtime`).
    pub extra: BTreeMap<String, Value>,
}

impl ReceiptMetadata {
    pub fn to_value(&self) -> Value {
        let mut map: Map<String, Value> = self
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(budget) = &self.budget_authority {
            map.insert("budget_authority".into(), budget.to_value());
        }
        if let Some(financial) = &self.financial {
            map.insert("financial".into(), financial.to_value());
        }
        if let Some(nonce) = &self.execution_nonce {
            map.insert("execution_nonce".into(), nonce.to_value());
        }
        Value::Object(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold() -> HoldId {
        HoldId::new("budget-hold:req-1:cap-1:0")
    }

    #[test]
    fn budget_metadata_has_the_seeds_shape() {
        let authorize_index = BudgetCommitIndex::new(7, 0, 0);
        let capture_event = EventId::new(format!(
            "{}:capture-invocation:{}",
            hold(),
            authorize_index.0
        ));
        let mut budget = BudgetAuthorityMetadata::new(hold());
        budget
            .cluster("cluster-a", 3, "linearizable")
            .committed(
                BudgetStep::Authorize,
                EventId::new(format!("{}:authorize", hold())),
                authorize_index,
            )
            .ambiguous(BudgetStep::InvocationCapture, capture_event.clone())
            .retained(BudgetStep::InvocationCapture);
        let value = budget.to_value();
        assert_eq!(value["hold_id"], "budget-hold:req-1:cap-1:0");
        assert_eq!(
            value["authorize"]["event_id"],
            "budget-hold:req-1:cap-1:0:authorize"
        );
        assert_eq!(value["authorize"]["budget_commit_index"], authorize_index.0);
        assert!(value["authorize"].get("authorize_ambiguous").is_none());
        let capture = &value["invocation_capture"];
        assert_eq!(capture["event_id"], capture_event.as_str());
        assert_eq!(capture["invocation_capture_ambiguous"], true);
        assert_eq!(capture["admission_retained"], true);
        assert!(capture.get("budget_commit_index").is_none());
        assert_eq!(
            (value["term"].as_u64(), value["cluster_id"].as_str()),
            (Some(3), Some("cluster-a"))
        );
    }

    #[test]
    fn cancellation_flag_matches_the_seed() {
        let mut budget = BudgetAuthorityMetadata::new(hold());
        budget.ambiguous(BudgetStep::CancelCapturedBeforeDispatch, EventId::new("e"));
        let value = budget.to_value();
        assert_eq!(
            value["cancel_captured_before_dispatch"]["cancellation_ambiguous"],
            true
        );
    }

    #[test]
    fn financial_and_nonce_metadata() {
        let mut financial = FinancialMetadata::new("req-1");
        financial.payment_authorization_retained = Some(true);
        financial.payment_authorization_ambiguous = Some(true);
        financial.payment_release_status = Some(ReleaseStatus::Unconfirmed);
        financial.settlement_status = Some(SettlementStatus::Authorized);
        let nonce = ExecutionNonceMetadata {
            nonce_id: NonceId::new("nonce-1"),
            event_id: EventId::new("nonce-1:consume"),
            commit_index: None,
            cleanup_unconfirmed: true,
        };
        let metadata = ReceiptMetadata {
            financial: Some(financial),
            execution_nonce: Some(nonce),
            ..ReceiptMetadata::default()
        }
        .to_value();
        assert_eq!(metadata["financial"]["payment_reference"], "req-1");
        assert_eq!(
            metadata["financial"]["payment_authorization_retained"],
            true
        );
        assert_eq!(
            metadata["financial"]["payment_release_status"],
            "unconfirmed"
        );
        assert_eq!(metadata["financial"]["settlement_status"], "authorized");
        assert!(metadata["financial"].get("captured_units").is_none());
        assert_eq!(metadata["execution_nonce"]["consume_ambiguous"], true);
        assert_eq!(metadata["execution_nonce"]["cleanup_unconfirmed"], true);
        assert!(metadata.get("budget_authority").is_none());
    }
}
