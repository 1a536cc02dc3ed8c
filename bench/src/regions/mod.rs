//! `tally-bench regions`: five voters in three regions (east 2, central 2, west 1) with real
//! delay between them, callers in every region, and the leader's whole region cut off.
//!
//! Every node and each region's callers get a network namespace of their own; a router
//! namespace joins them and holds each packet for its pair's one-way delay (`delay_router`,
//! user space, since this machine has no `netem`): round trips of 30 ms east–central, 60 ms
//! central–west, 90 ms east–west and ~1 ms within a region. Needs root, `ip` and
//! /dev/net/tun. It prints and saves (JSON and a PNG under `--out`):
//!
//! 1. the round trips the router gives, measured (TCP connects);
//! 2. write (authorize) and linearizable read (`GetEvent`) latency p50/p99 per caller region,
//!    with the leader in its preferred region, east;
//! 3. the failover: the leader's region is cut off under load, then healed: when a new leader
//!    is elected and where, the first commit of its term, when leadership is back in east,
//!    every acknowledged write read back (lost: must be 0) and the shared budget's exposure
//!    against its limit (overspend: must be none).

mod chart;
mod delay_router;
mod load;
mod nodes;
mod topology;

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use nodes::{ClusterView, NodeHost, RegionCluster, WanTimeouts};
use topology::Topology;

const REGIONS: [&str; 3] = ["east", "central", "west"];
/// Voters per region: a majority of five needs two regions, whichever is lost.
const NODES_PER_REGION: [usize; 3] = [2, 2, 1];
/// Round trips between regions, ms (the diagonal: between two hosts of one region).
const ROUND_TRIP_MS: [[f64; 3]; 3] = [[1.0, 30.0, 90.0], [30.0, 1.0, 60.0], [90.0, 60.0, 1.0]];
/// Load before the cut, seconds.
const BEFORE_CUT_S: f64 = 10.0;
/// Calls in the latency load that only warm connections up.
const WARM_UP: Duration = Duration::from_secs(3);

#[derive(Debug, clap::Args)]
pub struct RegionsArgs {
    /// The tally-node binary (default: next to this one).
    #[arg(long)]
    node_binary: Option<PathBuf>,
    /// Where the nodes keep their data (default: a temp dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Where regions.json, regions-failover.png and each node's log go.
    #[arg(long, default_value = "target/regions")]
    out: PathBuf,
    /// Concurrent callers in each region (1 to 256).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    callers_per_region: u16,
    /// Seconds of the latency load, after 3 s of warm-up.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    latency_s: u64,
    /// Seconds the leader's region stays cut off.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    cut_s: u64,
    /// Seconds of load after the region is healed.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    after_heal_s: u64,
    /// Authorizes the shared budget allows in all (each asks for 100 units): small enough
    /// that the failover load runs into the limit, so overspend is tested.
    #[arg(long, default_value_t = 3_000)]
    shared_limit_calls: u64,
    /// Raft heartbeat for the WAN: openraft gives each heartbeat and each append this long to
    /// be answered, so it must exceed the widest round trip (90 ms here) with room for a busy
    /// follower; at 100 ms the west node fell behind and never caught up.
    #[arg(long, default_value_t = 200)]
    heartbeat_interval_ms: u64,
    #[arg(long, default_value_t = 1_000)]
    election_timeout_min_ms: u64,
    #[arg(long, default_value_t = 1_500)]
    election_timeout_max_ms: u64,
}

/// Latency of one caller region, ms.
#[derive(Debug, serde::Serialize)]
struct RegionFigures {
    region: String,
    writes: u64,
    write_p50_ms: f64,
    write_p99_ms: f64,
    reads: u64,
    read_p50_ms: f64,
    read_p99_ms: f64,
    failed: u64,
}

