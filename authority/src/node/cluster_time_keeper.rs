//! Keeping cluster time with the leader's clock (docs/spec.md §6): the leader's half; the
//! write path's is `cluster_time_gate.rs`.
//!
//! Cluster time moves only when an entry applies, and by at most `max_clock_step_ms` per entry
//! (the clamp that stops one bad clock from leaping it forward). A cluster that wrote nothing
//! for longer than a step (idle, or down) therefore trailed its leader's clock, and a hold
//! authorized in the first entries after that counted its timeout from the past: it expired as
//! the next entries caught cluster time up. Measured before this module
//! (`scripts/downtime-holds`): after 15 minutes down, 0.2% of the commands of 60 s of `tally
//! bench` were refused `hold_expired`; after a day, 29.8% were refused because their
//! `not_after_ms` was more than a day past cluster time.
//!
//! So the leader proposes entries with no command, stamped with its clock: one whenever cluster
//! time trails it by half the gate's bound (an idle cluster writes one small entry every
//! 4.5 s at the default step), and after downtime as many as it takes, [`MAX_TICKS_IN_FLIGHT`]
//! at a time, each advancing one step (the clamp holds). A catch-up of more than one step
//! trusts this node's clock, so it goes at full speed only once a clock probe round begun after
//! the lag was seen has found a majority of the members agreeing with it
//! (`Health::clock_confirmed_since`: a clock that jumped since the last round is not trusted on
//! that round's word); until then one step per [`UNCONFIRMED_STEP_EVERY`]. A leader whose clock is far ahead thus moves cluster time at
//! most a step a second before the probes make it hand leadership away (a loaded cluster's
//! client entries moved it a step each before this module).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::watch;

use super::cluster_time_gate::{gate_after_ms, ClusterTimeGate};
use super::health::Health;
use super::proposer::Proposer;

/// How often every node looks at the lag (a watch read and a metrics read: cheap). Well under
/// [`tick_after_ms`] of the smallest step (250 ms), so an idle leader ticks before the gate
/// closes.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How often a leader whose clock no probe has confirmed yet moves cluster time by a step.
pub const UNCONFIRMED_STEP_EVERY: Duration = Duration::from_secs(1);

/// Ticks proposed at once while catching up. Each is a few dozen bytes; Raft appends and
/// replicates a round together, so a day of downtime (8,640 steps of 10 s) is 34 rounds.
pub const MAX_TICKS_IN_FLIGHT: u64 = 256;

/// Past this lag the keeper proposes a tick: half the gate's bound, so the gate never meets an
/// idle cluster's lag (4.5 s at the default 10 s step, 250 ms at the smallest, 1 s).
pub fn tick_after_ms(max_clock_step_ms: u64) -> u64 {
    gate_after_ms(max_clock_step_ms) / 2
}

/// Entries that bring cluster time up to `lag_ms` ahead: each advances at most a step.
pub fn ticks_to_catch_up(lag_ms: u64, max_clock_step_ms: u64) -> u64 {
    assert!(
        max_clock_step_ms > 0,
        "max_clock_step_ms is validated to 1 s ..= 10 min, got 0"
    );
    lag_ms.div_ceil(max_clock_step_ms)
}

/// On the leader: proposes ticks while cluster time trails by [`tick_after_ms`] or more.
pub async fn run(
    proposer: Arc<Proposer>,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    let gate = proposer.time_gate();
    let mut ticker = tokio::time::interval(CHECK_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unconfirmed = Unconfirmed::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = gate.wake_keeper.notified() => {}
            _ = shutdown.changed() => return,
        }
        if !proposer.is_leader() {
            continue;
        }
        tokio::select! {
            _ = catch_up(&proposer, &gate, &health, &mut unconfirmed) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// A catch-up of more than a step on a clock no probe has confirmed yet: when the lag was first
/// seen (a probe round must begin after it), when the last step was taken, and whether the
/// wait was logged (once per wait).
#[derive(Default)]
struct Unconfirmed {
    lag_seen: Option<Instant>,
    last_step: Option<Instant>,
    told: bool,
}

/// Proposes ticks until cluster time trails this leader's clock by less than
/// [`tick_after_ms`], or a tick fails (the next check tries again), or this node's clock is
/// not yet confirmed by a majority (then one tick per [`UNCONFIRMED_STEP_EVERY`]).
async fn catch_up(
    proposer: &Proposer,
    gate: &ClusterTimeGate,
    health: &Health,
    unconfirmed: &mut Unconfirmed,
) {
    let started = Instant::now();
    let mut committed = 0u64;
    let mut announced = false;
    loop {
        let time = gate.applied();
        let lag_ms = gate.lag_ms();
        if lag_ms < tick_after_ms(time.max_clock_step_ms).max(1) {
            *unconfirmed = Unconfirmed::default();
            break;
        }
        let needed = ticks_to_catch_up(lag_ms, time.max_clock_step_ms);
        // One step trusts this clock no more than a client command's entry does.
        let lag_seen = *unconfirmed.lag_seen.get_or_insert_with(Instant::now);
        let confirmed = needed == 1 || health.clock_confirmed_since(lag_seen);
        if !confirmed {
            if !unconfirmed.told {
                unconfirmed.told = true;
                // Expected for a second after every restart that followed downtime; a clock
                // the probes then find off makes the health monitor warn and step down.
                tracing::info!(
                    node_id = proposer.node_id(),
                    lag_ms,
                    "cluster time trails this leader's clock, which no clock probe has yet \
                     found a majority agreeing with: one step a second until one does"
                );
            }
            if unconfirmed
                .last_step
                .is_some_and(|at| at.elapsed() < UNCONFIRMED_STEP_EVERY)
            {
                return;
            }
            unconfirmed.last_step = Some(Instant::now());
        }
        if needed > 1 && confirmed && !announced {
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
        let round = if confirmed {
            needed.min(MAX_TICKS_IN_FLIGHT)
        } else {
            1
        };
        let answers = join_all((0..round).map(|_| proposer.propose_clock_tick())).await;
        let ok = answers.iter().filter(|answer| answer.is_ok()).count() as u64;
        committed += ok;
        gate.metrics().observe_clock_ticks(ok);
        if let Some(Err(error)) = answers.into_iter().find(Result::is_err) {
            tracing::debug!(%error, "a clock tick failed; trying again at the next check");
            return;
        }
        if !confirmed {
            return;
        }
    }
    if announced {
        tracing::info!(
            node_id = proposer.node_id(),
            entries = committed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "cluster time caught up with this leader's clock"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_ticks_well_before_the_gate_closes() {
        assert_eq!(tick_after_ms(10_000), 4_500);
        assert_eq!(tick_after_ms(1_000), 250);
        for step in [1_000, 1_999, 2_000, 10_000, 600_000] {
            let check_ms = CHECK_EVERY.as_millis() as u64;
            assert!(
                tick_after_ms(step) + check_ms < gate_after_ms(step) && gate_after_ms(step) < step,
                "an idle leader ticks a check before the gate closes, and the gate closes \
                 before an entry could be clamped: step {step} ms"
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
}
