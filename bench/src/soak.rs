//! `tally-bench soak`: three node processes under a fixed offered rate for a long time, each
//! node's resident memory and disk use sampled, written as CSV and JSON and drawn in a PNG.
//!
//! This is the test of a node that lives for months (docs/sizing.md): after the warm-up, is
//! every node's RSS flat and under its `memory_budget_bytes`, and how many disk bytes does a
//! command of history cost? The offered rate is printed next to the achieved one: a soak whose
//! cluster fell behind its schedule measured a lighter load than it says. `--full-speed`
//! drops the schedule: the callers send as fast as the cluster answers, the load a node's
//! memory must hold at its worst.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use tally_client::cli::bench::{drive_counted, BenchArgs, BenchReport};
use tally_client::{ClientConfig, TallyClient};

use crate::cluster::{self, ProcessCluster};
use crate::{breakdown, soak_chart};

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// Offered commands per second (a tool call is 3), on a fixed schedule.
    #[arg(long, default_value_t = 5_000.0, value_parser = tally_client::cli::bench::parse_rate)]
    rate: f64,
    /// No schedule: every caller sends its next call as soon as the last is answered (the
    /// cluster's full speed; set the callers with --concurrency).
    #[arg(long, conflicts_with = "rate")]
    full_speed: bool,
    /// Seconds under load, warm-up included.
    #[arg(long, default_value_t = 1_920)]
    duration_s: u64,
    /// Seconds at the start left out of the flatness figures (memory grows while the first
    /// retention window fills and caches warm).
    #[arg(long, default_value_t = 120)]
    warmup_s: u64,
    /// The cluster's retention, set through the log before the load (full events are kept this
    /// long past their `not_after_ms`, then compacted).
    #[arg(long, default_value_t = 600_000)]
    retention_ms: u64,
    /// Each node's `memory_budget_bytes` (default: the node's own default, 1 GiB).
    #[arg(long, default_value_t = 1 << 30)]
    memory_budget_bytes: u64,
    /// Commands per `Batch` (0: unary calls).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Callers: enough that the schedule, not the callers, sets the rate.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    #[arg(long, default_value_t = 1_000)]
    families: u64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    sample_every_s: u64,
    /// Stop the soak (keeping what was sampled) when a node's RSS passes this, so a node that
    /// does not hold its budget cannot take the machine down (default: 4 × the budget).
    #[arg(long)]
    stop_above_rss_bytes: Option<u64>,
    /// Run nothing: read a soak's CSV (one this command wrote) and write its summary, JSON and
    /// PNG under --out again, with this command's other settings as the run's.
    #[arg(long)]
    replot: Option<PathBuf>,
    /// Where `soak.csv`, `soak.json` and `soak.png` go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
    /// The tally-node binary (default: next to this one).
    #[arg(long)]
    node_binary: Option<PathBuf>,
    /// Parent of the nodes' temp data dir (default: the system temp dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Nodes listen on BASE+1..3; 0 picks free ports from 27,500 up.
    #[arg(long, default_value_t = 0)]
    base_port: u16,
}

/// The longest soak accepted: a week, sampled at most every 5 s, is ~121k samples per node.
const MAX_DURATION_S: u64 = 7 * 24 * 3_600;

/// One node at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub at_s: f64,
    pub node: usize,
    pub rss_bytes: u64,
    pub disk_bytes: u64,
    /// Commands decided in the whole cluster over the last sample period.
    pub commands_per_s: f64,
    /// CPU seconds (user + system) the node process has used since it started; 0 when
    /// unknown (a CSV from before this column).
    pub cpu_s: f64,
}

/// One node's figures after the warm-up.
#[derive(Debug, Serialize)]
pub struct NodeSummary {
    pub node: usize,
    pub rss_min_bytes: u64,
    pub rss_max_bytes: u64,
    pub rss_mean_bytes: u64,
    /// Half the min-to-max range as a share of the mean: "flat within ±x%".
    pub rss_spread_pct: f64,
    /// RSS growth per hour, by least squares over the samples after the warm-up.
    pub rss_slope_bytes_per_h: f64,
    pub under_budget: bool,
    pub disk_end_bytes: u64,
    pub disk_bytes_per_command: f64,
}

