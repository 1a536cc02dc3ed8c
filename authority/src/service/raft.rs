//! The internal `Raft` service, node to node: vote, streaming append, chunked snapshot
//! install, leadership transfer, write forwarding and read indexes. Payloads are versioned
//! rmp-serde; message sizes are capped by the server's limits.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use tally_api::pb::raft_server::Raft as RaftRpc;
use tally_api::pb::{RaftBytes, SnapshotChunk};
use tally_api::{decode_raft, encode_raft};
use tally_ledger::Command;
use tonic::{Request, Response, Status, Streaming};

use super::peer_auth::PeerAuth;
use super::read_gate::ReadGate;
use crate::node::proposer::{ForwardReply, Proposer};
use crate::node::write_error::WriteError;
use crate::raft::types::{Raft, Snapshot, SnapshotMeta, TypeConfig};

type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;

/// The largest snapshot this node accepts: snapshots are held in memory while installed.
const MAX_SNAPSHOT_BYTES: u64 = 8 << 30;

pub struct RaftService {
    raft: Raft,
    proposer: Arc<Proposer>,
    reads: Arc<ReadGate>,
    auth: PeerAuth,
}

impl RaftService {
    pub fn new(raft: Raft, proposer: Arc<Proposer>, reads: Arc<ReadGate>, auth: PeerAuth) -> Self {
        Self {
            raft,
            proposer,
            reads,
            auth,
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

    /// One reply per request, in order, until the sender closes the stream.
    async fn append(
        &self,
        request: Request<Streaming<RaftBytes>>,
    ) -> Result<Response<AppendStream>, Status> {
        let caller = self.auth.caller(&request)?;
        let raft = self.raft.clone();
        let input = request.into_inner();
        let output = input.then(move |message| {
            let raft = raft.clone();
            async move {
                let message = message?;
                let append: AppendEntriesRequest<TypeConfig> = decode(&message.payload)?;
                PeerAuth::claims(caller, append.vote.leader_id().node_id, "log append")?;
                let answer = raft.append_entries(append).await.map_err(fatal)?;
                let payload = encode_raft(&answer).map_err(|e| Status::internal(e.to_string()))?;
                Ok(RaftBytes {
                    payload: payload.into(),
                })
            }
        });
        Ok(Response::new(Box::pin(output)))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftBytes>, Status> {
        let caller = self.auth.caller(&request)?;
        let mut chunks = request.into_inner();
        let mut header: Option<(Vote, SnapshotMeta)> = None;
        let mut data: Vec<u8> = Vec::new();
        let mut done = false;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            if header.is_none() {
                let decoded: (Vote, SnapshotMeta) = decode(&chunk.header)?;
                PeerAuth::claims(caller, decoded.0.leader_id().node_id, "snapshot")?;
                header = Some(decoded);
            }
            if chunk.offset != data.len() as u64 {
                return Err(Status::invalid_argument(format!(
                    "snapshot chunk at offset {} after {} bytes",
                    chunk.offset,
                    data.len()
                )));
            }
            if data.len() as u64 + chunk.data.len() as u64 > MAX_SNAPSHOT_BYTES {
                return Err(Status::resource_exhausted(
                    "snapshot larger than this node accepts",
                ));
            }
            data.extend_from_slice(&chunk.data);
            if chunk.done {
                done = true;
                break;
            }
        }
        let Some((vote, meta)) = header else {
            return Err(Status::invalid_argument("snapshot stream without a header"));
        };
        if !done {
            return Err(Status::invalid_argument(
                "snapshot stream ended before its last chunk",
            ));
        }
        let answer = self
            .raft
            .install_full_snapshot(
                vote,
                Snapshot {
                    meta,
                    snapshot: data,
                },
            )
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
}
