//! Where a command's time goes, stage by stage: each node's `/metrics` carries openraft's
//! per-entry lifecycle percentiles when the node is built with `--features stage-stats`
//! (`tally_raft_stage_latency_microseconds{stage,quantile}`); this scrapes them over plain
//! HTTP/1.1 and prints the leader's gaps next to the client's latency and the disk's fsync.
//! Every build also reports the spans of a write on the node that served it
//! (`tally_write_span_microseconds{span,quantile}`): the request handler, the proposer's call
//! inside it and Raft's `client_write` inside that, so the time outside openraft is split too.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const STAGE_METRIC: &str = "tally_raft_stage_latency_microseconds";
const SAMPLES_METRIC: &str = "tally_raft_stage_samples";
const LEADER_METRIC: &str = "tally_raft_is_leader";
const SPAN_METRIC: &str = "tally_write_span_microseconds";
const SPAN_SAMPLES_METRIC: &str = "tally_write_span_samples";
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The gaps, in pipeline order, with what each one is made of.
pub const STAGES: [(&str, &str, &str); 6] = [
    (
        "proposed_to_received",
        "proposed→received",
        "API channel to the core",
    ),
    (
        "received_to_submitted",
        "received→submitted",
        "core: engine to log store",
    ),
    (
        "submitted_to_persisted",
        "submitted→persisted",
        "the leader's own fsync",
    ),
    (
        "persisted_to_committed",
        "persisted→committed",
        "replication + follower fsync + quorum",
    ),
    ("committed_to_applied", "committed→applied", "apply"),
    (
        "proposed_to_applied",
        "proposed→applied",
        "all of the above",
    ),
];

/// A write's spans on the node that served it, outermost first, with what each holds.
pub const SPANS: [(&str, &str); 3] = [
    (
        "handler",
        "the request handler: checks, reply built (holds propose)",
    ),
    (
        "propose",
        "the proposer: coalescing queue, shedding check (holds client_write)",
    ),
    (
        "client_write",
        "Raft's client_write: openraft's stages, the apply's answer",
    ),
];

/// One stage-to-stage gap on one node, in microseconds.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Gap {
    pub p50_us: f64,
    pub p99_us: f64,
    /// Log entries the percentiles are over.
    pub samples: u64,
}

/// What one node's `/metrics` says about its stages.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize)]
pub struct NodeStages {
    pub node_id: u64,
    pub leader: bool,
    /// By the `stage` label (`submitted_to_persisted`, ...); empty without `stage-stats`.
    pub gaps: BTreeMap<String, Gap>,
    /// By the `span` label (`handler`, `propose`, `client_write`), over recent writes.
    pub spans: BTreeMap<String, Gap>,
}

/// `GET /metrics` from `addr` (host:port), the body as text.
pub async fn scrape(addr: &str) -> anyhow::Result<String> {
    tokio::time::timeout(SCRAPE_TIMEOUT, async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let response = String::from_utf8_lossy(&response);
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow::anyhow!("{addr}: no HTTP header end"))?;
        let status = head.lines().next().unwrap_or_default();
        anyhow::ensure!(status.contains(" 200 "), "{addr}: {status}");
        Ok(body.to_owned())
    })
    .await
    .map_err(|_| anyhow::anyhow!("{addr}: /metrics took over {SCRAPE_TIMEOUT:?}"))?
}

/// Reads the stage gaps and the leader flag out of a Prometheus text exposition.
pub fn parse(node_id: u64, text: &str) -> NodeStages {
    let mut node = NodeStages {
        node_id,
        ..NodeStages::default()
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let label = |key: &str| {
            labels.split(',').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
            })
        };
        // Which table the series fills, by which label, and whether it is the sample count.
        let (table, key, samples) = match name {
            LEADER_METRIC => {
                node.leader = value >= 1.0;
                continue;
            }
            STAGE_METRIC => (&mut node.gaps, "stage", false),
            SAMPLES_METRIC => (&mut node.gaps, "stage", true),
            SPAN_METRIC => (&mut node.spans, "span", false),
            SPAN_SAMPLES_METRIC => (&mut node.spans, "span", true),
            _ => continue,
        };
        let Some(stage) = label(key) else {
            continue;
        };
        if samples {
            table.entry(stage).or_default().samples = value as u64;
            continue;
        }
        match label("quantile").as_deref() {
            Some("0.5") => table.entry(stage).or_default().p50_us = value,
            Some("0.99") => table.entry(stage).or_default().p99_us = value,
            _ => {}
        }
    }
    node
}

