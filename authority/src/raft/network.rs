//! The Raft network over tonic: vote, append (pipelined over the streaming `Append` rpc,
//! `append_stream`), full snapshots in chunks, and leadership transfer. Payloads are
//! versioned rmp-serde bytes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use tally_api::pb::raft_client::RaftClient;
use tally_api::pb::{RaftBytes, SnapshotChunk};
use tally_api::{decode_raft, encode_raft, MAX_MESSAGE_BYTES};
use tally_tls::Transport;
use tonic::transport::Channel;

use super::append_stream::{self, Link};
use super::types::{NodeId, Snapshot, TallyNode, TypeConfig};
use crate::faults::NetworkFaults;

/// Snapshot chunk size: well under the message limit.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connect waits after the last one to the same peer failed. openraft backs off a
/// failing replication stream only between the requests of a stream it has opened; a stream
/// that cannot open (the peer is down) fails at once and is opened again at once. Without
/// this wait a leader retried a stopped peer ~6,000 times a second, and a 3-node dev cluster
/// restored from a backup grew from 0.7 to 7.2 GB in the 11 s its third node took to start.
const RECONNECT_DELAY: Duration = Duration::from_millis(200);

type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;

/// Builds one connection per peer.
#[derive(Clone)]
pub struct NetworkFactory {
    self_id: NodeId,
    faults: Arc<NetworkFaults>,
    /// This node's certificate toward its peers' peer ports, or plaintext.
    transport: Transport,
}

impl NetworkFactory {
    pub fn new(self_id: NodeId, faults: Arc<NetworkFaults>, transport: Transport) -> Self {
        Self {
            self_id,
            faults,
            transport,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &TallyNode) -> Connection {
        Connection {
            link: Link {
                from: self.self_id,
                to: target,
                faults: self.faults.clone(),
                broken: Arc::default(),
            },
            address: node.peer_address().to_owned(),
            transport: self.transport.clone(),
            client: None,
            failed_at: None,
        }
    }
}

pub struct Connection {
    /// This node, the peer, the injected faults between them, and whether the last append
    /// stream failed (then the next call reconnects).
    link: Link,
    address: String,
    transport: Transport,
    client: Option<RaftClient<Channel>>,
    /// When the last connect to the peer failed (none since it succeeded).
    failed_at: Option<tokio::time::Instant>,
}

pub(super) fn unreachable<E: std::error::Error + 'static>(error: &E) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(error))
}

pub(super) fn network<E: std::error::Error + 'static>(error: &E) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(error))
}

