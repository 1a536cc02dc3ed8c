//! The reads of docs/spec.md §7 through the router. A live family answers by message (so the read
//! sees the state after the last applied index); a passivated one is decoded in place and
//! stays passivated, so reads never change which families are live.

use std::collections::BTreeMap;
use std::sync::Arc;

use tally_ledger::limits::MAX_LIST_LIMIT;
use tally_ledger::list_position::{hold_order, usage_order};
use tally_ledger::{
    AccountKey, BudgetCommitIndex, CapabilityId, EventId, EventLookup, EventRecord, Family,
    FamilyId, Hold, HoldFilter, HoldView, UsagePosition, UsageRecord,
};
use tokio::sync::oneshot;

use super::actor_table::{gone, send, Located};
use super::error::RouterError;
use super::messages::FamilyMsg;
use super::router::FamilyRouter;

impl FamilyRouter {
    pub async fn get_usage(
        &self,
        family_id: &FamilyId,
        key: &AccountKey,
    ) -> Result<Option<UsageRecord>, RouterError> {
        let key = key.clone();
        Ok(self
            .read_family(family_id, move |f| f.get_usage(&key))
            .await?
            .flatten())
    }

    /// Across every family when `family_id` is `None`, merged in docs/spec.md order
    /// (`updated_at_ms desc, capability_id, grant_index`, then family id), after `after`.
    pub async fn list_usages(
        &self,
        family_id: Option<&FamilyId>,
        capability_id: Option<&CapabilityId>,
        after: Option<&UsagePosition>,
        limit: usize,
    ) -> Result<Vec<(FamilyId, UsageRecord)>, RouterError> {
        let limit = limit.min(MAX_LIST_LIMIT);
        let capability_id = capability_id.cloned();
        let after = after.cloned();
        let read = move |f: &Family| f.list_usages(capability_id.as_ref(), after.as_ref(), limit);
        let per_family = self.read_some(family_id, read).await?;
        let order = |a: &(FamilyId, UsageRecord), b: &(FamilyId, UsageRecord)| {
            usage_order((&a.0, &a.1), (&b.0, &b.1))
        };
        Ok(merge(per_family, limit, order))
    }

    /// Retained events of one family in commit order.
    pub async fn list_events(
        &self,
        family_id: &FamilyId,
        capability_id: Option<&CapabilityId>,
        grant_index: Option<u32>,
        after: Option<BudgetCommitIndex>,
        limit: usize,
    ) -> Result<Vec<EventRecord>, RouterError> {
        let capability_id = capability_id.cloned();
        let read =
            move |f: &Family| f.list_events(capability_id.as_ref(), grant_index, after, limit);
        Ok(self.read_family(family_id, read).await?.unwrap_or_default())
    }

    /// `Unknown` for a family that holds no state: an in-flight command may still create it.
    pub async fn get_event(
        &self,
        family_id: &FamilyId,
        event_id: &EventId,
    ) -> Result<EventLookup, RouterError> {
        let event_id = event_id.clone();
        let lookup = self
            .read_family(family_id, move |f| f.get_event(&event_id))
            .await?;
        Ok(lookup.unwrap_or(EventLookup::Unknown))
    }

    pub async fn get_hold(
        &self,
        family_id: &FamilyId,
        hold_id: &tally_ledger::HoldId,
    ) -> Result<Option<HoldView>, RouterError> {
        let hold_id = hold_id.clone();
        Ok(self
            .read_family(family_id, move |f| f.get_hold(&hold_id))
            .await?
            .flatten())
    }

    /// Live holds for reconcilers, oldest first (`created_at_ms`, family id, hold id), across
    /// every family when `family_id` is `None`, after `filter.after`.
    pub async fn list_holds(
        &self,
        family_id: Option<&FamilyId>,
        filter: &HoldFilter,
        limit: usize,
    ) -> Result<Vec<(FamilyId, Hold)>, RouterError> {
        let limit = limit.min(MAX_LIST_LIMIT);
        let filter = filter.clone();
        let per_family = self
            .read_some(family_id, move |f: &Family| f.list_holds(&filter, limit))
            .await?;
        let order =
            |a: &(FamilyId, Hold), b: &(FamilyId, Hold)| hold_order((&a.0, &a.1), (&b.0, &b.1));
        Ok(merge(per_family, limit, order))
    }

    /// One family's state digest (`None`: the family holds no state).
    pub async fn family_digest(
        &self,
        family_id: &FamilyId,
    ) -> Result<Option<[u8; 32]>, RouterError> {
        self.check_running()?;
        match self.actors.locate(family_id) {
            Located::Passivated(bytes) => Ok(Some(tally_ledger::snapshot::digest_bytes(bytes))),
            Located::Live(_) | Located::Absent => self.read_family(family_id, Family::digest).await,
        }
    }

