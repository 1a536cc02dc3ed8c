//! The write path's half of keeping cluster time with the leader's clock (docs/spec.md §6;
//! the other half is `cluster_time_keeper.rs`).
//!
//! Cluster time moves only when an entry applies, by at most `max_clock_step_ms` per entry. A
//! client command proposed while cluster time trails the leader's clock by more than a step
//! would have its entry clamped into the past: a hold it authorizes would count its
//! `hold_timeout_ms` from then and expire early, and its `not_after_ms` could be refused as too
//! far ahead. So on the leader a client command is proposed only while the lag is below a
//! step (less a margin for the time until its entry is stamped); otherwise it waits for the
//! keeper to catch cluster time up, for at most a quarter of the proposal timeout and at most
//! [`MAX_WAIT`], and is then refused with a definite UNAVAILABLE: nothing was proposed, a
//! retry is safe.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::clock::NodeClock;
use super::metrics::NodeMetrics;
use super::write_error::WriteError;
use crate::raft::types::{AppliedTime, NodeId};

/// What the gate keeps between its check and a whole step: the time from the check to the
/// stamp of the entry that carries the command (the coalescer's queue, milliseconds).
const STAMP_MARGIN_MS: u64 = 1_000;

/// The longest a client command waits for the keeper before it is refused.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// Past this lag a client command waits: the entry carrying it, stamped a little later, could
/// otherwise be clamped. A step less [`STAMP_MARGIN_MS`] (less half a step for steps under
/// 2 s).
pub fn gate_after_ms(max_clock_step_ms: u64) -> u64 {
    max_clock_step_ms - (max_clock_step_ms / 2).min(STAMP_MARGIN_MS)
}

/// The leader's write gate, and how it wakes the keeper.
pub struct ClusterTimeGate {
    applied: watch::Receiver<AppliedTime>,
    clock: Arc<NodeClock>,
    metrics: Arc<NodeMetrics>,
    /// A quarter of the proposal timeout, at most [`MAX_WAIT`]: a forwarded write's answer
    /// comes back before the follower's own timeout.
    max_wait: Duration,
    pub(super) wake_keeper: Notify,
}

impl ClusterTimeGate {
    pub fn new(
        applied: watch::Receiver<AppliedTime>,
        clock: Arc<NodeClock>,
        metrics: Arc<NodeMetrics>,
        propose_timeout: Duration,
    ) -> Self {
        Self {
            applied,
            clock,
            metrics,
            max_wait: (propose_timeout / 4).min(MAX_WAIT),
            wake_keeper: Notify::new(),
        }
    }

    pub(super) fn metrics(&self) -> &NodeMetrics {
        &self.metrics
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
    /// its clock; waits for the keeper, then refuses, definite. `leader` gives the hint a
    /// refusal carries (read only then: every write passes here).
    pub async fn admit(
        &self,
        leader: impl FnOnce() -> Option<(NodeId, String)>,
    ) -> Result<(), WriteError> {
        if self.is_open() {
            return Ok(());
        }
        self.metrics.observe_cluster_time_wait();
        self.wake_keeper.notify_one();
        let mut applied = self.applied.clone();
        let caught_up = applied.wait_for(|time| self.admits(time));
        if let Ok(Ok(_)) = tokio::time::timeout(self.max_wait, caught_up).await {
            return Ok(());
        }
        self.metrics.observe_cluster_time_refusal();
        Err(WriteError::Unavailable {
            leader: leader(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_opens_below_what_one_entry_can_clamp() {
        assert_eq!(gate_after_ms(10_000), 9_000);
        // The smallest step keeps half of it as the margin, the largest a second.
        assert_eq!(gate_after_ms(1_000), 500);
        assert_eq!(gate_after_ms(600_000), 599_000);
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
        // A 2 s proposal timeout: the wait is a quarter of it.
        let gate = Arc::new(ClusterTimeGate::new(
            watched,
            clock.clone(),
            metrics.clone(),
            Duration::from_secs(2),
        ));
        // Nothing catches up: refused after the wait, definite, and counted.
        let started = std::time::Instant::now();
        let refused = gate.admit(|| None).await.expect_err("a minute behind");
        assert!(
            started.elapsed() >= Duration::from_millis(500)
                && started.elapsed() < Duration::from_millis(900),
            "waited a quarter of the proposal timeout: {:?}",
            started.elapsed()
        );
        assert!(
            matches!(&refused, WriteError::Unavailable { reason, .. } if reason.contains("trails")),
            "{refused:?}"
        );
        assert_eq!(metrics.cluster_time_refusals(), 1);
        // The keeper catches up while a command waits: it goes on.
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.admit(|| None).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
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
        gate.admit(|| None).await.expect("caught up");
        assert_eq!(metrics.cluster_time_waits(), 2);
    }
}
