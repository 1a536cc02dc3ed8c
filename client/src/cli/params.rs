//! `tally params`: the replicated cluster parameters (docs/spec.md §5.5, §6). They change only
//! through the log, so every replica compacts and clamps time alike; this shows them as the
//! leader applied them, or proposes a change of the fields given (and only those) and waits
//! until it is committed.

use clap::Args;
use tally_api::pb;
use tally_ledger::cluster_time::{MAX_CLOCK_STEP_MS, RETENTION_MS};
use tally_ledger::ParamsChange;

use super::find_leader;
use super::output::{print_json, Table};
use crate::TallyClient;

#[derive(Debug, Args)]
#[command(after_help = SIZING)]
pub struct ParamsArgs {
    /// How long after a command's `not_after_ms` its full event stays in memory; after it,
    /// only a compact record is kept (for ever). Memory grows with commands/s × retention.
    /// A change holds for what is retained already too (rules version 3, `tally params`
    /// shows the version in force): lowering it compacts what it makes due in bounded
    /// slices, raising it keeps longer what is not compacted yet. Under version 2 those
    /// already retained keep the retention they were applied under.
    /// 1000..=31536000000 (1 s to 365 days).
    #[arg(long, value_parser = clap::value_parser!(u64).range(RETENTION_MS))]
    pub retention_ms: Option<u64>,
    /// The largest step cluster time may take in one log entry (a bad leader clock cannot
    /// leap it forward further). 1000..=600000 (1 s to 10 min).
    #[arg(long, value_parser = clap::value_parser!(u64).range(MAX_CLOCK_STEP_MS))]
    pub max_clock_step_ms: Option<u64>,
    /// The regions the leader should be in, best first, comma separated (at most 8): the
    /// leader hands leadership to a healthy, caught-up voter of a better region.
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "no_preferred_leader_regions"
    )]
    pub preferred_leader_regions: Option<Vec<String>>,
    /// Clears the preferred leader regions: the leader stays wherever it is elected.
    #[arg(long)]
    pub no_preferred_leader_regions: bool,
}

const SIZING: &str = "Without options, prints the parameters in force. With options, changes \
only the parameters given: a change made at the same time by someone else to another \
parameter also holds. Per command (docs/sizing.md): about 1.1 KB of memory while its full \
event is retained; after it, about 0.5 KB of disk for ever and a few bytes of memory. \
RULES_VERSION, the rules that decide what leaves memory, is not set here: the leader raises \
it once every member runs a release that knows newer rules (docs/operations.md, Upgrades). \
Examples: tally params --retention-ms 3600000; tally params --preferred-leader-regions \
eu-west,us-east";

impl ParamsArgs {
    fn change(&self) -> ParamsChange {
        let preferred_leader_regions = if self.no_preferred_leader_regions {
            Some(Vec::new())
        } else {
            self.preferred_leader_regions.clone()
        };
        ParamsChange {
            retention_ms: self.retention_ms,
            max_clock_step_ms: self.max_clock_step_ms,
            preferred_leader_regions,
        }
    }
}

/// Prints the parameters in force, after changing them when asked.
pub async fn run(client: &TallyClient, args: ParamsArgs, json: bool) -> anyhow::Result<u8> {
    let leader = find_leader(client).await?;
    let change = args.change();
    let (params, log_index) = if !change.is_empty() {
        let reply = client
            .admin_client(&leader)?
            .set_params(pb::SetParamsRequest::from(&change))
            .await?
            .into_inner();
        (reply.params, Some(reply.log_index))
    } else {
        (client.status(&leader).await?.params, None)
    };
    let params = params.ok_or_else(|| anyhow::anyhow!("the leader {leader} sent no parameters"))?;
    // 0 from a node that predates versions: it applies version 1.
    let rules_version = params.rules_version.max(tally_ledger::LEGACY_RULES);
    if json {
        print_json(&serde_json::json!({
            "retention_ms": params.retention_ms,
            "max_clock_step_ms": params.max_clock_step_ms,
            "preferred_leader_regions": params.preferred_leader_regions,
            "rules_version": rules_version,
            "committed_at_log_index": log_index,
        }));
    } else {
        let mut table = Table::new(&[
            "RETENTION_MS",
            "MAX_CLOCK_STEP_MS",
            "PREFERRED_LEADER_REGIONS",
            "RULES_VERSION",
        ]);
        let preferred = if params.preferred_leader_regions.is_empty() {
            "-".to_owned()
        } else {
            params.preferred_leader_regions.join(",")
        };
        table.row(vec![
            params.retention_ms.to_string(),
            params.max_clock_step_ms.to_string(),
            preferred,
            rules_version.to_string(),
        ]);
        table.print();
        if let Some(index) = log_index {
            println!("committed at log index {index}");
        }
    }
    Ok(0)
}
