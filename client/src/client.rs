//! `TallyClient`: submits commands with docs/spec.md §9's lost-acknowledgement discipline. A
//! definite failure before proposing moves to another node; an indefinite one retries the same
//! command (same event id, same deadline) on the current leader with jittered backoff; when
//! retrying runs out, `ResolveEvent` turns "unknown" into the committed answer or a tombstone.
//! Only when no quorum answers that either is the outcome `Unknown`.

use std::time::{Duration, Instant};

use rand::Rng;
use tally_api::pb;
use tally_api::status::{leader_header, leader_hint};
use tally_api::RemoteError;
use tally_ledger::{ClientCommand, Command, Decision, Outcome as LedgerOutcome, Resolution};
use tonic::Status;

use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::nodes::Nodes;
use crate::outcome::Outcome;
use crate::region::RegionLookup;

pub struct TallyClient {
    pub(crate) nodes: Nodes,
    pub(crate) config: ClientConfig,
    /// The cluster id the authority stamps on its decisions (docs/spec.md §6), once seen.
    cluster_id: std::sync::Mutex<Option<String>>,
    pub(crate) region_lookup: RegionLookup,
}

/// One attempt's result, classified.
enum Attempt {
    Decided(Decision),
    Refused(tally_ledger::LedgerError),
    /// The node would not let this client in (certificate, role or namespace): definite,
    /// and every node will answer the same.
    Denied {
        reason: String,
    },
    /// Not proposed: safe to try elsewhere.
    NotProposed {
        reason: String,
    },
    /// Maybe applied.
    Indefinite {
        reason: String,
    },
}

