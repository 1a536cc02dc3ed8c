//! One lazily connected channel per node, and the client's guess of the leader: from
//! `x-tally-leader` hints and from which node last answered a write. A client with a region
//! prefers the nodes of its region, while they answer.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::budget_client::BudgetClient;
use tally_api::MAX_MESSAGE_BYTES;
use tally_tls::Transport;
use tonic::transport::Channel;

use crate::error::ClientError;

pub struct Nodes {
    channels: Mutex<BTreeMap<String, Channel>>,
    state: Mutex<Guess>,
    attempt_timeout: Duration,
    transport: Transport,
}

struct Guess {
    endpoints: Vec<String>,
    leader: Option<String>,
    next: usize,
    /// The nodes in this client's region (empty without a region, or none there).
    local: Vec<String>,
    /// Local nodes that failed, and when: skipped for [`LOCAL_RETRY_AFTER`], so a dead local
    /// node costs one failed attempt, not one per command.
    local_failed: BTreeMap<String, Instant>,
}

/// How long a local node that failed is passed over before it is tried again.
pub const LOCAL_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The most endpoints the client remembers: the seeds, the members it learned, and leaders
/// named by hints (a cluster has at most 7 voters and a few learners).
pub const MAX_ENDPOINTS: usize = 64;

impl Guess {
    /// The first node of this client's region that has not failed recently.
    fn usable_local(&self) -> Option<&String> {
        self.local.iter().find(|address| {
            self.local_failed
                .get(*address)
                .is_none_or(|at| at.elapsed() >= LOCAL_RETRY_AFTER)
        })
    }

    fn remember(&mut self, address: &str) {
        if !self.endpoints.iter().any(|e| e == address) && self.endpoints.len() < MAX_ENDPOINTS {
            self.endpoints.push(address.to_owned());
        }
    }
}