#[derive(Debug, Serialize)]
struct SoakReport {
    /// `None`: full speed, no schedule.
    offered_commands_per_s: Option<f64>,
    achieved_commands_per_s: f64,
    /// Commands decided: the load's count, or integrated from the samples when it stopped.
    commands: u64,
    retention_ms: u64,
    memory_budget_bytes: u64,
    warmup_s: u64,
    /// Why the soak stopped before its end (a node past `--stop-above-rss-bytes`).
    stopped: Option<String>,
    /// The load's own report (latency too), when it ran to its end.
    load: Option<BenchReport>,
    /// The nodes' CPU after the warm-up, the three summed.
    cpu: Option<ClusterCpu>,
    nodes: Vec<NodeSummary>,
}

/// The nodes' CPU per command decided after the warm-up: the cost of a committed command
/// on all replicas together, at this soak's load (docs/benchmarks.md).
#[derive(Debug, Serialize, PartialEq)]
pub struct ClusterCpu {
    pub seconds: f64,
    /// Cores busy on average: CPU seconds per second.
    pub cores: f64,
    pub commands: u64,
    pub us_per_command: f64,
}

impl SoakArgs {
    /// The offered rate, `None` at full speed.
    fn offered_rate(&self) -> Option<f64> {
        (!self.full_speed).then_some(self.rate)
    }
}

/// "offered N commands/s" or "full speed", for the printed lines and the chart's title.
fn offered_text(offered: Option<f64>) -> String {
    match offered {
        Some(rate) => format!("offered {rate:.0} commands/s"),
        None => "full speed (no schedule)".to_owned(),
    }
}