impl Connection {
    /// Applies injected faults, then returns a connected client (connecting lazily, no sooner
    /// than [`RECONNECT_DELAY`] after a failed connect).
    async fn client(&mut self) -> Result<RaftClient<Channel>, RPCError<TypeConfig>> {
        if self
            .link
            .broken
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            self.client = None;
        }
        if let (Some(client), None) = (&self.client, self.link.cut()) {
            return Ok(client.clone());
        }
        if let Some(failed_at) = self.failed_at {
            tokio::time::sleep_until(failed_at + RECONNECT_DELAY).await;
        }
        let connected = self.connect().await;
        self.failed_at = connected.is_err().then(tokio::time::Instant::now);
        let client = connected?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// One connect to the peer (an injected cut fails it as the network would).
    async fn connect(&self) -> Result<RaftClient<Channel>, RPCError<TypeConfig>> {
        if let Some(cut) = self.link.cut() {
            return Err(cut);
        }
        let endpoint = self
            .transport
            .endpoint(&self.address)
            .map_err(|e| unreachable(&e))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let channel = endpoint.connect().await.map_err(|e| unreachable(&e))?;
        Ok(RaftClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A failed call drops the channel so the next one reconnects.
    fn forget<T>(&mut self, error: RPCError<TypeConfig>) -> Result<T, RPCError<TypeConfig>> {
        self.client = None;
        Err(error)
    }
}

impl RaftNetworkV2<TypeConfig> for Connection {
    type SnapshotData = super::snapshot_file::SnapshotFile;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut client = self.client().await?;
        let request = RaftBytes {
            payload: encode_raft(&rpc).map_err(|e| network(&e))?.into(),
        };
        let call = async {
            let mut replies = client
                .append(futures_util::stream::once(async { request }))
                .await?
                .into_inner();
            replies.message().await
        };
        match tokio::time::timeout(option.hard_ttl(), call).await {
            Ok(Ok(Some(reply))) => decode_raft(&reply.payload).map_err(|e| network(&e)),
            Ok(Ok(None)) => self.forget(network(&std::io::Error::other(
                "append stream closed without a reply",
            ))),
            Ok(Err(status)) => self.forget(network(&status)),
            Err(elapsed) => self.forget(network(&elapsed)),
        }
    }

    /// Pipelined: requests go out as openraft makes them, on one open stream
    /// (`append_stream`), instead of one round trip each.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        Box::pin(async move {
            let client = self.client().await?;
            let link = self.link.clone();
            let replies = append_stream::open(client, link, input, option.hard_ttl()).await?;
            let replies: BoxStream<'s, _> = Box::pin(replies);
            Ok(replies)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut client = self.client().await?;
        let request = RaftBytes {
            payload: encode_raft(&rpc).map_err(|e| network(&e))?.into(),
        };
        match tokio::time::timeout(option.hard_ttl(), client.vote(request)).await {
            Ok(Ok(reply)) => decode_raft(&reply.into_inner().payload).map_err(|e| network(&e)),
            Ok(Err(status)) => self.forget(network(&status)),
            Err(elapsed) => self.forget(network(&elapsed)),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut client = self.client().await.map_err(StreamingError::from)?;
        // A node's own snapshot links its rows: the follower gets them as a stream, written
        // once beside the snapshot (the first send reads every row, on a thread of lower
        // priority than apply: `background.rs`).
        let (linked, meta) = (snapshot.snapshot, snapshot.meta.clone());
        let data = crate::background::run("tally-expand", move || linked.streamable(&meta))
            .await
            .map_err(|e| StreamingError::from(network(&e)))?
            .map_err(|e| StreamingError::from(network(&e)))?;
        let header = encode_raft(&(vote, snapshot.meta.clone(), data.digest()))
            .map_err(|e| StreamingError::from(network(&e)))?;
        let chunk_bytes = SNAPSHOT_CHUNK_BYTES as u64;
        let chunk_count = data.len().div_ceil(chunk_bytes).max(1);
        // Each chunk is read from the file when the stream wants it (on a blocking thread):
        // at most one chunk per stream in memory, whatever the snapshot's size. A read error
        // ends the stream early; the receiver refuses the short stream and the leader retries.
        let chunks = futures_util::stream::iter(0..chunk_count)
            .then(move |i| {
                let data = data.clone();
                let header = if i == 0 { header.clone() } else { Vec::new() };
                async move {
                    let offset = i * chunk_bytes;
                    let read = tokio::task::spawn_blocking(move || {
                        data.read_chunk(offset, SNAPSHOT_CHUNK_BYTES)
                    })
                    .await;
                    match read {
                        Ok(Ok(bytes)) => Some(SnapshotChunk {
                            header: header.into(),
                            offset,
                            data: bytes.into(),
                            done: i + 1 == chunk_count,
                        }),
                        Ok(Err(error)) => {
                            tracing::warn!(%error, offset, "could not read a snapshot chunk");
                            None
                        }
                        Err(error) => {
                            tracing::warn!(%error, offset, "a snapshot chunk read stopped");
                            None
                        }
                    }
                }
            })
            .take_while(|chunk| std::future::ready(chunk.is_some()))
            .filter_map(std::future::ready);
        let send = client.install_snapshot(chunks);
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            reply = send => match reply {
                Ok(reply) => decode_raft(&reply.into_inner().payload)
                    .map_err(|e| StreamingError::from(network(&e))),
                Err(status) => {
                    self.client = None;
                    Err(StreamingError::from(network(&status)))
                }
            },
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let mut client = self.client().await?;
        let request = RaftBytes {
            payload: encode_raft(&req).map_err(|e| network(&e))?.into(),
        };
        match tokio::time::timeout(option.hard_ttl(), client.transfer_leader(request)).await {
            Ok(Ok(reply)) => decode_raft(&reply.into_inner().payload).map_err(|e| network(&e)),
            Ok(Err(status)) => self.forget(network(&status)),
            Err(elapsed) => self.forget(network(&elapsed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stopped peer is connected to at most once per [`RECONNECT_DELAY`], however fast
    /// openraft asks: a leader retried one ~6,000 times a second.
    #[tokio::test]
    async fn a_stopped_peer_is_retried_at_most_once_per_reconnect_delay() {
        // A port that was just free: nothing listens, so a connect is refused at once.
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .to_string();
        let mut factory = NetworkFactory::new(1, Arc::default(), Transport::Insecure);
        let peer = TallyNode::new(address.clone(), address, "local".into());
        let mut connection = factory.new_client(2, &peer).await;
        let started = tokio::time::Instant::now();
        let mut attempts = 0u32;
        while started.elapsed() < Duration::from_secs(1) {
            assert!(connection.client().await.is_err(), "nothing listens there");
            attempts += 1;
        }
        let most = 1 + (1_000 / RECONNECT_DELAY.as_millis()) as u32;
        assert!(
            (2..=most).contains(&attempts),
            "{attempts} connects in 1 s, expected 2..={most}"
        );
    }
}