#[derive(Debug, serde::Serialize)]
struct Failover {
    leader_before: u64,
    cut_region: String,
    /// From the cut to the first sample that found a leader outside the cut region.
    new_leader_after_s: Option<f64>,
    new_leader: Option<u64>,
    new_leader_region: Option<String>,
    /// From the cut to the first acknowledged write of a later term.
    first_commit_after_s: Option<f64>,
    /// From healing to the first sample with the leader back in the preferred region.
    back_in_preferred_after_heal_s: Option<f64>,
    /// Per caller region: acknowledged, unknown after resolving, unavailable.
    acknowledged: Vec<(String, usize, u64, u64)>,
    audit: load::Audit,
    overspent: bool,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    regions: Vec<String>,
    nodes_per_region: Vec<usize>,
    round_trip_ms_configured: Vec<Vec<f64>>,
    /// Caller region × node region, min of 5 TCP connects.
    round_trip_ms_measured: Vec<Vec<f64>>,
    timeouts: WanTimeouts,
    callers_per_region: u16,
    latency: Vec<RegionFigures>,
    /// The latency target: a write from the leader's region within the round trip to the
    /// nearest other region + 5 ms at p50.
    leader_region_write_target_ms: f64,
    failover: Failover,
    /// 3 × the maximum election timeout.
    first_commit_target_s: f64,
}

/// Waits for a namespace thread and passes its error on.
fn finish<T>(handle: JoinHandle<anyhow::Result<T>>) -> anyhow::Result<T> {
    handle
        .join()
        .map_err(|_| anyhow::anyhow!("a thread of the regions bench panicked"))?
}

fn ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1_000.0
}

