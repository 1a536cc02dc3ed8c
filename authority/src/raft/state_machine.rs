//! openraft's `RaftStateMachine` over the family router. Live families are in memory,
//! passivated ones in the family store on disk (a spill area); snapshots are on disk.
//! Restart = newest valid snapshot + replay of the committed log after it (openraft drives
//! both, from `get_current_snapshot` and the persisted committed id). A node's own snapshots
//! link the store's runs of rows instead of copying them, so a restart takes them back in
//! without reading them; a snapshot from the leader is a stream and is read row by row.

use std::io;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload as RaftPayload, OptionalSend, RaftSnapshotBuilder};
use tokio::sync::{watch, Mutex};

use super::snapshot_file::{SnapshotDir, SnapshotFile};
use super::types::{
    log_position, AppliedTime, LogId, Membership, ProposalReply, Snapshot, SnapshotMeta,
    TypeConfig, PROPOSAL_VERSION,
};
use crate::families::snapshot_stream;
use crate::families::{
    EntryInput, EntryPayload, FamilyRouter, FamilyStoreDir, RouterConfig, RouterCut,
};

/// The router behind a lock: openraft's apply task and the read path share it.
pub type SharedRouter = Arc<Mutex<FamilyRouter>>;

pub struct TallyStateMachine {
    router: SharedRouter,
    router_config: RouterConfig,
    /// Where each router's family store goes (a restore builds a new one).
    family_stores: FamilyStoreDir,
    applied: Option<LogId>,
    membership: Membership,
    snapshots: SnapshotDir,
    /// The last applied log id, for health checks and read-your-writes waits.
    applied_tx: watch::Sender<Option<LogId>>,
    /// Cluster time after the last applied entry, for the leader's write gate and its keeper
    /// (`node/cluster_time_gate.rs`, `node/cluster_time_keeper.rs`).
    applied_time_tx: watch::Sender<AppliedTime>,
}

/// What the state machine publishes after each apply and install.
pub struct AppliedWatches {
    pub log_id: watch::Receiver<Option<LogId>>,
    pub time: watch::Receiver<AppliedTime>,
}

/// Cluster time after the router's last applied entry, and the step in force.
pub fn applied_time(router: &FamilyRouter) -> AppliedTime {
    AppliedTime {
        cluster_time_ms: router.cluster_time_ms(),
        max_clock_step_ms: router.params().max_clock_step_ms,
    }
}

impl TallyStateMachine {
    pub fn new(
        router_config: RouterConfig,
        family_stores: FamilyStoreDir,
        snapshots: SnapshotDir,
    ) -> Result<(Self, SharedRouter, AppliedWatches), io::Error> {
        let store = family_stores.create().map_err(io::Error::other)?;
        let router = FamilyRouter::with_store(router_config, store).map_err(io::Error::other)?;
        let (applied_time_tx, applied_time_rx) = watch::channel(applied_time(&router));
        let router = Arc::new(Mutex::new(router));
        let (applied_tx, applied_rx) = watch::channel(None);
        let machine = Self {
            router: router.clone(),
            router_config,
            family_stores,
            applied: None,
            membership: Membership::default(),
            snapshots,
            applied_tx,
            applied_time_tx,
        };
        let watches = AppliedWatches {
            log_id: applied_rx,
            time: applied_time_rx,
        };
        Ok((machine, router, watches))
    }
}

impl RaftStateMachine<TypeConfig> for TallyStateMachine {
    type SnapshotData = SnapshotFile;
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
        let (outputs, time) = {
            let mut router = self.router.lock().await;
            let outputs = router.apply(inputs).await.map_err(io::Error::other)?;
            (outputs, applied_time(&router))
        };
        assert_eq!(
            outputs.len(),
            responders.len(),
            "the router answers every entry"
        );
        self.applied = last;
        self.applied_tx.send_replace(last);
        self.applied_time_tx.send_replace(time);
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

