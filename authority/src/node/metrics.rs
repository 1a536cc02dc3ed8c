//! Prometheus metrics on `/metrics` (docs/architecture.md "Observability"): commit latency, entries per
//! fsync, apply lag, leader changes, forwarded writes, denials by reason, family actors, and the
//! server limits at work (requests shed and timed out, connections refused).
//! The text format is written by hand and served by a minimal HTTP/1.1 responder on a plain
//! `TcpListener`, so no HTTP framework or metrics crate is needed.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tally_ledger::{DenyRule, Outcome};
use tally_raft_store::StoreMetrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::clock::NodeClock;
use super::recent_latency::WriteSpans;
use crate::families::MemoryUse;
use crate::raft::state_machine::{applied_time, SharedRouter};
use crate::raft::types::{NodeId, Raft};

/// Upper bounds (seconds) of the commit latency histogram's buckets.
const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const DENY_RULES: [DenyRule; 3] = [
    DenyRule::InvocationLimit,
    DenyRule::PerInvocationCostLimit,
    DenyRule::TotalCostLimit,
];
/// The largest request head the responder reads; `/metrics` needs a few dozen bytes.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Counters the write path updates; gauges are read from Raft, the store and the router at
/// scrape time.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    commit_latency_buckets: [AtomicU64; LATENCY_BUCKETS_S.len()],
    commit_latency_count: AtomicU64,
    commit_latency_sum_us: AtomicU64,
    forwarded_writes: AtomicU64,
    leader_changes: AtomicU64,
    /// Leadership transfers this node started to put the leader in a preferred region.
    leader_placement_transfers: AtomicU64,
    /// `Budget` reads (any consistency) this node answered or tried to.
    reads: AtomicU64,
    denials: [AtomicU64; DENY_RULES.len()],
    /// How long the last leaderless period lasted, as this node saw it.
    last_election_ms: AtomicU64,
    /// `Budget` requests refused at once because `max_in_flight_requests` were in flight.
    shed_requests: AtomicU64,
    /// `Budget` requests answered UNKNOWN after `request_timeout_ms`.
    expired_requests: AtomicU64,
    /// Client commands refused before proposing because this leader's oldest proposal had
    /// waited past `shed_after_ms` (docs/spec.md §5.6).
    commit_age_sheds: AtomicU64,
    /// Entries with no command this leader proposed to move cluster time up to its clock
    /// (`node/cluster_time_keeper.rs`).
    clock_ticks: AtomicU64,
    /// Client commands that waited for cluster time to catch up before being proposed, and
    /// those of them refused after the wait.
    cluster_time_waits: AtomicU64,
    cluster_time_refusals: AtomicU64,
    /// Proposals handed to Raft and not yet answered, and the wall clock ms the oldest of them
    /// was proposed at (0: none), kept by the proposer.
    pending_proposals: AtomicU64,
    oldest_pending_proposal_ms: AtomicU64,
    /// Connections closed on accept because `max_connections` were open.
    refused_connections: AtomicU64,
    in_flight_requests: AtomicU64,
    open_connections: AtomicU64,
    /// Bytes under the data dir at the disk watcher's last check (docs/spec.md §5.6).
    pub data_dir_bytes: AtomicU64,
    /// Free bytes on the data dir's filesystem at the disk watcher's last check.
    pub disk_free_bytes: AtomicU64,
    /// Recent durations of the spans of writes served here, for the stage breakdown.
    pub write_spans: WriteSpans,
}

