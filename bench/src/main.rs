//! `tally-bench`: a real 3-node cluster on loopback with fsync on, many clients doing
//! authorize + capture + reconcile on 1,000 families, unary and `Batch`, reported next to the
//! single-stream `fdatasync` rate of the same disk (the physical reference).
//!
//! Build both binaries, the node with its stage timings, then run: `cargo build --release -p
//! tally-authority --features stage-stats -p tally-bench && target/release/tally-bench`. After
//! each load it prints where a command's time goes on the leader, stage by stage (`breakdown`:
//! proposed → received → submitted → persisted → committed → applied), next to the client's
//! p50 and the disk's fsync p50; a node built without `stage-stats` runs the same, with no
//! breakdown. `tally-bench compare etcd` runs the same workload against a 3-member etcd too and
//! prints the ratios (`compare`). `tally-bench soak` holds a fixed offered rate for a long
//! time and samples each node's memory and disk (`soak`, `soak_chart`). `tally-bench regions`
//! measures five voters in three regions with real delay between them (`regions`).
//! `tally-bench scale-out-chart` draws deploy/scale-out's kernel scale-out results
//! (`scale_out_chart`).

mod breakdown;
mod cluster;
mod compare;
mod etcd;
mod fsync;
mod regions;
mod round_trip;
mod scale_out_chart;
mod soak;
mod soak_chart;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tally_client::cli::bench::{drive, BenchArgs, BenchReport};
use tally_client::{ClientConfig, TallyClient};

