//! The reads of docs/spec.md §7, linearizable by default. `EventLookup::Unknown` is never a no.

use tally_api::convert::list_page::{HoldPage, UsagePage};
use tally_api::pb;
use tally_ledger::{
    AccountKey, EventId, EventLookup, EventRecord, FamilyId, HoldFilter, HoldId, HoldView,
    UsagePosition, UsageRecord,
};

use crate::client::TallyClient;
use crate::error::ClientError;

impl TallyClient {
    pub async fn get_usage(
        &self,
        family: &FamilyId,
        key: &AccountKey,
    ) -> Result<Option<UsageRecord>, ClientError> {
        let request = pb::GetUsageRequest {
            family_id: family.to_string(),
            account: Some(key.into()),
            consistency: 0,
        };
        let reply = self
            .read(|mut c| {
                let r = request.clone();
                async move { c.get_usage(r).await }
            })
            .await?;
        Ok(reply.into_record()?)
    }

    /// One page of accounts, most recently updated first, each with its family; `after` is
    /// the previous page's `next`.
    pub async fn list_usages(
        &self,
        family: Option<&FamilyId>,
        capability: Option<&str>,
        after: Option<&UsagePosition>,
        limit: u32,
    ) -> Result<UsagePage, ClientError> {
        let request = pb::ListUsagesRequest {
            family_id: family.map(ToString::to_string),
            capability_id: capability.map(str::to_owned),
            limit,
            consistency: 0,
            after: after.map(Into::into),
        };
        let reply = self
            .read(|mut c| {
                let r = request.clone();
                async move { c.list_usages(r).await }
            })
            .await?;
        Ok(reply.into_page()?)
    }

    pub async fn list_events(
        &self,
        family: &FamilyId,
        capability: Option<&str>,
        grant_index: Option<u32>,
        after_commit_index: Option<u64>,
        limit: u32,
    ) -> Result<Vec<EventRecord>, ClientError> {
        let request = pb::ListEventsRequest {
            family_id: family.to_string(),
            capability_id: capability.map(str::to_owned),
            grant_index,
            after_commit_index,
            limit,
            consistency: 0,
        };
        let reply = self
            .read(|mut c| {
                let r = request.clone();
                async move { c.list_events(r).await }
            })
            .await?;
        Ok(reply.into_records()?)
    }

    pub async fn get_event(
        &self,
        family: &FamilyId,
        event_id: &EventId,
    ) -> Result<EventLookup, ClientError> {
        let request = pb::GetEventRequest {
            family_id: family.to_string(),
            event_id: event_id.to_string(),
            consistency: 0,
        };
        let reply = self
            .read(|mut c| {
                let r = request.clone();
                async move { c.get_event(r).await }
            })
            .await?;
        Ok(EventLookup::try_from(reply)?)
    }

    pub async fn get_hold(
        &self,
        family: &FamilyId,
        hold_id: &HoldId,
    ) -> Result<Option<HoldView>, ClientError> {
        let request = pb::GetHoldRequest {
            family_id: family.to_string(),
            hold_id: hold_id.to_string(),
            consistency: 0,
        };
        let reply = self
            .read(|mut c| {
                let r = request.clone();
                async move { c.get_hold(r).await }
            })
            .await?;
        Ok(reply.into_view()?)
    }

    /// One page of live holds matching `filter`, oldest first, each with its family; set
    /// `filter.after` to the previous page's `next`.
    pub async fn list_holds(
        &self,
        family: Option<&FamilyId>,
        filter: &HoldFilter,
        limit: u32,
    ) -> Result<HoldPage, ClientError> {
        let request = pb::ListHoldsRequest {
            family_id: family.map(ToString::to_string),
            state: filter.state.map(|s| pb::InvocationState::from(s) as i32),
            created_before_ms: filter.created_before_ms,
            limit,
            consistency: 0,
            with_remaining_exposure: filter.with_remaining_exposure,
            after: filter.after.as_ref().map(Into::into),
        };
        let reply = self
            .read(|mut c| {
                let r = request.clone();
                async move { c.list_holds(r).await }
            })
            .await?;
        Ok(reply.into_page()?)
    }

    /// A node's status (role, term, leader, indexes, members).
    pub async fn status(&self, endpoint: &str) -> Result<pb::StatusReply, ClientError> {
        let mut admin = self.nodes.admin(endpoint)?;
        let call = admin.status(pb::StatusRequest {});
        match tokio::time::timeout(self.config.attempt_timeout, call).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(ClientError::Remote(status.into())),
            Err(_) => Err(ClientError::Unreachable(format!(
                "{endpoint}: no reply in time"
            ))),
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.endpoints()
    }

    pub fn admin_client(
        &self,
        endpoint: &str,
    ) -> Result<pb::admin_client::AdminClient<tonic::transport::Channel>, ClientError> {
        self.nodes.admin(endpoint)
    }
}
