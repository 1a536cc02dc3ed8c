//! Unary writes that reach the leader at the same time share one log entry.
//!
//! Kernels send unary commands (authorize, capture, reconcile), one per request. Proposed one
//! entry each, every command pays an entry's whole way through Raft on every replica: the core
//! task's bookkeeping, encoding, replication messages, a frame in the log, an apply round. At
//! a few hundred commands a second that per-entry cost is most of a node's CPU (docs/
//! benchmarks.md "Kernel scale-out"), and under load the core task's per-entry work is what
//! runs out first. `Batch` requests avoid it, but only for callers that can batch.
//!
//! So commands go through one queue here. The task that drains it takes the first, yields
//! once so that request handlers already runnable can queue theirs, then takes everything
//! queued (up to `MAX_COMMANDS_PER_ENTRY` commands) as one proposal, and goes back to the
//! queue at once: groups are proposed without waiting for each other, like separate entries.
//! Nothing waits for a timer: alone, a command goes on after one yield; under load, the
//! commands that arrived while the task waited for a core go together.
//!
//! A request of `NO_YIELD_FROM_COMMANDS` commands or more (a client's `Batch`) does not wait
//! for the yield: it fills an entry well already, and the yield only delayed it (at a fixed
//! 15,000 commands/s of `Batch` 64, p50 4.4–4.5 ms without the queue, 4.9–5.4 ms with the
//! yield, no CPU saved). It still takes whatever else is queued by then, which is what lifts
//! a saturated node (batches queue up while the task waits for a core).
//!
//! Each command's result is its own (the ledger applies an entry's commands one by one, and a
//! refused command does not affect the others); a failure of the entry (not committed in
//! time, leadership lost) is every member's, exactly as if each had been its own entry.

use std::sync::Arc;

use tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;
use tally_ledger::Command;
use tokio::sync::{mpsc, oneshot};

use super::clock::NodeClock;
use super::local_writer::LocalWriter;
use super::write_error::WriteError;
use crate::raft::types::{Proposal, ProposalReply};

/// Commands waiting for the coalescing task, in requests. When it is full, callers wait for
/// room: a leader that cannot keep up holds its callers back rather than queueing without
/// bound (load shedding refuses new ones first when commits stall).
pub const MAX_QUEUED_WRITES: usize = 4_096;

/// Requests of at least this many commands go out without the yield.
pub const NO_YIELD_FROM_COMMANDS: usize = 32;

/// One caller's commands and where its share of the result goes.
struct Waiting {
    commands: Vec<Command>,
    reply: oneshot::Sender<Result<ProposalReply, WriteError>>,
}

/// The queue in front of the local writer, and the task that drains it.
pub struct EntryCoalescer {
    queue: mpsc::Sender<Waiting>,
}

impl EntryCoalescer {
    /// Starts the draining task on the current runtime.
    pub fn start(writer: LocalWriter, clock: Arc<NodeClock>) -> Self {
        let (queue, waiting) = mpsc::channel(MAX_QUEUED_WRITES);
        tokio::spawn(drain(waiting, writer, clock));
        Self { queue }
    }

    /// Proposes `commands` (1..=`MAX_COMMANDS_PER_ENTRY`, checked by the caller) in an entry
    /// shared with whatever else is queued now, and returns this caller's results.
    pub async fn propose(&self, commands: Vec<Command>) -> Result<ProposalReply, WriteError> {
        assert!(
            !commands.is_empty() && commands.len() <= MAX_COMMANDS_PER_ENTRY,
            "the caller checks the command count: {}",
            commands.len()
        );
        let (reply, answer) = oneshot::channel();
        if self.queue.send(Waiting { commands, reply }).await.is_err() {
            // Nothing was proposed: the task is gone with the runtime.
            return Err(WriteError::Unavailable {
                leader: None,
                reason: "this node is stopping".to_owned(),
            });
        }
        answer.await.unwrap_or_else(|_| {
            // The group's task ended without answering (the runtime stopped): its entry may
            // have been proposed.
            Err(WriteError::Unknown {
                reason: "the node stopped while the entry was in flight".to_owned(),
            })
        })
    }
}

async fn drain(mut waiting: mpsc::Receiver<Waiting>, writer: LocalWriter, clock: Arc<NodeClock>) {
    let mut carried: Option<Waiting> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match waiting.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        // Let the request handlers that are runnable now queue their commands behind it.
        if first.commands.len() < NO_YIELD_FROM_COMMANDS {
            tokio::task::yield_now().await;
        }
        let mut count = first.commands.len();
        let mut group = vec![first];
        while let Ok(next) = waiting.try_recv() {
            if count + next.commands.len() > MAX_COMMANDS_PER_ENTRY {
                carried = Some(next);
                break;
            }
            count += next.commands.len();
            group.push(next);
        }
        let proposal_time_ms = clock.now_ms();
        tokio::spawn(propose_group(writer.clone(), proposal_time_ms, group));
    }
}

/// Proposes the group's commands as one entry and hands each caller its results.
async fn propose_group(writer: LocalWriter, now_ms: u64, group: Vec<Waiting>) {
    let sizes: Vec<usize> = group.iter().map(|w| w.commands.len()).collect();
    let mut commands = Vec::with_capacity(sizes.iter().sum());
    let mut replies = Vec::with_capacity(group.len());
    for waiting in group {
        commands.extend(waiting.commands);
        replies.push(waiting.reply);
    }
    let count = commands.len();
    match writer.write(Proposal::commands(now_ms, commands)).await {
        Ok(reply) => {
            assert_eq!(
                reply.results.len(),
                count,
                "one result per proposed command"
            );
            let mut results = reply.results.into_iter();
            for (size, answer) in sizes.into_iter().zip(replies) {
                let share = ProposalReply {
                    log_id: reply.log_id,
                    cluster_time_ms: reply.cluster_time_ms,
                    results: results.by_ref().take(size).collect(),
                };
                // A caller that gave up (its request was cancelled) no longer listens.
                let _ = answer.send(Ok(share));
            }
        }
        Err(error) => {
            for answer in replies {
                let _ = answer.send(Err(error.clone()));
            }
        }
    }
}
