//! `tally-bench compare etcd`: the same workload against Tally and against a 3-member etcd, in
//! one run, on the same disk, and a table of the ratios.
//!
//! The workload on both: one tool call = authorize + capture + reconcile (100 units exposed,
//! 60 realized, a per-call limit of 100) on 1,000 families, with 10% of the calls on family 0
//! (the hot family) and again with no hot family. Tally runs 1 caller unary, 64 callers unary
//! and `Batch` 64 with 1,024 callers (`tally_client::cli::bench::drive`, the default bench's
//! driver). etcd runs the scheme of [`crate::etcd`] at 1, 16, 64 and 256 callers, with a `Txn`
//! per step and with up to 64 steps a `Txn`. Baselines are like with like, per variant: the
//! 1-caller row against etcd's 1 caller, Tally's unary rows against etcd's best tool calls/s
//! with a `Txn` per step, Tally's `Batch` against etcd's best of all (batched `Txn`s).
//! Tally's commands are steps, so its tool calls/s is commands/s divided by 3.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::json;
use tally_client::cli::bench::{drive, BenchArgs, BenchReport};
use tally_client::{ClientConfig, TallyClient};

use crate::etcd::driver::{Etcd, Load, Report, Totals, REALIZED_PER_CALL};
use crate::etcd::members::{self, EtcdCluster};
use crate::{cluster, fsync};

#[derive(Debug, Subcommand)]
pub enum Target {
    /// Against a 3-member etcd (Debian's etcd-server, installed by scripts/etcd-install when
    /// `etcd` is not on PATH; skipped with the reason if it cannot be).
    ///
    /// Tally: 1 caller unary, 64 callers unary, Batch 64 with 1,024 callers. etcd: 1, 16, 64
    /// and 256 callers, a Txn per step and up to 64 steps a Txn (the scheme is documented in
    /// bench/src/etcd/mod.rs). Each with 10% of calls on one hot family and with none. Prints
    /// a table of tool calls/s and Tally's ratio to etcd's best, like with like: 1 caller
    /// against 1 caller, unary against a Txn per step, Batch against the best of all. Checks
    /// etcd's account totals against the calls made. fsync on for both.
    #[command(verbatim_doc_comment)]
    Etcd(EtcdArgs),
}

#[derive(Debug, Args)]
pub struct EtcdArgs {
    /// Seconds per load (20 loads by default: 6 on Tally, 14 on etcd; plus ~15 s of setup,
    /// disk probe and a 2 s etcd race check).
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Do not install etcd when it is not on PATH (etcd is then skipped).
    #[arg(long)]
    skip_install: bool,
    /// The tally-node binary (default: next to this one).
    #[arg(long)]
    node_binary: Option<PathBuf>,
    /// Parent of the temp dir both clusters keep their data in (default: the system temp dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 1_000)]
    families: u64,
    /// Tally's nodes listen on BASE+1..3 (metrics BASE+101..103); 0 picks the first base from
    /// 27,500 up (in steps of 300) whose nine ports are free. etcd always takes free ports.
    #[arg(long, default_value_t = 0)]
    base_port: u16,
    /// etcd's caller counts to sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    etcd_callers: Vec<usize>,
    /// Most steps the etcd client puts in one Txn, to sweep: 1 is a Txn per step; more
    /// batches like Tally's Batch (at most 64: etcd's --max-txn-ops of 128). A batch size
    /// above 1 is not run with 1 caller.
    #[arg(long, value_delimiter = ',', default_value = "1,64",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    etcd_batch: Vec<u16>,
    /// Write the JSON report here too.
    #[arg(long)]
    json_out: Option<PathBuf>,
}

/// Tally's loads: (name, batch, callers).
const TALLY_LOADS: [(&str, usize, usize); 3] = [
    ("1 caller unary", 0, 1),
    ("64 callers unary", 0, 64),
    ("Batch 64, 1,024 callers", 64, 1_024),
];
/// (name, share of calls on family 0).
const VARIANTS: [(&str, f64); 2] = [("hot family 10%", 0.1), ("no hot family", 0.0)];

