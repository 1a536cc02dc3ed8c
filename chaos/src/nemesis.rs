//! The nemeses and their seeded schedule: SIGKILL of the leader at a failpoint during
//! captures, a crash at a failpoint while restarting, SIGKILL of the leader or any node,
//! SIGSTOP/SIGCONT pauses, partitions through the proxies (leader in the minority, one-way, a
//! bridge, clients cut off), the leader's whole region cut off, slow links, a membership
//! change, a snapshot install to a restarted node, and kills of kernel processes. Every fault is healed before the next one
//! starts, and every wait is bounded.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tally_api::pb;

use crate::cluster::ChaosCluster;
use crate::proxy::Rules;

/// Faults per run, whatever the duration.
pub const MAX_FAULTS: usize = 20_000;
/// What a node's state machine logs when it installs a snapshot from the leader.
const SNAPSHOT_INSTALLED: &str = "installed snapshot";
/// How long a failpoint-armed node is given to hit its point.
const FAILPOINT_WAIT: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Arm a failpoint on the running leader (Admin `SetFailpoints`) and wait for it to abort
    /// there: the leader dies mid-capture, applied but not answered, and so on.
    FailpointKill,
    /// Kill a node and restart it with a failpoint armed from `FAILPOINTS`: it crashes again
    /// while catching up.
    CrashOnRestart,
    KillLeader,
    KillRandom,
    PauseLeader,
    PauseRandom,
    /// The leader alone on one side.
    PartitionLeader,
    /// The leader cannot send to the others (it still hears them).
    OneWayFromLeader,
    /// The others cannot reach the leader (it still reaches them).
    OneWayToLeader,
    /// Two nodes cannot talk; the third hears both.
    Bridge,
    /// Clients cannot reach the leader.
    ClientsCut,
    SlowLinks,
    /// Demote a follower to a learner (ChangeMembership with retain), then make it a voter
    /// again.
    Membership,
    /// Kill a follower, snapshot the leader while it is down, restart it: it installs the
    /// snapshot when the log it needs was purged.
    SnapshotInstall,
    /// SIGKILL a kernel node process mid-workload, restart it after the hold.
    KillKernel,
    /// The leader's whole region cut off from the other regions, both ways (its nodes still
    /// reach each other, clients still reach every node); once healed, leadership moves back
    /// into the preferred region.
    RegionCut,
}

/// The failpoints the `FailpointKill` nemesis arms on the leader, in turn.
pub const LEADER_FAILPOINTS: [&str; 6] = [
    "apply.after.capture_invocation=1*return",
    "reply.before_send.capture_invocation=1*return",
    "apply.before.capture_invocation=1*return",
    "apply.after.capture_invocation=2*off->1*return",
    "apply.after.reconcile_hold=1*return",
    "log.after_append=5*off->1*return",
];

/// The failpoints `CrashOnRestart` starts a node with.
pub const RESTART_FAILPOINTS: [&str; 2] = [
    "log.after_append=20*off->1*return",
    "apply.after.capture_invocation=1*return",
];

#[derive(Clone, Debug, Serialize)]
pub struct FaultRecord {
    pub index: usize,
    pub kind: FaultKind,
    pub targets: Vec<u64>,
    /// Milliseconds since the run started.
    pub start_ms: u64,
    pub end_ms: u64,
    pub detail: String,
}

/// One planned fault.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub kind: FaultKind,
    pub hold_ms: u64,
    pub gap_ms: u64,
}