    /// Runs `read` against one family, wherever it is; `None` if the family holds no state.
    pub(super) async fn read_family<R: Send + 'static>(
        &self,
        family_id: &FamilyId,
        read: impl FnOnce(&Family) -> R + Send + 'static,
    ) -> Result<Option<R>, RouterError> {
        self.check_running()?;
        match self.actors.locate(family_id) {
            Located::Live(actor) => {
                let (tx, rx) = oneshot::channel();
                let message = FamilyMsg::Read(Box::new(move |family: &Family| {
                    let _ = tx.send(read(family));
                }));
                send(family_id, actor, message)?;
                rx.await.map(Some).map_err(|_| gone(family_id))
            }
            Located::Passivated(bytes) => Ok(Some(read(&decode(family_id, bytes)?))),
            Located::Absent => Ok(None),
        }
    }

    /// Runs `read` against every live family at once; answers in family-id order.
    pub(super) async fn read_live<R: Send + 'static>(
        &self,
        read: impl Fn(&Family) -> R + Send + Sync + 'static,
    ) -> Result<BTreeMap<FamilyId, R>, RouterError> {
        let read = Arc::new(read);
        self.ask_live(move |tx| {
            let read = Arc::clone(&read);
            FamilyMsg::Read(Box::new(move |family: &Family| {
                let _ = tx.send(read(family));
            }))
        })
        .await
    }

    /// Every live family itself, shared (copy on write: see `FamilyMsg::Share`).
    pub(super) async fn share_live(&self) -> Result<BTreeMap<FamilyId, Arc<Family>>, RouterError> {
        self.ask_live(FamilyMsg::Share).await
    }

    /// Sends every live actor the message `ask` makes around a reply channel and collects
    /// the answers by family. A family that does not answer (its actor is gone) fails it all.
    async fn ask_live<R: Send + 'static>(
        &self,
        ask: impl Fn(oneshot::Sender<R>) -> FamilyMsg,
    ) -> Result<BTreeMap<FamilyId, R>, RouterError> {
        self.check_running()?;
        let mut pending = Vec::with_capacity(self.actors.live_count());
        for (family_id, actor) in self.actors.live() {
            let (tx, rx) = oneshot::channel();
            send(family_id, actor, ask(tx))?;
            pending.push((family_id.clone(), rx));
        }
        let mut answers = BTreeMap::new();
        for (family_id, rx) in pending {
            let answer = rx.await.map_err(|_| gone(&family_id))?;
            answers.insert(family_id, answer);
        }
        Ok(answers)
    }

    /// `read` over one family, or over all of them (live by message, passivated decoded).
    async fn read_some<T: Send + 'static>(
        &self,
        family_id: Option<&FamilyId>,
        read: impl Fn(&Family) -> Vec<T> + Send + Sync + 'static,
    ) -> Result<Vec<(FamilyId, Vec<T>)>, RouterError> {
        if let Some(family_id) = family_id {
            let rows = self.read_family(family_id, read).await?.unwrap_or_default();
            return Ok(vec![(family_id.clone(), rows)]);
        }
        let read = Arc::new(read);
        let live_read = Arc::clone(&read);
        let mut all: Vec<(FamilyId, Vec<T>)> = self
            .read_live(move |f| live_read(f))
            .await?
            .into_iter()
            .collect();
        for (family_id, bytes) in self.actors.passivated() {
            all.push((family_id.clone(), read(&decode(family_id, bytes)?)));
        }
        Ok(all)
    }
}

/// Decodes a passivated family for a read; undecodable state is a fatal fault.
pub(super) fn decode(family_id: &FamilyId, bytes: &[u8]) -> Result<Family, RouterError> {
    Family::from_snapshot_bytes(bytes).map_err(|error| RouterError::FamilyFailed {
        family_id: family_id.clone(),
        reason: error.to_string(),
    })
}

/// Merges per-family rows into one list in `order`, keeping at most `limit` rows in memory
/// beyond one family's share.
fn merge<T>(
    per_family: Vec<(FamilyId, Vec<T>)>,
    limit: usize,
    order: impl Fn(&(FamilyId, T), &(FamilyId, T)) -> std::cmp::Ordering,
) -> Vec<(FamilyId, T)> {
    let mut rows: Vec<(FamilyId, T)> = Vec::new();
    for (family_id, family_rows) in per_family {
        rows.extend(family_rows.into_iter().map(|row| (family_id.clone(), row)));
        if rows.len() > limit.saturating_mul(2) {
            rows.sort_by(&order);
            rows.truncate(limit);
        }
    }
    rows.sort_by(&order);
    rows.truncate(limit);
    rows
}