pub async fn run(target: Target) -> anyhow::Result<()> {
    let Target::Etcd(args) = target;
    let began = Instant::now();
    let binary = cluster::node_binary(
        args.node_binary.as_deref(),
        "cargo build --release -p tally-authority",
    )?;
    anyhow::ensure!(args.families > 0, "--families must be positive");
    anyhow::ensure!(
        !args.etcd_callers.is_empty() && args.etcd_callers.iter().all(|&c| c > 0),
        "--etcd-callers takes positive counts"
    );
    anyhow::ensure!(!args.etcd_batch.is_empty(), "--etcd-batch takes sizes");
    let temp = tempfile::tempdir_in(args.data_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let (fdatasync, fdatasync_p50, fdatasync_p99) =
        fsync::fdatasync_profile(temp.path(), Duration::from_secs(3))?;
    println!(
        "disk: {fdatasync:.0} sequential fdatasync/s, p50 {fdatasync_p50:.2} ms, p99 {fdatasync_p99:.2} ms (512 B appends) in {}",
        temp.path().display()
    );
    let duration = Duration::from_secs(args.duration_s);

    let (tally, tally_round_trip_p50_ms) =
        run_tally(&args, &binary, &temp.path().join("tally"), duration).await?;
    let etcd = match members::find_or_install(args.skip_install) {
        Err(why) => {
            println!("etcd: skipped: etcd not available ({why})");
            EtcdSide::Skipped(why)
        }
        Ok(etcd_binary) => run_etcd(&args, &etcd_binary, &temp.path().join("etcd"), duration)
            .await
            .unwrap_or_else(|error| {
                println!("etcd: skipped: the etcd run failed ({error:#})");
                EtcdSide::Skipped(format!("the etcd run failed: {error:#}"))
            }),
    };

    let rows = table_rows(&tally, &etcd);
    println!();
    print_table(&rows, &etcd);
    println!(
        "{}",
        one_caller_target(&rows, fdatasync_p50, tally_round_trip_p50_ms)
    );
    let elapsed = began.elapsed().as_secs_f64();
    println!("\nwhole run: {elapsed:.0} s");
    if let Some(path) = &args.json_out {
        let (etcd_json, rtt) = match &etcd {
            EtcdSide::Skipped(why) => (json!({ "skipped": why }), None),
            EtcdSide::Ran(ran) => (
                json!({
                    "version": ran.version,
                    "members": members::MEMBERS,
                    "flags": "--quota-backend-bytes 8589934592 --logger zap --log-level warn; defaults otherwise (fsync on)",
                    "batch_sizes": args.etcd_batch,
                    "totals_after_runs": ran.totals,
                    "runs": ran.runs.iter().map(|(variant, report)| json!({ "variant": variant, "report": report })).collect::<Vec<_>>(),
                }),
                Some(ran.round_trip_p50_ms),
            ),
        };
        let report = json!({
            "fdatasync_per_s": fdatasync,
            "fdatasync_p50_ms": fdatasync_p50,
            "fdatasync_p99_ms": fdatasync_p99,
            "grpc_round_trip_p50_ms": rtt,
            "tally_grpc_round_trip_p50_ms": tally_round_trip_p50_ms,
            "families": args.families,
            "duration_s": args.duration_s,
            "tally": tally.iter().map(|run| json!({
                "variant": run.variant,
                "load": run.load,
                "tool_calls_per_s": run.report.commands_per_s / 3.0,
                "report": run.report,
            })).collect::<Vec<_>>(),
            "etcd": etcd_json,
            "table": rows,
            "seconds": elapsed,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        println!("report written to {}", path.display());
    }
    Ok(())
}

struct TallyRun {
    variant: &'static str,
    load: &'static str,
    report: BenchReport,
}

async fn run_tally(
    args: &EtcdArgs,
    binary: &Path,
    dir: &Path,
    duration: Duration,
) -> anyhow::Result<(Vec<TallyRun>, f64)> {
    std::fs::create_dir_all(dir)?;
    let base_port = match args.base_port {
        0 => cluster::free_base_port()?,
        chosen => chosen,
    };
    let cluster = cluster::ProcessCluster::start(binary, dir, 3, base_port).await?;
    println!(
        "tally: 3 tally-node processes (async worker threads per node: {}) on {}",
        cluster.worker_threads,
        cluster.endpoints.join(", ")
    );
    let round_trip_p50_ms = cluster.round_trip_p50_ms("tally").await?;
    let client = Arc::new(TallyClient::new(ClientConfig::new(
        cluster.endpoints.clone(),
        cluster.kernel.clone(),
    ))?);
    let mut runs = Vec::new();
    // Each load with and without the hot family back to back, so drift hits both alike.
    for (load, batch, concurrency) in TALLY_LOADS {
        for (variant, hot_share) in VARIANTS {
            let bench = BenchArgs {
                families: args.families,
                hot_share,
                denied_share: 0.0,
                concurrency,
                duration_s: duration.as_secs(),
                batch,
                rate: None,
                quiet: true,
            };
            let report = drive(client.clone(), &bench).await;
            println!(
                "tally {variant:<15} {load:<24} {:>8.0} tool calls/s ({:>7.0} commands/s)  per command p50 {:>6.2} ms  p99 {:>6.2} ms  errors {}",
                report.commands_per_s / 3.0,
                report.commands_per_s,
                report.p50_ms,
                report.p99_ms,
                report.errors,
            );
            runs.push(TallyRun {
                variant,
                load,
                report,
            });
        }
    }
    drop(cluster);
    Ok((runs, round_trip_p50_ms))
}

/// The latency floor for one caller: a command's p50 at most twice a bare fsync
/// plus a bare round trip (the client's to the leader and the leader's to a follower, each
/// with one fsync behind it), both measured in this run on Tally's own transport.
fn one_caller_target(rows: &[Row], fdatasync_p50_ms: f64, round_trip_p50_ms: f64) -> String {
    let floor_ms = 2.0 * (fdatasync_p50_ms + round_trip_p50_ms);
    let measured: Vec<String> = rows
        .iter()
        .filter(|row| row.load == TALLY_LOADS[0].0)
        .map(|row| {
            let verdict = if row.tally_command_p50_ms <= floor_ms {
                "met"
            } else {
                "not met"
            };
            format!(
                "{} {:.2} ms ({verdict})",
                row.variant, row.tally_command_p50_ms
            )
        })
        .collect();
    format!(
        "1 caller target: p50 per command <= 2 x (fdatasync p50 {fdatasync_p50_ms:.3} + Tally's round trip p50 {round_trip_p50_ms:.3}) = {floor_ms:.2} ms: {}",
        measured.join(", ")
    )
}

enum EtcdSide {
    Skipped(String),
    Ran(EtcdRun),
}

struct EtcdRun {
    version: String,
    round_trip_p50_ms: f64,
    totals: Totals,
    runs: Vec<(&'static str, Report)>,
}

impl EtcdRun {
    fn at(&self, variant: &str, callers: usize) -> Option<&Report> {
        self.runs
            .iter()
            .find(|(v, r)| *v == variant && r.callers == callers && r.max_batch == 1)
            .map(|(_, r)| r)
    }

    /// etcd's best tool calls/s in `variant`; `unary`: among its runs with a `Txn` per step.
    fn best(&self, variant: &str, unary: bool) -> Option<&Report> {
        self.runs
            .iter()
            .filter(|(v, r)| *v == variant && (!unary || r.max_batch == 1))
            .map(|(_, r)| r)
            .max_by(|a, b| a.calls_per_s.total_cmp(&b.calls_per_s))
    }
}

async fn run_etcd(
    args: &EtcdArgs,
    binary: &Path,
    dir: &Path,
    duration: Duration,
) -> anyhow::Result<EtcdSide> {
    std::fs::create_dir_all(dir)?;
    let version = members::version(binary)
        .trim_start_matches("etcd Version: ")
        .to_owned();
    let cluster = EtcdCluster::start(binary, dir).await?;
    let leader = cluster.leader().await?;
    println!(
        "etcd: {version}, {} members on {} (leader {leader})",
        members::MEMBERS,
        cluster.endpoints.join(", "),
    );
    let etcd = Etcd::new(members::channel(&leader).await?);
    let round_trip_p50_ms = etcd.round_trip_p50_ms(2_000).await?;
    println!("etcd: loopback gRPC round trip (serializable Range) p50 {round_trip_p50_ms:.3} ms");
    // The conflict path, exercised: a second client with its own cache races this one on 4
    // families of their own; the account totals are checked after the sweep.
    let rival = Etcd::new(members::channel(&leader).await?);
    let race = Load {
        prefix: "race-family-",
        families: 4,
        hot_share: 0.0,
        callers: 16,
        max_batch: 8,
        duration: Duration::from_secs(2),
    };
    let (ours, theirs) = tokio::join!(etcd.drive(&race), rival.drive(&race));
    println!(
        "etcd: race check, 2 clients x 16 callers on 4 families for 2 s: {} calls, {} conflicts retried, {} failed calls",
        ours.calls + theirs.calls,
        ours.conflicts + theirs.conflicts,
        ours.failed_calls + theirs.failed_calls,
    );
    let mut calls = ours.calls + theirs.calls;
    let mut complete = ours.failed_calls + theirs.failed_calls == 0;
    let mut runs = Vec::new();
    let loads = args.etcd_batch.iter().flat_map(|&batch| {
        args.etcd_callers
            .iter()
            .filter(move |&&callers| batch == 1 || callers > 1)
            .map(move |&callers| (usize::from(batch), callers))
    });
    let loads: Vec<(usize, usize)> = loads.collect();
    for &(max_batch, callers) in &loads {
        for (variant, hot_share) in VARIANTS {
            let load = Load {
                prefix: "bench-family-",
                families: args.families,
                hot_share,
                callers,
                max_batch,
                duration,
            };
            let report = etcd.drive(&load).await;
            println!(
                "etcd  {variant:<15} {callers:>4} callers, <={max_batch:>2} steps/Txn {:>6.0} tool calls/s ({:>7.0} steps/s)  per call p50 {:>6.2} ms  per step p50 {:>6.2} ms  p99 {:>6.2} ms  {:.2} steps/Txn  conflicts {}  wire retries {}  replays {}  failed calls {}{}",
                report.calls_per_s,
                report.steps_per_s,
                report.call_p50_ms,
                report.step_p50_ms,
                report.step_p99_ms,
                report.steps_per_txn,
                report.conflicts,
                report.rpc_errors,
                report.replays,
                report.failed_calls,
                report.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default(),
            );
            calls += report.calls;
            complete &= report.failed_calls == 0;
            runs.push((variant, report));
        }
    }
    let totals = etcd.account_totals().await?;
    let expected = Totals {
        accounts: totals.accounts,
        invocations: calls,
        exposed_units: 0,
        realized_units: REALIZED_PER_CALL * calls,
    };
    let totals_ok = totals == expected;
    println!(
        "etcd: totals check over {} accounts: {} invocations for {calls} calls, {} units exposed, {} realized: {}",
        totals.accounts,
        totals.invocations,
        totals.exposed_units,
        totals.realized_units,
        match (totals_ok, complete) {
            (true, _) => "ok",
            (false, false) => "off, as some calls failed part way",
            (false, true) => "MISMATCH",
        }
    );
    anyhow::ensure!(
        totals_ok || !complete,
        "etcd's account totals do not match the calls made: {totals:?}, expected {expected:?}"
    );
    drop(cluster);
    Ok(EtcdSide::Ran(EtcdRun {
        version,
        round_trip_p50_ms,
        totals,
        runs,
    }))
}

/// One row of the printed table.
#[derive(Debug, serde::Serialize)]
struct Row {
    variant: &'static str,
    load: &'static str,
    etcd_callers: Option<usize>,
    etcd_max_batch: Option<usize>,
    etcd_calls_per_s: Option<f64>,
    etcd_call_p50_ms: Option<f64>,
    etcd_step_p50_ms: Option<f64>,
    tally_calls_per_s: f64,
    tally_commands_per_s: f64,
    tally_command_p50_ms: f64,
    tally_command_p99_ms: f64,
    ratio: Option<f64>,
}

fn table_rows(tally: &[TallyRun], etcd: &EtcdSide) -> Vec<Row> {
    // Grouped by variant, loads in their order.
    VARIANTS
        .iter()
        .flat_map(|(variant, _)| tally.iter().filter(move |run| run.variant == *variant))
        .map(|run| {
            let baseline = match etcd {
                EtcdSide::Skipped(_) => None,
                // Like with like: one caller against one caller; Tally unary against etcd's
                // best with a Txn per step; Tally's Batch against etcd's best of all.
                EtcdSide::Ran(ran) if run.report.concurrency == 1 && run.report.batch == 0 => {
                    ran.at(run.variant, 1)
                }
                EtcdSide::Ran(ran) => ran.best(run.variant, run.report.batch == 0),
            };
            let tally_calls_per_s = run.report.commands_per_s / 3.0;
            Row {
                variant: run.variant,
                load: run.load,
                etcd_callers: baseline.map(|b| b.callers),
                etcd_max_batch: baseline.map(|b| b.max_batch),
                etcd_calls_per_s: baseline.map(|b| b.calls_per_s),
                etcd_call_p50_ms: baseline.map(|b| b.call_p50_ms),
                etcd_step_p50_ms: baseline.map(|b| b.step_p50_ms),
                tally_calls_per_s,
                tally_commands_per_s: run.report.commands_per_s,
                tally_command_p50_ms: run.report.p50_ms,
                tally_command_p99_ms: run.report.p99_ms,
                ratio: baseline
                    .filter(|b| b.calls_per_s > 0.0)
                    .map(|b| tally_calls_per_s / b.calls_per_s),
            }
        })
        .collect()
}

fn print_table(rows: &[Row], etcd: &EtcdSide) {
    println!("| variant | load | etcd (best: callers, Txn) | Tally | ratio |");
    println!("|---|---|---|---|---|");
    for row in rows {
        let etcd_cell = match (row.etcd_calls_per_s, row.etcd_callers, row.etcd_max_batch) {
            (Some(calls), Some(callers), Some(1)) => {
                format!("{calls:.0} calls/s ({callers}, a Txn per step)")
            }
            (Some(calls), Some(callers), Some(batch)) => {
                format!("{calls:.0} calls/s ({callers}, <={batch} steps/Txn)")
            }
            _ => "skipped".into(),
        };
        let ratio = row.ratio.map_or("-".into(), |r| format!("{r:.1}x"));
        println!(
            "| {} | {} | {etcd_cell} | {:.0} calls/s ({:.0} commands/s; p50 {:.2} ms, p99 {:.2} ms per command) | {ratio} |",
            row.variant,
            row.load,
            row.tally_calls_per_s,
            row.tally_commands_per_s,
            row.tally_command_p50_ms,
            row.tally_command_p99_ms,
        );
        if row.load == TALLY_LOADS[0].0 {
            let etcd_latency = match (row.etcd_call_p50_ms, row.etcd_step_p50_ms) {
                (Some(call), Some(step)) => {
                    format!("p50 {call:.2} ms per call ({step:.2} ms per step)")
                }
                _ => "-".into(),
            };
            println!(
                "| {} | 1 caller, latency | {etcd_latency} | p50 ~{:.2} ms per call (3 x {:.2} ms per command) | - |",
                row.variant,
                3.0 * row.tally_command_p50_ms,
                row.tally_command_p50_ms,
            );
        }
    }
    match etcd {
        EtcdSide::Skipped(why) => println!("etcd skipped: {why}"),
        EtcdSide::Ran(ran) => println!(
            "etcd {}; loopback gRPC round trip p50 {:.3} ms. Baselines, like with like: 1 caller against etcd's 1 caller; unary against etcd's best with a Txn per step; Batch against etcd's best of all (batched Txns).",
            ran.version, ran.round_trip_p50_ms
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        #[command(subcommand)]
        Compare(Target),
    }

    fn etcd_args(args: &[&str]) -> Result<EtcdArgs, clap::Error> {
        let all = ["tally-bench", "compare", "etcd"].iter().chain(args);
        Cli::try_parse_from(all).map(|cli| {
            let Command::Compare(Target::Etcd(args)) = cli.command;
            args
        })
    }

    #[test]
    fn compare_etcd_parses_its_sweep_and_refuses_batches_etcd_would_refuse() {
        let args = etcd_args(&[]).expect("defaults");
        assert_eq!(args.etcd_callers, [1, 16, 64, 256]);
        assert_eq!(args.etcd_batch, [1, 64]);
        assert_eq!((args.duration_s, args.skip_install), (10, false));
        let args = etcd_args(&[
            "--duration-s",
            "5",
            "--skip-install",
            "--etcd-callers",
            "4,8",
        ])
        .expect("parses");
        assert_eq!((args.duration_s, args.skip_install), (5, true));
        assert_eq!(args.etcd_callers, [4, 8]);
        assert!(
            etcd_args(&["--etcd-batch", "65"]).is_err(),
            "over --max-txn-ops"
        );
        assert!(etcd_args(&["--etcd-batch", "0"]).is_err());
    }

    fn row(load: &'static str, variant: &'static str, p50_ms: f64) -> Row {
        Row {
            variant,
            load,
            etcd_callers: None,
            etcd_max_batch: None,
            etcd_calls_per_s: None,
            etcd_call_p50_ms: None,
            etcd_step_p50_ms: None,
            tally_calls_per_s: 0.0,
            tally_commands_per_s: 0.0,
            tally_command_p50_ms: p50_ms,
            tally_command_p99_ms: p50_ms,
            ratio: None,
        }
    }

    #[test]
    fn the_one_caller_target_is_twice_fsync_plus_round_trip_judged_per_variant() {
        let one = TALLY_LOADS[0].0;
        let rows = [
            row(one, "hot family 10%", 0.30),
            row(one, "no hot family", 0.31),
            row(TALLY_LOADS[1].0, "hot family 10%", 9.0),
        ];
        let line = one_caller_target(&rows, 0.05, 0.1);
        assert!(line.contains("= 0.30 ms"), "{line}");
        assert!(line.contains("hot family 10% 0.30 ms (met)"), "{line}");
        assert!(line.contains("no hot family 0.31 ms (not met)"), "{line}");
        assert!(!line.contains("9.00"), "only the 1-caller rows: {line}");
    }
}
