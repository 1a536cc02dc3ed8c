//! How a client talks to a cluster: where the nodes are, how long it waits, how it retries
//! and how it batches.

use std::time::Duration;

pub use tally_tls::Transport;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Seed endpoints (`host:port`); the client learns the leader from them.
    pub endpoints: Vec<String>,
    /// Mutual TLS with this client's certificate, or plaintext against `--insecure` nodes.
    pub transport: Transport,
    /// One attempt's timeout.
    pub attempt_timeout: Duration,
    /// How long a command is retried (same event id) before the client resolves it, and how
    /// long a read goes on trying the nodes (with backoff, while none names a leader or none
    /// answers) before it returns `Unreachable`. Refusals and bad arguments return at once.
    pub retry_for: Duration,
    /// How long `ResolveEvent` is tried before the answer is `Unknown`.
    pub resolve_for: Duration,
    /// Backoff between attempts: doubles from `backoff_min` up to `backoff_max`, jittered.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// The region this client runs in. When set, it sends reads and writes to the nodes of its
    /// region (learned from `Budget.Members`): a follower there serves linearizable reads with
    /// one round trip to the leader for its read index, and forwards writes to the leader
    /// over its warm peer connection. Without it (or with no node there), it talks to the
    /// leader directly.
    pub region: Option<String>,
}

impl ClientConfig {
    pub fn new(endpoints: Vec<String>, transport: Transport) -> Self {
        Self {
            endpoints,
            transport,
            attempt_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(10),
            resolve_for: Duration::from_secs(10),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            region: None,
        }
    }
}

/// Coalescing of concurrent calls into `Batch` requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Commands per `Batch` request (at most 4,096).
    pub max_commands: usize,
    /// How long the first queued command waits for company.
    pub linger: Duration,
    /// Commands waiting in the queue; beyond it callers wait (backpressure).
    pub max_queued: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_commands: 256,
            linger: Duration::from_millis(1),
            max_queued: 16_384,
        }
    }
}