/// The seeded schedule: every kind in a shuffled round, failpoint kills twice per round.
pub fn schedule(seed: u64, count: usize) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_f417);
    let mut kinds = vec![
        FaultKind::FailpointKill,
        FaultKind::FailpointKill,
        FaultKind::CrashOnRestart,
        FaultKind::KillLeader,
        FaultKind::KillRandom,
        FaultKind::PauseLeader,
        FaultKind::PauseRandom,
        FaultKind::PartitionLeader,
        FaultKind::OneWayFromLeader,
        FaultKind::OneWayToLeader,
        FaultKind::Bridge,
        FaultKind::ClientsCut,
        FaultKind::SlowLinks,
        FaultKind::SnapshotInstall,
        FaultKind::Membership,
        FaultKind::KillKernel,
        FaultKind::RegionCut,
    ];
    let mut out = Vec::new();
    while out.len() < count.min(MAX_FAULTS) {
        kinds.shuffle(&mut rng);
        // A failpoint kill first in every round, so even a short run has one.
        if let Some(at) = kinds.iter().position(|k| *k == FaultKind::FailpointKill) {
            kinds.swap(0, at);
        }
        // A kernel kill early in every round, so even a short run has one.
        if let Some(at) = kinds.iter().position(|k| *k == FaultKind::KillKernel) {
            let to = rng.random_range(1..5);
            kinds.swap(to, at);
        }
        for kind in &kinds {
            out.push(Step {
                kind: *kind,
                hold_ms: rng.random_range(2_000..=5_000),
                gap_ms: rng.random_range(1_500..=3_000),
            });
        }
    }
    out.truncate(count.min(MAX_FAULTS));
    out
}

pub struct Nemesis {
    rng: StdRng,
    start: Instant,
    failpoint_turn: usize,
    pub faults: Vec<FaultRecord>,
}