impl Nodes {
    pub fn new(
        endpoints: Vec<String>,
        attempt_timeout: Duration,
        transport: Transport,
    ) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::Config(
                "at least one endpoint is needed".to_owned(),
            ));
        }
        Ok(Self {
            channels: Mutex::new(BTreeMap::new()),
            state: Mutex::new(Guess {
                endpoints,
                leader: None,
                next: 0,
                local: Vec::new(),
                local_failed: BTreeMap::new(),
            }),
            attempt_timeout,
            transport,
        })
    }

    fn guess(&self) -> std::sync::MutexGuard<'_, Guess> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node to try next: a node of this client's region (it forwards writes to the
    /// leader), else the believed leader, else the seeds in turn.
    pub fn target(&self) -> String {
        let mut guess = self.guess();
        if let Some(local) = guess.usable_local() {
            return local.clone();
        }
        if let Some(leader) = &guess.leader {
            return leader.clone();
        }
        let target = guess.endpoints[guess.next % guess.endpoints.len()].clone();
        guess.next += 1;
        target
    }

    /// A hint names the leader; a node that has just failed is no longer believed to lead.
    pub fn note_leader(&self, address: Option<String>) {
        let mut guess = self.guess();
        if let Some(address) = &address {
            guess.remember(address);
        }
        guess.leader = address;
    }

    /// `failed` did not answer (or answered that it cannot say): it is no longer believed to
    /// lead, and if it is a node of this client's region it is passed over for a while.
    pub fn forget_leader(&self, failed: &str) {
        let mut guess = self.guess();
        if guess.leader.as_deref() == Some(failed) {
            guess.leader = None;
        }
        drop(guess);
        self.note_local_failure(failed);
    }

    /// A node of this client's region that did not answer is passed over for a while.
    pub fn note_local_failure(&self, failed: &str) {
        let mut guess = self.guess();
        if guess.local.iter().any(|l| l == failed) {
            guess.local_failed.insert(failed.to_owned(), Instant::now());
        }
    }

    /// The nodes of this client's region, as the cluster's membership names them.
    pub fn set_local(&self, local: Vec<String>) {
        let mut guess = self.guess();
        for address in &local {
            guess.remember(address);
        }
        guess
            .local_failed
            .retain(|address, _| local.contains(address));
        guess.local = local;
    }

    pub fn local(&self) -> Vec<String> {
        self.guess().local.clone()
    }

    /// Where a read goes, in order: the usable nodes of this client's region, the node
    /// [`Self::target`] names, then every other endpoint. Each address once.
    pub fn read_targets(&self) -> Vec<String> {
        let first = self.target();
        let guess = self.guess();
        let mut targets: Vec<String> = Vec::with_capacity(guess.endpoints.len() + 1);
        let local = guess.local.iter().filter(|address| {
            guess
                .local_failed
                .get(*address)
                .is_none_or(|at| at.elapsed() >= LOCAL_RETRY_AFTER)
        });
        for address in local.chain([&first]).chain(&guess.endpoints) {
            if !targets.contains(address) {
                targets.push(address.clone());
            }
        }
        targets
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.guess().endpoints.clone()
    }

    pub fn channel(&self, address: &str) -> Result<Channel, ClientError> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        let channel = self
            .transport
            .endpoint(address)
            .map_err(|e| ClientError::Config(format!("bad endpoint {address:?}: {e}")))?
            .connect_timeout(self.attempt_timeout)
            .timeout(self.attempt_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Drops the cached channel to `address`, so the next call opens a fresh connection. A
    /// call that got no answer (a timeout, a transport error) may be stuck behind a stalled
    /// connection: after a network cut heals, TCP sends again only at its next retransmission,
    /// seconds away after its backoff, and every call on that connection waits for it.
    pub fn drop_channel(&self, address: &str) {
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(address);
    }

    pub fn budget(&self, address: &str) -> Result<BudgetClient<Channel>, ClientError> {
        Ok(BudgetClient::new(self.channel(address)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    pub fn admin(&self, address: &str) -> Result<AdminClient<Channel>, ClientError> {
        Ok(AdminClient::new(self.channel(address)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(endpoints: &[&str]) -> Nodes {
        Nodes::new(
            endpoints.iter().map(|e| (*e).to_owned()).collect(),
            Duration::from_secs(1),
            Transport::Insecure,
        )
        .expect("endpoints given")
    }

    #[test]
    fn without_local_nodes_the_leader_is_the_target() {
        let nodes = nodes(&["a:1", "b:1", "c:1"]);
        nodes.note_leader(Some("b:1".to_owned()));
        assert_eq!(nodes.target(), "b:1");
        assert_eq!(nodes.read_targets(), ["b:1", "a:1", "c:1"]);
    }

    #[test]
    fn a_local_node_is_preferred_over_the_leader_until_it_fails() {
        let nodes = nodes(&["a:1", "b:1"]);
        nodes.note_leader(Some("b:1".to_owned()));
        nodes.set_local(vec!["c:1".to_owned()]);
        assert_eq!(nodes.target(), "c:1", "writes go to the local node");
        assert_eq!(nodes.read_targets(), ["c:1", "a:1", "b:1"]);
        assert_eq!(
            nodes.endpoints(),
            ["a:1", "b:1", "c:1"],
            "learned node kept"
        );
        nodes.note_local_failure("c:1");
        assert_eq!(nodes.target(), "b:1", "a failed local node is passed over");
        assert_eq!(nodes.read_targets(), ["b:1", "a:1", "c:1"]);
        // A failure of a node that is not local changes no preference.
        nodes.note_local_failure("a:1");
        nodes.set_local(vec!["a:1".to_owned()]);
        assert_eq!(nodes.target(), "a:1", "a new membership view starts afresh");
    }

    #[test]
    fn the_endpoint_list_is_bounded() {
        let nodes = nodes(&["a:1"]);
        for i in 0..(MAX_ENDPOINTS * 2) {
            nodes.note_leader(Some(format!("n{i}:1")));
        }
        assert_eq!(nodes.endpoints().len(), MAX_ENDPOINTS);
    }
}
