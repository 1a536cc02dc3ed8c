//! Router snapshots and the state digest. A snapshot is a consistent cut at the last applied
//! index: every live actor is asked for its state (its FIFO mailbox is empty, since `apply`
//! awaited every reply), which it shares copy-on-write, and that is joined with the passivated
//! families' bytes and the router's own replicated state; encoding comes after, off the apply
//! path (`RouterCut::encode`). The digest depends only on replicated state, never on which
//! families happen to be live.

use std::collections::{btree_map, BTreeMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use sha2::{Digest, Sha256};
use tally_ledger::snapshot::digest_bytes;
use tally_ledger::{Family, FamilyId, IdMap};

use super::actor_table::ActorTable;
use super::config::RouterConfig;
use super::error::RouterError;
use super::expiry_index::ExpiryIndex;
use super::router::FamilyRouter;
use super::router_state::RouterState;

/// Bumped whenever the encoding of `RouterSnapshot` changes. Version 2 may carry raised
/// alarms after the router state's other fields (docs/spec.md §5.6); a node that reads only
/// version 1 refuses it by its version rather than drop the alarms.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 2;
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
/// with their actors (copy on write) and the passivated families' bytes with the actor table,
/// so taking it holds up the apply path for a message round trip per live family and a
/// reference count per passivated one, instead of encoding (or copying) every family's state,
/// which would hold writes up for as long as the whole state takes to encode. `encode`
/// does the heavy part, off the apply path; it drops each family as soon as it is encoded, so
/// an actor copies its family only if it applies a command before the encoder got to it.
pub struct RouterCut {
    state: RouterState,
    maintenance_due: IdMap<FamilyId, u64>,
    live: BTreeMap<FamilyId, Arc<Family>>,
    passivated: BTreeMap<FamilyId, Arc<Vec<u8>>>,
}

impl RouterCut {
    pub fn encode(self) -> RouterSnapshot {
        // Copied here, off the apply path, unless the router has let go of them meanwhile.
        let mut families: BTreeMap<FamilyId, ByteBuf> = self
            .passivated
            .into_iter()
            .map(|(family_id, bytes)| (family_id, ByteBuf::from(Arc::unwrap_or_clone(bytes))))
            .collect();
        for (family_id, family) in self.live {
            let bytes = ByteBuf::from(family.to_snapshot_bytes());
            drop(family);
            match families.entry(family_id) {
                btree_map::Entry::Vacant(slot) => {
                    slot.insert(bytes);
                }
                btree_map::Entry::Occupied(taken) => {
                    panic!("family {} is both live and passivated", taken.key())
                }
            }
        }
        RouterSnapshot {
            format_version: SNAPSHOT_FORMAT_VERSION,
            state: self.state,
            maintenance_due: self.maintenance_due,
            families,
        }
    }
}

impl FamilyRouter {
    /// A consistent cut at the last applied index, encoded.
    pub async fn snapshot(&self) -> Result<RouterSnapshot, RouterError> {
        Ok(self.cut().await?.encode())
    }

    /// A consistent cut at the last applied index, to encode later (see `RouterCut`).
    pub async fn cut(&self) -> Result<RouterCut, RouterError> {
        let live = self.share_live().await?;
        let passivated = self
            .actors
            .passivated()
            .iter()
            .map(|(family_id, bytes)| (family_id.clone(), Arc::clone(bytes)))
            .collect();
        Ok(RouterCut {
            state: self.state.clone(),
            maintenance_due: self.expiry.as_map().clone(),
            live,
            passivated,
        })
    }

    /// A router at the snapshot's cut. Every family starts passivated and gets an actor on its
    /// next command, so restoring costs no decoding.
    pub fn restore(config: RouterConfig, snapshot: RouterSnapshot) -> Result<Self, RouterError> {
        if !(OLDEST_SNAPSHOT_FORMAT_VERSION..=SNAPSHOT_FORMAT_VERSION)
            .contains(&snapshot.format_version)
        {
            return Err(RouterError::Snapshot(format!(
                "router snapshot format version {} is not one this node reads \
                 ({OLDEST_SNAPSHOT_FORMAT_VERSION}..={SNAPSHOT_FORMAT_VERSION}): another release \
                 wrote it; run that release, or start this node from an empty data dir so that \
                 it receives a snapshot from the cluster",
                snapshot.format_version
            )));
        }
        assert!(
            snapshot.format_version >= 2 || snapshot.state.alarms.is_empty(),
            "a version {} snapshot cannot carry alarms",
            snapshot.format_version
        );
        if let Some(orphan) = snapshot
            .maintenance_due
            .iter()
            .map(|(id, _)| id)
            .find(|id| !snapshot.families.contains_key(*id))
        {
            return Err(RouterError::Snapshot(format!(
                "maintenance scheduled for family {orphan}, which has no state"
            )));
        }
        let passivated = snapshot
            .families
            .into_iter()
            .map(|(id, bytes)| (id, Arc::new(bytes.into_vec())))
            .collect();
        FamilyRouter::from_parts(
            config,
            snapshot.state,
            ExpiryIndex::from_map(snapshot.maintenance_due),
            ActorTable::from_passivated(passivated),
        )
    }

    /// SHA-256 over the router's replicated state and each family's digest in family-id
    /// order. Equal on every replica at the same applied index.
    pub async fn digest(&self) -> Result<[u8; 32], RouterError> {
        let mut families = self.read_live(Family::digest).await?;
        for (family_id, bytes) in self.actors.passivated() {
            let previous = families.insert(family_id.clone(), digest_bytes(bytes));
            assert!(
                previous.is_none(),
                "family {family_id} is both live and passivated"
            );
        }
        Ok(compose_digest(&self.state, self.expiry.as_map(), &families))
    }
}

fn compose_digest(
    state: &RouterState,
    maintenance_due: &IdMap<FamilyId, u64>,
    families: &BTreeMap<FamilyId, [u8; 32]>,
) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"tally-router-state-v1");
    // The router state holds only integers, ids and ordered maps: it always encodes.
    let encoded = rmp_serde::to_vec(&(state, maintenance_due))
        .unwrap_or_else(|error| panic!("router state does not encode: {error}"));
    hasher.update((encoded.len() as u64).to_be_bytes());
    hasher.update(&encoded);
    hasher.update((families.len() as u64).to_be_bytes());
    for (family_id, digest) in families {
        hasher.update((family_id.as_str().len() as u64).to_be_bytes());
        hasher.update(family_id.as_str().as_bytes());
        hasher.update(digest);
    }
    hasher.finalize().into()
}