/// Scrapes every node (`metrics[i]` is node `i + 1`); a node that does not answer is left out.
pub async fn collect(metrics: &[String]) -> Vec<NodeStages> {
    let mut nodes = Vec::new();
    for (i, addr) in metrics.iter().enumerate() {
        match scrape(addr).await {
            Ok(text) => nodes.push(parse(i as u64 + 1, &text)),
            Err(error) => eprintln!("stage breakdown: {error}"),
        }
    }
    nodes
}

/// The printed breakdown: the leader's gaps, each follower's own fsync, the leader's write
/// spans, then the client's p50 with the gRPC round trip and the disk's fsync it stands on.
/// `scenario_entries` tells whether openraft's window (its last 1,024 batches) reaches back
/// into an earlier scenario.
pub fn render(
    nodes: &[NodeStages],
    client_p50_ms: f64,
    floors: Floors,
    scenario_entries: u64,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let Some(leader) = nodes.iter().find(|n| n.leader) else {
        return "  stages: no leader answered /metrics\n".to_owned();
    };
    if leader.gaps.is_empty() {
        out.push_str(
            "  stages: the nodes report none; build them with \
             `cargo build --release -p tally-authority --features stage-stats`\n",
        );
    } else {
        render_stages(&mut out, nodes, leader, scenario_entries);
    }
    if !leader.spans.is_empty() {
        let samples = leader.spans.values().map(|s| s.samples).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "  write spans on the leader (node {}), over its last {samples} writes, each inside the one above:",
            leader.node_id
        );
        for (key, what) in SPANS {
            let span = leader.spans.get(key).copied().unwrap_or_default();
            let _ = writeln!(
                out,
                "    {key:<20} p50 {:>8.0} µs  p99 {:>8.0} µs  {what}",
                span.p50_us, span.p99_us
            );
        }
    }
    let _ = writeln!(
        out,
        "    client p50 {:>8.0} µs per command; gRPC round trip p50 {:>8.0} µs; disk fdatasync p50 {:>8.0} µs",
        client_p50_ms * 1_000.0,
        floors.round_trip_p50_ms * 1_000.0,
        floors.fsync_p50_ms * 1_000.0
    );
    out
}

/// What a command's latency stands on, measured by the bench in the same run.
#[derive(Debug, Clone, Copy)]
pub struct Floors {
    /// `Admin.ClockProbe` to the leader over mTLS.
    pub round_trip_p50_ms: f64,
    /// A bare 512-byte append and `fdatasync` on the nodes' disk.
    pub fsync_p50_ms: f64,
}