impl NodeMetrics {
    /// One local proposal, from `client_write` to its reply (leader only).
    pub fn observe_commit(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bound, bucket) in LATENCY_BUCKETS_S.iter().zip(&self.commit_latency_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.commit_latency_count.fetch_add(1, Ordering::Relaxed);
        self.commit_latency_sum_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    /// A write this follower sent to the leader.
    pub fn observe_forward(&self) {
        self.forwarded_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// A fresh (not replayed) decision: denials are counted by rule.
    pub fn observe_decision(&self, outcome: &Outcome, replayed: bool) {
        if let (Outcome::Denied { reason }, false) = (outcome, replayed) {
            let slot = DENY_RULES
                .iter()
                .position(|rule| *rule == reason.rule)
                .unwrap_or(0);
            self.denials[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn observe_leader_placement_transfer(&self) {
        self.leader_placement_transfers
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn leader_placement_transfers(&self) -> u64 {
        self.leader_placement_transfers.load(Ordering::Relaxed)
    }

    pub fn observe_read(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    pub fn forwarded_writes(&self) -> u64 {
        self.forwarded_writes.load(Ordering::Relaxed)
    }

    pub fn commits(&self) -> u64 {
        self.commit_latency_count.load(Ordering::Relaxed)
    }

    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(Ordering::Relaxed)
    }

    pub fn observe_shed(&self) {
        self.shed_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn observe_expired(&self) {
        self.expired_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn observe_commit_age_shed(&self) {
        self.commit_age_sheds.fetch_add(1, Ordering::Relaxed);
    }

    pub fn observe_clock_ticks(&self, ticks: u64) {
        self.clock_ticks.fetch_add(ticks, Ordering::Relaxed);
    }

    pub fn clock_ticks(&self) -> u64 {
        self.clock_ticks.load(Ordering::Relaxed)
    }

    pub fn observe_cluster_time_wait(&self) {
        self.cluster_time_waits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cluster_time_waits(&self) -> u64 {
        self.cluster_time_waits.load(Ordering::Relaxed)
    }

    pub fn observe_cluster_time_refusal(&self) {
        self.cluster_time_refusals.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cluster_time_refusals(&self) -> u64 {
        self.cluster_time_refusals.load(Ordering::Relaxed)
    }

    pub fn commit_age_sheds(&self) -> u64 {
        self.commit_age_sheds.load(Ordering::Relaxed)
    }

    /// `count` proposals await their answer, the oldest proposed at wall clock `oldest_ms`.
    pub fn track_pending_proposals(&self, count: u64, oldest_ms: u64) {
        self.pending_proposals.store(count, Ordering::Relaxed);
        self.oldest_pending_proposal_ms
            .store(oldest_ms, Ordering::Relaxed);
    }

    pub fn pending_proposals(&self) -> u64 {
        self.pending_proposals.load(Ordering::Relaxed)
    }

    /// How long the oldest pending proposal has waited, in ms (0 when none waits).
    pub fn oldest_pending_proposal_age_ms(&self) -> u64 {
        match self.oldest_pending_proposal_ms.load(Ordering::Relaxed) {
            0 => 0,
            since_ms => super::clock::wall_clock_ms().saturating_sub(since_ms),
        }
    }

    pub fn observe_refused_connection(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A request admitted (`+1`) or answered (`-1`).
    pub fn track_in_flight(&self, admitted: bool) {
        track(&self.in_flight_requests, admitted);
    }

    /// A connection accepted (`+1`) or closed (`-1`).
    pub fn track_connection(&self, opened: bool) {
        track(&self.open_connections, opened);
    }

    pub fn shed_requests(&self) -> u64 {
        self.shed_requests.load(Ordering::Relaxed)
    }

    pub fn expired_requests(&self) -> u64 {
        self.expired_requests.load(Ordering::Relaxed)
    }

    pub fn refused_connections(&self) -> u64 {
        self.refused_connections.load(Ordering::Relaxed)
    }

    pub fn in_flight_requests(&self) -> u64 {
        self.in_flight_requests.load(Ordering::Relaxed)
    }

    pub fn open_connections(&self) -> u64 {
        self.open_connections.load(Ordering::Relaxed)
    }
}

fn track(gauge: &AtomicU64, up: bool) {
    if up {
        gauge.fetch_add(1, Ordering::Relaxed);
    } else {
        gauge.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The router's memory and family store figures, read under its lock.
struct FamiliesMemory {
    /// The budget's share and what counts against it, as `Admin.Status` shows them.
    used: MemoryUse,
    stored_bytes: usize,
    store_file_bytes: u64,
    store_reads: u64,
    store_commits: u64,
    cold_rows: u64,
    cold_lookups: (u64, u64),
    filter_pages: crate::families::FilterPages,
    cold_reads: u64,
    cold_run_index_bytes: usize,
    cold_runs: (usize, u64),
}

/// What a scrape reads besides the counters.
#[derive(Clone)]
pub struct Sources {
    pub node_id: NodeId,
    pub metrics: Arc<NodeMetrics>,
    pub raft: Raft,
    pub store: Arc<StoreMetrics>,
    pub router: SharedRouter,
    /// This node's clock, which cluster time's lag is measured against.
    pub clock: Arc<NodeClock>,
}

/// The Prometheus text exposition (format 0.0.4) of everything this node reports.
pub async fn render(sources: &Sources) -> String {
    let m = &sources.metrics;
    let raft = crate::raft::types::current_metrics(&sources.raft);
    let store = sources.store.snapshot();
    let (families_memory, alarms, cluster_time_lag_ms) = {
        let router = sources.router.lock().await;
        let cluster_time_lag_ms = applied_time(&router).lag_ms(sources.clock.now_ms());
        let alarms: Vec<(String, String)> = crate::families::AlarmKind::ALL
            .into_iter()
            .map(|kind| {
                let raised = router
                    .alarms()
                    .iter()
                    .filter(|(k, _, _)| *k == kind)
                    .count();
                (format!("{{kind=\"{kind}\"}}"), raised.to_string())
            })
            .collect();
        let families_memory = FamiliesMemory {
            used: router.memory_use(),
            stored_bytes: router.passivated_bytes(),
            store_file_bytes: router.store().file_bytes().unwrap_or(0),
            store_reads: router.store().reads(),
            store_commits: router.store().commits(),
            cold_rows: router.cold_rows(),
            cold_lookups: router.cold_lookups(),
            filter_pages: router.filter_pages(),
            cold_reads: router.store().cold_reads(),
            cold_run_index_bytes: router.store().cold_run_index_bytes(),
            cold_runs: router.store().cold_run_counts(),
        };
        (families_memory, alarms, cluster_time_lag_ms)
    };
    let used = &families_memory.used;
    let committed = raft.local_committed.map_or(0, |c| c.index);
    let applied = raft.last_applied.map_or(0, |a| a.index);
    let is_leader = raft.current_leader == Some(sources.node_id);

    let mut out = String::with_capacity(4096);
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, String)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (suffix, value) in lines {
            let _ = writeln!(out, "{name}{suffix} {value}");
        }
    };
    let plain = |value: String| vec![(String::new(), value)];

    let mut histogram = Vec::new();
    for (bound, bucket) in LATENCY_BUCKETS_S.iter().zip(&m.commit_latency_buckets) {
        histogram.push((
            format!("_bucket{{le=\"{bound}\"}}"),
            bucket.load(Ordering::Relaxed).to_string(),
        ));
    }
    let count = m.commit_latency_count.load(Ordering::Relaxed);
    histogram.push(("_bucket{le=\"+Inf\"}".to_owned(), count.to_string()));
    histogram.push((
        "_sum".to_owned(),
        format!(
            "{}",
            m.commit_latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6
        ),
    ));
    histogram.push(("_count".to_owned(), count.to_string()));
    metric(
        "tally_commit_latency_seconds",
        "histogram",
        "Leader proposals from client_write to the applied reply.",
        &histogram,
    );
    metric(
        "tally_alarms_raised",
        "gauge",
        "Nodes with the alarm raised through the log, by kind; while no_space is above 0 new \
         exposure is refused (docs/spec.md 5.6).",
        &alarms,
    );
    metric(
        "tally_data_dir_bytes",
        "gauge",
        "Bytes under the data dir at the disk watcher's last check.",
        &plain(m.data_dir_bytes.load(Ordering::Relaxed).to_string()),
    );
    metric(
        "tally_disk_free_bytes",
        "gauge",
        "Free bytes on the data dir's filesystem at the disk watcher's last check.",
        &plain(m.disk_free_bytes.load(Ordering::Relaxed).to_string()),
    );
    metric(
        "tally_raft_log_entries_per_fsync",
        "gauge",
        "Mean log entries per append fsync (group commit).",
        &plain(format!("{}", store.entries_per_fsync())),
    );
    metric(
        "tally_raft_log_appends_total",
        "counter",
        "Append transactions, one fsync each.",
        &plain(store.appends.to_string()),
    );
    metric(
        "tally_raft_log_entries_total",
        "counter",
        "Log entries written by append transactions.",
        &plain(store.entries.to_string()),
    );
    metric(
        "tally_raft_log_fsyncs_total",
        "counter",
        "Every fsync of the log store.",
        &plain(store.fsyncs().to_string()),
    );
    metric(
        "tally_raft_log_reads_total",
        "counter",
        "Entry reads by replication and apply, by source: the in-memory tail or the file.",
        &[
            (
                "{source=\"cache\"}".to_owned(),
                store.cache_reads.to_string(),
            ),
            ("{source=\"file\"}".to_owned(), store.file_reads.to_string()),
        ],
    );
    metric(
        "tally_apply_lag_entries",
        "gauge",
        "Committed log index minus applied log index on this node.",
        &plain(committed.saturating_sub(applied).to_string()),
    );
    metric(
        "tally_raft_committed_index",
        "gauge",
        "The committed log index this node knows.",
        &plain(committed.to_string()),
    );
    metric(
        "tally_raft_applied_index",
        "gauge",
        "The last log index this node applied.",
        &plain(applied.to_string()),
    );
    metric(
        "tally_raft_term",
        "gauge",
        "This node's current term.",
        &plain(raft.current_term.to_string()),
    );
    metric(
        "tally_raft_is_leader",
        "gauge",
        "1 while this node leads.",
        &plain(u8::from(is_leader).to_string()),
    );
    metric(
        "tally_leader_changes_total",
        "counter",
        "Times the leader this node knows changed (to another node or to none).",
        &plain(m.leader_changes().to_string()),
    );
    metric(
        "tally_last_election_milliseconds",
        "gauge",
        "How long the last leaderless period lasted, as this node saw it.",
        &plain(m.last_election_ms.load(Ordering::Relaxed).to_string()),
    );
    metric(
        "tally_forwarded_writes_total",
        "counter",
        "Writes this node forwarded to the leader.",
        &plain(m.forwarded_writes().to_string()),
    );
    metric(
        "tally_reads_total",
        "counter",
        "Budget reads this node was asked to serve.",
        &plain(m.reads().to_string()),
    );
    metric(
        "tally_leader_placement_transfers_total",
        "counter",
        "Leadership transfers this node started to move the leader to a preferred region.",
        &plain(m.leader_placement_transfers().to_string()),
    );
    let denials: Vec<(String, String)> = DENY_RULES
        .iter()
        .zip(&m.denials)
        .map(|(rule, count)| {
            (
                format!("{{reason=\"{}\"}}", rule.as_str()),
                count.load(Ordering::Relaxed).to_string(),
            )
        })
        .collect();
    metric(
        "tally_denials_total",
        "counter",
        "Denied decisions this node proposed, by the rule that denied.",
        &denials,
    );
    metric(
        "tally_requests_shed_total",
        "counter",
        "Budget requests refused at once (UNAVAILABLE, definite) at max_in_flight_requests.",
        &plain(m.shed_requests().to_string()),
    );
    metric(
        "tally_writes_shed_by_commit_age_total",
        "counter",
        "Budget writes refused before proposing (UNAVAILABLE, definite) because this leader's \
         oldest proposal had waited past shed_after_ms for commit, or more commands waited than \
         it answers in shed_after_ms at its current rate (docs/spec.md 5.6).",
        &plain(m.commit_age_sheds().to_string()),
    );
    metric(
        "tally_cluster_time_lag_milliseconds",
        "gauge",
        "How far cluster time (after the last applied entry) trails this node's clock. On the \
         leader, client writes wait past max_clock_step_ms less 1 s.",
        &plain(cluster_time_lag_ms.to_string()),
    );
    metric(
        "tally_clock_ticks_total",
        "counter",
        "Entries with no command this node proposed as leader to move cluster time up to its \
         clock (one per half step on an idle cluster, more after downtime).",
        &plain(m.clock_ticks().to_string()),
    );
    metric(
        "tally_writes_waited_for_cluster_time_total",
        "counter",
        "Budget writes that waited, before proposing, for cluster time to catch up with this \
         leader's clock.",
        &plain(m.cluster_time_waits().to_string()),
    );
    metric(
        "tally_writes_refused_for_cluster_time_total",
        "counter",
        "Budget writes refused (UNAVAILABLE, definite) because cluster time had not caught up \
         with this leader's clock within 1 s.",
        &plain(m.cluster_time_refusals().to_string()),
    );
    metric(
        "tally_proposals_pending",
        "gauge",
        "Proposals this node handed to Raft and has not seen answered (committed and applied, \
         or discarded).",
        &plain(m.pending_proposals().to_string()),
    );
    metric(
        "tally_oldest_pending_proposal_age_milliseconds",
        "gauge",
        "How long the oldest pending proposal has waited; past shed_after_ms new writes are \
         shed. 0 when none waits.",
        &plain(m.oldest_pending_proposal_age_ms().to_string()),
    );
    metric(
        "tally_requests_expired_total",
        "counter",
        "Budget requests answered UNKNOWN (indefinite) after request_timeout_ms.",
        &plain(m.expired_requests().to_string()),
    );
    metric(
        "tally_requests_in_flight",
        "gauge",
        "Budget requests being served now.",
        &plain(m.in_flight_requests().to_string()),
    );
    metric(
        "tally_connections_refused_total",
        "counter",
        "Connections closed on accept at max_connections.",
        &plain(m.refused_connections().to_string()),
    );
    metric(
        "tally_connections_open",
        "gauge",
        "gRPC connections open now (clients and peers).",
        &plain(m.open_connections().to_string()),
    );
    metric(
        "tally_family_actors",
        "gauge",
        "Budget family actors by state.",
        &[
            (
                "{state=\"live\"}".to_owned(),
                used.families_in_memory.to_string(),
            ),
            (
                "{state=\"passivated\"}".to_owned(),
                used.families_on_disk.to_string(),
            ),
        ],
    );
    metric(
        "tally_live_families_bytes",
        "gauge",
        "Estimated heap bytes of the families kept in memory, and the budget for them \
         (half of memory_budget_bytes); beyond it the least recently used are passivated.",
        &[
            (
                "{kind=\"used\"}".to_owned(),
                used.families_bytes.to_string(),
            ),
            ("{kind=\"budget\"}".to_owned(), used.share_bytes.to_string()),
        ],
    );
    let process = [
        ("resident", crate::allocator::process_resident_bytes()),
        ("heap_in_use", crate::heap_count::heap_in_use_bytes()),
    ];
    let process: Vec<(String, String)> = (process.into_iter())
        .filter_map(|(kind, bytes)| Some((format!("{{kind=\"{kind}\"}}"), bytes?.to_string())))
        .collect();
    metric(
        "tally_process_memory_bytes",
        "gauge",
        "The process's resident memory, and the heap bytes it has in use (tally-node counts \
         them as it allocates); the difference is mostly free heap memory not yet given back \
         and code. Nodes that share a process (tally-node dev) report the same figures.",
        &process,
    );
    metric(
        "tally_family_store_bytes",
        "gauge",
        "The family store on disk: passivated families' encoded bytes, and the file's size.",
        &[
            (
                "{kind=\"families\"}".to_owned(),
                families_memory.stored_bytes.to_string(),
            ),
            (
                "{kind=\"file\"}".to_owned(),
                families_memory.store_file_bytes.to_string(),
            ),
        ],
    );
    metric(
        "tally_family_store_reads_total",
        "counter",
        "Families read back from the family store (activations, reads, digests, snapshots).",
        &plain(families_memory.store_reads.to_string()),
    );
    metric(
        "tally_family_store_commits_total",
        "counter",
        "Commits that wrote families or their filters to the family store (a passivation \
         writes a group of families of at most 1/32 of the families' share per commit).",
        &plain(families_memory.store_commits.to_string()),
    );
    metric(
        "tally_cold_rows",
        "gauge",
        "Rows families moved out of memory (compact dedupe rows and archived holds past \
         retention), kept in the family store.",
        &plain(families_memory.cold_rows.to_string()),
    );
    metric(
        "tally_cold_filter_bytes",
        "gauge",
        "Memory of the filters that spare a fresh id a disk read, those of the families in \
         memory: their pages in memory, keys waiting beside pages on disk, page tables \
         (counted in the families' half of memory_budget_bytes; a spilled family's filters \
         are in the family store).",
        &plain(used.filter_bytes.to_string()),
    );
    let pages = &families_memory.filter_pages;
    metric(
        "tally_cold_filter_share_bytes",
        "gauge",
        "What the filters may keep in memory (an eighth of memory_budget_bytes); beyond it the \
         pages of the largest filters go to the node's page file and a lookup reads a 4 KiB \
         block of each such filter.",
        &plain(pages.share_bytes.to_string()),
    );
    metric(
        "tally_cold_filter_file_bytes",
        "gauge",
        "The filters' page file on disk (pages beyond their share, and slots a snapshot being \
         written still names or free for reuse).",
        &plain(pages.file_bytes.to_string()),
    );
    metric(
        "tally_cold_filter_pending_hashes",
        "gauge",
        "Keys added to filter pages on disk, waiting as hashes in memory until the page is \
         read back and they are set (counted in tally_cold_filter_bytes).",
        &plain(pages.pending_hashes.to_string()),
    );
    metric(
        "tally_cold_filter_io_total",
        "counter",
        "The filters' page file: 4 KiB blocks read for lookups, 64 KiB pages read back to set \
         waiting keys, and pages written.",
        &[
            (
                "{op=\"block_read\"}".to_owned(),
                pages.block_reads.to_string(),
            ),
            (
                "{op=\"page_read\"}".to_owned(),
                pages.page_reads.to_string(),
            ),
            (
                "{op=\"page_write\"}".to_owned(),
                pages.page_writes.to_string(),
            ),
        ],
    );
    let (lookups, passed) = families_memory.cold_lookups;
    metric(
        "tally_cold_lookups_total",
        "counter",
        "Ids looked up among rows out of memory before a batch: all of them, and those the \
         filters passed to the store (disk reads per fresh id = passed / all).",
        &[
            ("{result=\"all\"}".to_owned(), lookups.to_string()),
            ("{result=\"passed\"}".to_owned(), passed.to_string()),
        ],
    );
    metric(
        "tally_cold_store_reads_total",
        "counter",
        "Reads of rows out of memory from the family store (batches and point reads).",
        &plain(families_memory.cold_reads.to_string()),
    );
    metric(
        "tally_cold_store_memory_bytes",
        "gauge",
        "Memory the store keeps for rows out of memory: rows waiting to be written and the \
         block indexes of the runs on disk (counted in the families' half of \
         memory_budget_bytes).",
        &plain(used.store_memory_bytes.to_string()),
    );
    metric(
        "tally_cold_run_index_bytes",
        "gauge",
        "The part of tally_cold_store_memory_bytes the runs' indexes take (a key per 2 MiB of \
         rows, and the last group and block each run read): what grows with the history.",
        &plain(families_memory.cold_run_index_bytes.to_string()),
    );
    let (runs, merges) = families_memory.cold_runs;
    metric(
        "tally_cold_runs",
        "gauge",
        "Sorted runs of rows out of memory on disk (a lookup the filters pass reads one block \
         of each).",
        &plain(runs.to_string()),
    );
    metric(
        "tally_cold_run_merges_total",
        "counter",
        "Merges of runs of rows out of memory (four runs of one size into one).",
        &plain(merges.to_string()),
    );
    render_write_spans(&mut out, &m.write_spans);
    #[cfg(feature = "stage-stats")]
    render_stage_latency(&mut out, &sources.raft).await;
    out
}

/// The write spans' percentiles over their recent windows (`recent_latency.rs`); a span with
/// no sample yet is left out.
fn render_write_spans(out: &mut String, spans: &WriteSpans) {
    const NAME: &str = "tally_write_span_microseconds";
    const SAMPLES: &str = "tally_write_span_samples";
    let measured: Vec<_> = spans
        .labelled()
        .into_iter()
        .filter_map(|(span, recent)| Some((span, recent.percentiles()?)))
        .collect();
    let _ = writeln!(
        out,
        "# HELP {NAME} A write's spans on the node that served it, over the last {} writes: \
         the handler (decoded request to reply) holds propose (queue, checks, forwarding), which \
         holds client_write (Raft and the apply).",
        super::recent_latency::RECENT_SAMPLES
    );
    let _ = writeln!(out, "# TYPE {NAME} gauge");
    for (span, p) in &measured {
        for (quantile, value) in [("0.5", p.p50), ("0.9", p.p90), ("0.99", p.p99)] {
            let _ = writeln!(
                out,
                "{NAME}{{span=\"{span}\",quantile=\"{quantile}\"}} {value}"
            );
        }
    }
    let _ = writeln!(out, "# HELP {SAMPLES} Writes behind {NAME}, by span.");
    let _ = writeln!(out, "# TYPE {SAMPLES} gauge");
    for (span, p) in &measured {
        let _ = writeln!(out, "{SAMPLES}{{span=\"{span}\"}} {}", p.samples);
    }
}

/// The stage-to-stage gaps openraft's core measures per log entry (feature `stage-stats`):
/// proposed (client_write) → received (core dequeued it) → submitted (to the log store) →
/// persisted (the store's fsync returned) → committed (this node saw the commit index) →
/// applied (the state machine answered). Followers record from `submitted` on. openraft keeps
/// the last 1,024 batches per stage, so these percentiles cover a recent window, not all time.
/// One call to the core, at scrape time only.
#[cfg(feature = "stage-stats")]
async fn render_stage_latency(out: &mut String, raft: &Raft) {
    const NAME: &str = "tally_raft_stage_latency_microseconds";
    const SAMPLES: &str = "tally_raft_stage_samples";
    let Ok(mut stats) = raft.runtime_stats().await else {
        return;
    };
    // The core builds the histograms before it answers; building them again is harmless and
    // keeps this independent of that detail.
    stats.build_log_stage_histograms();
    let h = &stats.log_stage_histograms;
    let stages = [
        ("proposed_to_received", &h.proposed_to_received),
        ("received_to_submitted", &h.received_to_submitted),
        ("submitted_to_persisted", &h.submitted_to_persisted),
        ("persisted_to_committed", &h.persisted_to_committed),
        ("committed_to_applied", &h.committed_to_applied),
        ("proposed_to_applied", &h.proposed_to_applied),
    ];
    let _ = writeln!(
        out,
        "# HELP {NAME} Log entry stage-to-stage latency over openraft's recent window."
    );
    let _ = writeln!(out, "# TYPE {NAME} gauge");
    let stats: Vec<_> = stages
        .iter()
        .map(|(stage, histogram)| (*stage, histogram.percentile_stats()))
        .collect();
    for (stage, p) in &stats {
        for (quantile, value) in [("0.5", p.p50), ("0.9", p.p90), ("0.99", p.p99)] {
            let _ = writeln!(
                out,
                "{NAME}{{stage=\"{stage}\",quantile=\"{quantile}\"}} {value}"
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP {SAMPLES} Log entries behind tally_raft_stage_latency_microseconds, by stage."
    );
    let _ = writeln!(out, "# TYPE {SAMPLES} gauge");
    for (stage, p) in &stats {
        let _ = writeln!(out, "{SAMPLES}{{stage=\"{stage}\"}} {}", p.samples);
    }
}

/// Counts leader changes and times leaderless periods from Raft's metrics.
pub async fn watch_leader(
    raft: Raft,
    metrics: Arc<NodeMetrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    use openraft::async_runtime::WatchReceiver;
    let mut rx = raft.metrics();
    let mut leader = rx.borrow_watched().current_leader;
    let mut leaderless_since = leader.is_none().then(tokio::time::Instant::now);
    loop {
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let now = rx.borrow_watched().current_leader;
        if now == leader {
            continue;
        }
        metrics.leader_changes.fetch_add(1, Ordering::Relaxed);
        match (now, leaderless_since) {
            (None, _) => leaderless_since = Some(tokio::time::Instant::now()),
            (Some(_), Some(since)) => {
                metrics
                    .last_election_ms
                    .store(since.elapsed().as_millis() as u64, Ordering::Relaxed);
                leaderless_since = None;
            }
            (Some(_), None) => {}
        }
        leader = now;
    }
}

/// Binds `addr`; the listener is handed to [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Answers `GET /metrics` (and `GET /`) with the text format, anything else with 404, one
/// request per connection.
pub async fn serve(listener: TcpListener, sources: Sources, mut shutdown: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                let sources = sources.clone();
                tokio::spawn(async move {
                    if let Err(error) =
                        tokio::time::timeout(REQUEST_TIMEOUT, respond(stream, &sources)).await
                    {
                        tracing::debug!(%error, "metrics request timed out");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "metrics listener accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn respond(mut stream: TcpStream, sources: &Sources) {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = if method == "GET" && (path == "/metrics" || path == "/") {
        (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(sources).await,
        )
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found; try GET /metrics\n".to_owned(),
        )
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_cumulative() {
        let m = NodeMetrics::default();
        m.observe_commit(Duration::from_micros(700));
        m.observe_commit(Duration::from_millis(30));
        assert_eq!(m.commit_latency_buckets[0].load(Ordering::Relaxed), 0);
        assert_eq!(m.commit_latency_buckets[1].load(Ordering::Relaxed), 1);
        assert_eq!(m.commit_latency_buckets[6].load(Ordering::Relaxed), 2);
        assert_eq!(m.commits(), 2);
    }
}
