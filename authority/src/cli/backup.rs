//! `tally-node backup` and `tally-node restore`: the command-line side of
//! [`crate::node::backup`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tally_api::pb;
use tally_api::pb::admin_client::AdminClient;

use super::Credentials;
use crate::node::backup;

#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// The node's data dir (its `data_dir` setting).
    #[arg(long, default_value = "./tally-data")]
    pub data_dir: PathBuf,
    /// The backup file to write; it must not exist yet.
    #[arg(long)]
    pub out: PathBuf,
    /// The node's client address: ask it for a snapshot of everything it has applied first,
    /// and wait for it (needs an operator certificate).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// How long to wait for that snapshot.
    #[arg(long, default_value_t = 120_000)]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub credentials: Credentials,
}

#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup file (`tally-node backup --out`).
    #[arg(long)]
    pub from: PathBuf,
    /// The empty data dir of the node to start from it.
    #[arg(long)]
    pub data_dir: PathBuf,
}

pub async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    if let Some(endpoint) = &args.endpoint {
        fresh_snapshot(endpoint, &args).await?;
    }
    let (data_dir, out) = (args.data_dir.clone(), args.out.clone());
    let meta = tokio::task::spawn_blocking(move || backup::export(&data_dir, &out)).await??;
    let bytes = std::fs::metadata(&args.out)?.len();
    println!(
        "backed up the snapshot at log index {} ({bytes} bytes) to {}",
        meta.last_log_id.map_or(0, |id| id.index),
        args.out.display()
    );
    Ok(())
}

/// How often `fresh_snapshot` asks again while no snapshot covers the index it waits for.
const RETRIGGER_EVERY: Duration = Duration::from_secs(2);

/// Asks the node for a snapshot and waits until its status reports one at or past the index
/// it had applied when asked.
async fn fresh_snapshot(endpoint: &str, args: &BackupArgs) -> anyhow::Result<()> {
    let channel = args
        .credentials
        .transport()?
        .endpoint(endpoint)?
        .connect()
        .await?;
    let mut admin = AdminClient::new(channel);
    let applied = admin
        .status(pb::StatusRequest {})
        .await?
        .into_inner()
        .applied_index
        .unwrap_or(0);
    admin
        .trigger_snapshot(pb::TriggerSnapshotRequest {})
        .await?;
    println!("asked {endpoint} for a snapshot of index {applied} or later");
    let deadline = Instant::now() + Duration::from_millis(args.timeout_ms);
    let mut asked_at = Instant::now();
    loop {
        let status = admin.status(pb::StatusRequest {}).await?.into_inner();
        if status.snapshot_index.unwrap_or(0) >= applied {
            return Ok(());
        }
        // A snapshot already being written when we asked ends below `applied`, and the node
        // takes no second request meanwhile: ask again until one covers it.
        if asked_at.elapsed() >= RETRIGGER_EVERY {
            admin
                .trigger_snapshot(pb::TriggerSnapshotRequest {})
                .await?;
            asked_at = Instant::now();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{endpoint} has not written a snapshot of index {applied} within {} ms (its newest is \
             at {:?})",
            args.timeout_ms,
            status.snapshot_index
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let meta = backup::restore(&args.from, &args.data_dir)?;
    println!(
        "restored the snapshot at log index {} into {}; start the node on it with its old id \
         and addresses",
        meta.last_log_id.map_or(0, |id| id.index),
        args.data_dir.display()
    );
    Ok(())
}
