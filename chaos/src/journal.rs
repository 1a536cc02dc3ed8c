//! Follows every workload family's journal while the run goes on, so the checker sees events
//! that compaction removes before the final read.
//!
//! With a short retention a full event leaves the nodes' state `not_after + retention` after
//! its command was sent (docs/spec.md §5.5); only its compact record stays, which `GetEvent`
//! still answers. The follower reads each family's new events a few times a second, with
//! LOCAL consistency from whichever node answers (a node only serves applied, hence committed,
//! events, and applies a prefix of the log, so reading from the last commit index seen never
//! skips one it has). Events are immutable once committed, so the union over time is the
//! journal. An event compacted before any read reached it (the follower starved for longer
//! than `not_after` + retention) is missing here; the checker then finds it through
//! `GetEvent` for the checks that need only its commit index.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_api::pb;
use tally_api::pb::budget_client::BudgetClient;
use tally_ledger::EventRecord;
use tonic::transport::Channel;

const PERIOD: Duration = Duration::from_millis(300);
const READ_TIMEOUT: Duration = Duration::from_millis(800);
const PAGE: u32 = 500;
/// Events kept in all; beyond it the follower stops and says so (a soak of a day fits).
const MAX_EVENTS: usize = 5_000_000;
/// `ListEvents` consistency LOCAL: the node's applied state.
const LOCAL: i32 = pb::Consistency::Local as i32;

/// Each family's followed events by commit index.
pub type Followed = BTreeMap<String, BTreeMap<u64, EventRecord>>;

#[derive(Clone, Default)]
pub struct JournalFollower {
    events: Arc<Mutex<Followed>>,
    /// Set when `MAX_EVENTS` was reached: the journal is no longer followed.
    full: Arc<AtomicBool>,
    /// Family reads that a node answered, and rounds in which none did.
    reads_answered: Arc<AtomicU64>,
    reads_unanswered: Arc<AtomicU64>,
}

impl JournalFollower {
    /// Follows `families` on `nodes` (id, listen address) until `stop`.
    pub fn spawn(
        &self,
        nodes: Vec<(u64, String)>,
        transport: tally_tls::Transport,
        families: Vec<String>,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let (events, full) = (self.events.clone(), self.full.clone());
        let (answered, unanswered) = (self.reads_answered.clone(), self.reads_unanswered.clone());
        tokio::spawn(async move {
            let mut channels: BTreeMap<u64, BudgetClient<Channel>> = BTreeMap::new();
            let mut next_node = 0usize;
            while !stop.load(Ordering::Relaxed) && !full.load(Ordering::Relaxed) {
                for family in &families {
                    let after = cursor(&events, family);
                    // Whichever node answers first, starting from a different one each time.
                    let mut read = false;
                    for attempt in 0..nodes.len() {
                        let (id, address) = &nodes[(next_node + attempt) % nodes.len()];
                        match read_after(&mut channels, *id, address, &transport, family, after)
                            .await
                        {
                            Some(page) => {
                                if !record(&events, family, page) {
                                    full.store(true, Ordering::Relaxed);
                                }
                                read = true;
                                break;
                            }
                            None => {
                                channels.remove(id);
                            }
                        }
                    }
                    let counter = if read { &answered } else { &unanswered };
                    counter.fetch_add(1, Ordering::Relaxed);
                    next_node = next_node.wrapping_add(1);
                }
                tokio::time::sleep(PERIOD).await;
            }
        })
    }

    /// What was followed, and how the following went.
    pub fn followed(&self) -> (Followed, FollowerStats) {
        let events = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let stats = FollowerStats {
            full: self.full.load(Ordering::Relaxed),
            reads_answered: self.reads_answered.load(Ordering::Relaxed),
            reads_unanswered: self.reads_unanswered.load(Ordering::Relaxed),
        };
        (events, stats)
    }
}

/// How the following went: a follower no node answered saw nothing, and the checker then
/// leans on compact records alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FollowerStats {
    /// It stopped at `MAX_EVENTS`.
    pub full: bool,
    pub reads_answered: u64,
    pub reads_unanswered: u64,
}

fn cursor(events: &Mutex<Followed>, family: &str) -> Option<u64> {
    let events = events.lock().unwrap_or_else(|p| p.into_inner());
    events.get(family)?.keys().next_back().copied()
}

/// Adds a page; false once the follower holds `MAX_EVENTS`.
fn record(events: &Mutex<Followed>, family: &str, page: Vec<EventRecord>) -> bool {
    let mut events = events.lock().unwrap_or_else(|p| p.into_inner());
    let held: usize = events.values().map(BTreeMap::len).sum();
    if held + page.len() > MAX_EVENTS {
        return false;
    }
    let journal = events.entry(family.to_owned()).or_default();
    for event in page {
        journal.insert(event.commit_index.0, event);
    }
    true
}

/// Every event of `family` after `after` that node `id` has applied (up to a few pages), or
/// `None` when the node did not answer in time.
async fn read_after(
    channels: &mut BTreeMap<u64, BudgetClient<Channel>>,
    id: u64,
    address: &str,
    transport: &tally_tls::Transport,
    family: &str,
    mut after: Option<u64>,
) -> Option<Vec<EventRecord>> {
    if let std::collections::btree_map::Entry::Vacant(slot) = channels.entry(id) {
        let endpoint = transport.endpoint(address).ok()?;
        let channel = tokio::time::timeout(READ_TIMEOUT, endpoint.connect())
            .await
            .ok()?
            .ok()?;
        slot.insert(BudgetClient::new(channel));
    }
    let mut client = channels.get(&id)?.clone();
    let mut events = Vec::new();
    for _ in 0..20 {
        let request = pb::ListEventsRequest {
            family_id: family.to_owned(),
            capability_id: None,
            grant_index: None,
            after_commit_index: after,
            limit: PAGE,
            consistency: LOCAL,
        };
        let page = tokio::time::timeout(READ_TIMEOUT, client.list_events(request))
            .await
            .ok()?
            .ok()?
            .into_inner()
            .into_records()
            .ok()?;
        let full_page = page.len() == PAGE as usize;
        after = page.last().map(|e| e.commit_index.0).or(after);
        events.extend(page);
        if !full_page {
            break;
        }
    }
    Some(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_merged_by_commit_index_and_the_cursor_is_the_last() {
        let events = Mutex::new(Followed::new());
        assert_eq!(cursor(&events, "f"), None);
        let replica = crate::checker::tests::clean().replica(1);
        let sample = replica.families[crate::checker::tests::FAMILY].events[0].clone();
        let event = |index: u64| {
            let mut e = sample.clone();
            e.commit_index.0 = index;
            e
        };
        assert!(record(&events, "f", vec![event(3), event(5)]));
        assert!(
            record(&events, "f", vec![event(5), event(9)]),
            "a re-read overlaps"
        );
        assert_eq!(cursor(&events, "f"), Some(9));
        let held = events.lock().expect("lock");
        assert_eq!(held["f"].keys().copied().collect::<Vec<_>>(), [3, 5, 9]);
    }
}
