//! Writing on this node, believed to lead: one proposal handed to Raft, awaited under the
//! proposal timeout, counted as pending (for load shedding) until Raft answers, and every
//! failure said as exactly as it is known. The proposer uses it for parameter and alarm
//! changes; client commands reach it through the entry coalescer.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::errors::{ClientWriteError, RaftError};

use super::metrics::NodeMetrics;
use super::proposer::{PendingProposal, PendingProposals};
use super::write_error::WriteError;
use crate::raft::types::{Proposal, ProposalReply, Raft};

/// Cheap to clone: handles and settings.
#[derive(Clone)]
pub struct LocalWriter {
    raft: Raft,
    timeout: Duration,
    /// New client commands are refused while the oldest pending proposal is older than this;
    /// `None`: never.
    pub(super) shed_after: Option<Duration>,
    pub(super) pending: Arc<PendingProposals>,
    metrics: Arc<NodeMetrics>,
}

impl LocalWriter {
    pub(super) fn new(
        raft: Raft,
        timeout: Duration,
        shed_after: Option<Duration>,
        pending: Arc<PendingProposals>,
        metrics: Arc<NodeMetrics>,
    ) -> Self {
        Self {
            raft,
            timeout,
            shed_after,
            pending,
            metrics,
        }
    }

    /// Writes on this node, believed to lead. Anything but a reply is indefinite: the entry
    /// may have been appended before leadership was lost (openraft reports a discarded entry
    /// as `ForwardToLeader`, which is why that is `Unknown` here, never `Unavailable`).
    ///
    /// The proposal counts as pending until Raft answers it. When the wait times out while
    /// shedding is on, a task goes on awaiting the answer, so the entry keeps its age: a
    /// leader whose writes all time out must not look idle and take more.
    pub async fn write(&self, proposal: Proposal) -> Result<ProposalReply, WriteError> {
        let started = Instant::now();
        let pending = self.pending.enter();
        let raft = self.raft.clone();
        let mut write = Box::pin(async move { raft.client_write(proposal).await });
        let answer = tokio::time::timeout(self.timeout, &mut write).await;
        if answer.is_err() && self.shed_after.is_some() {
            watch_until_answered(pending, write);
        }
        match answer {
            Ok(Ok(response)) => {
                self.metrics.observe_commit(started.elapsed());
                for decision in response.data.results.iter().flatten() {
                    self.metrics
                        .observe_decision(&decision.outcome, decision.replayed);
                }
                Ok(response.data)
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to)))) => {
                Err(WriteError::Unknown {
                    reason: format!(
                        "leadership moved to {:?} while the entry was in flight",
                        to.leader_id
                    ),
                })
            }
            Ok(Err(RaftError::APIError(other))) => Err(WriteError::Unknown {
                reason: other.to_string(),
            }),
            Ok(Err(RaftError::Fatal(fatal))) => Err(WriteError::Internal {
                reason: fatal.to_string(),
            }),
            Err(_) => Err(WriteError::Unknown {
                reason: format!(
                    "not committed within {} ms of proposing",
                    self.timeout.as_millis()
                ),
            }),
        }
    }
}

/// Awaits `write` after its caller gave up, keeping `pending` (its age) until Raft answers:
/// committed, discarded, or the node stops.
fn watch_until_answered<W>(pending: PendingProposal, write: W)
where
    W: Future + Send + 'static,
{
    tokio::spawn(async move {
        let _pending = pending;
        let _ = write.await;
    });
}