    /// Streams the snapshot's families into a new family store (a linked snapshot's runs are
    /// taken in by link) and checks the state's digest against the sender's before the new
    /// router replaces the old one; a received snapshot is then kept as a snapshot of the
    /// node's own, linked to the restored runs (both on blocking threads).
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotFile,
    ) -> Result<(), io::Error> {
        let (config, stores) = (self.router_config, self.family_stores.clone());
        let (snapshots, saved_meta) = (self.snapshots.clone(), meta.clone());
        let began = std::time::Instant::now();
        let linked = snapshot.runs_dir().is_some();
        tracing::info!(
            last_log_id = ?meta.last_log_id,
            bytes = snapshot.len(),
            linked,
            "installing snapshot"
        );
        let own = self.snapshots.clone();
        let restored = tokio::task::spawn_blocking(move || {
            let (router, digest) = match snapshot.runs_dir() {
                // The node's own snapshot, at start: its runs are taken in, not read.
                Some(runs) => snapshot_stream::restore_linked(
                    config,
                    &mut snapshot.reader(),
                    runs,
                    stores.create()?,
                )?,
                None => {
                    snapshot_stream::restore_from(config, &mut snapshot.reader(), stores.create()?)?
                }
            };
            if digest != snapshot.digest() {
                return Err(crate::families::RouterError::Snapshot(
                    "the snapshot's state does not match the digest its sender gave".into(),
                ));
            }
            Ok((router, snapshot.digest(), own.holds(&snapshot)))
        })
        .await
        .map_err(io::Error::other)?
        .map_err(io::Error::other)?;
        let (restored, digest, in_place) = restored;
        if !in_place {
            // A received stream: the node keeps the state as a snapshot of its own, which
            // links the restored run instead of copying the stream's rows again.
            let cut = restored.cut().await.map_err(io::Error::other)?;
            let saved = tokio::task::spawn_blocking(move || {
                snapshots.save_linked(&saved_meta, |out, runs| {
                    snapshot_stream::write_linked(cut, out, runs).map_err(io::Error::other)
                })
            })
            .await
            .map_err(io::Error::other)??;
            if saved.digest() != digest {
                return Err(io::Error::other(
                    "a snapshot of the state just restored holds another state",
                ));
            }
        }
        let time = applied_time(&restored);
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
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.applied_tx.send_replace(self.applied);
        self.applied_time_tx.send_replace(time);
        tracing::info!(
            last_log_id = ?meta.last_log_id,
            linked,
            elapsed_ms = began.elapsed().as_millis() as u64,
            "installed snapshot"
        );
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let snapshots = self.snapshots.clone();
        let latest = tokio::task::spawn_blocking(move || snapshots.load_latest())
            .await
            .map_err(io::Error::other)??;
        Ok(latest.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

/// A cut of the state at one applied index, waiting to be encoded and written.
pub struct SnapshotCut {
    meta: SnapshotMeta,
    router_cut: Option<RouterCut>,
    snapshots: SnapshotDir,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotCut {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let router_cut = self
            .router_cut
            .take()
            .ok_or_else(|| io::Error::other("the state machine could not cut a snapshot"))?;
        let meta = self.meta.clone();
        let dir = self.snapshots.clone();
        // Encoding every family is CPU-heavy and reading passivated ones is disk I/O: a
        // thread of its own, not an async worker, at a lower priority than apply and the Raft
        // tasks (`background.rs`). The families stream to the file one by one; the rows out
        // of memory stay where they are, linked (`snapshot_file.rs`).
        let saved_meta = meta.clone();
        let file = crate::background::run("tally-snapshot", move || {
            dir.save_linked(&saved_meta, |out, runs| {
                snapshot_stream::write_linked(router_cut, out, runs).map_err(io::Error::other)
            })
        })
        .await??;
        tracing::info!(bytes = file.len(), last_log_id = ?meta.last_log_id, "wrote snapshot");
        Ok(Snapshot {
            meta,
            snapshot: file,
        })
    }
}
