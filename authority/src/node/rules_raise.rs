//! Raising the rules (docs/spec.md §5.5, "Rules versions"). What leaves memory, and when, is
//! replicated state, so a release that changes it must not apply its new rules until every
//! replica does, from the same entry. On the leader only, every `CHECK_EVERY` this task reads
//! the rules version each member reported in its last clock probe (`Admin.ClockProbe`) and,
//! once every member knows a version newer than the one in force, proposes raising it through
//! the log. A rolling upgrade thus switches by itself after its last node restarts; a new
//! cluster switches within seconds of electing its first leader.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;

use super::health::{peer_addresses, Health};
use super::proposer::Proposer;
use crate::raft::state_machine::SharedRouter;
use crate::raft::types::{NodeId, Raft};

/// How often the leader looks. Cheap: a metrics read, the router lock for a moment, and no
/// network (the clock monitor's probes carry the members' versions).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The version to raise the rules to: the newest that this node (`own`, its
/// `max_rules_version`) and every peer know,
/// if it is newer than `in_force`. A peer never heard from (`None`) or from a release that
/// predates versions (0) holds the rules where they are.
pub fn rules_to_raise(in_force: u32, own: u32, peers: &[Option<u32>]) -> Option<u32> {
    let mut common = own;
    for peer in peers {
        common = common.min((*peer)?);
    }
    (common > in_force).then_some(common)
}

/// When some member knows rules newer than `in_force` but they are not raised: each peer's
/// report ("127.0.0.1:7403: 1", "?" for none yet), for the leader's log. `None` when no one
/// knows newer rules, so nothing is held.
fn held_by(in_force: u32, own: u32, peers: &[String], reported: &[Option<u32>]) -> Option<String> {
    let newest = reported.iter().flatten().copied().chain([own]).max();
    (newest > Some(in_force)).then(|| {
        let each = peers.iter().zip(reported).map(|(peer, known)| match known {
            Some(known) => format!("{peer}: {known}"),
            None => format!("{peer}: ?"),
        });
        each.collect::<Vec<_>>().join(", ")
    })
}

pub async fn run(
    node_id: NodeId,
    raft: Raft,
    router: SharedRouter,
    proposer: Arc<Proposer>,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(CHECK_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What held the rules at the last look, so a wait is logged once, not every second.
    let mut last_held: Option<String> = None;
    let mut warned_already_raised = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let (state, peers) = crate::raft::types::with_metrics(&raft, |metrics| {
            (metrics.state, peer_addresses(metrics, node_id))
        });
        let leads = state == ServerState::Leader;
        // A follower looks only until it has warned: the warning is its only work here.
        if !leads && warned_already_raised {
            continue;
        }
        let in_force = router.lock().await.params().rules_version;
        let own = health.rules_known();
        if in_force > own && !warned_already_raised {
            warned_already_raised = true;
            tracing::warn!(
                in_force,
                max_rules_version = own,
                "the rules in force are newer than max_rules_version: they were raised before \
                 it was set, and the setting holds nothing back"
            );
        }
        if !leads {
            continue;
        }
        let reported = health.peers_rules_known(&peers);
        let Some(version) = rules_to_raise(in_force, own, &reported) else {
            // Said once per change of what holds them, not every tick.
            let holding = held_by(in_force, own, &peers, &reported);
            if holding.is_some() && holding != last_held {
                tracing::info!(
                    in_force,
                    own,
                    peers = holding.as_deref().unwrap_or_default(),
                    "newer rules wait for every member to know them (max_rules_version, or an \
                     older release)"
                );
            }
            last_held = holding;
            continue;
        };
        last_held = None;
        match proposer.propose_rules(version).await {
            Ok(reply) => tracing::info!(
                from = in_force,
                to = version,
                log_index = reply.log_id.index,
                "every member knows newer rules: raised them"
            ),
            Err(error) => {
                tracing::warn!(%error, to = version, "raising the rules failed; retrying next tick")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rules_to_raise;

    #[test]
    fn the_log_names_each_peers_report_only_while_newer_rules_wait() {
        let peers = ["a:1".to_owned(), "b:2".to_owned()];
        assert_eq!(
            super::held_by(1, 2, &peers, &[Some(1), None]).as_deref(),
            Some("a:1: 1, b:2: ?")
        );
        assert_eq!(super::held_by(2, 2, &peers, &[Some(2), Some(2)]), None);
        assert_eq!(super::held_by(1, 1, &peers, &[Some(1), Some(1)]), None);
    }

    #[test]
    fn rules_rise_only_to_what_every_member_knows() {
        // Every member knows 2: raise from 1.
        assert_eq!(rules_to_raise(1, 2, &[Some(2), Some(2)]), Some(2));
        // One node alone raises at once.
        assert_eq!(rules_to_raise(1, 2, &[]), Some(2));
        // Already in force, or newer than this node knows: nothing.
        assert_eq!(rules_to_raise(2, 2, &[Some(2)]), None);
        assert_eq!(rules_to_raise(3, 2, &[Some(3)]), None);
        // A peer not heard from, or from before versions (0), holds them.
        assert_eq!(rules_to_raise(1, 2, &[Some(2), None]), None);
        assert_eq!(rules_to_raise(1, 2, &[Some(2), Some(0)]), None);
        // Mixed releases: the newest that all know.
        assert_eq!(rules_to_raise(1, 3, &[Some(2), Some(3)]), Some(2));
        assert_eq!(rules_to_raise(2, 3, &[Some(2), Some(3)]), None);
    }
}
