//! `tally params`: the replicated cluster parameters (docs/spec.md §5.5, §6). They change only
//! through the log, so every replica compacts and clamps time alike; this shows them as the
//! leader applied them, or proposes new values and waits until they are committed.

use clap::Args;
use tally_api::pb;

use super::find_leader;
use super::output::{print_json, Table};
use crate::TallyClient;

#[derive(Debug, Args)]
#[command(after_help = SIZING)]
pub struct ParamsArgs {
    /// How long after a command's `not_after_ms` its full event stays in memory; after it,
    /// only a compact record is kept (for ever). Memory grows with commands/s × retention.
    #[arg(long)]
    pub retention_ms: Option<u64>,
    /// The largest step cluster time may take in one log entry (a bad leader clock cannot
    /// leap it forward further).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_clock_step_ms: Option<u64>,
}

const SIZING: &str = "Without options, prints the parameters in force. Memory per command \
(docs/sizing.md): about 1.1 KB while its full event is retained, about 0.4 KB for \
ever after. Example: tally params --retention-ms 3600000";

impl ParamsArgs {
    fn is_change(&self) -> bool {
        self.retention_ms.is_some() || self.max_clock_step_ms.is_some()
    }
}

/// Prints the parameters in force, after changing them when asked.
pub async fn run(client: &TallyClient, args: ParamsArgs, json: bool) -> anyhow::Result<u8> {
    let leader = find_leader(client).await?;
    let (params, log_index) = if args.is_change() {
        let reply = client
            .admin_client(&leader)?
            .set_params(pb::SetParamsRequest {
                retention_ms: args.retention_ms,
                max_clock_step_ms: args.max_clock_step_ms,
            })
            .await?
            .into_inner();
        (reply.params, Some(reply.log_index))
    } else {
        (client.status(&leader).await?.params, None)
    };
    let params = params.ok_or_else(|| anyhow::anyhow!("the leader {leader} sent no parameters"))?;
    if json {
        print_json(&serde_json::json!({
            "retention_ms": params.retention_ms,
            "max_clock_step_ms": params.max_clock_step_ms,
            "committed_at_log_index": log_index,
        }));
    } else {
        let mut table = Table::new(&["RETENTION_MS", "MAX_CLOCK_STEP_MS"]);
        table.row(vec![
            params.retention_ms.to_string(),
            params.max_clock_step_ms.to_string(),
        ]);
        table.print();
        if let Some(index) = log_index {
            println!("committed at log index {index}");
        }
    }
    Ok(0)
}
