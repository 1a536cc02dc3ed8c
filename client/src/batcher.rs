//! Automatic batching: concurrent `submit`s are coalesced into `Batch` requests (bounded size
//! and linger), so many kernel tasks share round trips and fsyncs. Each caller keeps its own
//! command and answer; identical commands from two callers stay two commands, so the second
//! sees the first as the owner. A batch whose reply is lost falls back to each command's own
//! retry-and-resolve path.

use std::sync::Arc;

use tally_api::pb;
use tally_api::status::leader_header;
use tally_api::RemoteError;
use tally_ledger::{ClientCommand, Decision};
use tokio::sync::{mpsc, oneshot};

use crate::client::TallyClient;
use crate::config::BatchConfig;
use crate::outcome::Outcome;

type Job = (ClientCommand, oneshot::Sender<Outcome>);

/// A handle that batches; cheap to clone and share between tasks.
#[derive(Clone)]
pub struct BatchingClient {
    queue: mpsc::Sender<Job>,
    client: Arc<TallyClient>,
}

impl BatchingClient {
    pub fn new(client: Arc<TallyClient>, config: BatchConfig) -> Self {
        assert!(
            (1..=tally_api::MAX_BATCH_COMMANDS).contains(&config.max_commands),
            "batch size must be 1..={}",
            tally_api::MAX_BATCH_COMMANDS
        );
        let (queue, jobs) = mpsc::channel(config.max_queued.max(1));
        tokio::spawn(run(client.clone(), config, jobs));
        Self { queue, client }
    }

    pub async fn submit(&self, command: ClientCommand) -> Outcome {
        let (reply, answer) = oneshot::channel();
        if self.queue.send((command.clone(), reply)).await.is_err() {
            return self.client.submit(command).await;
        }
        match answer.await {
            Ok(outcome) => outcome,
            // The batcher is gone; the command may have been sent: resolve it ourselves.
            Err(_) => self.client.resolve(command).await,
        }
    }

    pub fn client(&self) -> &Arc<TallyClient> {
        &self.client
    }
}

async fn run(client: Arc<TallyClient>, config: BatchConfig, mut jobs: mpsc::Receiver<Job>) {
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        let linger = tokio::time::sleep(config.linger);
        tokio::pin!(linger);
        while batch.len() < config.max_commands {
            tokio::select! {
                job = jobs.recv() => match job {
                    Some(job) => batch.push(job),
                    None => break,
                },
                _ = &mut linger => break,
            }
        }
        tokio::spawn(send(client.clone(), batch));
    }
}

async fn send(client: Arc<TallyClient>, batch: Vec<Job>) {
    let wire: Vec<pb::Command> = batch
        .iter()
        .map(|(command, _)| pb::Command::from(command))
        .collect();
    client.learn_region().await;
    let target = client.nodes.target();
    let reply = match client.nodes.budget(&target) {
        Ok(mut budget) => {
            let call = budget.batch(pb::BatchRequest { commands: wire });
            match tokio::time::timeout(client.config.attempt_timeout, call).await {
                Ok(Ok(reply)) => Some(reply),
                Ok(Err(status)) => {
                    if matches!(
                        tally_api::RemoteError::from(&status),
                        tally_api::RemoteError::Transport { .. }
                    ) {
                        client.nodes.drop_channel(&target);
                    }
                    None
                }
                Err(_) => {
                    client.nodes.drop_channel(&target);
                    None
                }
            }
        }
        Err(_) => None,
    };
    let Some(reply) = reply else {
        // Whole-batch failure: each command takes its own retry and resolve path.
        client.nodes.forget_leader(&target);
        for (command, answer) in batch {
            let client = client.clone();
            tokio::spawn(async move {
                let _ = answer.send(client.submit(command).await);
            });
        }
        return;
    };
    if let Some(leader) = leader_header(reply.metadata()) {
        // Served through a follower: the next batch goes straight to the leader.
        client.nodes.note_leader(Some(leader));
    }
    let results = reply.into_inner().results;
    assert_eq!(
        results.len(),
        batch.len(),
        "the server answers every command of a batch"
    );
    for ((command, answer), result) in batch.into_iter().zip(results) {
        let outcome = match result.result {
            Some(pb::batch_result::Result::Decision(decision)) => {
                client.note_stamp(&decision);
                match Decision::try_from(decision) {
                    Ok(decision) => Some(Outcome::Decided(decision)),
                    Err(_) => None,
                }
            }
            Some(pb::batch_result::Result::Error(detail)) => match RemoteError::try_from(detail) {
                Ok(RemoteError::Ledger(error)) => Some(Outcome::Refused(error)),
                _ => None,
            },
            None => None,
        };
        match outcome {
            Some(outcome) => {
                let _ = answer.send(outcome);
            }
            None => {
                let client = client.clone();
                tokio::spawn(async move {
                    let _ = answer.send(client.submit(command).await);
                });
            }
        }
    }
}