impl TallyClient {
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let nodes = Nodes::new(
            config.endpoints.clone(),
            config.attempt_timeout,
            config.transport.clone(),
        )?;
        Ok(Self {
            nodes,
            config,
            cluster_id: std::sync::Mutex::new(None),
            region_lookup: RegionLookup::default(),
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The id of the cluster that answered, from the stamp on its decisions.
    pub fn cluster_id(&self) -> Option<String> {
        self.cluster_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn note_stamp(&self, decision: &pb::Decision) {
        if let Some(stamp) = &decision.cluster {
            let mut known = self.cluster_id.lock().unwrap_or_else(|p| p.into_inner());
            if known.as_deref() != Some(stamp.cluster_id.as_str()) {
                *known = Some(stamp.cluster_id.clone());
            }
        }
    }

    /// Submits one client command and returns what is known of it.
    pub async fn submit(&self, command: ClientCommand) -> Outcome {
        let start = Instant::now();
        let mut indefinite: Option<String> = None;
        let mut last_reason = String::new();
        let mut backoff = self.config.backoff_min;
        while start.elapsed() < self.config.retry_for {
            match self.attempt(&Command::Apply(command.clone())).await {
                Attempt::Decided(decision) => return Outcome::Decided(decision),
                Attempt::Refused(error) => return Outcome::Refused(error),
                // The same credentials will be refused again: not applied, stop now.
                Attempt::Denied { reason } => return Outcome::Unavailable { reason },
                Attempt::NotProposed { reason } => last_reason = reason,
                Attempt::Indefinite { reason } => indefinite = Some(reason),
            }
            backoff = self.pause(backoff).await;
        }
        match indefinite {
            None => Outcome::Unavailable {
                reason: last_reason,
            },
            Some(reason) => self.resolve_after(command, reason).await,
        }
    }

    /// `ResolveEvent` for a command whose outcome was lost.
    pub async fn resolve(&self, command: ClientCommand) -> Outcome {
        self.resolve_after(command, "resolve requested".to_owned())
            .await
    }

    async fn resolve_after(&self, command: ClientCommand, mut reason: String) -> Outcome {
        let event_id = command.header.event_id.clone();
        let start = Instant::now();
        let mut backoff = self.config.backoff_min;
        let resolve = Command::Resolve(command);
        while start.elapsed() < self.config.resolve_for {
            match self.attempt(&resolve).await {
                Attempt::Decided(decision) => {
                    return match decision.outcome {
                        LedgerOutcome::Resolved(Resolution::Applied(original)) => {
                            Outcome::Decided(*original)
                        }
                        LedgerOutcome::Resolved(Resolution::NotApplied) => {
                            Outcome::NotApplied { event_id }
                        }
                        other => Outcome::Unknown {
                            event_id,
                            reason: format!("unexpected resolve answer {other:?}"),
                        },
                    }
                }
                // A refused resolve (a conflict) is definite about the original too.
                Attempt::Refused(error) => return Outcome::Refused(error),
                // Refused before the log was read: nothing is known of the original.
                Attempt::Denied { reason: why } => {
                    return Outcome::Unknown {
                        event_id,
                        reason: why,
                    }
                }
                Attempt::NotProposed { reason: why } | Attempt::Indefinite { reason: why } => {
                    reason = why
                }
            }
            backoff = self.pause(backoff).await;
        }
        Outcome::Unknown { event_id, reason }
    }

    /// Sends `command` once (as a one-command batch) to a node of this client's region, or
    /// else the believed leader.
    async fn attempt(&self, command: &Command) -> Attempt {
        self.learn_region().await;
        let target = self.nodes.target();
        let wire = match pb::Command::try_from(command) {
            Ok(wire) => wire,
            Err(error) => return Attempt::Refused(error.into()),
        };
        let mut client = match self.nodes.budget(&target) {
            Ok(client) => client,
            Err(error) => {
                return Attempt::NotProposed {
                    reason: error.to_string(),
                }
            }
        };
        let call = client.batch(pb::BatchRequest {
            commands: vec![wire],
        });
        let reply = match tokio::time::timeout(self.config.attempt_timeout, call).await {
            Ok(Ok(reply)) => {
                // A follower that forwarded names the leader: go there next time.
                let leader = leader_header(reply.metadata()).unwrap_or_else(|| target.clone());
                self.nodes.note_leader(Some(leader));
                reply.into_inner()
            }
            Ok(Err(status)) => return self.classify_status(&target, status),
            Err(_) => {
                self.nodes.forget_leader(&target);
                self.nodes.drop_channel(&target);
                return Attempt::Indefinite {
                    reason: format!("{target}: no reply in time"),
                };
            }
        };
        match reply.results.into_iter().next().and_then(|r| r.result) {
            Some(pb::batch_result::Result::Decision(decision)) => {
                self.note_stamp(&decision);
                match Decision::try_from(decision) {
                    Ok(decision) => Attempt::Decided(decision),
                    Err(error) => Attempt::Indefinite {
                        reason: format!("undecodable decision: {error}"),
                    },
                }
            }
            Some(pb::batch_result::Result::Error(detail)) => {
                self.classify_remote(&target, RemoteError::try_from(detail).ok())
            }
            None => Attempt::Indefinite {
                reason: "empty batch reply".to_owned(),
            },
        }
    }

    fn classify_status(&self, target: &str, status: Status) -> Attempt {
        let hint = leader_hint(&status);
        let remote = RemoteError::from(&status);
        if let RemoteError::Unavailable { .. } = remote {
            self.nodes.note_leader(hint);
        } else if matches!(remote, RemoteError::Transport { .. }) {
            self.nodes.forget_leader(target);
            self.nodes.drop_channel(target);
            // A connection that could not be opened sent nothing: definite. Anything else
            // (a reset, a timeout, a proxy error) may have been sent: not known.
            let message = status.message();
            let never_connected = message.contains("tcp connect error")
                || message.contains("error trying to connect");
            if status.code() == tonic::Code::Unavailable && never_connected {
                return Attempt::NotProposed {
                    reason: format!("{target}: {}", status.message()),
                };
            }
        }
        self.classify_remote(target, Some(remote))
    }

    fn classify_remote(&self, target: &str, remote: Option<RemoteError>) -> Attempt {
        match remote {
            Some(RemoteError::Ledger(error)) => Attempt::Refused(error),
            Some(denied @ RemoteError::Refused { .. }) => Attempt::Denied {
                reason: format!("{target}: {denied}"),
            },
            Some(RemoteError::Unavailable {
                message,
                leader_address,
                ..
            }) => {
                self.nodes.note_leader(leader_address);
                Attempt::NotProposed {
                    reason: format!("{target}: {message}"),
                }
            }
            Some(other) => {
                self.nodes.forget_leader(target);
                Attempt::Indefinite {
                    reason: format!("{target}: {other}"),
                }
            }
            None => Attempt::Indefinite {
                reason: format!("{target}: undecodable error detail"),
            },
        }
    }

    /// Sleeps a jittered backoff and returns the next one.
    async fn pause(&self, backoff: Duration) -> Duration {
        let jitter = rand::rng().random_range(0.5..1.5);
        tokio::time::sleep(backoff.mul_f64(jitter)).await;
        (backoff * 2).min(self.config.backoff_max)
    }

    /// Calls `read` on the nodes of this client's region, then the believed leader, then every
    /// other node, until one answers (reads are linearizable on any node). When
    /// none does (an election is under way, a node restarts), the round is tried again with
    /// backoff for `retry_for`: a read issued just as a leader steps down waits for the next one
    /// instead of failing, as a command would.
    pub(crate) async fn read<T, F, Fut>(&self, read: F) -> Result<T, ClientError>
    where
        F: Fn(tally_api::pb::budget_client::BudgetClient<tonic::transport::Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut backoff = self.config.backoff_min;
        loop {
            let last = match self.read_round(&read).await {
                Ok(reply) => return Ok(reply),
                Err(RoundFailure::Definite(error)) => return Err(error),
                Err(RoundFailure::NoAnswer(last)) => last,
            };
            if start.elapsed() >= self.config.retry_for {
                return Err(ClientError::Unreachable(last));
            }
            backoff = self.pause(backoff).await;
        }
    }

    /// One pass of [`Self::read`] over the believed leader and every endpoint.
    async fn read_round<T, F, Fut>(&self, read: &F) -> Result<T, RoundFailure>
    where
        F: Fn(tally_api::pb::budget_client::BudgetClient<tonic::transport::Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.learn_region().await;
        let targets = self.nodes.read_targets();
        let mut last = String::from("no endpoint");
        for target in targets {
            let client = self.nodes.budget(&target).map_err(RoundFailure::Definite)?;
            match tokio::time::timeout(self.config.attempt_timeout, read(client)).await {
                Ok(Ok(reply)) => return Ok(reply.into_inner()),
                Ok(Err(status)) => {
                    let remote = RemoteError::from(&status);
                    if matches!(remote, RemoteError::Ledger(_) | RemoteError::Refused { .. }) {
                        return Err(RoundFailure::Definite(remote.into()));
                    }
                    if matches!(remote, RemoteError::Transport { .. }) {
                        self.nodes.note_local_failure(&target);
                        self.nodes.drop_channel(&target);
                    }
                    self.nodes.note_leader(leader_hint(&status));
                    last = format!("{target}: {remote}");
                }
                Err(_) => {
                    self.nodes.note_local_failure(&target);
                    self.nodes.drop_channel(&target);
                    last = format!("{target}: no reply in time");
                }
            }
        }
        Err(RoundFailure::NoAnswer(last))
    }
}

/// Why one round of reads ended without a reply.
enum RoundFailure {
    /// An answer that another node would give too (a refusal, a bad argument, a bad endpoint).
    Definite(ClientError),
    /// No node answered; the last reason seen.
    NoAnswer(String),
}