pub fn run(args: RegionsArgs) -> anyhow::Result<()> {
    if let Some(reason) = topology::unavailable() {
        anyhow::bail!("tally-bench regions cannot run on this machine: {reason}");
    }
    anyhow::ensure!(
        args.heartbeat_interval_ms > 0
            && args.election_timeout_min_ms > 2 * args.heartbeat_interval_ms
            && args.election_timeout_max_ms > args.election_timeout_min_ms,
        "need 0 < 2 × heartbeat < election timeout min < max"
    );
    let binary = crate::cluster::node_binary(
        args.node_binary.as_deref(),
        "cargo build --release -p tally-authority",
    )?;
    std::fs::create_dir_all(&args.out)?;
    let temp = tempfile::tempdir_in(args.data_dir.clone().unwrap_or_else(std::env::temp_dir))?;

    // Hosts 1..=5 are the nodes, 6..=8 each region's callers.
    let node_regions: Vec<usize> = NODES_PER_REGION
        .iter()
        .enumerate()
        .flat_map(|(region, count)| std::iter::repeat_n(region, *count))
        .collect();
    let host_regions: Vec<usize> = node_regions
        .iter()
        .copied()
        .chain(0..REGIONS.len())
        .collect();
    let one_way = ROUND_TRIP_MS
        .iter()
        .map(|row| {
            row.iter()
                .map(|rtt| Duration::from_secs_f64(rtt / 2_000.0))
                .collect()
        })
        .collect();
    let topology = Topology::build(&host_regions, one_way)?;
    let callers_ns = |region: usize| {
        topology.hosts[node_regions.len() + region]
            .namespace
            .clone()
    };
    let timeouts = WanTimeouts {
        heartbeat_interval_ms: args.heartbeat_interval_ms,
        election_timeout_min_ms: args.election_timeout_min_ms,
        election_timeout_max_ms: args.election_timeout_max_ms,
    };
    let node_hosts: Vec<NodeHost> = topology.hosts[..node_regions.len()]
        .iter()
        .enumerate()
        .map(|(index, host)| NodeHost {
            id: index as u64 + 1,
            host: host.clone(),
            region: REGIONS[host.region].to_owned(),
        })
        .collect();
    println!(
        "regions: {} (voters {:?}); round trips east–central {} ms, central–west {} ms, east–west {} ms",
        REGIONS.join(", "),
        NODES_PER_REGION,
        ROUND_TRIP_MS[0][1],
        ROUND_TRIP_MS[1][2],
        ROUND_TRIP_MS[0][2]
    );
    println!(
        "timeouts: heartbeat {} ms, election {}–{} ms",
        timeouts.heartbeat_interval_ms,
        timeouts.election_timeout_min_ms,
        timeouts.election_timeout_max_ms
    );
    let cluster = RegionCluster::start(&binary, temp.path(), &args.out, node_hosts, timeouts)?;
    let view = cluster.view.clone();
    let preferred: Vec<String> = REGIONS.iter().map(|r| (*r).to_owned()).collect();
    {
        let (view, preferred) = (view.clone(), preferred.clone());
        let leader = finish(topology::run_in(&callers_ns(0), move || async move {
            view.initialize(&preferred).await?;
            view.wait_leader_in(REGIONS[0], Duration::from_secs(60))
                .await
        }))?;
        println!("cluster up, leader node {leader} in {}", REGIONS[0]);
    }

    let measured_rtt = measure_round_trips(&view, &callers_ns)?;
    println!("measured round trips (TCP connect, min of 5), caller region × node region, ms:");
    for (region, row) in measured_rtt.iter().enumerate() {
        let cells: Vec<String> = row.iter().map(|rtt| format!("{rtt:>6.1}")).collect();
        println!("  {:<8} {}", REGIONS[region], cells.join(" "));
    }

    let latency = latency_phase(&args, &cluster, &callers_ns)?;
    println!(
        "latency, {} callers per region, {} s (write = authorize, read = linearizable GetEvent):",
        args.callers_per_region, args.latency_s
    );
    println!("  region    writes  write p50  write p99   read p50   read p99  failed");
    for f in &latency {
        println!(
            "  {:<8} {:>7} {:>8.1} ms {:>7.1} ms {:>7.1} ms {:>7.1} ms {:>7}",
            f.region,
            f.writes,
            f.write_p50_ms,
            f.write_p99_ms,
            f.read_p50_ms,
            f.read_p99_ms,
            f.failed
        );
    }
    let target_ms = measured_rtt[0][1] + 5.0;
    println!(
        "  target: a write from east within the round trip to central + 5 ms = {target_ms:.1} ms at p50: {}",
        if latency[0].write_p50_ms <= target_ms { "met" } else { "not met" }
    );

    let (failover, timeline) = failover_phase(&args, &topology, &cluster, &callers_ns)?;
    let first_commit_target_s = 3.0 * args.election_timeout_max_ms as f64 / 1_000.0;
    print_failover(&failover, first_commit_target_s);
    let title = format!(
        "5 voters in 3 regions (30/60/90 ms): leader's region {} cut off for {} s, {} callers per region",
        failover.cut_region, args.cut_s, args.callers_per_region
    );
    let png = args.out.join("regions-failover.png");
    chart::draw(
        &png,
        &chart::Timeline {
            regions: &REGIONS,
            acked_at_s: timeline.acked_at_s,
            leader: &timeline.leader,
            cut_at_s: BEFORE_CUT_S,
            heal_at_s: BEFORE_CUT_S + args.cut_s as f64,
            end_s: timeline.end_s,
            title: &title,
        },
    )?;
    let report = Report {
        regions: preferred,
        nodes_per_region: NODES_PER_REGION.to_vec(),
        round_trip_ms_configured: ROUND_TRIP_MS.iter().map(|r| r.to_vec()).collect(),
        round_trip_ms_measured: measured_rtt,
        timeouts,
        callers_per_region: args.callers_per_region,
        latency,
        leader_region_write_target_ms: target_ms,
        failover,
        first_commit_target_s,
    };
    let json = args.out.join("regions.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {} and {}", json.display(), png.display());
    drop(cluster);
    drop(topology);
    anyhow::ensure!(
        report.failover.audit.lost == 0 && !report.failover.overspent,
        "acknowledged writes were lost or the shared budget was overspent"
    );
    Ok(())
}

/// Min of 5 TCP connects from each region's callers to each node, by node region.
fn measure_round_trips(
    view: &ClusterView,
    callers_ns: &dyn Fn(usize) -> String,
) -> anyhow::Result<Vec<Vec<f64>>> {
    let mut matrix = Vec::new();
    for region in 0..REGIONS.len() {
        let nodes: Vec<(usize, String)> = view
            .nodes
            .iter()
            .map(|n| (n.host.region, n.endpoint()))
            .collect();
        let row = finish(topology::run_in(&callers_ns(region), move || async move {
            let mut best = vec![f64::INFINITY; REGIONS.len()];
            for (node_region, address) in nodes {
                for _ in 0..5 {
                    let began = Instant::now();
                    tokio::net::TcpStream::connect(&address).await?;
                    let rtt = began.elapsed().as_secs_f64() * 1_000.0;
                    best[node_region] = best[node_region].min(rtt);
                }
            }
            Ok(best)
        }))?;
        matrix.push(row);
    }
    Ok(matrix)
}