pub async fn run(args: SoakArgs) -> anyhow::Result<()> {
    if let Some(csv) = &args.replot {
        let samples = read_csv(csv)?;
        let out_csv = args.out.join("soak.csv");
        anyhow::ensure!(
            std::fs::canonicalize(csv).ok() != std::fs::canonicalize(&out_csv).ok(),
            "--replot {} would be overwritten: give another --out",
            csv.display()
        );
        return finish(&args, &samples, None, None);
    }
    anyhow::ensure!(
        (1..=MAX_DURATION_S).contains(&args.duration_s) && args.warmup_s < args.duration_s,
        "--duration-s must be 1..={MAX_DURATION_S} and longer than --warmup-s"
    );
    anyhow::ensure!(
        args.batch <= tally_api::MAX_BATCH_COMMANDS && args.concurrency > 0 && args.families > 0,
        "--batch is at most {}; --concurrency and --families are positive",
        tally_api::MAX_BATCH_COMMANDS
    );
    let binary = cluster::node_binary(
        args.node_binary.as_deref(),
        "cargo build --release -p tally-authority",
    )?;
    let temp = tempfile::tempdir_in(args.data_dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let base_port = match args.base_port {
        0 => cluster::free_base_port()?,
        chosen => chosen,
    };
    let settings = [(
        "TALLY_MEMORY_BUDGET_BYTES".to_owned(),
        args.memory_budget_bytes.to_string(),
    )];
    let cluster = ProcessCluster::start_with(&binary, temp.path(), 3, base_port, &settings).await?;
    cluster.set_retention_ms(args.retention_ms).await?;
    println!(
        "soak: 3 tally-node processes (async worker threads per node: {}) on {} (data in {}), \
         memory_budget_bytes {}, retention {} ms; {} (batch {}, {} callers, {} families) for {} s, \
         sampling every {} s",
        cluster.worker_threads,
        cluster.endpoints.join(", "),
        temp.path().display(),
        args.memory_budget_bytes,
        args.retention_ms,
        offered_text(args.offered_rate()),
        args.batch,
        args.concurrency,
        args.families,
        args.duration_s,
        args.sample_every_s,
    );
    let client = Arc::new(TallyClient::new(ClientConfig::new(
        cluster.endpoints.clone(),
        cluster.kernel.clone(),
    ))?);
    let bench = BenchArgs {
        families: args.families,
        hot_share: 0.1,
        denied_share: 0.0,
        concurrency: args.concurrency,
        duration_s: args.duration_s,
        batch: args.batch,
        rate: args.offered_rate(),
        quiet: true,
    };
    let decided = Arc::new(AtomicU64::new(0));
    let load = tokio::spawn({
        let decided = decided.clone();
        async move { drive_counted(client, &bench, decided).await }
    });
    let (samples, stopped) = sample_until_done(&cluster, &decided, &args, &load).await;
    let load = match stopped {
        Some(_) => {
            load.abort();
            None
        }
        None => Some(load.await?),
    };
    drop(cluster);
    finish(&args, &samples, load, stopped)
}

/// Writes the CSV, JSON and PNG of `samples` under `--out` and prints the summary; an error
/// after writing them when the soak was `stopped`.
fn finish(
    args: &SoakArgs,
    samples: &[Sample],
    load: Option<BenchReport>,
    stopped: Option<String>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let csv = args.out.join("soak.csv");
    write_csv(&csv, samples)?;
    let commands = load
        .as_ref()
        .map_or_else(|| integrated_commands(samples), |l| l.commands);
    let achieved = load.as_ref().map_or_else(
        || commands as f64 / samples.last().map_or(1.0, |s| s.at_s.max(1.0)),
        |l| l.commands_per_s,
    );
    let report = SoakReport {
        offered_commands_per_s: args.offered_rate(),
        achieved_commands_per_s: achieved,
        commands,
        retention_ms: args.retention_ms,
        memory_budget_bytes: args.memory_budget_bytes,
        warmup_s: args.warmup_s,
        stopped: stopped.clone(),
        load,
        cpu: cluster_cpu(samples, args.warmup_s),
        nodes: summarize(samples, args, commands),
    };
    let png = args.out.join("soak.png");
    soak_chart::draw(
        &png,
        samples,
        args.memory_budget_bytes,
        args.warmup_s,
        &format!(
            "tally-bench soak: {}, achieved {:.0} commands/s, retention {} s, batch {}{}",
            offered_text(report.offered_commands_per_s),
            report.achieved_commands_per_s,
            args.retention_ms / 1_000,
            args.batch,
            if report.stopped.is_some() {
                " (stopped early)"
            } else {
                ""
            }
        ),
    )?;
    let json = args.out.join("soak.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    print_report(&report);
    println!(
        "wrote {}, {} and {}",
        csv.display(),
        json.display(),
        png.display()
    );
    match stopped {
        Some(why) => anyhow::bail!("the soak stopped early: {why}"),
        None => Ok(()),
    }
}

/// Commands decided, from the sampled rates (for a soak whose load report was cut off).
fn integrated_commands(samples: &[Sample]) -> u64 {
    commands_after(samples.iter(), 1, 0.0) as u64
}

/// Commands decided after `from_s`, integrating `node`'s sampled rates: each sample's rate is
/// over the period that ends at it (from the sample before, or from `from_s`).
fn commands_after<'a>(samples: impl Iterator<Item = &'a Sample>, node: usize, from_s: f64) -> f64 {
    let mut by_time: Vec<(f64, f64)> = samples
        .filter(|s| s.node == node && s.at_s >= from_s)
        .map(|s| (s.at_s, s.commands_per_s))
        .collect();
    by_time.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut last_at = from_s;
    for (at_s, rate) in by_time {
        total += rate * (at_s - last_at);
        last_at = at_s;
    }
    total
}

/// Samples read back from a soak's CSV (`--replot`).
fn read_csv(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let mut samples = Vec::new();
    for (number, line) in text.lines().enumerate().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let parsed = (|| -> Option<Sample> {
            let (at_s, node, rss, disk, rate, cpu) = match fields.as_slice() {
                [at_s, node, rss, disk, rate, cpu] => {
                    (at_s, node, rss, disk, rate, cpu.parse().ok()?)
                }
                [at_s, node, rss, disk, rate] => (at_s, node, rss, disk, rate, 0.0),
                _ => return None,
            };
            Some(Sample {
                at_s: at_s.parse().ok()?,
                node: node.parse().ok()?,
                rss_bytes: rss.parse().ok()?,
                disk_bytes: disk.parse().ok()?,
                commands_per_s: rate.parse().ok()?,
                cpu_s: cpu,
            })
        })();
        samples.push(parsed.ok_or_else(|| {
            anyhow::anyhow!(
                "{} line {}: not at_s,node,rss_bytes,disk_bytes,commands_per_s[,cpu_s]",
                path.display(),
                number + 1
            )
        })?);
    }
    anyhow::ensure!(!samples.is_empty(), "{} holds no samples", path.display());
    Ok(samples)
}