#[derive(Debug, Parser)]
#[command(
    name = "tally-bench",
    about = "Cluster load benchmark against the disk's fdatasync rate",
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// The tally-node binary (default: next to this one).
    #[arg(long)]
    node_binary: Option<PathBuf>,
    /// Where the nodes keep their data (default: a temp dir on the disk under test).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Seconds per scenario.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    #[arg(long, default_value_t = 1_000)]
    families: u64,
    #[arg(long, default_value_t = 27_400)]
    base_port: u16,
    /// Write the JSON report here too.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// A load to run, as `BATCH:CONCURRENCY` (batch 0 = unary calls); repeat for several, run
    /// in order. Default: `0:64`, `64:1024` and `256:1024` (the loads docs/benchmarks.md
    /// reports).
    #[arg(long = "scenario", value_parser = parse_scenario)]
    scenarios: Vec<(usize, usize)>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run the same workload against Tally and another system, same disk, one run.
    #[command(subcommand)]
    Compare(compare::Target),
    /// A fixed offered rate for a long time (default 5,000 commands/s for 32 minutes,
    /// retention 10 minutes), sampling each node's RSS and disk use: CSV, JSON and a PNG under
    /// --out, and whether memory stayed flat and under the budget after the warm-up.
    Soak(soak::SoakArgs),
    /// Five voters in three regions with real delay between them (network namespaces and a
    /// user-space delay router; needs root): write and read latency per caller region, then
    /// the leader's whole region cut off and healed under load. JSON and a PNG under --out.
    Regions(regions::RegionsArgs),
    /// Draw the PNG of deploy/scale-out's results file (tool calls/s through 1, 2, 4 kernel
    /// containers against the cluster's own limit, and the cores each group used).
    ScaleOutChart {
        /// The results file deploy/scale-out wrote (results.json).
        #[arg(long)]
        results: PathBuf,
        /// The PNG to write.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Enough callers that the nodes, not the callers, are the limit: with 256 callers `Batch` 64
/// left a quarter of the two cores idle (four batches in flight); 1,024 callers keep 16 in
/// flight and saturate them.
const DEFAULT_SCENARIOS: [(usize, usize); 3] = [(0, 64), (64, 1_024), (256, 1_024)];

fn parse_scenario(text: &str) -> Result<(usize, usize), String> {
    let (batch, concurrency) = text
        .split_once(':')
        .ok_or_else(|| format!("`{text}` is not BATCH:CONCURRENCY"))?;
    let batch: usize = batch.parse().map_err(|e| format!("batch `{batch}`: {e}"))?;
    let concurrency: usize = concurrency
        .parse()
        .map_err(|e| format!("concurrency `{concurrency}`: {e}"))?;
    if batch > tally_api::MAX_BATCH_COMMANDS {
        return Err(format!(
            "batch {batch}: at most {}",
            tally_api::MAX_BATCH_COMMANDS
        ));
    }
    if !(1..=100_000).contains(&concurrency) {
        return Err(format!("concurrency {concurrency}: 1..=100000"));
    }
    Ok((batch, concurrency))
}

#[derive(Debug, serde::Serialize)]
struct Scenario {
    name: String,
    report: BenchReport,
    log_entries: u64,
    commands_per_entry: f64,
    times_fdatasync_rate: f64,
    /// Each node's stage-to-stage percentiles after this load (empty gaps without
    /// `stage-stats`).
    stages: Vec<breakdown::NodeStages>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Some(Command::Compare(target)) => return compare::run(target).await,
        Some(Command::Soak(soak)) => return soak::run(soak).await,
        Some(Command::Regions(regions)) => {
            return tokio::task::block_in_place(|| regions::run(regions))
        }
        Some(Command::ScaleOutChart { results, out }) => {
            scale_out_chart::draw_file(&results, &out)?;
            println!("chart written to {}", out.display());
            return Ok(());
        }
        None => {}
    }
    let binary = cluster::node_binary(
        args.node_binary.as_deref(),
        "cargo build --release -p tally-authority --features stage-stats",
    )?;
    let temp = tempfile::tempdir_in(args.data_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let (fdatasync, fsync_p50_ms, fsync_p99_ms) =
        fsync::fdatasync_profile(temp.path(), Duration::from_secs(3))?;
    println!(
        "disk: {fdatasync:.0} sequential fdatasync/s, p50 {fsync_p50_ms:.2} ms, p99 \
         {fsync_p99_ms:.2} ms (512 B appends) in {}",
        temp.path().display()
    );

    let cluster = cluster::ProcessCluster::start(&binary, temp.path(), 3, args.base_port).await?;
    println!(
        "cluster: 3 tally-node processes (async worker threads per node: {}) on {}",
        cluster.worker_threads,
        cluster.endpoints.join(", ")
    );
    let round_trip_p50_ms = cluster.round_trip_p50_ms("cluster").await?;
    let client = Arc::new(TallyClient::new(ClientConfig::new(
        cluster.endpoints.clone(),
        cluster.kernel.clone(),
    ))?);
    let mut scenarios = Vec::new();
    let scenarios_to_run = if args.scenarios.is_empty() {
        DEFAULT_SCENARIOS.to_vec()
    } else {
        args.scenarios.clone()
    };
    for (batch, concurrency) in scenarios_to_run {
        let name = match batch {
            0 => "unary".to_owned(),
            batch => format!("batch {batch}"),
        };
        let before = cluster.leader_last_log().await?;
        let bench = BenchArgs {
            families: args.families,
            hot_share: 0.1,
            denied_share: 0.0,
            concurrency,
            duration_s: args.duration_s,
            batch,
            rate: None,
            quiet: true,
        };
        let report = drive(client.clone(), &bench).await;
        let entries = cluster
            .leader_last_log()
            .await?
            .saturating_sub(before)
            .max(1);
        let stages = breakdown::collect(&cluster.metrics).await;
        let scenario = Scenario {
            name,
            commands_per_entry: report.commands as f64 / entries as f64,
            times_fdatasync_rate: report.commands_per_s / fdatasync,
            log_entries: entries,
            report,
            stages,
        };
        println!(
            "{:<10} {:>9.0} commands/s  p50 {:>7.2} ms  p99 {:>7.2} ms  {:>6.1} commands/entry  {:>5.1}x fdatasync rate  (concurrency {}, errors {})",
            scenario.name,
            scenario.report.commands_per_s,
            scenario.report.p50_ms,
            scenario.report.p99_ms,
            scenario.commands_per_entry,
            scenario.times_fdatasync_rate,
            concurrency,
            scenario.report.errors,
        );
        print!(
            "{}",
            breakdown::render(
                &scenario.stages,
                scenario.report.p50_ms,
                breakdown::Floors {
                    round_trip_p50_ms,
                    fsync_p50_ms,
                },
                scenario.log_entries,
            )
        );
        scenarios.push(scenario);
    }
    let json = serde_json::json!({ "fdatasync_per_s": fdatasync, "families": args.families, "scenarios": scenarios });
    if let Some(path) = args.json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
        println!("report written to {}", path.display());
    }
    drop(cluster);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_parse_and_bad_ones_say_why() {
        assert_eq!(parse_scenario("64:1024"), Ok((64, 1024)));
        assert_eq!(parse_scenario("0:1"), Ok((0, 1)));
        for (text, says) in [
            ("64", "is not BATCH:CONCURRENCY"),
            ("x:1", "batch `x`"),
            ("64:y", "concurrency `y`"),
            ("64:0", "concurrency 0: 1..=100000"),
            ("100000:8", "at most"),
        ] {
            let error = parse_scenario(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
        let args = Args::try_parse_from(["tally-bench"]).expect("no arguments");
        assert!(args.scenarios.is_empty(), "the defaults apply");
        assert!(Args::try_parse_from(["tally-bench", "--scenario", "64"]).is_err());
    }
}
