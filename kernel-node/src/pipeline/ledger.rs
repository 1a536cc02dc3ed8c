//! What the pipeline needs from the cluster, as a trait so a test can put a fault between the
//! kernel and a real cluster. [`TallyClient`] is the production implementation: its
//! `Outcome::Unknown` (no quorum before the deadline) is the only path to the seed's
//! fail-closed ambiguity.

use async_trait::async_trait;
use tally_client::{ClientError, HoldPage, Outcome, TallyClient};
use tally_ledger::{ClientCommand, FamilyId, HoldFilter, HoldId, HoldView};

#[async_trait]
pub trait BudgetLedger: Send + Sync {
    /// Same-id retries, then `ResolveEvent`; `Unknown` only without a quorum.
    async fn submit(&self, command: ClientCommand) -> Outcome;
    /// `ResolveEvent` for `command`: its committed answer, or a tombstone.
    async fn resolve(&self, command: ClientCommand) -> Outcome;
    /// One page of live holds, each with its family.
    async fn list_holds(
        &self,
        family: Option<&FamilyId>,
        filter: &HoldFilter,
        limit: u32,
    ) -> Result<HoldPage, ClientError>;
    async fn get_hold(
        &self,
        family: &FamilyId,
        hold_id: &HoldId,
    ) -> Result<Option<HoldView>, ClientError>;
    /// The id of the cluster that answers, once known (receipts name it).
    fn cluster_id(&self) -> Option<String> {
        None
    }
}

#[async_trait]
impl BudgetLedger for TallyClient {
    async fn submit(&self, command: ClientCommand) -> Outcome {
        TallyClient::submit(self, command).await
    }

    async fn resolve(&self, command: ClientCommand) -> Outcome {
        TallyClient::resolve(self, command).await
    }

    async fn list_holds(
        &self,
        family: Option<&FamilyId>,
        filter: &HoldFilter,
        limit: u32,
    ) -> Result<HoldPage, ClientError> {
        TallyClient::list_holds(self, family, filter, limit).await
    }

    async fn get_hold(
        &self,
        family: &FamilyId,
        hold_id: &HoldId,
    ) -> Result<Option<HoldView>, ClientError> {
        TallyClient::get_hold(self, family, hold_id).await
    }

    fn cluster_id(&self) -> Option<String> {
        TallyClient::cluster_id(self)
    }
}