fn render_stages(
    out: &mut String,
    nodes: &[NodeStages],
    leader: &NodeStages,
    scenario_entries: u64,
) {
    use std::fmt::Write as _;
    let total = leader
        .gaps
        .get("proposed_to_applied")
        .copied()
        .unwrap_or_default();
    let window = if total.samples > scenario_entries {
        format!(
            "over its last {} entries, {} of them from earlier scenarios",
            total.samples,
            total.samples - scenario_entries
        )
    } else {
        format!(
            "over its last {} of this scenario's {} entries",
            total.samples, scenario_entries
        )
    };
    let _ = writeln!(
        out,
        "  stages on the leader (node {}), {window}:",
        leader.node_id
    );
    for (key, label, what) in STAGES {
        let gap = leader.gaps.get(key).copied().unwrap_or_default();
        let _ = writeln!(
            out,
            "    {label:<20} p50 {:>8.0} µs  p99 {:>8.0} µs  {what}",
            gap.p50_us, gap.p99_us
        );
    }
    for follower in nodes.iter().filter(|n| !n.leader) {
        let gap = follower
            .gaps
            .get("submitted_to_persisted")
            .copied()
            .unwrap_or_default();
        let earlier = if gap.samples > scenario_entries {
            ", some from earlier scenarios"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "    node {} submitted→persisted p50 {:>8.0} µs  p99 {:>8.0} µs  the follower's fsync \
             (last {} entries{earlier})",
            follower.node_id, gap.p50_us, gap.p99_us, gap.samples
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOORS: Floors = Floors {
        round_trip_p50_ms: 0.07,
        fsync_p50_ms: 0.9,
    };

    const SCRAPE: &str = "\
# HELP tally_raft_is_leader 1 while this node leads.
# TYPE tally_raft_is_leader gauge
tally_raft_is_leader 1
# TYPE tally_raft_stage_latency_microseconds gauge
tally_raft_stage_latency_microseconds{stage=\"submitted_to_persisted\",quantile=\"0.5\"} 950
tally_raft_stage_latency_microseconds{stage=\"submitted_to_persisted\",quantile=\"0.9\"} 1200
tally_raft_stage_latency_microseconds{stage=\"submitted_to_persisted\",quantile=\"0.99\"} 2100
tally_raft_stage_latency_microseconds{stage=\"proposed_to_applied\",quantile=\"0.5\"} 3000
tally_raft_stage_latency_microseconds{stage=\"proposed_to_applied\",quantile=\"0.99\"} 7000
# TYPE tally_raft_stage_samples gauge
tally_raft_stage_samples{stage=\"submitted_to_persisted\"} 4096
tally_raft_stage_samples{stage=\"proposed_to_applied\"} 4096
tally_write_span_microseconds{span=\"handler\",quantile=\"0.5\"} 480
tally_write_span_microseconds{span=\"handler\",quantile=\"0.99\"} 900
tally_write_span_samples{span=\"handler\"} 1024
tally_raft_log_reads_total{source=\"cache\"} 17
garbage line
";

    #[test]
    fn parses_the_stage_gaps_and_the_leader_flag() {
        let node = parse(2, SCRAPE);
        assert_eq!(node.node_id, 2);
        assert!(node.leader);
        assert_eq!(node.gaps.len(), 2, "{node:?}");
        assert_eq!(
            node.gaps["submitted_to_persisted"],
            Gap {
                p50_us: 950.0,
                p99_us: 2100.0,
                samples: 4096
            }
        );
        assert_eq!(node.gaps["proposed_to_applied"].p99_us, 7000.0);
        assert_eq!(
            node.spans["handler"],
            Gap {
                p50_us: 480.0,
                p99_us: 900.0,
                samples: 1024
            }
        );
        assert_eq!(node.spans.len(), 1, "{node:?}");
    }

    #[test]
    fn a_node_without_the_feature_reports_no_gaps_and_the_breakdown_says_how() {
        let node = parse(1, "tally_raft_is_leader 1\ntally_raft_term 3\n");
        assert!(node.leader && node.gaps.is_empty());
        assert!(render(&[node], 1.0, FLOORS, 10).contains("--features stage-stats"));
        let follower = parse(3, "tally_raft_is_leader 0\n");
        assert!(render(&[follower], 1.0, FLOORS, 10).contains("no leader"));
        // The write spans come with every build.
        let spans = parse(
            1,
            "tally_raft_is_leader 1\ntally_write_span_microseconds{span=\"propose\",quantile=\"0.5\"} 77\n",
        );
        let text = render(&[spans], 1.0, FLOORS, 10);
        assert!(text.contains("--features stage-stats"), "{text}");
        assert!(
            text.contains("propose              p50       77 µs"),
            "{text}"
        );
    }

    #[test]
    fn the_breakdown_names_each_stage_and_flags_a_window_from_earlier_scenarios() {
        let leader = parse(1, SCRAPE);
        let follower = parse(2, &SCRAPE.replace("is_leader 1", "is_leader 0"));
        let text = render(&[leader.clone(), follower], 2.5, FLOORS, 1000);
        for (_, label, _) in STAGES {
            assert!(text.contains(label), "{label}: {text}");
        }
        assert!(
            text.contains("3096 of them from earlier scenarios"),
            "{text}"
        );
        assert!(text.contains("node 2 submitted→persisted"), "{text}");
        assert!(
            text.contains("(last 4096 entries, some from earlier"),
            "{text}"
        );
        assert!(text.contains("client p50     2500 µs"), "{text}");
        assert!(text.contains("gRPC round trip p50       70 µs"), "{text}");
        assert!(
            text.contains("handler              p50      480 µs"),
            "{text}"
        );
        let text = render(&[leader], 2.5, FLOORS, 10_000);
        assert!(
            text.contains("last 4096 of this scenario's 10000 entries"),
            "{text}"
        );
    }
}
