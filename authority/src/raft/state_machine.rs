//! openraft's `RaftStateMachine` over the family router. The state lives in memory; snapshots
//! are on disk. Restart = newest valid snapshot + replay of the committed log after it
//! (openraft drives both, from `get_current_snapshot` and the persisted committed id).

use std::io;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload as RaftPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::{watch, Mutex};

use super::snapshot_file::SnapshotDir;
use super::types::{
    log_position, LogId, Membership, ProposalReply, Snapshot, SnapshotMeta, TypeConfig,
    PROPOSAL_VERSION,
};
use crate::families::{
    EntryInput, EntryPayload, FamilyRouter, RouterConfig, RouterCut, RouterSnapshot,
};

/// The router behind a lock: openraft's apply task and the read path share it.
pub type SharedRouter = Arc<Mutex<FamilyRouter>>;

pub struct TallyStateMachine {
    router: SharedRouter,
    router_config: RouterConfig,
    applied: Option<LogId>,
    membership: Membership,
    snapshots: SnapshotDir,
    /// The last applied log id, for health checks and read-your-writes waits.
    applied_tx: watch::Sender<Option<LogId>>,
}

impl TallyStateMachine {
    pub fn new(
        router_config: RouterConfig,
        snapshots: SnapshotDir,
    ) -> Result<(Self, SharedRouter, watch::Receiver<Option<LogId>>), io::Error> {
        let router = FamilyRouter::new(router_config).map_err(io::Error::other)?;
        let router = Arc::new(Mutex::new(router));
        let (applied_tx, applied_rx) = watch::channel(None);
        let machine = Self {
            router: router.clone(),
            router_config,
            applied: None,
            membership: Membership::default(),
            snapshots,
            applied_tx,
        };
        Ok((machine, router, applied_rx))
    }
}

impl RaftStateMachine<TypeConfig> for TallyStateMachine {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = SnapshotCut;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), io::Error> {
        Ok((self.applied, self.membership.clone()))
    }

    /// Applies every entry of the call as one router batch, then answers every responder.
    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut inputs = Vec::new();
        let mut responders = Vec::new();
        let mut last = None;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let log_id = entry.log_id();
            let (stamped_ms, payload) = match entry.payload {
                RaftPayload::Blank => (0, EntryPayload::Blank),
                RaftPayload::Membership(membership) => {
                    self.membership = Membership::new(Some(log_id), membership);
                    (0, EntryPayload::Blank)
                }
                RaftPayload::Normal(proposal) => {
                    if proposal.version != PROPOSAL_VERSION {
                        return Err(io::Error::other(format!(
                            "entry {log_id} has payload version {}, this node applies {PROPOSAL_VERSION}: \
                             stopping rather than guessing",
                            proposal.version
                        )));
                    }
                    (proposal.stamped_ms, proposal.body.into_payload())
                }
            };
            inputs.push(EntryInput {
                log_id: log_position(&log_id),
                stamped_ms,
                payload,
            });
            responders.push(responder);
            last = Some(log_id);
        }
        if inputs.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "failpoints")]
        let kinds =
            crate::failpoints::kinds(inputs.iter().flat_map(|input| match &input.payload {
                EntryPayload::Commands(commands) => commands.as_slice(),
                _ => &[],
            }));
        #[cfg(feature = "failpoints")]
        crate::failpoints::hit_kinds("apply.before", &kinds);
        let outputs = self
            .router
            .lock()
            .await
            .apply(inputs)
            .await
            .map_err(io::Error::other)?;
        assert_eq!(
            outputs.len(),
            responders.len(),
            "the router answers every entry"
        );
        self.applied = last;
        self.applied_tx.send_replace(last);
        #[cfg(feature = "failpoints")]
        crate::failpoints::hit_kinds("apply.after", &kinds);
        for (output, responder) in outputs.into_iter().zip(responders) {
            if let Some(responder) = responder {
                responder.send(ProposalReply {
                    log_id: output.log_id,
                    cluster_time_ms: output.cluster_time_ms,
                    results: output.results,
                });
            }
        }
        Ok(())
    }

    /// The consistent cut: the router asks every live family actor for its state, whose FIFO
    /// order makes it the state at `self.applied`, and gets the family itself, shared (copy on
    /// write); encoding and the file write happen later, in openraft's snapshot task, on a
    /// blocking thread, while apply goes on.
    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<SnapshotCut> {
        let cut = self.router.lock().await.cut().await;
        match cut {
            Ok(router_cut) => Some(SnapshotCut {
                meta: SnapshotMeta {
                    last_log_id: self.applied,
                    last_membership: self.membership.clone(),
                },
                router_cut: Some(router_cut),
                snapshots: self.snapshots.clone(),
            }),
            Err(error) => {
                tracing::error!(%error, force, "could not cut a snapshot");
                None
            }
        }
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotCut {
        match self.try_create_snapshot_builder(true).await {
            Some(cut) => cut,
            None => SnapshotCut {
                meta: SnapshotMeta::default(),
                router_cut: None,
                snapshots: self.snapshots.clone(),
            },
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        let router_snapshot = RouterSnapshot::from_bytes(&snapshot).map_err(io::Error::other)?;
        let restored =
            FamilyRouter::restore(self.router_config, router_snapshot).map_err(io::Error::other)?;
        let old = std::mem::replace(&mut *self.router.lock().await, restored);
        old.shutdown().await;
        // Every restored family starts passivated and uncounted in the hold index: count them
        // in the background, off the lock (until then `ListHolds` reads them all).
        let router = Arc::clone(&self.router);
        tokio::spawn(async move {
            match crate::families::rebuild_hold_index(&router).await {
                Ok(counted) => tracing::info!(counted, "hold index rebuilt after a snapshot"),
                Err(error) => tracing::warn!(%error, "hold index not rebuilt after a snapshot"),
            }
        });
        self.snapshots.save(&Snapshot {
            meta: meta.clone(),
            snapshot,
        })?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.applied_tx.send_replace(self.applied);
        tracing::info!(last_log_id = ?meta.last_log_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        Ok(self.snapshots.load_latest()?)
    }
}

/// A cut of the state at one applied index, waiting to be encoded and written.
pub struct SnapshotCut {
    meta: SnapshotMeta,
    router_cut: Option<RouterCut>,
    snapshots: SnapshotDir,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotCut {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let router_cut = self
            .router_cut
            .take()
            .ok_or_else(|| io::Error::other("the state machine could not cut a snapshot"))?;
        let meta = self.meta.clone();
        let dir = self.snapshots.clone();
        // Encoding every family is CPU-heavy: a blocking thread, not an async worker.
        let (path, snapshot) = tokio::task::spawn_blocking(move || {
            let bytes = router_cut.encode().to_bytes().map_err(io::Error::other)?;
            let snapshot = Snapshot {
                meta,
                snapshot: bytes,
            };
            let path = dir.save(&snapshot)?;
            Ok::<_, io::Error>((path, snapshot))
        })
        .await
        .map_err(io::Error::other)??;
        tracing::info!(path = %path.display(), bytes = snapshot.snapshot.len(), "wrote snapshot");
        Ok(snapshot)
    }
}
