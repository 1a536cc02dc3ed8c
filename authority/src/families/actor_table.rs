//! Where each family lives: in a live actor, or passivated into the family store on disk.
//! Passivation is node-local memory management, not replicated state: nothing replicated or
//! digested depends on it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ractor::{ActorRef, ActorRuntime};
use tally_ledger::{Family, FamilyId, IdKey, IdMap};
use tokio::sync::oneshot;

use super::error::RouterError;
use super::family_actor::{FamilyActor, FamilyStart};
use super::family_store::{on_blocking_thread, FamilyStore, StoreView};
use super::messages::FamilyMsg;

pub(crate) struct LiveActor {
    pub actor: ActorRef<FamilyMsg>,
    /// Log index of the last entry that sent this family a command (the LRU key).
    pub last_used: u64,
    /// The family's estimated heap bytes after its last batch (`Family::footprint_bytes`).
    pub footprint_bytes: usize,
}

/// Where a family is right now.
pub(crate) enum Located<'a> {
    Live(&'a ActorRef<FamilyMsg>),
    /// Passivated: its bytes are in the family store (read them through a `StoreView`).
    Stored(StoredRow),
    Absent,
}

/// A passivated family's row in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoredRow {
    /// The length of its encoding.
    pub bytes: usize,
    /// Unique in the process for each write of a family: a count made from a row is recorded
    /// only while the family still has that row (`hold_index.rs`).
    pub version: u64,
}

