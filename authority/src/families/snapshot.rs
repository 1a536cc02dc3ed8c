//! Router snapshots and the state digest. A snapshot is a consistent cut at the last applied
//! index: every live actor is asked for its state (its FIFO mailbox is empty, since `apply`
//! awaited every reply), which it shares copy-on-write, and that is joined with the passivated
//! families' bytes and the router's own replicated state; encoding comes after, off the apply
//! path (`RouterCut::encode`). The digest depends only on replicated state, never on which
//! families happen to be live.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use sha2::{Digest, Sha256};
use tally_ledger::snapshot::digest_bytes;
use tally_ledger::{Family, FamilyId, IdMap};

use super::actor_table::ActorTable;
use super::cold_index::ColdIndex;
use super::config::RouterConfig;
use super::error::RouterError;
use super::expiry_index::ExpiryIndex;
use super::family_store::{on_blocking_thread, FamilyStore, StoreView};
use super::router::FamilyRouter;
use super::router_state::RouterState;

/// Bumped whenever the encoding of `RouterSnapshot` changes. Version 2 may carry raised
/// alarms after the router state's other fields (docs/spec.md §5.6); a node that reads only
/// version 1 refuses it by its version rather than drop the alarms. Version 3 adds a fifth
/// field, the rows families moved out of memory (`tally_ledger::cold`).
pub const SNAPSHOT_FORMAT_VERSION: u32 = 3;
/// The oldest version still restored: version 1 is version 2 without alarms (its router
/// state simply ends before them), so it restores with none raised.
pub const OLDEST_SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// Everything a replica needs to resume at `state.last_applied`. Ordered containers only, so
/// equal states encode to equal bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterSnapshot {
    pub format_version: u32,
    pub state: RouterState,
    /// Each family's next maintenance time (the expiry index; encoded as an id-ordered map).
    pub maintenance_due: IdMap<FamilyId, u64>,
    /// Each family's canonical encoding (`Family::to_snapshot_bytes`).
    pub families: BTreeMap<FamilyId, ByteBuf>,
    /// The rows each family moved out of memory, by key within the family: from version 3,
    /// and left out while no family has any. Checked against each family's `ColdMeta` when
    /// restored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cold_rows: BTreeMap<FamilyId, BTreeMap<ByteBuf, ByteBuf>>,
}

impl RouterSnapshot {
    pub fn to_bytes(&self) -> Result<Vec<u8>, RouterError> {
        rmp_serde::to_vec(self).map_err(|error| RouterError::Snapshot(error.to_string()))
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, RouterError> {
        rmp_serde::from_slice(bytes).map_err(|error| RouterError::Snapshot(error.to_string()))
    }

    /// The digest of the router this snapshot restores to (equal to `FamilyRouter::digest`).
    pub fn digest(&self) -> [u8; 32] {
        let families = self
            .families
            .iter()
            .map(|(id, bytes)| (id.clone(), digest_bytes(bytes)))
            .collect();
        compose_digest(&self.state, &self.maintenance_due, &families)
    }
}

/// A consistent cut at the last applied index, not yet encoded: the live families are shared
/// with their actors (copy on write), and the passivated ones are read later through a view
/// of the family store taken at the cut. Taking it holds up the apply path for a message
/// round trip per live family, instead of encoding every family's state, which would hold
/// writes up for as long as the whole state takes to encode. `snapshot_stream::write_cut`
/// does the heavy part, off the apply path; it drops each family as soon as it is encoded, so
/// an actor copies its family only if it applies a command before the writer got to it.
pub struct RouterCut {
    pub(super) state: RouterState,
    pub(super) maintenance_due: IdMap<FamilyId, u64>,
    pub(super) live: BTreeMap<FamilyId, Arc<Family>>,
    /// The passivated families at the cut, and a view of the store at the cut to read them
    /// from (later passivations do not change what it reads).
    pub(super) stored: Vec<FamilyId>,
    pub(super) view: StoreView,
    /// The families with rows out of memory at the cut, how many, and their filters (shared
    /// with the router's index, copy on write; read the rows from `view`).
    pub(super) cold: ColdIndex,
}

impl RouterCut {
    /// The cut as one `RouterSnapshot` in memory (tests and tools; a node streams it to a
    /// file instead). Reads passivated families from the store: call it on a blocking thread.
    pub fn encode(self) -> Result<RouterSnapshot, RouterError> {
        let mut bytes = Vec::new();
        super::snapshot_stream::write_cut(self, &mut bytes)?;
        RouterSnapshot::from_bytes(&bytes)
    }
}

impl FamilyRouter {
    /// A consistent cut at the last applied index, encoded (on a blocking thread).
    pub async fn snapshot(&self) -> Result<RouterSnapshot, RouterError> {
        let cut = self.cut().await?;
        on_blocking_thread("a snapshot encode", move || cut.encode()).await
    }