fn latency_phase(
    args: &RegionsArgs,
    cluster: &RegionCluster,
    callers_ns: &dyn Fn(usize) -> String,
) -> anyhow::Result<Vec<RegionFigures>> {
    let measure_from = Instant::now() + WARM_UP;
    let until = measure_from + Duration::from_secs(args.latency_s);
    let callers = usize::from(args.callers_per_region);
    let handles: Vec<_> = (0..REGIONS.len())
        .map(|region| {
            let (endpoints, transport) = (cluster.view.endpoints(), cluster.kernel.clone());
            topology::run_in(&callers_ns(region), move || async move {
                let client = load::client(endpoints, transport, REGIONS[region])?;
                load::latency(
                    client,
                    REGIONS[region].to_owned(),
                    callers,
                    measure_from,
                    until,
                )
                .await
            })
        })
        .collect();
    let mut figures = Vec::new();
    for (region, handle) in handles.into_iter().enumerate() {
        let measured = finish(handle)?;
        figures.push(RegionFigures {
            region: REGIONS[region].to_owned(),
            writes: measured.writes.len(),
            write_p50_ms: ms(&measured.writes, 0.5),
            write_p99_ms: ms(&measured.writes, 0.99),
            reads: measured.reads.len(),
            read_p50_ms: ms(&measured.reads, 0.5),
            read_p99_ms: ms(&measured.reads, 0.99),
            failed: measured.failed,
        });
    }
    Ok(figures)
}

/// What the chart needs of the failover.
struct FailoverTimeline {
    acked_at_s: Vec<Vec<f64>>,
    leader: Vec<(f64, Option<usize>)>,
    end_s: f64,
}