/// Samples every node each period until the load task ends, printing a progress line; with
/// the reason when a node passed the RSS limit first.
async fn sample_until_done(
    cluster: &ProcessCluster,
    decided: &AtomicU64,
    args: &SoakArgs,
    load: &tokio::task::JoinHandle<BenchReport>,
) -> (Vec<Sample>, Option<String>) {
    let rss_limit = args
        .stop_above_rss_bytes
        .unwrap_or(args.memory_budget_bytes.saturating_mul(4));
    let start = Instant::now();
    let period = Duration::from_secs(args.sample_every_s);
    let nodes = cluster.nodes();
    let mut samples = Vec::new();
    let (mut last_at, mut last_decided) = (Instant::now(), 0u64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !load.is_finished() {
        tick.tick().await;
        if start.elapsed().as_secs_f64() > args.duration_s as f64 {
            break;
        }
        let now_decided = decided.load(Ordering::Relaxed);
        let rate = (now_decided - last_decided) as f64 / last_at.elapsed().as_secs_f64();
        (last_at, last_decided) = (Instant::now(), now_decided);
        let at_s = start.elapsed().as_secs_f64();
        let mut line = format!("{at_s:>6.0} s  {rate:>7.0} commands/s");
        for (index, ((pid, _), metrics_addr)) in nodes.iter().zip(&cluster.metrics).enumerate() {
            let rss_bytes = rss_bytes(*pid).unwrap_or(0);
            let cpu_s = cpu_seconds(*pid).unwrap_or(0.0);
            let disk_bytes = data_dir_bytes(metrics_addr).await;
            line.push_str(&format!(
                "  node {}: RSS {:>5} MB, disk {:>5} MB",
                index + 1,
                rss_bytes >> 20,
                disk_bytes >> 20
            ));
            samples.push(Sample {
                at_s,
                node: index + 1,
                rss_bytes,
                disk_bytes,
                commands_per_s: rate,
                cpu_s,
            });
        }
        println!("{line}");
        let over = samples
            .iter()
            .rev()
            .take(nodes.len())
            .find(|s| s.rss_bytes > rss_limit);
        if let Some(over) = over {
            let why = format!(
                "node {} RSS {} MB passed --stop-above-rss-bytes ({} MB) at {:.0} s",
                over.node,
                over.rss_bytes >> 20,
                rss_limit >> 20,
                over.at_s
            );
            return (samples, Some(why));
        }
    }
    (samples, None)
}

/// A process's resident set from `/proc/<pid>/status` (`VmRSS`, in kB).
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1_024)
}

/// The CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: count from the last `)`.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime), counted from 1 with the pid and name as 1 and 2.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the running system and touches no memory of ours.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_s > 0).then(|| ticks as f64 / per_s as f64)
}

/// The nodes' CPU from the first sample at or after the warm-up to the last, over the
/// commands decided meanwhile (the sampled rates, integrated); `None` without CPU figures or
/// with less than two samples after the warm-up.
fn cluster_cpu(samples: &[Sample], warmup_s: u64) -> Option<ClusterCpu> {
    let settled: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at_s >= warmup_s as f64)
        .collect();
    let first_at = settled.iter().map(|s| s.at_s).reduce(f64::min)?;
    let last_at = settled.iter().map(|s| s.at_s).reduce(f64::max)?;
    if last_at <= first_at || settled.iter().any(|s| s.cpu_s <= 0.0) {
        return None;
    }
    let mut seconds = 0.0;
    let mut nodes: Vec<usize> = settled.iter().map(|s| s.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    for node in &nodes {
        let at = |when: f64| {
            settled
                .iter()
                .find(|s| s.node == *node && s.at_s == when)
                .map(|s| s.cpu_s)
        };
        seconds += at(last_at)? - at(first_at)?;
    }
    // The periods after `first_at`: the first sample's own period is before it.
    let commands = commands_after(settled.iter().copied(), nodes[0], first_at);
    Some(ClusterCpu {
        seconds,
        cores: seconds / (last_at - first_at),
        commands: commands as u64,
        us_per_command: seconds * 1e6 / commands.max(1.0),
    })
}