impl Nemesis {
    pub fn new(seed: u64, start: Instant) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x0bad_cafe),
            start,
            failpoint_turn: (seed % LEADER_FAILPOINTS.len() as u64) as usize,
            faults: Vec::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Runs `steps` until `deadline`, healing after each.
    /// The schedule repeats until the deadline (a soak outlasts one schedule).
    pub async fn run(&mut self, cluster: &mut ChaosCluster, steps: &[Step], deadline: Instant) {
        for step in steps.iter().cycle().take(MAX_FAULTS) {
            if Instant::now() >= deadline || self.faults.len() >= MAX_FAULTS {
                break;
            }
            let start_ms = self.now_ms();
            let (targets, detail) = match self.inject(cluster, step).await {
                Ok(done) => done,
                Err(error) => (Vec::new(), format!("skipped: {error:#}")),
            };
            heal(cluster).await;
            self.faults.push(FaultRecord {
                index: self.faults.len(),
                kind: step.kind,
                targets,
                start_ms,
                end_ms: self.now_ms(),
                detail,
            });
            let rest = Duration::from_millis(step.gap_ms);
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(rest.min(left)).await;
        }
    }

    fn random_node(&mut self, cluster: &ChaosCluster) -> u64 {
        let ids = cluster.ids();
        ids[self.rng.random_range(0..ids.len())]
    }

    async fn inject(
        &mut self,
        cluster: &mut ChaosCluster,
        step: &Step,
    ) -> anyhow::Result<(Vec<u64>, String)> {
        let hold = Duration::from_millis(step.hold_ms);
        if step.kind == FaultKind::KillKernel {
            return self.kill_kernel(cluster, hold).await;
        }
        let (leader, term) = cluster.wait_leader(Duration::from_secs(15)).await?;
        let others: Vec<u64> = cluster.ids().into_iter().filter(|n| *n != leader).collect();
        match step.kind {
            FaultKind::FailpointKill => self.failpoint_kill(cluster, leader, hold).await,
            FaultKind::CrashOnRestart => self.crash_on_restart(cluster, hold).await,
            FaultKind::KillLeader | FaultKind::KillRandom => {
                let target = if step.kind == FaultKind::KillLeader {
                    leader
                } else {
                    self.random_node(cluster)
                };
                cluster.kill(target);
                tokio::time::sleep(hold).await;
                cluster.start_node(target, None)?;
                Ok((
                    vec![target],
                    format!("SIGKILL, restarted after {hold:?} (leader was {leader}, term {term})"),
                ))
            }
            FaultKind::PauseLeader | FaultKind::PauseRandom => {
                let target = if step.kind == FaultKind::PauseLeader {
                    leader
                } else {
                    self.random_node(cluster)
                };
                cluster.pause(target);
                tokio::time::sleep(hold).await;
                cluster.resume(target);
                Ok((vec![target], format!("SIGSTOP for {hold:?}, then SIGCONT")))
            }
            FaultKind::RegionCut => {
                let region = cluster.region(leader).unwrap_or_default().to_owned();
                let (inside, outside): (Vec<u64>, Vec<u64>) = cluster
                    .ids()
                    .into_iter()
                    .partition(|id| cluster.region(*id) == Some(region.as_str()));
                let mut rules = Rules::default();
                rules.cut(&inside, &outside);
                cluster.net.set_rules(rules);
                tokio::time::sleep(hold).await;
                Ok((
                    inside.clone(),
                    format!("the leader's region {region} ({inside:?}) cut off from {outside:?}"),
                ))
            }
            FaultKind::PartitionLeader => {
                let mut rules = Rules::default();
                rules.cut(&[leader], &others);
                cluster.net.set_rules(rules);
                tokio::time::sleep(hold).await;
                Ok((
                    vec![leader],
                    format!("leader {leader} isolated from {others:?}"),
                ))
            }
            FaultKind::OneWayFromLeader | FaultKind::OneWayToLeader => {
                let mut rules = Rules::default();
                if step.kind == FaultKind::OneWayFromLeader {
                    rules.cut_one_way(&[leader], &others);
                } else {
                    rules.cut_one_way(&others, &[leader]);
                }
                cluster.net.set_rules(rules);
                tokio::time::sleep(hold).await;
                Ok((vec![leader], format!("one-way cut around leader {leader}")))
            }
            FaultKind::Bridge => {
                let mut rules = Rules::default();
                if let [a, b] = others.as_slice() {
                    rules.cut(&[*a], &[*b]);
                }
                cluster.net.set_rules(rules);
                tokio::time::sleep(hold).await;
                Ok((
                    others.clone(),
                    format!("{others:?} cut from each other, bridged by leader {leader}"),
                ))
            }
            FaultKind::ClientsCut => {
                let mut rules = Rules::default();
                rules.cut_clients(&[leader]);
                cluster.net.set_rules(rules);
                tokio::time::sleep(hold).await;
                Ok((vec![leader], "clients cannot reach the leader".to_owned()))
            }
            FaultKind::SlowLinks => {
                let delay = self.rng.random_range(20..=150);
                cluster.net.set_rules(Rules {
                    delay_ms: delay,
                    ..Rules::default()
                });
                tokio::time::sleep(hold).await;
                Ok((Vec::new(), format!("{delay} ms per chunk between nodes")))
            }
            FaultKind::SnapshotInstall => {
                self.snapshot_install(cluster, leader, &others, hold).await
            }
            FaultKind::Membership => self.membership(cluster, leader, &others, hold).await,
            FaultKind::KillKernel => self.kill_kernel(cluster, hold).await,
        }
    }

    /// Arms a failpoint on the running leader and waits (bounded) for the process to abort
    /// there; it stays down for `hold`, then restarts clean. A `reply.*` point fires on the
    /// node that answers the client, which may be a follower forwarding to the leader, so it
    /// is armed on every node and disarmed on the others as soon as one dies.
    async fn failpoint_kill(
        &mut self,
        cluster: &mut ChaosCluster,
        leader: u64,
        hold: Duration,
    ) -> anyhow::Result<(Vec<u64>, String)> {
        let point = LEADER_FAILPOINTS[self.failpoint_turn % LEADER_FAILPOINTS.len()];
        self.failpoint_turn += 1;
        let armed: Vec<u64> = if point.starts_with("reply.") {
            cluster.ids()
        } else {
            vec![leader]
        };
        // Only a node that runs now can die at the point (the check below counts deaths).
        let armed: Vec<u64> = armed
            .into_iter()
            .filter(|id| cluster.is_running(*id))
            .collect();
        anyhow::ensure!(!armed.is_empty(), "no node to arm {point} on is running");
        let name = point.split_once('=').map_or(point, |(name, _)| name);
        // A node can abort at the point before its answer to the arming call leaves (a
        // `reply.*` point fires on the next reply, a client's as well), so the call then fails
        // with a reset connection although the point fired. A failed call is judged by whether
        // the node died, below; it skips the fault only if none did.
        let mut arm_failures = Vec::new();
        for id in &armed {
            let armed_here = async {
                let mut admin = cluster.admin(*id).await?;
                admin
                    .set_failpoints(pb::SetFailpointsRequest {
                        spec: point.to_owned(),
                    })
                    .await?;
                anyhow::Ok(())
            };
            if let Err(error) = armed_here.await {
                arm_failures.push(error.context(format!("arming {point} on node {id}")));
            }
        }
        let start = Instant::now();
        let mut died = Vec::new();
        while start.elapsed() < FAILPOINT_WAIT && died.is_empty() {
            for id in &armed {
                if !cluster.is_running(*id) {
                    died.push(*id);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let after = start.elapsed();
        for id in armed.iter().filter(|id| !died.contains(id)) {
            if let Ok(mut admin) = cluster.admin(*id).await {
                let _ = admin
                    .set_failpoints(pb::SetFailpointsRequest {
                        spec: format!("{name}=off"),
                    })
                    .await;
            }
        }
        if died.is_empty() {
            if let Some(error) = arm_failures.into_iter().next() {
                return Err(error);
            }
            return Ok((
                armed,
                format!("{point}: did not fire within {FAILPOINT_WAIT:?}; disarmed"),
            ));
        }
        tokio::time::sleep(hold).await;
        for id in &died {
            cluster.start_node(*id, None)?;
        }
        let roles: Vec<String> = died
            .iter()
            .map(|id| {
                if *id == leader {
                    format!("leader {id}")
                } else {
                    format!("follower {id}")
                }
            })
            .collect();
        Ok((
            died,
            format!(
                "{point}: {} aborted at the failpoint after {after:?}, down {hold:?}",
                roles.join(" and ")
            ),
        ))
    }

    /// SIGKILLs one kernel process (in-flight calls die with it), restarts it after `hold`.
    async fn kill_kernel(
        &mut self,
        cluster: &mut ChaosCluster,
        hold: Duration,
    ) -> anyhow::Result<(Vec<u64>, String)> {
        let ids: Vec<u64> = cluster.kernels.keys().copied().collect();
        anyhow::ensure!(!ids.is_empty(), "no kernel processes in this run");
        let target = ids[self.rng.random_range(0..ids.len())];
        let kernel = cluster
            .kernels
            .get_mut(&target)
            .ok_or_else(|| anyhow::anyhow!("no kernel {target}"))?;
        kernel.kill();
        tokio::time::sleep(hold).await;
        kernel.start()?;
        kernel.wait_listening(Duration::from_secs(15)).await?;
        Ok((
            vec![target],
            format!("kernel {target}: SIGKILL, restarted after {hold:?}"),
        ))
    }

    /// Kills a node and restarts it with a failpoint armed from the environment, so it
    /// crashes again while catching up; then restarts it clean.
    async fn crash_on_restart(
        &mut self,
        cluster: &mut ChaosCluster,
        hold: Duration,
    ) -> anyhow::Result<(Vec<u64>, String)> {
        let target = self.random_node(cluster);
        let point = RESTART_FAILPOINTS[self.rng.random_range(0..RESTART_FAILPOINTS.len())];
        cluster.kill(target);
        tokio::time::sleep(hold / 2).await;
        cluster.start_node(target, Some(point))?;
        let start = Instant::now();
        let mut fired = false;
        while start.elapsed() < FAILPOINT_WAIT {
            if !cluster.is_running(target) {
                fired = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cluster.start_node(target, None)?;
        Ok((
            vec![target],
            format!(
                "{point}: {}",
                if fired {
                    "restarted node aborted at the failpoint"
                } else {
                    "did not fire in time"
                }
            ),
        ))
    }

    /// Voters minus one follower (kept as a learner), then all of them again, each change on
    /// whoever leads at the time.
    async fn membership(
        &mut self,
        cluster: &mut ChaosCluster,
        leader: u64,
        others: &[u64],
        hold: Duration,
    ) -> anyhow::Result<(Vec<u64>, String)> {
        let follower = others[self.rng.random_range(0..others.len())];
        let all = cluster.ids();
        let fewer: Vec<u64> = all.iter().copied().filter(|n| *n != follower).collect();
        let mut admin = cluster.admin(leader).await?;
        let shrink = tokio::time::timeout(
            Duration::from_secs(10),
            admin.change_membership(pb::ChangeMembershipRequest {
                voters: fewer.clone(),
                retain: true,
            }),
        )
        .await;
        let shrunk = matches!(shrink, Ok(Ok(_)));
        tokio::time::sleep(hold).await;
        // Restore on the current leader, retrying while leadership moves (bounded).
        let start = Instant::now();
        let mut restored = false;
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok((current, _)) = cluster.wait_leader(Duration::from_secs(5)).await {
                if let Ok(mut admin) = cluster.admin(current).await {
                    let grow = tokio::time::timeout(
                        Duration::from_secs(10),
                        admin.change_membership(pb::ChangeMembershipRequest {
                            voters: all.clone(),
                            retain: true,
                        }),
                    )
                    .await;
                    if matches!(grow, Ok(Ok(_))) {
                        restored = true;
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        anyhow::ensure!(restored, "could not restore the voters {all:?}");
        Ok((
            vec![follower],
            format!(
                "voters {fewer:?} for {hold:?} ({}), then {all:?} again",
                if shrunk {
                    "demoted"
                } else {
                    "demotion refused"
                }
            ),
        ))
    }

    async fn snapshot_install(
        &mut self,
        cluster: &mut ChaosCluster,
        leader: u64,
        others: &[u64],
        hold: Duration,
    ) -> anyhow::Result<(Vec<u64>, String)> {
        let follower = others[self.rng.random_range(0..others.len())];
        let installs_before = cluster
            .nodes
            .get(&follower)
            .map_or(0, |n| n.log_mentions(SNAPSHOT_INSTALLED));
        cluster.kill(follower);
        tokio::time::sleep(hold).await;
        let triggered = match cluster.admin(leader).await {
            Ok(mut admin) => admin
                .trigger_snapshot(pb::TriggerSnapshotRequest {})
                .await
                .is_ok(),
            Err(_) => false,
        };
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        cluster.start_node(follower, None)?;
        // The follower's state machine logs each snapshot it installs from the leader.
        let start = Instant::now();
        let mut installed = false;
        while start.elapsed() < Duration::from_secs(10) && !installed {
            tokio::time::sleep(Duration::from_millis(250)).await;
            installed = cluster
                .nodes
                .get(&follower)
                .is_some_and(|n| n.log_mentions(SNAPSHOT_INSTALLED) > installs_before);
        }
        Ok((
            vec![follower],
            format!(
                "follower {follower} down {hold:?}; leader snapshot {}; {}",
                if triggered {
                    "triggered"
                } else {
                    "not triggered"
                },
                if installed {
                    "the follower installed the leader's snapshot"
                } else {
                    "the follower caught up from the log"
                }
            ),
        ))
    }
}

/// Undoes every fault: the network heals, paused nodes resume, dead nodes restart clean.
pub async fn heal(cluster: &mut ChaosCluster) {
    cluster.net.heal();
    for id in cluster.ids() {
        if cluster.nodes.get(&id).is_some_and(|n| n.is_paused()) {
            cluster.resume(id);
        }
        if !cluster.is_running(id) {
            if let Err(error) = cluster.start_node(id, None) {
                tracing::warn!(%error, id, "could not restart node");
            }
        }
    }
    for (id, kernel) in &mut cluster.kernels {
        if !kernel.is_running() {
            if let Err(error) = kernel.start() {
                tracing::warn!(%error, id, "could not restart kernel");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_seeded_bounded_and_starts_with_a_failpoint_kill() {
        let a = schedule(7, 30);
        let b = schedule(7, 30);
        assert_eq!(a.len(), 30);
        assert_eq!(
            a.iter().map(|s| (s.kind, s.hold_ms)).collect::<Vec<_>>(),
            b.iter().map(|s| (s.kind, s.hold_ms)).collect::<Vec<_>>()
        );
        assert_eq!(a[0].kind, FaultKind::FailpointKill);
        assert!(schedule(7, 10_000).len() <= MAX_FAULTS);
    }

    #[test]
    fn every_round_of_the_schedule_cuts_the_leaders_region_off_once() {
        let round = 18;
        let steps = schedule(42, 3 * round);
        for (number, kinds) in steps.chunks(round).enumerate() {
            let cuts = kinds
                .iter()
                .filter(|s| s.kind == FaultKind::RegionCut)
                .count();
            assert_eq!(cuts, 1, "round {number}: {kinds:?}");
        }
    }
}