impl StoredRow {
    fn new(bytes: usize) -> Self {
        static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);
        Self {
            bytes,
            version: NEXT_VERSION.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// Live families are keyed by `IdKey` (the id's first 24 bytes inline, then the id): every
/// round looks up each of its families here, and the families of one entry share a last-used
/// index, so the LRU order breaks those ties by the same key, mostly without reading id bytes.
pub(crate) struct ActorTable {
    live: IdMap<FamilyId, LiveActor>,
    /// `(last_used, family)`, least recently used first.
    lru: BTreeSet<(u64, IdKey<FamilyId>)>,
    /// The sum of the live families' `footprint_bytes`.
    live_footprint_bytes: usize,
    /// Passivated families and the length of their encoding; the bytes are in `store`. In
    /// memory because scans, digests and snapshots walk it in family-id order, and because
    /// it tells a new family from a stored one without a disk read.
    stored: BTreeMap<FamilyId, StoredRow>,
    stored_bytes: usize,
    store: FamilyStore,
}

impl ActorTable {
    pub fn new(store: FamilyStore) -> Self {
        Self {
            live: IdMap::default(),
            lru: BTreeSet::new(),
            live_footprint_bytes: 0,
            stored: BTreeMap::new(),
            stored_bytes: 0,
            store,
        }
    }

    /// A table whose families are all passivated: `stored` names what `store` holds.
    pub fn from_stored(store: FamilyStore, stored: BTreeMap<FamilyId, usize>) -> Self {
        let stored_bytes = stored.values().sum();
        let stored = stored
            .into_iter()
            .map(|(family_id, bytes)| (family_id, StoredRow::new(bytes)))
            .collect();
        Self {
            stored,
            stored_bytes,
            ..Self::new(store)
        }
    }

    pub fn locate(&self, family_id: &FamilyId) -> Located<'_> {
        if let Some(live) = self.live.get(family_id) {
            return Located::Live(&live.actor);
        }
        match self.stored.get(family_id) {
            Some(row) => Located::Stored(*row),
            None => Located::Absent,
        }
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    pub fn stored_count(&self) -> usize {
        self.stored.len()
    }

    pub fn is_live(&self, family_id: &FamilyId) -> bool {
        self.live.contains_key(family_id)
    }

    /// A live family's footprint after its last batch (`set_footprint`); none if not live.
    pub fn live_footprint(&self, family_id: &FamilyId) -> Option<usize> {
        self.live.get(family_id).map(|live| live.footprint_bytes)
    }

    pub fn is_stored(&self, family_id: &FamilyId) -> bool {
        self.stored.contains_key(family_id)
    }

    pub fn live(&self) -> impl Iterator<Item = (&FamilyId, &ActorRef<FamilyMsg>)> {
        self.live.iter().map(|(id, live)| (id, &live.actor))
    }

    /// The passivated families, in family-id order, with the length of their encoding.
    pub fn stored(&self) -> &BTreeMap<FamilyId, StoredRow> {
        &self.stored
    }

    pub fn stored_bytes_total(&self) -> usize {
        self.stored_bytes
    }

    pub fn live_footprint_bytes(&self) -> usize {
        self.live_footprint_bytes
    }

    pub fn store(&self) -> &FamilyStore {
        &self.store
    }

    /// A view of the store holding every passivated family as of now (see `StoreView`).
    pub fn view(&self) -> Result<StoreView, RouterError> {
        self.store.view()
    }

    /// Reads the stored bytes of `families` on a blocking thread: what a round must have in
    /// hand before it activates them, so no actor (and no ledger code) waits on the disk.
    /// `also` reads what else goes with them (their filters) from the same view, on the same
    /// thread; with no family to fetch it is not called.
    pub async fn fetch<T: Default + Send + 'static>(
        &self,
        families: Vec<FamilyId>,
        also: impl FnOnce(&StoreView) -> Result<T, RouterError> + Send + 'static,
    ) -> Result<(BTreeMap<FamilyId, Vec<u8>>, T), RouterError> {
        if families.is_empty() {
            return Ok((BTreeMap::new(), T::default()));
        }
        let view = self.view()?;
        let (fetched, also) = on_blocking_thread("a family fetch", move || {
            Ok((view.read_each(families, |bytes| bytes)?, also(&view)?))
        })
        .await?;
        Ok((fetched.into_iter().collect(), also))
    }

    /// Records a live family's footprint after a batch.
    pub fn set_footprint(&mut self, family_id: &FamilyId, footprint_bytes: usize) {
        let live = self
            .live
            .get_mut(family_id)
            .unwrap_or_else(|| panic!("footprint of family {family_id}, which is not live"));
        self.live_footprint_bytes =
            self.live_footprint_bytes - live.footprint_bytes + footprint_bytes;
        live.footprint_bytes = footprint_bytes;
    }

    /// The family's actor, spawned (new, or from the stored bytes the round fetched, which
    /// `fetched` must hold for a stored family) if it is not live; marks it used at
    /// `used_at`, the log index of a client command. With `None` (the round only expires
    /// its holds) a live family keeps its place in the LRU order and a spawned one goes
    /// first, so a family only expiry brought back is the first spilled over the budget.
    pub fn activate(
        &mut self,
        family_id: &FamilyId,
        used_at: Option<u64>,
        fetched: &mut BTreeMap<FamilyId, Vec<u8>>,
    ) -> Result<ActorRef<FamilyMsg>, RouterError> {
        if let Some(live) = self.live.get_mut(family_id) {
            if let Some(log_index) = used_at {
                move_in_lru(&mut self.lru, family_id, live, log_index);
            }
            return Ok(live.actor.clone());
        }
        let start = match self.stored.remove(family_id) {
            Some(row) => {
                self.stored_bytes -= row.bytes;
                let bytes = fetched.remove(family_id).unwrap_or_else(|| {
                    panic!("family {family_id} activated before its stored bytes were fetched")
                });
                FamilyStart::Resume {
                    family_id: family_id.clone(),
                    bytes: Arc::new(bytes),
                }
            }
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
        let last_used = used_at.unwrap_or(0);
        self.live.insert(
            family_id.clone(),
            LiveActor {
                actor: actor.clone(),
                last_used,
                footprint_bytes: 0,
            },
        );
        self.lru.insert((last_used, IdKey::new(family_id.clone())));
        Ok(actor)
    }

    /// The live families to passivate, least recently used first: those beyond `max_live`,
    /// then more while the live footprint plus `other_bytes` exceeds `max_live_bytes`, but
    /// only families last used before `spill_before` (the round just applied, or earlier: see
    /// `RouterConfig::min_idle_entries_to_spill`). A family passivated frees its footprint and
    /// `freed_with(family)` of `other_bytes` (its filters, which leave memory with it). A
    /// family in use stays: passivating it would only bring it back on its next command, so
    /// one family larger than the budget stays live alone.
    pub fn over_limit(
        &self,
        max_live: usize,
        max_live_bytes: usize,
        other_bytes: usize,
        freed_with: impl Fn(&FamilyId) -> usize,
        spill_before: u64,
    ) -> Vec<FamilyId> {
        let excess = self.live.len().saturating_sub(max_live);
        let mut footprint = self.live_footprint_bytes + other_bytes;
        let mut chosen = Vec::new();
        for (used, family) in &self.lru {
            if chosen.len() >= excess && footprint <= max_live_bytes {
                break;
            }
            if *used >= spill_before && chosen.len() >= excess {
                break;
            }
            let live = self.live.get(family.id()).unwrap_or_else(|| {
                panic!("family {} is in the LRU order but not live", family.id())
            });
            footprint -= live.footprint_bytes + freed_with(family.id());
            chosen.push(family.id().clone());
        }
        chosen
    }

    /// Live families last used before log index `before`.
    pub fn idle_before(&self, before: u64) -> Vec<FamilyId> {
        self.lru
            .iter()
            .take_while(|(used, _)| *used < before)
            .map(|(_, family)| family.id().clone())
            .collect()
    }

    /// Marks a live family used at `log_index`: it moves to that place in the LRU order,
    /// unless it was used later already.
    pub fn mark_used(&mut self, family_id: &FamilyId, log_index: u64) {
        let live = (self.live.get_mut(family_id))
            .unwrap_or_else(|| panic!("family {family_id} marked used but not live"));
        move_in_lru(&mut self.lru, family_id, live, log_index);
    }

    /// Passivates live families: takes each actor's state (its mailbox is empty, as the
    /// router awaited every reply), writes the bytes to the store (on a blocking thread) with
    /// what `also` gives to write beside them (their filters, encoded on that thread) in one
    /// commit, and waits for the actors to stop.
    pub async fn passivate(
        &mut self,
        families: &[FamilyId],
        also: impl FnOnce() -> Result<Vec<(FamilyId, Vec<u8>)>, RouterError> + Send + 'static,
    ) -> Result<(), RouterError> {
        if families.is_empty() {
            return Ok(());
        }
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
        let mut written = Vec::with_capacity(pending.len());
        for (family_id, actor, rx) in pending {
            let bytes = rx.await.map_err(|_| gone(family_id))?;
            // Only now: ractor handles a stop before queued messages, so an earlier stop
            // could overtake the read.
            actor.stop(None);
            written.push((family_id.clone(), Arc::new(bytes)));
            stopping.push(actor);
        }
        let store = self.store.clone();
        let written = on_blocking_thread("a family write", move || {
            (store.write_with_filters(&written, &also()?)).map(|()| written)
        })
        .await?;
        for (family_id, bytes) in written {
            self.stored_bytes += bytes.len();
            self.stored.insert(family_id, StoredRow::new(bytes.len()));
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
        self.live_footprint_bytes -= live.footprint_bytes;
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

/// Moves a live family to `log_index` in the LRU order, unless it was used later already.
fn move_in_lru(
    lru: &mut BTreeSet<(u64, IdKey<FamilyId>)>,
    family_id: &FamilyId,
    live: &mut LiveActor,
    log_index: u64,
) {
    if live.last_used >= log_index {
        return;
    }
    // One key, moved from the old LRU row to the new one.
    let mut row = (live.last_used, IdKey::new(family_id.clone()));
    assert!(
        lru.remove(&row),
        "family {family_id} is live but not in the LRU order"
    );
    row.0 = log_index;
    live.last_used = log_index;
    lru.insert(row);
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
