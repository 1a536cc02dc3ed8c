//! Linearizable reads (docs/spec.md §7): on the leader, ReadIndex through openraft; on a follower,
//! the leader's read index over the internal `ReadIndex` rpc, then a wait until this node has
//! applied through it. Either way the read sees every write acknowledged before it began.

use std::sync::Arc;
use std::time::Duration;

use openraft::ReadPolicy;
use tally_api::pb::RaftBytes;
use tally_api::{decode_raft, encode_raft};
use tokio::sync::watch;

use crate::node::proposer::Proposer;
use crate::node::write_error::WriteError;
use crate::raft::types::{LogId, Raft};

pub struct ReadGate {
    raft: Raft,
    proposer: Arc<Proposer>,
    applied: watch::Receiver<Option<LogId>>,
    timeout: Duration,
}

impl ReadGate {
    pub fn new(
        raft: Raft,
        proposer: Arc<Proposer>,
        applied: watch::Receiver<Option<LogId>>,
        timeout: Duration,
    ) -> Self {
        Self {
            raft,
            proposer,
            applied,
            timeout,
        }
    }

    /// The index the leader confirms as committed while still leading.
    pub async fn leader_read_index(&self) -> Result<u64, WriteError> {
        match tokio::time::timeout(
            self.timeout,
            self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        {
            Ok(Ok(read)) => Ok(read.index()),
            Ok(Err(error)) => Err(WriteError::Unavailable {
                leader: self.proposer.leader(),
                reason: error.to_string(),
            }),
            Err(_) => Err(WriteError::Unavailable {
                leader: self.proposer.leader(),
                reason: "leadership not confirmed in time".to_owned(),
            }),
        }
    }

    /// Returns once a read on this node is linearizable.
    pub async fn linearize(&self) -> Result<(), WriteError> {
        let index = if self.proposer.is_leader() {
            self.leader_read_index().await?
        } else {
            self.remote_read_index().await?
        };
        self.wait_applied(index).await
    }

    async fn remote_read_index(&self) -> Result<u64, WriteError> {
        let mut call = self.proposer.leader_client().await?;
        let leader = call.leader.clone();
        let request = RaftBytes {
            payload: encode_raft(&())
                .map_err(|e| WriteError::Internal {
                    reason: e.to_string(),
                })?
                .into(),
        };
        let unavailable = |reason: String| WriteError::Unavailable {
            leader: Some(leader.clone()),
            reason,
        };
        let reply = tokio::time::timeout(self.timeout, call.client.read_index(request))
            .await
            .map_err(|_| {
                unavailable("the leader did not answer the read index in time".to_owned())
            })?
            .map_err(|status| unavailable(format!("read index from the leader: {status}")))?;
        call.answered();
        let answer: Result<u64, WriteError> = decode_raft(&reply.into_inner().payload)
            .map_err(|e| unavailable(format!("undecodable read index: {e}")))?;
        answer
    }

    async fn wait_applied(&self, index: u64) -> Result<(), WriteError> {
        let mut applied = self.applied.clone();
        let reached = async move {
            applied
                .wait_for(|log_id| log_id.is_some_and(|id| id.index >= index))
                .await
                .map(|_| ())
        };
        match tokio::time::timeout(self.timeout, reached).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(WriteError::Unavailable {
                leader: self.proposer.leader(),
                reason: format!("this node did not apply through index {index} in time"),
            }),
        }
    }
}
