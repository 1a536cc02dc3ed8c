//! Where each family lives: in a live actor, or as passivated bytes. Passivation is node-local
//! memory management, not replicated state: nothing replicated or digested depends on it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ractor::{ActorRef, ActorRuntime};
use tally_ledger::{Family, FamilyId, IdKey, IdMap};
use tokio::sync::oneshot;

use super::error::RouterError;
use super::family_actor::{FamilyActor, FamilyStart};
use super::messages::FamilyMsg;

pub(crate) struct LiveActor {
    pub actor: ActorRef<FamilyMsg>,
    /// Log index of the last entry that sent this family a command (the LRU key).
    pub last_used: u64,
}

/// Where a family is right now.
pub(crate) enum Located<'a> {
    Live(&'a ActorRef<FamilyMsg>),
    Passivated(&'a Arc<Vec<u8>>),
    Absent,
}

/// Live families are keyed by `IdKey` (the id's first 24 bytes inline, then the id): every
/// round looks up each of its families here, and the families of one entry share a last-used
/// index, so the LRU order breaks those ties by the same key, mostly without reading id bytes.
#[derive(Default)]
pub(crate) struct ActorTable {
    live: IdMap<FamilyId, LiveActor>,
    /// `(last_used, family)`, least recently used first.
    lru: BTreeSet<(u64, IdKey<FamilyId>)>,
    /// Shared, so a snapshot cut takes a reference to each, not a copy (see `RouterCut`).
    passivated: BTreeMap<FamilyId, Arc<Vec<u8>>>,
}

impl ActorTable {
    pub fn from_passivated(passivated: BTreeMap<FamilyId, Arc<Vec<u8>>>) -> Self {
        Self {
            passivated,
            ..Self::default()
        }
    }

    pub fn locate(&self, family_id: &FamilyId) -> Located<'_> {
        if let Some(live) = self.live.get(family_id) {
            return Located::Live(&live.actor);
        }
        match self.passivated.get(family_id) {
            Some(bytes) => Located::Passivated(bytes),
            None => Located::Absent,
        }
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    pub fn passivated_count(&self) -> usize {
        self.passivated.len()
    }

    pub fn is_live(&self, family_id: &FamilyId) -> bool {
        self.live.contains_key(family_id)
    }

    pub fn live(&self) -> impl Iterator<Item = (&FamilyId, &ActorRef<FamilyMsg>)> {
        self.live.iter().map(|(id, live)| (id, &live.actor))
    }

    pub fn passivated(&self) -> &BTreeMap<FamilyId, Arc<Vec<u8>>> {
        &self.passivated
    }

    pub fn passivated_bytes_total(&self) -> usize {
        self.passivated.values().map(|bytes| bytes.len()).sum()
    }

    /// The family's actor, spawned (new, or from its passivated bytes) if it is not live;
    /// marks it used at `log_index`.
    pub fn activate(
        &mut self,
        family_id: &FamilyId,
        log_index: u64,
    ) -> Result<ActorRef<FamilyMsg>, RouterError> {
        if let Some(live) = self.live.get_mut(family_id) {
            // One key, moved from the old LRU row to the new one.
            let mut row = (live.last_used, IdKey::new(family_id.clone()));
            assert!(
                self.lru.remove(&row),
                "family {family_id} is live but not in the LRU order"
            );
            row.0 = log_index;
            live.last_used = log_index;
            self.lru.insert(row);
            return Ok(live.actor.clone());
        }
        let start = match self.passivated.remove(family_id) {
            Some(bytes) => FamilyStart::Resume {
                family_id: family_id.clone(),
                bytes,
            },
            None => FamilyStart::New(family_id.clone()),
        };
        // `spawn_instant` queues messages before `pre_start` runs, so many families start
        // (and decode) in parallel. A failed start drops their replies; the router sees it.
        let (actor, _join) =
            ActorRuntime::spawn_instant(None, FamilyActor, start).map_err(|error| {
                RouterError::Spawn {
                    family_id: family_id.clone(),
                    reason: error.to_string(),
                }
            })?;
        self.live.insert(
            family_id.clone(),
            LiveActor {
                actor: actor.clone(),
                last_used: log_index,
            },
        );
        self.lru.insert((log_index, IdKey::new(family_id.clone())));
        Ok(actor)
    }

    /// Live families beyond `max_live`, least recently used first.
    pub fn over_limit(&self, max_live: usize) -> Vec<FamilyId> {
        let excess = self.live.len().saturating_sub(max_live);
        self.lru
            .iter()
            .take(excess)
            .map(|(_, family)| family.id().clone())
            .collect()
    }

    /// Live families last used before log index `before`.
    pub fn idle_before(&self, before: u64) -> Vec<FamilyId> {
        self.lru
            .iter()
            .take_while(|(used, _)| *used < before)
            .map(|(_, family)| family.id().clone())
            .collect()
    }

    /// Passivates live families: takes each actor's state (its mailbox is empty, as the
    /// router awaited every reply), waits for it to stop, and keeps the bytes.
    pub async fn passivate(&mut self, families: &[FamilyId]) -> Result<(), RouterError> {
        let mut pending = Vec::with_capacity(families.len());
        for family_id in families {
            let actor = self.detach(family_id);
            let (tx, rx) = oneshot::channel();
            let read = Box::new(move |family: &Family| {
                let _ = tx.send(family.to_snapshot_bytes());
            });
            send(family_id, &actor, FamilyMsg::Read(read))?;
            pending.push((family_id, actor, rx));
        }
        let mut stopping = Vec::with_capacity(pending.len());
        for (family_id, actor, rx) in pending {
            let bytes = rx.await.map_err(|_| gone(family_id))?;
            // Only now: ractor handles a stop before queued messages, so an earlier stop
            // could overtake the read.
            actor.stop(None);
            self.passivated.insert(family_id.clone(), Arc::new(bytes));
            stopping.push(actor);
        }
        for actor in stopping {
            // Without a timeout `wait` only returns once the actor stopped.
            let _ = actor.wait(None).await;
        }
        Ok(())
    }

    /// Stops and forgets families that hold no state: they are as if never touched.
    pub async fn forget(&mut self, families: &[FamilyId]) {
        let mut stopping = Vec::with_capacity(families.len());
        for family_id in families {
            let actor = self.detach(family_id);
            actor.stop(None);
            stopping.push(actor);
        }
        for actor in stopping {
            // Without a timeout `wait` only returns once the actor stopped.
            let _ = actor.wait(None).await;
        }
    }

    fn detach(&mut self, family_id: &FamilyId) -> ActorRef<FamilyMsg> {
        let live = self
            .live
            .remove(family_id)
            .unwrap_or_else(|| panic!("family {family_id} detached but not live"));
        let removed = self
            .lru
            .remove(&(live.last_used, IdKey::new(family_id.clone())));
        assert!(
            removed,
            "family {family_id} is live but not in the LRU order"
        );
        live.actor
    }

    /// Stops every live actor without waiting (the router is going away).
    pub fn stop_all(&mut self) {
        for live in self.live.values() {
            live.actor.stop(None);
        }
    }
}

/// Sends to a family actor; a closed mailbox means the actor died.
pub(crate) fn send(
    family_id: &FamilyId,
    actor: &ActorRef<FamilyMsg>,
    message: FamilyMsg,
) -> Result<(), RouterError> {
    actor.send_message(message).map_err(|_| gone(family_id))
}

/// The error for an actor that stopped without answering (a panic, or undecodable state).
pub(crate) fn gone(family_id: &FamilyId) -> RouterError {
    RouterError::FamilyFailed {
        family_id: family_id.clone(),
        reason: "the family actor stopped without answering (panic or undecodable state)".into(),
    }
}