/// What a node's data dir uses on disk, as the node measures it for its quota
/// (`tally_data_dir_bytes`, every `disk_check_interval_ms`, each file once however many names
/// it has); 0 when the node does not answer.
async fn data_dir_bytes(metrics_addr: &str) -> u64 {
    let text = breakdown::scrape(metrics_addr).await.unwrap_or_default();
    data_dir_bytes_in(&text).unwrap_or(0)
}

/// `tally_data_dir_bytes` out of a Prometheus text exposition.
fn data_dir_bytes_in(text: &str) -> Option<u64> {
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix("tally_data_dir_bytes "))?;
    value.trim().parse::<f64>().ok().map(|bytes| bytes as u64)
}

fn write_csv(path: &Path, samples: &[Sample]) -> anyhow::Result<()> {
    let mut text = String::from("at_s,node,rss_bytes,disk_bytes,commands_per_s,cpu_s\n");
    for s in samples {
        text.push_str(&format!(
            "{:.1},{},{},{},{:.0},{:.2}\n",
            s.at_s, s.node, s.rss_bytes, s.disk_bytes, s.commands_per_s, s.cpu_s
        ));
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn summarize(samples: &[Sample], args: &SoakArgs, commands: u64) -> Vec<NodeSummary> {
    let mut nodes: Vec<usize> = samples.iter().map(|s| s.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
        .into_iter()
        .map(|node| {
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.node == node).collect();
            let settled: Vec<&Sample> = mine
                .iter()
                .copied()
                .filter(|s| s.at_s >= args.warmup_s as f64)
                .collect();
            let settled = if settled.is_empty() {
                mine.clone()
            } else {
                settled
            };
            summarize_node(node, &settled, mine.last().copied(), args, commands)
        })
        .collect()
}

fn summarize_node(
    node: usize,
    settled: &[&Sample],
    last: Option<&Sample>,
    args: &SoakArgs,
    commands: u64,
) -> NodeSummary {
    let rss: Vec<f64> = settled.iter().map(|s| s.rss_bytes as f64).collect();
    let (min, max) = rss
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let mean = rss.iter().sum::<f64>() / rss.len().max(1) as f64;
    let times: Vec<f64> = settled.iter().map(|s| s.at_s).collect();
    let disk_end_bytes = last.map_or(0, |s| s.disk_bytes);
    NodeSummary {
        node,
        rss_min_bytes: if rss.is_empty() { 0 } else { min as u64 },
        rss_max_bytes: max as u64,
        rss_mean_bytes: mean as u64,
        rss_spread_pct: if mean > 0.0 {
            (max - min) / 2.0 / mean * 100.0
        } else {
            0.0
        },
        rss_slope_bytes_per_h: slope_per_s(&times, &rss) * 3_600.0,
        under_budget: max as u64 <= args.memory_budget_bytes,
        disk_end_bytes,
        disk_bytes_per_command: disk_end_bytes as f64 / commands.max(1) as f64,
    }
}

/// Least-squares slope of `ys` against `xs` (0 with fewer than two distinct x).
fn slope_per_s(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return 0.0;
    }
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

fn print_report(report: &SoakReport) {
    match &report.load {
        Some(load) => println!(
            "{}, achieved {:.0} commands/s ({} commands, {} errors; per command p50 {:.2} ms, p99 {:.2} ms, max {:.0} ms)",
            offered_text(report.offered_commands_per_s),
            report.achieved_commands_per_s,
            load.commands,
            load.errors,
            load.p50_ms,
            load.p99_ms,
            load.max_ms,
        ),
        None => println!(
            "{}, achieved {:.0} commands/s (~{} commands from the sampled rates; no latency figures)",
            offered_text(report.offered_commands_per_s),
            report.achieved_commands_per_s,
            report.commands
        ),
    }
    if let Some(cpu) = &report.cpu {
        println!(
            "nodes' CPU after the warm-up: {:.2} cores, {:.1} µs per command decided ({:.0} CPU s for {} commands, 3 replicas summed)",
            cpu.cores, cpu.us_per_command, cpu.seconds, cpu.commands
        );
    }
    println!(
        "after the {} s warm-up (budget {} MB per node):",
        report.warmup_s,
        report.memory_budget_bytes >> 20
    );
    for node in &report.nodes {
        println!(
            "  node {}: RSS {}..{} MB (mean {} MB, flat within ±{:.1}%, trend {:+.0} MB/h), {} budget; disk {} MB at the end, {:.0} B per command",
            node.node,
            node.rss_min_bytes >> 20,
            node.rss_max_bytes >> 20,
            node.rss_mean_bytes >> 20,
            node.rss_spread_pct,
            node.rss_slope_bytes_per_h / 1_048_576.0,
            if node.under_budget { "under its" } else { "OVER its" },
            node.disk_end_bytes >> 20,
            node.disk_bytes_per_command,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_and_spread_are_what_the_samples_say() {
        assert_eq!(slope_per_s(&[0.0, 1.0, 2.0], &[10.0, 12.0, 14.0]), 2.0);
        assert_eq!(slope_per_s(&[5.0], &[1.0]), 0.0);
        assert_eq!(slope_per_s(&[1.0, 1.0], &[1.0, 3.0]), 0.0);
        let samples: Vec<Sample> = [(0.0, 50), (10.0, 90), (20.0, 110), (30.0, 100)]
            .into_iter()
            .map(|(at_s, mb)| Sample {
                at_s,
                node: 1,
                rss_bytes: mb << 20,
                disk_bytes: 1_000,
                commands_per_s: 1.0,
                cpu_s: 0.0,
            })
            .collect();
        let args = SoakArgs {
            warmup_s: 10,
            memory_budget_bytes: 100 << 20,
            ..parse(&[])
        };
        let summary = summarize(&samples, &args, 100);
        assert_eq!(summary.len(), 1);
        let node = &summary[0];
        assert_eq!(
            (
                node.rss_min_bytes >> 20,
                node.rss_max_bytes >> 20,
                node.rss_mean_bytes >> 20
            ),
            (90, 110, 100),
            "the warm-up sample is left out"
        );
        assert!(
            (node.rss_spread_pct - 10.0).abs() < 1e-9,
            "{}",
            node.rss_spread_pct
        );
        assert!(!node.under_budget, "110 MB is over a 100 MB budget");
        assert_eq!(node.disk_bytes_per_command, 10.0);
    }

    #[test]
    fn the_data_dir_s_bytes_are_read_from_the_node_s_metrics() {
        let text = "# TYPE tally_data_dir_bytes gauge\ntally_data_dir_bytes_total 1\n\
                    tally_data_dir_bytes 4657000000\ntally_disk_free_bytes 9\n";
        assert_eq!(data_dir_bytes_in(text), Some(4_657_000_000));
        assert_eq!(data_dir_bytes_in("tally_disk_free_bytes 9\n"), None);
    }

    /// Two nodes sampled every 10 s at 1,000 commands/s: after a warm-up of 10 s, 20 s of
    /// load (20,000 commands) cost node 1 4 s and node 2 6 s of CPU: 0.5 cores, 500 µs.
    #[test]
    fn the_cpu_per_command_counts_from_the_first_sample_after_the_warm_up() {
        let sample = |at_s: f64, node: usize, cpu_s: f64| Sample {
            at_s,
            node,
            rss_bytes: 1,
            disk_bytes: 1,
            commands_per_s: 1_000.0,
            cpu_s,
        };
        let samples = [
            sample(0.0, 1, 0.5),
            sample(0.0, 2, 0.5),
            sample(10.0, 1, 3.0),
            sample(10.0, 2, 2.0),
            sample(20.0, 1, 5.0),
            sample(20.0, 2, 5.0),
            sample(30.0, 1, 7.0),
            sample(30.0, 2, 8.0),
        ];
        assert_eq!(
            cluster_cpu(&samples, 10),
            Some(ClusterCpu {
                seconds: 10.0,
                cores: 0.5,
                commands: 20_000,
                us_per_command: 500.0,
            })
        );
        assert_eq!(cluster_cpu(&samples, 30), None, "one sample is no interval");
        let unknown = [sample(0.0, 1, 0.0), sample(10.0, 1, 0.0)];
        assert_eq!(cluster_cpu(&unknown, 0), None, "no CPU column");
    }

    #[test]
    fn the_process_s_own_cpu_is_read() {
        let start = cpu_seconds(std::process::id()).expect("this process has a stat");
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let used = cpu_seconds(std::process::id()).expect("still") - start;
        assert!(used >= 0.1, "300 ms of spinning counted {used} s");
    }

    #[test]
    fn the_process_s_own_rss_is_read() {
        let rss = rss_bytes(std::process::id()).expect("this process has a VmRSS");
        assert!(rss > 1 << 20, "{rss}");
    }

    fn try_parse(args: &[&str]) -> Result<SoakArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            soak: SoakArgs,
        }
        let all = ["soak"].iter().chain(args);
        <Cli as clap::Parser>::try_parse_from(all).map(|cli| cli.soak)
    }

    fn parse(args: &[&str]) -> SoakArgs {
        try_parse(args).expect("parses")
    }

    #[test]
    fn a_csv_reads_back_as_written_and_bad_lines_say_where() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("soak.csv");
        let samples: Vec<Sample> = (1..=3)
            .map(|i| Sample {
                at_s: f64::from(i) * 5.0,
                node: 1,
                rss_bytes: 1 << 20,
                disk_bytes: 2 << 20,
                commands_per_s: 100.0,
                cpu_s: f64::from(i),
            })
            .collect();
        write_csv(&path, &samples).expect("written");
        let read = read_csv(&path).expect("read back");
        assert_eq!(read.len(), 3);
        assert_eq!((read[2].at_s, read[2].rss_bytes), (15.0, 1 << 20));
        assert_eq!(integrated_commands(&read), 1_500, "100/s over 15 s");
        assert_eq!(read[2].cpu_s, 3.0);
        std::fs::write(
            &path,
            "at_s,node,rss_bytes,disk_bytes,commands_per_s\n5,1,2,3,4\n",
        )
        .expect("written");
        let old = read_csv(&path).expect("a CSV from before the cpu_s column");
        assert_eq!((old[0].commands_per_s, old[0].cpu_s), (4.0, 0.0));
        std::fs::write(
            &path,
            "at_s,node,rss_bytes,disk_bytes,commands_per_s\n1,x,2,3,4\n",
        )
        .expect("written");
        let error = read_csv(&path).expect_err("a bad node").to_string();
        assert!(error.contains("line 2"), "{error}");
    }

    #[test]
    fn defaults_are_the_issue_s_soak() {
        let args = parse(&[]);
        assert_eq!(
            (args.rate, args.retention_ms, args.warmup_s),
            (5_000.0, 600_000, 120)
        );
        assert_eq!(
            args.duration_s, 1_920,
            "32 minutes: 2 of warm-up and 30 measured"
        );
        assert_eq!(args.offered_rate(), Some(5_000.0));
    }

    #[test]
    fn full_speed_drops_the_schedule_and_refuses_a_rate_beside_it() {
        let args = parse(&["--full-speed"]);
        assert_eq!(args.offered_rate(), None);
        assert_eq!(
            offered_text(args.offered_rate()),
            "full speed (no schedule)"
        );
        assert_eq!(
            offered_text(parse(&["--rate", "2000"]).offered_rate()),
            "offered 2000 commands/s"
        );
        assert!(try_parse(&["--full-speed", "--rate", "2000"]).is_err());
    }
}
