//! Samples who leads, a few times a second, from the nodes' own status (direct addresses),
//! so the report can count leader changes and the timeline can draw terms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::{NodeRole, StatusRequest};

/// Samples kept; a soak of a day at 4 Hz fits.
const MAX_SAMPLES: usize = 400_000;
const PERIOD: Duration = Duration::from_millis(250);
const TIMEOUT: Duration = Duration::from_millis(400);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LeaderSample {
    pub at_ms: u64,
    pub leader: Option<u64>,
    pub term: u64,
}

#[derive(Clone, Default)]
pub struct LeaderWatch {
    samples: Arc<Mutex<Vec<LeaderSample>>>,
}

impl LeaderWatch {
    /// Samples `nodes` (id, listen address) until `stop`.
    pub fn spawn(
        &self,
        nodes: Vec<(u64, String)>,
        transport: tally_tls::Transport,
        start: Instant,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let samples = self.samples.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut best: Option<(u64, u64)> = None;
                for (id, address) in &nodes {
                    if let Some((role, term)) = probe(&transport, address).await {
                        if role == NodeRole::Leader as i32 && best.is_none_or(|(_, t)| term > t) {
                            best = Some((*id, term));
                        }
                    }
                }
                let sample = LeaderSample {
                    at_ms: start.elapsed().as_millis() as u64,
                    leader: best.map(|(id, _)| id),
                    term: best.map_or(0, |(_, term)| term),
                };
                {
                    let mut samples = samples.lock().unwrap_or_else(|p| p.into_inner());
                    if samples.len() < MAX_SAMPLES {
                        samples.push(sample);
                    }
                }
                tokio::time::sleep(PERIOD).await;
            }
        })
    }

    pub fn samples(&self) -> Vec<LeaderSample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

async fn probe(transport: &tally_tls::Transport, address: &str) -> Option<(i32, u64)> {
    let endpoint = transport
        .endpoint(address)
        .ok()?
        .connect_timeout(TIMEOUT)
        .timeout(TIMEOUT);
    let channel = tokio::time::timeout(TIMEOUT, endpoint.connect())
        .await
        .ok()?
        .ok()?;
    let mut admin = AdminClient::new(channel);
    let reply = tokio::time::timeout(TIMEOUT, admin.status(StatusRequest {}))
        .await
        .ok()?
        .ok()?
        .into_inner();
    Some((reply.role, reply.term))
}

/// Changes of (leader, term) among samples that saw a leader.
pub fn leader_changes(samples: &[LeaderSample]) -> usize {
    let mut last: Option<(u64, u64)> = None;
    let mut changes = 0;
    for sample in samples {
        if let Some(leader) = sample.leader {
            let now = (leader, sample.term);
            if last.is_some_and(|l| l != now) {
                changes += 1;
            }
            last = Some(now);
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_changes_count_new_leaders_and_terms_only() {
        let s = |at_ms, leader, term| LeaderSample {
            at_ms,
            leader,
            term,
        };
        let samples = [
            s(0, Some(1), 1),
            s(1, None, 0),
            s(2, Some(1), 1),
            s(3, Some(2), 2),
            s(4, Some(2), 3),
        ];
        assert_eq!(leader_changes(&samples), 2);
    }
}
