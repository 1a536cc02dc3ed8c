//! Writing on this node, believed to lead: one proposal handed to Raft, awaited under the
//! proposal timeout, counted as pending (for load shedding) until Raft answers, and every
//! failure said as exactly as it is known. The proposer uses it for parameter and alarm
//! changes; client commands reach it through the entry coalescer. The pending proposals it
//! keeps ([`PendingProposals`]) are what the proposer's load shedding reads.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::errors::{ClientWriteError, RaftError};

use super::clock::wall_clock_ms;
use super::commit_rate::CommitRate;
use super::metrics::NodeMetrics;
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
        metrics: Arc<NodeMetrics>,
    ) -> Self {
        Self {
            raft,
            timeout,
            shed_after,
            pending: Arc::new(PendingProposals::new(Arc::clone(&metrics))),
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
        let reply = self.write_unmetered(proposal).await?;
        let elapsed = started.elapsed();
        self.metrics.observe_commit(elapsed);
        self.metrics.write_spans.client_write.record(elapsed);
        for decision in reply.results.iter().flatten() {
            self.metrics
                .observe_decision(&decision.outcome, decision.replayed);
        }
        Ok(reply)
    }

    /// [`Self::write`] without the commit latency and decision metrics: for entries no client
    /// waits on (the cluster time keeper's ticks).
    pub async fn write_unmetered(&self, proposal: Proposal) -> Result<ProposalReply, WriteError> {
        let pending = self.pending.enter(proposal.command_count());
        let raft = self.raft.clone();
        let mut write = Box::pin(async move { raft.client_write(proposal).await });
        let answer = tokio::time::timeout(self.timeout, &mut write).await;
        if answer.is_err() && self.shed_after.is_some() {
            watch_until_answered(pending, write);
        }
        match answer {
            Ok(Ok(response)) => Ok(response.data),
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

/// The proposals this node has handed to Raft and not yet seen answered, by when each went.
/// Sequence numbers are taken under the lock with the time, so the first is the oldest.
pub(super) struct PendingProposals {
    state: Mutex<PendingState>,
    /// Mirrors the count and the oldest's start for `/metrics`.
    metrics: Arc<NodeMetrics>,
}

struct PendingState {
    next: u64,
    /// Sequence number → when proposed, wall clock ms of it for `/metrics`, and its commands.
    since: BTreeMap<u64, (Instant, u64, usize)>,
    /// The commands of the proposals in `since`.
    commands: usize,
    /// How fast commands are answered while some wait.
    rate: CommitRate,
}

/// What load shedding reads of the pending proposals at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct PendingView {
    /// Proposals (entries) awaiting their answer.
    pub count: usize,
    /// Their commands.
    pub commands: usize,
    /// How long the oldest has waited.
    pub oldest_age: Option<Duration>,
    /// Commands answered per second over the last second in which some waited throughout.
    pub commands_per_s: Option<f64>,
}

impl PendingProposals {
    fn new(metrics: Arc<NodeMetrics>) -> Self {
        Self {
            state: Mutex::new(PendingState {
                next: 0,
                since: BTreeMap::new(),
                commands: 0,
                rate: CommitRate::new(Instant::now()),
            }),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PendingState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A proposal of `commands` commands handed to Raft now; pending until the guard drops.
    fn enter(self: &Arc<Self>, commands: usize) -> PendingProposal {
        let mut state = self.lock();
        let seq = state.next;
        state.next += 1;
        let now = Instant::now();
        let waiting = state.commands;
        state.rate.roll(now, waiting);
        state.since.insert(seq, (now, wall_clock_ms(), commands));
        state.commands += commands;
        self.publish(&state);
        PendingProposal {
            proposals: Arc::clone(self),
            seq,
        }
    }

    fn leave(&self, seq: u64) {
        let mut state = self.lock();
        let Some((_, _, commands)) = state.since.remove(&seq) else {
            panic!("pending proposal {seq} left twice");
        };
        state.commands -= commands;
        let waiting = state.commands;
        state.rate.answered(Instant::now(), commands, waiting);
        self.publish(&state);
    }

    fn publish(&self, state: &PendingState) {
        let oldest_ms = state.since.values().next().map_or(0, |(_, ms, _)| *ms);
        self.metrics
            .track_pending_proposals(state.since.len() as u64, oldest_ms);
    }

    /// How many are pending, how long the oldest has waited, and how fast they are answered.
    pub(super) fn snapshot(&self) -> PendingView {
        let mut state = self.lock();
        let now = Instant::now();
        let commands = state.commands;
        state.rate.roll(now, commands);
        PendingView {
            count: state.since.len(),
            commands,
            oldest_age: (state.since.values().next()).map(|(at, _, _)| now.duration_since(*at)),
            commands_per_s: state.rate.per_s(now),
        }
    }
}

/// One proposal awaiting its answer from Raft.
struct PendingProposal {
    proposals: Arc<PendingProposals>,
    seq: u64,
}

impl Drop for PendingProposal {
    fn drop(&mut self) {
        self.proposals.leave(self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_pending_proposal_is_the_first_still_waiting() {
        let metrics = Arc::new(NodeMetrics::default());
        let proposals = Arc::new(PendingProposals::new(Arc::clone(&metrics)));
        let count_and_oldest = |view: PendingView| (view.count, view.oldest_age);
        assert_eq!(count_and_oldest(proposals.snapshot()), (0, None));
        let first = proposals.enter(3);
        std::thread::sleep(Duration::from_millis(20));
        let second = proposals.enter(64);
        let (count, oldest) = count_and_oldest(proposals.snapshot());
        assert_eq!(count, 2);
        assert_eq!(proposals.snapshot().commands, 67);
        assert!(oldest.expect("pending") >= Duration::from_millis(20));
        assert_eq!(metrics.pending_proposals(), 2);
        drop(first);
        let (count, oldest) = count_and_oldest(proposals.snapshot());
        assert_eq!(count, 1);
        assert_eq!(proposals.snapshot().commands, 64);
        assert!(oldest.expect("pending") < Duration::from_millis(20));
        drop(second);
        assert_eq!(count_and_oldest(proposals.snapshot()), (0, None));
        assert_eq!(metrics.pending_proposals(), 0);
    }
}
