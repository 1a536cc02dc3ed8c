//! Keeping cluster time with the leader's clock (docs/spec.md §6).
//!
//! Cluster time moves only when an entry applies, and by at most `max_clock_step_ms` per entry
//! (the clamp that stops one bad clock from leaping it forward). A cluster that wrote nothing for
//! longer than a step (idle, or down) therefore trails its leader's clock, and a hold authorized
//! in the first entries after that was stamped in the past: its `expires_at_ms` came as the next
//! entries caught cluster time up, long before its `hold_timeout_ms`. Measured before this
//! module: after 15 minutes down, 448–3,068 of the commands in 60 s of `tally bench` were refused
//! `hold_expired`; after ~1.5 h, 16–17k; on a fresh cluster none.
//!
//! Two parts keep the clamp and remove the lag:
//! - **the keeper** (leader only) proposes entries with no command, stamped with its clock:
//!   one when cluster time trails by half a step (an idle cluster writes one small entry every
//!   half step), and after downtime as many as it takes, pipelined [`MAX_TICKS_IN_FLIGHT`] at
//!   a time, each advancing one step;
//! - **the gate**: a client command is proposed only while cluster time trails this leader's
//!   clock by less than a step (less a margin for the time until its entry is stamped), so the
//!   entry that carries it is never clamped and its holds expire when their timeout says.
//!   Otherwise it waits for the keeper, up to [`MAX_WAIT`], then is refused with a definite
//!   UNAVAILABLE: nothing was proposed, a retry is safe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::{watch, Notify};

use super::clock::NodeClock;
use super::metrics::NodeMetrics;
use super::proposer::Proposer;
use super::write_error::WriteError;
use crate::raft::types::{AppliedTime, NodeId};

/// How often every node looks at the lag (a watch read and a metrics read: cheap).
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// Ticks proposed at once while catching up. Each is a few dozen bytes; Raft appends and
/// replicates a round together, so a day of downtime (8,640 steps of 10 s) is 34 rounds.
pub const MAX_TICKS_IN_FLIGHT: u64 = 256;

/// What the gate keeps between its check and a whole step: the time from the check to the
/// stamp of the entry that carries the command (the coalescer's queue, milliseconds).
const STAMP_MARGIN_MS: u64 = 1_000;

/// How long a client command waits for the keeper before it is refused. Below the proposal
/// timeout (5 s by default, at least 1 ms), so a forwarded write's answer comes back first.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// Past this lag the keeper proposes a tick: half a step, so the gate never meets an idle
/// cluster's lag.
pub fn tick_after_ms(max_clock_step_ms: u64) -> u64 {
    max_clock_step_ms / 2
}

/// Past this lag a client command waits: the entry carrying it, stamped a little later, could
/// otherwise be clamped. A step less [`STAMP_MARGIN_MS`] (less half a step for steps under
/// 2 s).
pub fn gate_after_ms(max_clock_step_ms: u64) -> u64 {
    max_clock_step_ms - (max_clock_step_ms / 2).min(STAMP_MARGIN_MS)
}

/// Entries that bring cluster time up to `lag_ms` ahead: each advances at most a step.
pub fn ticks_to_catch_up(lag_ms: u64, max_clock_step_ms: u64) -> u64 {
    assert!(max_clock_step_ms > 0, "the clock step is at least 1 s");
    lag_ms.div_ceil(max_clock_step_ms)
}

/// The leader's write gate, and how the gate wakes the keeper.
pub struct ClusterTimeGate {
    applied: watch::Receiver<AppliedTime>,
    clock: Arc<NodeClock>,
    metrics: Arc<NodeMetrics>,
    wake_keeper: Notify,
}

impl ClusterTimeGate {
    pub fn new(
        applied: watch::Receiver<AppliedTime>,
        clock: Arc<NodeClock>,
        metrics: Arc<NodeMetrics>,
    ) -> Self {
        Self {
            applied,
            clock,
            metrics,
            wake_keeper: Notify::new(),
        }
    }

    /// Cluster time after the last entry this node applied.
    pub fn applied(&self) -> AppliedTime {
        *self.applied.borrow()
    }

    /// How far cluster time trails this node's clock.
    pub fn lag_ms(&self) -> u64 {
        self.applied().lag_ms(self.clock.now_ms())
    }

    /// Whether a client command would go through now, without waiting.
    pub fn is_open(&self) -> bool {
        self.admits(&self.applied())
    }

    fn admits(&self, time: &AppliedTime) -> bool {
        time.lag_ms(self.clock.now_ms()) <= gate_after_ms(time.max_clock_step_ms)
    }

    /// Lets a client command be proposed on this leader once cluster time is close enough to
    /// its clock; waits for the keeper up to [`MAX_WAIT`], then refuses, definite. `leader` is
    /// the hint the refusal carries.
    pub async fn admit(&self, leader: Option<(NodeId, String)>) -> Result<(), WriteError> {
        if self.admits(&self.applied()) {
            return Ok(());
        }
        self.metrics.observe_cluster_time_wait();
        self.wake_keeper.notify_one();
        let mut applied = self.applied.clone();
        let caught_up = applied.wait_for(|time| self.admits(time));
        if let Ok(Ok(_)) = tokio::time::timeout(MAX_WAIT, caught_up).await {
            return Ok(());
        }
        self.metrics.observe_cluster_time_refusal();
        Err(WriteError::Unavailable {
            leader,
            reason: format!(
                "cluster time trails this leader's clock by {} ms (the cluster was down or \
                 idle) and is catching up at most {} ms per entry; nothing was proposed, retry \
                 after a backoff",
                self.lag_ms(),
                self.applied().max_clock_step_ms
            ),
        })
    }
}

