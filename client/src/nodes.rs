//! One lazily connected channel per node, and the client's guess of the leader: from
//! `x-tally-leader` hints and from which node last answered a write.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

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
            }),
            attempt_timeout,
            transport,
        })
    }

    fn guess(&self) -> std::sync::MutexGuard<'_, Guess> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node to try next: the believed leader, else the seeds in turn.
    pub fn target(&self) -> String {
        let mut guess = self.guess();
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
            if !guess.endpoints.contains(address) {
                guess.endpoints.push(address.clone());
            }
        }
        guess.leader = address;
    }

    pub fn forget_leader(&self, failed: &str) {
        let mut guess = self.guess();
        if guess.leader.as_deref() == Some(failed) {
            guess.leader = None;
        }
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

    pub fn budget(&self, address: &str) -> Result<BudgetClient<Channel>, ClientError> {
        Ok(BudgetClient::new(self.channel(address)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    pub fn admin(&self, address: &str) -> Result<AdminClient<Channel>, ClientError> {
        Ok(AdminClient::new(self.channel(address)?))
    }
}
