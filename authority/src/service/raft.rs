//! The internal `Raft` service, node to node: vote, streaming append, chunked snapshot
//! install, leadership transfer, write forwarding, read indexes and alarm raises. Payloads
//! are versioned rmp-serde; message sizes are capped by the server's limits.

use std::pin::Pin;
use std::sync::{Arc, PoisonError};

use futures_util::{Stream, StreamExt};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, TransferLeaderRequest, VoteRequest,
};
use tally_api::pb::raft_server::Raft as RaftRpc;
use tally_api::pb::{RaftBytes, SnapshotChunk};
use tally_api::{decode_raft, encode_raft};
use tally_ledger::Command;
use tonic::{Request, Response, Status, Streaming};

use super::peer_auth::PeerAuth;
use super::read_gate::ReadGate;
use super::snapshot_inbox::SnapshotInbox;
use crate::families::snapshot_stream::digest_of;
use crate::families::AlarmChange;
use crate::node::proposer::{ForwardReply, Proposer};
use crate::node::write_error::WriteError;
use crate::raft::snapshot_file::SnapshotFile;
use crate::raft::types::{Raft, Snapshot, SnapshotMeta, TypeConfig};

type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;

pub struct RaftService {
    raft: Raft,
    proposer: Arc<Proposer>,
    reads: Arc<ReadGate>,
    auth: PeerAuth,
    snapshots: SnapshotInbox,
    /// Becomes true when the node shuts down: open `Append` streams end then, so the server's
    /// graceful shutdown, which waits for every open call, is not held up by a peer's
    /// replication stream (it stays open for as long as that peer leads).
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl RaftService {
    pub fn new(
        raft: Raft,
        proposer: Arc<Proposer>,
        reads: Arc<ReadGate>,
        auth: PeerAuth,
        snapshots: SnapshotInbox,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Self {
            raft,
            proposer,
            reads,
            auth,
            snapshots,
            shutdown,
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Status> {
    decode_raft(bytes).map_err(|e| Status::invalid_argument(format!("raft payload: {e}")))
}

fn reply<T: serde::Serialize>(value: &T) -> Result<Response<RaftBytes>, Status> {
    let payload = encode_raft(value).map_err(|e| Status::internal(format!("raft payload: {e}")))?;
    Ok(Response::new(RaftBytes {
        payload: payload.into(),
    }))
}

fn fatal(error: impl std::fmt::Display) -> Status {
    Status::internal(format!("raft fatal: {error}"))
}

type AppendStream = Pin<Box<dyn Stream<Item = Result<RaftBytes, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn vote(&self, request: Request<RaftBytes>) -> Result<Response<RaftBytes>, Status> {
        let caller = self.auth.caller(&request)?;
        let vote: VoteRequest<TypeConfig> = decode(&request.into_inner().payload)?;
        PeerAuth::claims(caller, vote.vote.leader_id().node_id, "vote request")?;
        let answer = self.raft.vote(vote).await.map_err(fatal)?;
        reply(&answer)
    }

    type AppendStream = AppendStream;

    /// One reply per request, in order, until the sender closes the stream or this node shuts
    /// down. The leader keeps one stream open per follower and pipelines its requests on it;
    /// here openraft's `stream_append` takes them in as they come, without waiting for the
    /// last one's fsync, so appends that arrive while the log writer syncs are written in its
    /// next frame together (one fsync for all) instead of one fsync each, one after another.
    /// The stream ends after a conflict or a higher vote (the leader starts a new session),
    /// and at the first message that does not decode or comes from a peer other than the
    /// leader it names: that message's status is the stream's last item, and openraft never
    /// sees it.
    async fn append(
        &self,
        request: Request<Streaming<RaftBytes>>,
    ) -> Result<Response<AppendStream>, Status> {
        let caller = self.auth.caller(&request)?;
        let refused: Arc<std::sync::Mutex<Option<Status>>> = Arc::default();
        let requests = {
            let refused = Arc::clone(&refused);
            request.into_inner().scan((), move |(), message| {
                let checked = message.and_then(|message| {
                    let append: AppendEntriesRequest<TypeConfig> = decode(&message.payload)?;
                    PeerAuth::claims(caller, append.vote.leader_id().node_id, "log append")?;
                    Ok(append)
                });
                std::future::ready(match checked {
                    Ok(append) => Some(append),
                    Err(status) => {
                        *refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
                        None
                    }
                })
            })
        };
        let replies = self.raft.stream_append(requests).map(|result| {
            let answer = AppendEntriesResponse::from(result.map_err(fatal)?);
            let payload = encode_raft(&answer).map_err(|e| Status::internal(e.to_string()))?;
            Ok(RaftBytes {
                payload: payload.into(),
            })
        });
        let refusal = futures_util::stream::once(async move {
            refused
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        })
        .filter_map(|refused| std::future::ready(refused.map(Err)));
        let mut shutdown = self.shutdown.clone();
        let stopping = async move {
            // A dropped sender is a node handle dropped without `shutdown`: the node goes on.
            if shutdown.wait_for(|stopping| *stopping).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        Ok(Response::new(Box::pin(
            replies.chain(refusal).take_until(stopping),
        )))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftBytes>, Status> {
        let caller = self.auth.caller(&request)?;
        let received = self
            .snapshots
            .receive(request.into_inner(), |header| {
                let (vote, meta, digest): (Vote, SnapshotMeta, [u8; 32]) = decode(header)?;
                PeerAuth::claims(caller, vote.leader_id().node_id, "snapshot")?;
                Ok((vote, meta, digest))
            })
            .await?;
        let (vote, meta, digest) = received.header;
        let snapshot = SnapshotFile::received(received.file, received.len, digest);
        // Read through once before openraft sees it: a stream that does not decode or does
        // not hold the state its sender's digest names is refused here, and the leader sends
        // again, instead of failing the install (which openraft treats as fatal).
        let checked = snapshot.clone();
        let read = tokio::task::spawn_blocking(move || digest_of(&mut checked.reader()))
            .await
            .map_err(|error| Status::internal(error.to_string()))?;
        match read {
            Ok(read) if read == digest => {}
            Ok(_) => {
                return Err(Status::data_loss(
                    "the snapshot's state does not match the digest its sender gave",
                ))
            }
            Err(error) => return Err(Status::invalid_argument(error.to_string())),
        }
        let answer = self
            .raft
            .install_full_snapshot(vote, Snapshot { meta, snapshot })
            .await
            .map_err(fatal)?;
        reply(&answer)
    }

    async fn forward(&self, request: Request<RaftBytes>) -> Result<Response<RaftBytes>, Status> {
        // The forwarding follower checked its client's role and namespaces; the leader checks
        // that the follower is a member.
        self.auth.caller(&request)?;
        let commands: Vec<Command> = decode(&request.into_inner().payload)?;
        // Never forward twice: if this node no longer leads, the caller learns who does.
        let answer: ForwardReply = self.proposer.propose_here(commands).await;
        reply(&answer)
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftBytes>,
    ) -> Result<Response<RaftBytes>, Status> {
        let caller = self.auth.caller(&request)?;
        let transfer: TransferLeaderRequest<TypeConfig> = decode(&request.into_inner().payload)?;
        PeerAuth::claims(
            caller,
            transfer.from_leader().leader_id().node_id,
            "leadership transfer",
        )?;
        let answer = self
            .raft
            .handle_transfer_leader(transfer)
            .await
            .map_err(fatal)?;
        reply(&answer)
    }

    async fn read_index(&self, request: Request<RaftBytes>) -> Result<Response<RaftBytes>, Status> {
        self.auth.caller(&request)?;
        let answer: Result<u64, WriteError> = self.reads.leader_read_index().await;
        reply(&answer)
    }

    /// A follower short of disk has the `NoSpace` alarm raised (docs/spec.md §5.6). Only a
    /// raise travels this way (an operator clears, on the Admin service), and only for the
    /// calling node: a member cannot stop new exposure in another's name.
    async fn raise_alarm(
        &self,
        request: Request<RaftBytes>,
    ) -> Result<Response<RaftBytes>, Status> {
        let caller = self.auth.caller(&request)?;
        let change: AlarmChange = decode(&request.into_inner().payload)?;
        let AlarmChange::Raise { node_id, .. } = &change else {
            return Err(Status::from(tally_api::pb::ErrorDetail::permission_denied(
                "a peer may only raise its own alarm; an operator clears alarms (Admin.ClearAlarm)",
            )));
        };
        PeerAuth::claims(caller, *node_id, "NoSpace alarm")?;
        tracing::warn!(%change, "a peer asks for an alarm");
        let answer: ForwardReply = self.proposer.propose_alarm_here(change).await;
        reply(&answer)
    }
}