/// On every node: publishes the lag; on the leader: proposes ticks while cluster time trails
/// by half a step or more.
pub async fn run(proposer: Arc<Proposer>, mut shutdown: watch::Receiver<bool>) {
    let gate = proposer.time_gate();
    let mut ticker = tokio::time::interval(CHECK_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = gate.wake_keeper.notified() => {}
            _ = shutdown.changed() => return,
        }
        gate.metrics.track_cluster_time_lag_ms(gate.lag_ms());
        if proposer.is_leader() {
            catch_up(&proposer, &gate).await;
        }
    }
}

/// Proposes ticks until cluster time trails this leader's clock by less than half a step, or a
/// tick fails (the next check tries again).
async fn catch_up(proposer: &Proposer, gate: &ClusterTimeGate) {
    let started = Instant::now();
    let mut proposed = 0u64;
    let mut announced = false;
    loop {
        let time = gate.applied();
        let lag_ms = gate.lag_ms();
        if lag_ms < tick_after_ms(time.max_clock_step_ms).max(1) {
            break;
        }
        let needed = ticks_to_catch_up(lag_ms, time.max_clock_step_ms);
        if needed > 1 && !announced {
            announced = true;
            tracing::info!(
                node_id = proposer.node_id(),
                lag_ms,
                applied_ms = time.cluster_time_ms,
                entries = needed,
                "cluster time trails this leader's clock; proposing entries to catch it up \
                 (client writes wait meanwhile)"
            );
        }
        let round = needed.min(MAX_TICKS_IN_FLIGHT);
        let answers = join_all((0..round).map(|_| proposer.propose_clock_tick())).await;
        proposed += round;
        gate.metrics.observe_clock_ticks(round);
        gate.metrics.track_cluster_time_lag_ms(gate.lag_ms());
        if let Some(Err(error)) = answers.into_iter().find(Result::is_err) {
            tracing::debug!(%error, "a clock tick failed; trying again at the next check");
            return;
        }
    }
    if announced {
        tracing::info!(
            node_id = proposer.node_id(),
            entries = proposed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "cluster time caught up with this leader's clock"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_lets_through_what_one_entry_cannot_clamp() {
        // Default step: ticks from 5 s of lag, commands wait from 9 s.
        assert_eq!(tick_after_ms(10_000), 5_000);
        assert_eq!(gate_after_ms(10_000), 9_000);
        // The smallest step keeps half of it as the margin.
        assert_eq!(tick_after_ms(1_000), 500);
        assert_eq!(gate_after_ms(1_000), 500);
        // The largest keeps a second.
        assert_eq!(gate_after_ms(600_000), 599_000);
        for step in [1_000, 1_999, 2_000, 10_000, 600_000] {
            assert!(
                tick_after_ms(step) <= gate_after_ms(step) && gate_after_ms(step) < step,
                "the keeper acts before the gate does, and the gate before a clamp: {step}"
            );
        }
    }

    #[test]
    fn a_catch_up_takes_one_entry_per_step() {
        assert_eq!(ticks_to_catch_up(0, 10_000), 0);
        assert_eq!(ticks_to_catch_up(1, 10_000), 1);
        assert_eq!(ticks_to_catch_up(10_000, 10_000), 1);
        assert_eq!(ticks_to_catch_up(10_001, 10_000), 2);
        // 15 minutes down: 90 entries; a day: 8,640, in 34 rounds.
        assert_eq!(ticks_to_catch_up(15 * 60_000, 10_000), 90);
        assert_eq!(
            ticks_to_catch_up(86_400_000, 10_000).div_ceil(MAX_TICKS_IN_FLIGHT),
            34
        );
    }

    #[test]
    fn no_lag_before_the_first_stamp_or_behind_it() {
        let fresh = AppliedTime {
            cluster_time_ms: 0,
            max_clock_step_ms: 10_000,
        };
        assert_eq!(fresh.lag_ms(1_700_000_000_000), 0);
        let running = AppliedTime {
            cluster_time_ms: 1_000_000,
            max_clock_step_ms: 10_000,
        };
        assert_eq!(running.lag_ms(999_000), 0);
        assert_eq!(running.lag_ms(1_012_000), 12_000);
    }

    #[tokio::test]
    async fn a_lagging_leader_waits_for_the_keeper_then_refuses() {
        let clock = Arc::new(NodeClock::new(0));
        let metrics = Arc::new(NodeMetrics::default());
        let now = clock.now_ms();
        let (applied, watched) = watch::channel(AppliedTime {
            cluster_time_ms: now - 60_000,
            max_clock_step_ms: 10_000,
        });
        let gate = Arc::new(ClusterTimeGate::new(
            watched,
            clock.clone(),
            metrics.clone(),
        ));
        // Nothing catches up: refused after the wait, definite, and counted.
        let refused = gate.admit(None).await.expect_err("a minute behind");
        assert!(
            matches!(&refused, WriteError::Unavailable { reason, .. } if reason.contains("trails")),
            "{refused:?}"
        );
        assert_eq!(metrics.cluster_time_refusals(), 1);
        // The keeper catches up while a command waits: it goes on.
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(None).await }
        });
        tokio::task::yield_now().await;
        applied.send_replace(AppliedTime {
            cluster_time_ms: clock.now_ms(),
            max_clock_step_ms: 10_000,
        });
        waiting
            .await
            .expect("joined")
            .expect("admitted once caught up");
        assert_eq!(metrics.cluster_time_waits(), 2);
        assert_eq!(metrics.cluster_time_refusals(), 1);
        // Within the gate: no wait.
        gate.admit(None).await.expect("caught up");
        assert_eq!(metrics.cluster_time_waits(), 2);
    }
}
