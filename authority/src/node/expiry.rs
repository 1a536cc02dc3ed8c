//! The leader's maintenance timer: every `expiry_interval_ms` it proposes `ExpireHolds` for the
//! families whose earliest hold expiry or compaction is due, so holds expire and idle families
//! compact on cluster time even when no client touches them.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;
use tally_ledger::Command;
use tokio::sync::watch;

use super::proposer::Proposer;
use crate::raft::state_machine::SharedRouter;
use crate::raft::types::Raft;

/// Families maintained per tick: one log entry's worth.
const FAMILIES_PER_TICK: usize = MAX_COMMANDS_PER_ENTRY;

pub async fn run(
    raft: Raft,
    router: SharedRouter,
    proposer: Arc<Proposer>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        if crate::raft::types::with_metrics(&raft, |m| m.state) != ServerState::Leader {
            continue;
        }
        // While cluster time catches up after downtime the gate would hold this back; the
        // holds it would expire are due after the catch-up all the same.
        if !proposer.time_gate().is_open() {
            continue;
        }
        // The router's cluster time trails the leader's clock; holds due by the wall clock
        // become due in cluster time once this entry is stamped.
        let now_ms = proposer.now_ms();
        let due = router.lock().await.due_families(now_ms, FAMILIES_PER_TICK);
        if due.is_empty() {
            continue;
        }
        let commands: Vec<Command> = due
            .into_iter()
            .map(|family_id| Command::ExpireHolds {
                family_id,
                up_to_ms: now_ms,
            })
            .collect();
        let count = commands.len();
        match proposer.propose(commands).await {
            Ok(_) => tracing::debug!(families = count, "proposed hold expiry"),
            Err(error) => {
                tracing::warn!(%error, families = count, "hold expiry proposal failed; retrying next tick")
            }
        }
    }
}
