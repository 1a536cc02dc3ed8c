//! Shared by the integration tests: a type config shaped like the authority's (u64 node ids,
//! `BasicNode`, byte payloads), a minimal in-memory state machine for openraft's suite, and
//! entry builders.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};

/// A versioned byte payload, like the authority's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub version: u8,
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload(v{}, {} bytes)", self.version, self.bytes.len())
    }
}

openraft::declare_raft_types!(
    /// The test type config: defaults (u64 ids and terms, `BasicNode`, tokio) plus a byte payload.
    pub TestConfig:
        D = Payload,
        R = u64,
);

pub type C = TestConfig;
pub type Entry = <C as openraft::RaftTypeConfig>::Entry;

/// A log id with leader (term, node 0).
pub fn log_id(term: u64, index: u64) -> LogIdOf<C> {
    openraft::LogId {
        leader_id: openraft::impls::leader_id_adv::LeaderId { term, node_id: 0 },
        index,
    }
}

/// A normal entry carrying `bytes`.
pub fn entry(term: u64, index: u64, bytes: Vec<u8>) -> Entry {
    Entry::new_normal(log_id(term, index), Payload { version: 1, bytes })
}

/// Appends through the real `append` and waits for the durability callback.
pub async fn append_durable<S: RaftLogStorage<C>>(
    store: &mut S,
    entries: Vec<Entry>,
) -> io::Result<()> {
    let (tx, rx) = C::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await?;
    rx.await
        .map_err(|_| io::Error::other("IOFlushed callback dropped"))?
}

/// State shared by a state machine and its snapshot builders.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct SmData {
    last_applied: Option<LogIdOf<C>>,
    membership: StoredMembershipOf<C>,
    /// index -> payload bytes of applied normal entries (ordered: serialized below).
    data: BTreeMap<u64, Vec<u8>>,
}

#[derive(Debug, Default)]
struct SmInner {
    data: SmData,
    snapshot: Option<(SnapshotMetaOf<C>, Vec<u8>)>,
}

/// The smallest state machine openraft's suite accepts: applies in memory, snapshots are
/// rmp-serde bytes of the whole state.
#[derive(Debug, Default, Clone)]
pub struct MemStateMachine {
    inner: Arc<Mutex<SmInner>>,
}

impl MemStateMachine {
    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, SmInner>> {
        self.inner
            .lock()
            .map_err(|_| io::Error::other("state machine lock poisoned"))
    }
}

impl RaftSnapshotBuilder<C> for MemStateMachine {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<C, Vec<u8>>, io::Error> {
        let mut inner = self.lock()?;
        let bytes = rmp_serde::to_vec_named(&inner.data).map_err(io::Error::other)?;
        let meta = SnapshotMetaOf::<C> {
            last_log_id: inner.data.last_applied,
            last_membership: inner.data.membership.clone(),
        };
        inner.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(SnapshotOf::<C, Vec<u8>> {
            meta,
            snapshot: bytes,
        })
    }
}

impl RaftStateMachine<C> for MemStateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<C>>, StoredMembershipOf<C>), io::Error> {
        let inner = self.lock()?;
        Ok((inner.data.last_applied, inner.data.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<C>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let log_id = entry.log_id();
            {
                let mut inner = self.lock()?;
                inner.data.last_applied = Some(log_id);
                match &entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(p) => {
                        inner.data.data.insert(log_id.index, p.bytes.clone());
                    }
                    EntryPayload::Membership(m) => {
                        inner.data.membership =
                            StoredMembershipOf::<C>::new(Some(log_id), m.clone());
                    }
                }
            }
            if let Some(r) = responder {
                r.send(log_id.index);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<C>,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let data: SmData = rmp_serde::from_slice(&snapshot).map_err(io::Error::other)?;
        let mut inner = self.lock()?;
        inner.data = data;
        inner.snapshot = Some((meta.clone(), snapshot));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<SnapshotOf<C, Vec<u8>>>, io::Error> {
        let inner = self.lock()?;
        Ok(inner
            .snapshot
            .as_ref()
            .map(|(meta, bytes)| SnapshotOf::<C, Vec<u8>> {
                meta: meta.clone(),
                snapshot: bytes.clone(),
            }))
    }
}