fn failover_phase(
    args: &RegionsArgs,
    topology: &Topology,
    cluster: &RegionCluster,
    callers_ns: &dyn Fn(usize) -> String,
) -> anyhow::Result<(Failover, FailoverTimeline)> {
    let view = cluster.view.clone();
    let (leader_before, term_before) = {
        let view = view.clone();
        finish(topology::run_in(&callers_ns(0), move || async move {
            view.leader(Duration::from_secs(2))
                .await
                .ok_or_else(|| anyhow::anyhow!("no leader before the cut"))
        }))?
    };
    let cut_region = view
        .region_index(leader_before)
        .expect("the leader is a node of the view");
    let watch_region = (0..REGIONS.len())
        .find(|r| *r != cut_region)
        .expect("three regions");
    let heal_at_s = BEFORE_CUT_S + args.cut_s as f64;
    let end_s = heal_at_s + args.after_heal_s as f64;
    let limit_units = args.shared_limit_calls.saturating_mul(load::UNITS_PER_CALL);
    let callers = usize::from(args.callers_per_region);
    let epoch = Instant::now();
    let until = epoch + Duration::from_secs_f64(end_s);
    let writers: Vec<_> = (0..REGIONS.len())
        .map(|region| {
            let (endpoints, transport) = (view.endpoints(), cluster.kernel.clone());
            topology::run_in(&callers_ns(region), move || async move {
                let client = load::client(endpoints, transport, REGIONS[region])?;
                load::failover(client, callers, limit_units, epoch, until).await
            })
        })
        .collect();
    let watcher = {
        let view = view.clone();
        topology::run_in(&callers_ns(watch_region), move || async move {
            let mut samples = Vec::new();
            while epoch.elapsed() < Duration::from_secs_f64(end_s) {
                let leader = view.leader(Duration::from_millis(300)).await;
                samples.push((
                    epoch.elapsed().as_secs_f64(),
                    leader.and_then(|(id, _)| view.region_index(id)),
                    leader.map(|(id, _)| id),
                ));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(samples)
        })
    };
    std::thread::sleep(Duration::from_secs_f64(BEFORE_CUT_S));
    topology.control.cut_off(cut_region);
    println!(
        "cut off {} (leader node {leader_before}, term {term_before})",
        REGIONS[cut_region]
    );
    std::thread::sleep(Duration::from_secs(args.cut_s));
    topology.control.heal();
    println!("healed {}", REGIONS[cut_region]);
    let mut loads = Vec::new();
    for writer in writers {
        loads.push(finish(writer)?);
    }
    let samples = finish(watcher)?;
    let acked: Vec<load::Acked> = loads.iter().flat_map(|l| l.acked.iter().cloned()).collect();
    let audit = {
        let (endpoints, transport) = (view.endpoints(), cluster.kernel.clone());
        let acked = acked.clone();
        finish(topology::run_in(
            &callers_ns(watch_region),
            move || async move {
                let client = load::client(endpoints, transport, REGIONS[watch_region])?;
                load::audit(client, acked, limit_units).await
            },
        ))?
    };
    let after_cut = samples
        .iter()
        .find(|(at, region, _)| *at > BEFORE_CUT_S && region.is_some_and(|r| r != cut_region));
    let first_commit_after_s = acked
        .iter()
        .filter(|a| a.term > term_before && a.at_s > BEFORE_CUT_S)
        .map(|a| a.at_s - BEFORE_CUT_S)
        .fold(None, |best: Option<f64>, at| {
            Some(best.map_or(at, |b| b.min(at)))
        });
    let back = samples
        .iter()
        .find(|(at, region, _)| *at > heal_at_s && *region == Some(0))
        .map(|(at, _, _)| at - heal_at_s);
    let overspent = audit.overspent();
    let failover = Failover {
        leader_before,
        cut_region: REGIONS[cut_region].to_owned(),
        new_leader_after_s: after_cut.map(|(at, _, _)| at - BEFORE_CUT_S),
        new_leader: after_cut.and_then(|(_, _, id)| *id),
        new_leader_region: after_cut.and_then(|(_, r, _)| r.map(|r| REGIONS[r].to_owned())),
        first_commit_after_s,
        back_in_preferred_after_heal_s: back,
        acknowledged: loads
            .iter()
            .enumerate()
            .map(|(r, l)| {
                (
                    REGIONS[r].to_owned(),
                    l.acked.len(),
                    l.unknown,
                    l.unavailable,
                )
            })
            .collect(),
        audit,
        overspent,
    };
    let timeline = FailoverTimeline {
        acked_at_s: loads
            .iter()
            .map(|l| l.acked.iter().map(|a| a.at_s).collect())
            .collect(),
        leader: samples
            .iter()
            .map(|(at, region, _)| (*at, *region))
            .collect(),
        end_s,
    };
    Ok((failover, timeline))
}

fn print_failover(f: &Failover, first_commit_target_s: f64) {
    let secs = |value: Option<f64>| value.map_or("never".to_owned(), |s| format!("{s:.2} s"));
    println!(
        "failover: {} (leader node {}) cut off",
        f.cut_region, f.leader_before
    );
    println!(
        "  new leader: node {} in {} after {}",
        f.new_leader.map_or("-".to_owned(), |id| id.to_string()),
        f.new_leader_region.as_deref().unwrap_or("-"),
        secs(f.new_leader_after_s)
    );
    println!(
        "  first commit of a later term after {} (target {first_commit_target_s:.1} s = 3 × election timeout max: {})",
        secs(f.first_commit_after_s),
        if f.first_commit_after_s.is_some_and(|s| s <= first_commit_target_s) { "met" } else { "not met" }
    );
    println!(
        "  leadership back in east {} after healing (target 10 s: {})",
        secs(f.back_in_preferred_after_heal_s),
        if f.back_in_preferred_after_heal_s.is_some_and(|s| s <= 10.0) {
            "met"
        } else {
            "not met"
        }
    );
    for (region, acked, unknown, unavailable) in &f.acknowledged {
        println!("  callers in {region:<8} {acked} acknowledged, {unknown} unknown, {unavailable} unavailable");
    }
    println!(
        "  acknowledged writes read back: {} of {}, lost {} (must be 0)",
        f.audit.acknowledged - f.audit.lost,
        f.audit.acknowledged,
        f.audit.lost
    );
    println!(
        "  shared budget: {} units exposed of {} ({} authorizes acknowledged): {}",
        f.audit.exposed_units,
        f.audit.limit_units,
        f.audit.authorized_acknowledged,
        if f.overspent {
            "OVERSPENT"
        } else {
            "no overspend"
        }
    );
}
