//! Which nodes are in this client's region: asked of the cluster (`Budget.Members`) once, and
//! again after a failed lookup no more often than [`LOOKUP_RETRY_AFTER`]. The answer goes to
//! [`crate::nodes::Nodes::set_local`], which sends reads and writes there first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tally_api::pb;

use crate::client::TallyClient;

/// A lookup that found no node answering is not tried again sooner than this, so a client
/// cut off from the cluster does not add a `Members` call to every command.
pub const LOOKUP_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Whether this client's region has been looked up, and when it was last tried.
#[derive(Debug, Default)]
pub struct RegionLookup {
    learned: AtomicBool,
    last_try: Mutex<Option<Instant>>,
}

/// The client addresses of the members in `region`, in the order the cluster lists them.
pub fn local_addresses(region: &str, reply: &pb::MembersReply) -> Vec<String> {
    reply
        .members
        .iter()
        .filter(|m| m.region == region && !m.address.is_empty())
        .map(|m| m.address.clone())
        .collect()
}

impl TallyClient {
    /// The endpoints of this client's region, as last learned (empty before, or without a
    /// region).
    pub fn local_endpoints(&self) -> Vec<String> {
        self.nodes.local()
    }

    /// Learns the nodes of this client's region, once; cheap (an atomic load) after that. A
    /// client without a region has nothing to learn. Failing to learn it is not an error:
    /// the client talks to the leader, as without a region.
    pub async fn learn_region(&self) {
        let Some(region) = self.config.region.as_deref() else {
            return;
        };
        if self.region_lookup.learned.load(Ordering::Acquire) {
            return;
        }
        {
            let mut last_try = self
                .region_lookup
                .last_try
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last_try.is_some_and(|at| at.elapsed() < LOOKUP_RETRY_AFTER) {
                return;
            }
            *last_try = Some(Instant::now());
        }
        for endpoint in self.nodes.endpoints() {
            let Ok(mut budget) = self.nodes.budget(&endpoint) else {
                continue;
            };
            let call = budget.members(pb::MembersRequest {});
            match tokio::time::timeout(self.config.attempt_timeout, call).await {
                Ok(Ok(reply)) => {
                    let local = local_addresses(region, reply.get_ref());
                    if local.is_empty() {
                        tracing::warn!(
                            region,
                            "no member of the cluster is in this client's region; talking to \
                             the leader"
                        );
                    }
                    self.nodes.set_local(local);
                    self.region_lookup.learned.store(true, Ordering::Release);
                    return;
                }
                Ok(Err(status)) => {
                    tracing::debug!(%endpoint, %status, "members lookup refused")
                }
                Err(_) => tracing::debug!(%endpoint, "members lookup timed out"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_members_of_the_region_are_local() {
        let member = |id: u64, region: &str| pb::MemberRegion {
            id,
            address: format!("10.0.0.{id}:7401"),
            region: region.to_owned(),
            voter: true,
        };
        let reply = pb::MembersReply {
            node_id: 1,
            members: vec![
                member(1, "eu-west"),
                member(2, "us-east"),
                member(3, "eu-west"),
            ],
            leader_id: Some(2),
        };
        assert_eq!(
            local_addresses("eu-west", &reply),
            ["10.0.0.1:7401", "10.0.0.3:7401"]
        );
        assert!(local_addresses("ap-south", &reply).is_empty());
    }
}
