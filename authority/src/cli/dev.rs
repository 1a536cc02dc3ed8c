//! `tally-node dev`: a local cluster in one command, for trying Tally out. Nodes run in this
//! process, each with its own data dir under `--data-dir`, on consecutive ports from
//! `--base-port + 1` (client ports) and `--base-port + 201` (peer ports). On first run it
//! makes a CA and certificates in `<data-dir>/tls` (nodes, `operator`, `kernel`, `reader`),
//! where `tally`, `tally-kernel demo` and the examples find them. A second run on the same
//! data dir restarts the same cluster.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use tally_tls::TlsFiles;

use crate::faults::NetworkFaults;
use crate::node::config::{LogFormat, NodeConfig};
use crate::node::{self, NodeHandle};
use crate::raft::types::TallyNode;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Number of nodes (1 to 7).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=7))]
    pub nodes: u64,
    /// Where the cluster keeps its state; reuse it to restart the same cluster.
    #[arg(long, default_value = "./tally-data")]
    pub data_dir: PathBuf,
    /// Node i listens on 127.0.0.1:(base-port + i).
    #[arg(long, default_value_t = 7400)]
    pub base_port: u16,
    /// How long to wait for the cluster to serve.
    #[arg(long, default_value_t = 30_000)]
    pub ready_timeout_ms: u64,
    /// Plaintext and no authentication (no certificates are made).
    #[arg(long)]
    pub insecure: bool,
    /// Each node's `memory_budget_bytes` (half for families kept in memory, the rest spilled
    /// to `<data-dir>/node-<i>/families/`); the nodes share this process, so it holds about
    /// `--nodes` times this much state.
    #[arg(long, default_value_t = 1 << 30)]
    pub memory_budget_bytes: u64,
    /// Each node's `spill_idle_entries`: families used in the last this many log entries are
    /// not spilled for the budget (0: spill any family not in the current round).
    #[arg(long, default_value_t = 1_000)]
    pub spill_idle_entries: u64,
    /// Each node's `filter_memory_bytes`: what the filters over rows out of memory keep in
    /// memory before the pages of the largest go to a scratch file on disk (default: an
    /// eighth of the budget; 0 keeps every page on disk).
    #[arg(long)]
    pub filter_memory_bytes: Option<u64>,
}

/// Where a dev cluster's CA and certificates live.
pub fn tls_dir(args: &DevArgs) -> PathBuf {
    args.data_dir.join("tls")
}

/// The config of node `id` of a dev cluster.
pub fn node_config(args: &DevArgs, id: u64) -> NodeConfig {
    NodeConfig {
        node_id: id,
        listen_addr: SocketAddr::from(([127, 0, 0, 1], args.base_port + id as u16)),
        metrics_addr: args
            .base_port
            .checked_add(100 + id as u16)
            .map(|port| SocketAddr::from(([127, 0, 0, 1], port))),
        peer_listen_addr: SocketAddr::from(([127, 0, 0, 1], args.base_port + 200 + id as u16)),
        data_dir: args.data_dir.join(format!("node-{id}")),
        cluster_id: "tally-dev".to_owned(),
        log_format: LogFormat::Pretty,
        tls: (!args.insecure).then(|| TlsFiles::in_dir(&tls_dir(args), &format!("node-{id}"))),
        insecure: args.insecure,
        reflection: true,
        memory_budget_bytes: args.memory_budget_bytes,
        spill_idle_entries: args.spill_idle_entries,
        filter_memory_bytes: args.filter_memory_bytes,
        ..NodeConfig::default()
    }
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    super::logging::init(LogFormat::Pretty);
    // A data dir restored from a backup holds state too: initializing it would fail.
    let fresh = !crate::node::holds_state(&args.data_dir.join("node-1"));
    if !args.insecure
        && tally_tls::issue::ensure_dev_certs(&tls_dir(&args), "tally-dev", args.nodes)?
    {
        println!("made a CA and certificates in {}", tls_dir(&args).display());
    }
    let mut nodes: Vec<NodeHandle> = Vec::new();
    for id in 1..=args.nodes {
        let config = node_config(&args, id);
        let node = node::start(config, Arc::<NetworkFaults>::default()).await?;
        nodes.push(node);
    }
    if fresh {
        let members: BTreeMap<u64, TallyNode> = nodes
            .iter()
            .map(|n| (n.config.node_id, n.config.member()))
            .collect();
        nodes[0].raft.initialize(members).await?;
        println!(
            "initialized a new {}-node cluster in {}",
            args.nodes,
            args.data_dir.display()
        );
    } else {
        println!(
            "restarting the cluster stored in {}",
            args.data_dir.display()
        );
    }
    let started = Instant::now();
    let deadline = started + Duration::from_millis(args.ready_timeout_ms);
    while !nodes.iter().all(|n| n.health.is_healthy()) {
        if Instant::now() > deadline {
            for node in nodes {
                node.shutdown().await;
            }
            anyhow::bail!(
                "the cluster did not serve within {} ms",
                args.ready_timeout_ms
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let leader = nodes[0].proposer.leader().map(|(id, _)| id).unwrap_or(0);
    println!(
        "\nTally dev cluster serving after {} ms (leader: node {leader})",
        started.elapsed().as_millis()
    );
    for node in &nodes {
        let metrics = node
            .metrics_local_addr
            .map(|metrics| format!(", metrics: http://{metrics}/metrics"))
            .unwrap_or_default();
        println!(
            "  node {}: {} (peer port {}{metrics})",
            node.config.node_id, node.local_addr, node.peer_local_addr
        );
    }
    let first = nodes[0].local_addr;
    let (security, grpcurl) = if args.insecure {
        (
            "INSECURE: plaintext, no authentication".to_owned(),
            "-plaintext".to_owned(),
        )
    } else {
        let dir = tls_dir(&args);
        let d = dir.display();
        (
            format!(
                "mutual TLS; certificates in {d} (operator, kernel, reader; `tally` finds them)"
            ),
            format!(
                "-cacert {d}/ca.pem -cert {d}/kernel.pem -key {d}/kernel.key -servername tally-node"
            ),
        )
    };
    println!(
        "  {security}\n\nTry it:\n  tally status\n  grpcurl {grpcurl} -d '{{\"header\":{{\"family_id\":\"fam\",\"capability_id\":\"cap\",\"grant_index\":0,\"event_id\":\"h1:authorize\",\"not_after_ms\":\"{}\"}},\"hold_id\":\"h1\",\"requested_exposure_units\":\"100\",\"limits\":{{\"max_invocations\":10,\"max_cost_per_invocation_units\":\"100\",\"max_total_cost_units\":\"1000\",\"currency\":\"USD\"}}}}' {first} tally.v1.Budget/AuthorizeHold\n\nCtrl-C or SIGTERM stops the cluster.",
        crate::node::clock::wall_clock_ms() + 3_600_000,
    );
    super::wait_for_signal().await;
    println!("stopping the cluster");
    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}