    /// A consistent cut at the last applied index, to encode later (see `RouterCut`).
    pub async fn cut(&self) -> Result<RouterCut, RouterError> {
        let live = self.share_live().await?;
        Ok(RouterCut {
            state: self.state.clone(),
            maintenance_due: self.expiry.as_map().into_owned(),
            live,
            stored: self.actors.stored().keys().cloned().collect(),
            view: self.actors.view()?,
            cold: self.cold.share(),
        })
    }

    /// A router at the snapshot's cut, with a family store in memory (tests and tools).
    pub fn restore(config: RouterConfig, snapshot: RouterSnapshot) -> Result<Self, RouterError> {
        Self::restore_into(config, snapshot, FamilyStore::in_memory()?)
    }

    /// A router at the snapshot's cut whose families are written to `store`, which must be
    /// empty: the snapshot's bytes through the streaming reader, so there is one restore path.
    /// Every family starts passivated and gets an actor on its next command, so restoring
    /// costs no decoding. Writes to the store: call it on a blocking thread.
    pub fn restore_into(
        config: RouterConfig,
        snapshot: RouterSnapshot,
        store: FamilyStore,
    ) -> Result<Self, RouterError> {
        let bytes = snapshot.to_bytes()?;
        let (router, _) =
            super::snapshot_stream::restore_from(config, &mut bytes.as_slice(), store)?;
        Ok(router)
    }

    /// A router whose families are all in `store` (`stored` names them and their lengths).
    pub(super) fn from_stored(
        config: RouterConfig,
        state: RouterState,
        maintenance_due: IdMap<FamilyId, u64>,
        store: FamilyStore,
        stored: BTreeMap<FamilyId, usize>,
        cold: ColdIndex,
    ) -> Result<Self, RouterError> {
        FamilyRouter::from_parts(
            config,
            state,
            ExpiryIndex::from_map(maintenance_due),
            ActorTable::from_stored(store, stored),
            cold,
        )
    }

    /// SHA-256 over the router's replicated state and each family's digest in family-id
    /// order. Equal on every replica at the same applied index.
    pub async fn digest(&self) -> Result<[u8; 32], RouterError> {
        let mut families = self.read_live(Family::digest).await?;
        let stored: Vec<FamilyId> = self.actors.stored().keys().cloned().collect();
        let view = self.actors.view()?;
        let stored = on_blocking_thread("a digest read", move || {
            view.read_each(stored, |bytes| digest_bytes(&bytes))
        })
        .await?;
        for (family_id, digest) in stored {
            let previous = families.insert(family_id.clone(), digest);
            assert!(
                previous.is_none(),
                "family {family_id} is both live and passivated"
            );
        }
        Ok(compose_digest(
            &self.state,
            &self.expiry.as_map(),
            &families,
        ))
    }
}

/// Refuses a snapshot of a format version this node does not read.
pub(super) fn check_restorable(version: u32, state: &RouterState) -> Result<(), RouterError> {
    if !(OLDEST_SNAPSHOT_FORMAT_VERSION..=SNAPSHOT_FORMAT_VERSION).contains(&version) {
        return Err(RouterError::Snapshot(format!(
            "router snapshot format version {version} is not one this node reads \
             ({OLDEST_SNAPSHOT_FORMAT_VERSION}..={SNAPSHOT_FORMAT_VERSION}): another release \
             wrote it; run that release, or start this node from an empty data dir so that \
             it receives a snapshot from the cluster"
        )));
    }
    if version < 2 && !state.alarms.is_empty() {
        return Err(RouterError::Snapshot(format!(
            "a version {version} snapshot cannot carry alarms"
        )));
    }
    Ok(())
}

/// The digest's hasher after the router's own state and the number of families: each
/// family's id and digest follow, in family-id order (see `compose_digest`).
pub(super) fn compose_digest_header(
    state: &RouterState,
    maintenance_due: &IdMap<FamilyId, u64>,
    family_count: usize,
) -> Sha256 {
    let mut hasher = Sha256::new();
    hasher.update(b"tally-router-state-v1");
    // The router state holds only integers, ids and ordered maps: it always encodes.
    let encoded = rmp_serde::to_vec(&(state, maintenance_due))
        .unwrap_or_else(|error| panic!("router state does not encode: {error}"));
    hasher.update((encoded.len() as u64).to_be_bytes());
    hasher.update(&encoded);
    hasher.update((family_count as u64).to_be_bytes());
    hasher
}

fn compose_digest(
    state: &RouterState,
    maintenance_due: &IdMap<FamilyId, u64>,
    families: &BTreeMap<FamilyId, [u8; 32]>,
) -> [u8; 32] {
    let mut hasher = compose_digest_header(state, maintenance_due, families.len());
    for (family_id, digest) in families {
        add_family_digest(&mut hasher, family_id, digest);
    }
    hasher.finalize().into()
}

/// Adds one family to the digest, after the header and the families before it in id order.
pub(super) fn add_family_digest(hasher: &mut Sha256, family_id: &FamilyId, digest: &[u8; 32]) {
    hasher.update((family_id.as_str().len() as u64).to_be_bytes());
    hasher.update(family_id.as_str().as_bytes());
    hasher.update(digest);
}
