//! A node's configuration: defaults, then a TOML file, then `TALLY_*` environment variables;
//! validated into a typed struct and printed once at start-up.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::raft::types::NodeId;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// This node's Raft id, unique in the cluster.
    pub node_id: NodeId,
    /// The client port: Budget, Admin, health (and reflection when enabled).
    pub listen_addr: SocketAddr,
    /// The address clients use to reach this node; defaults to `listen_addr`.
    pub advertise_addr: Option<String>,
    /// The peer port: only the internal Raft service, for members of the cluster.
    pub peer_listen_addr: SocketAddr,
    /// The address peers use to reach this node; defaults to `peer_listen_addr`.
    pub peer_advertise_addr: Option<String>,
    /// The region this node runs in, recorded in the membership and shown by `tally status`.
    pub region: String,
    /// This node's certificate and key and the cluster's CA (docs/architecture.md
    /// "Security"). Required unless `insecure`.
    pub tls: Option<tally_tls::TlsFiles>,
    /// Plaintext on both ports, with no authentication at all: anyone who reaches a port can
    /// append Raft entries or forge budget commands. For a sealed test network only; the node
    /// announces it loudly at start.
    #[serde(default)]
    pub insecure: bool,
    /// Serve gRPC server reflection (v1 and v1alpha) on the client port.
    #[serde(default)]
    pub reflection: bool,
    /// Where `/metrics` (Prometheus) listens; none disables it.
    pub metrics_addr: Option<SocketAddr>,
    /// Raft log, vote and snapshots live here.
    pub data_dir: PathBuf,
    /// Named in every decision (docs/spec.md §6).
    pub cluster_id: String,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// How long a write waits for commit after proposing before answering UNKNOWN.
    pub propose_timeout_ms: u64,
    /// Commands accepted in one `Batch` call (at most 4,096: one log entry).
    pub max_batch_commands: usize,
    /// Entries since the last snapshot that trigger a new one.
    pub snapshot_every_entries: u64,
    /// docs/spec.md §6: a node off by more than this from a majority refuses to lead.
    pub max_clock_offset_ms: u64,
    /// How often the leader proposes `ExpireHolds` for families with due holds.
    pub expiry_interval_ms: u64,
    /// Family actors kept live; the least recently used beyond it are passivated.
    pub max_live_families: usize,
    /// The memory this node's state may take (docs/spec.md §5.5): half for the families kept
    /// in memory (the least recently used beyond it are passivated to the family store on
    /// disk, `<data_dir>/families/`), an eighth for the store's page cache, and the rest for
    /// the Raft log's cache, buffers and indexes. At least 64 MiB.
    #[serde(default = "default_memory_budget_bytes")]
    pub memory_budget_bytes: u64,
    /// How much of the families' half the filters over rows out of memory may keep in memory
    /// before the pages of the largest go to a scratch file on disk (docs/sizing.md): unset,
    /// an eighth of `memory_budget_bytes`; at most half of it. More spares fresh ids their
    /// 4 KiB reads; 0 keeps every filter page on disk.
    #[serde(default)]
    pub filter_memory_bytes: Option<u64>,
    /// A family used in the last this many log entries is not spilled for the memory budget
    /// (families are spilled whole, and spilling one in use costs more than it saves). 0 makes
    /// the budget hard, at the cost of reading families in use back from disk.
    #[serde(default = "default_spill_idle_entries")]
    pub spill_idle_entries: u64,
    /// How often the node checks the free memory inside glibc's heaps, and gives it back to
    /// the system (`malloc_trim`) once it passes a quarter of `memory_budget_bytes`
    /// (`allocator.rs`); 0 = never. Without it a burst (a restore's first hold expiry) leaves
    /// the process holding what it freed. One check per process: in `tally-node dev` the
    /// first node's interval applies, against the sum of the nodes' quarters.
    #[serde(default = "default_malloc_trim_interval_ms")]
    pub malloc_trim_interval_ms: u64,
    /// Threads of the async runtime that serve requests, replicate and apply; 0 = tokio's
    /// default (`TOKIO_WORKER_THREADS` if set, else one per core). Several nodes on one host
    /// should split its cores between them: each idle worker a wake-up finds is a context
    /// switch, and three 2-worker nodes on 2 cores spent ~16% more CPU per command than with
    /// one worker each (docs/sizing.md "Cores"). Read once, before the runtime starts.
    #[serde(default)]
    pub worker_threads: usize,
    /// Connections served at once, peers' included (they share the listener): one more is
    /// closed as soon as it is accepted, before anything is read from it.
    pub max_connections: usize,
    /// HTTP/2 streams one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    /// At least `max_in_flight_requests`: a follower forwards its writes to the leader on one
    /// connection, and a write waiting there for a stream could time out unsent as UNKNOWN.
    pub max_concurrent_streams: u32,
    /// `Budget` requests served at once by this node. One more is refused at once with
    /// UNAVAILABLE, definite (docs/spec.md §10: load shed before proposing), never queued
    /// until its deadline. Raft, Admin and health calls are not counted, so peers and
    /// operators are never shed.
    pub max_in_flight_requests: usize,
    /// A `Budget` request still unanswered after this is answered UNKNOWN (indefinite). Above
    /// `propose_timeout_ms`, so a write's own timeout answers first, naming its event.
    pub request_timeout_ms: u64,
    /// Load shedding before proposing (docs/spec.md §5.6): while the oldest proposal this
    /// leader has waiting for commit is older than this, or more commands wait (at least 256)
    /// than it answers in this long at its current rate, new `Budget` writes are refused with
    /// UNAVAILABLE, definite (nothing proposed), instead of queueing to answer UNKNOWN. Below
    /// `propose_timeout_ms` it refuses before writes would time out; a proposal keeps its age
    /// past its own timeout, so a larger value still sheds, later. 0 = never.
    #[serde(default = "default_shed_after_ms")]
    pub shed_after_ms: u64,
    /// HTTP/2 PING interval on idle connections, and how long an unanswered PING keeps one
    /// open: a vanished peer or client frees its connection and requests.
    pub http2_keepalive_interval_ms: u64,
    pub http2_keepalive_timeout_ms: u64,
    /// An incoming snapshot stream that sends no chunk for this long is abandoned, so a
    /// stalled or hostile sender holds the node's one install slot only that long. Chunks
    /// are written to disk as they arrive.
    pub snapshot_chunk_timeout_ms: u64,
    /// The largest `Budget` or `Admin` message decoded or encoded. Raft messages between
    /// nodes always allow `tally_api::MAX_MESSAGE_BYTES`, since every peer must accept them.
    pub max_message_bytes: usize,
    /// Bytes the data dir (Raft log, snapshots) may use; 0 = no quota. The `NoSpace` alarm
    /// is raised through the log at 90% of it (docs/spec.md §5.6), so the log never fills.
    #[serde(default)]
    pub disk_quota_bytes: u64,
    /// Free space to keep on the data dir's filesystem; below it the `NoSpace` alarm is
    /// raised. 0 = not checked.
    #[serde(default = "default_disk_reserve_bytes")]
    pub disk_reserve_bytes: u64,
    /// How often the disk watcher measures the data dir and the filesystem.
    #[serde(default = "default_disk_check_interval_ms")]
    pub disk_check_interval_ms: u64,
    /// The least time between two leadership transfers the leader starts on its own to move
    /// leadership into a preferred region (`tally params --preferred-leader-regions`): a
    /// region that flaps cannot bounce leadership faster than this.
    #[serde(default = "default_leader_placement_interval_ms")]
    pub leader_placement_interval_ms: u64,
    /// The newest rules version (docs/spec.md §5.5, "Rules versions") this node lets the
    /// cluster raise to: it reports no newer one in its clock probes, and the leader raises the
    /// rules only to what every member reports. Defaults to the newest this release knows. Set
    /// it to the version in force while a rolling upgrade is on trial, so the way back to the
    /// older release stays open; unset it (a rolling restart) to let the raise happen. It
    /// lowers nothing already raised.
    #[serde(default = "default_max_rules_version")]
    pub max_rules_version: u32,
    /// `pretty` or `json`.
    pub log_format: LogFormat,
    /// Shifts this node's clock by this many ms. Always 0 in production; tests use it to make
    /// one node's clock disagree with its peers' (docs/spec.md §6's clock-offset rule).
    #[serde(default)]
    pub clock_offset_ms: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            node_id: 1,
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 7401)),
            advertise_addr: None,
            peer_listen_addr: SocketAddr::from(([127, 0, 0, 1], 7601)),
            peer_advertise_addr: None,
            region: "local".to_owned(),
            tls: None,
            insecure: false,
            reflection: false,
            metrics_addr: None,
            data_dir: PathBuf::from("./tally-data/node-1"),
            cluster_id: "tally-local".to_owned(),
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 800,
            propose_timeout_ms: 5_000,
            max_batch_commands: tally_ledger::limits::MAX_COMMANDS_PER_ENTRY,
            snapshot_every_entries: 20_000,
            max_clock_offset_ms: 500,
            expiry_interval_ms: 1_000,
            max_live_families: 10_000,
            memory_budget_bytes: default_memory_budget_bytes(),
            filter_memory_bytes: None,
            spill_idle_entries: default_spill_idle_entries(),
            malloc_trim_interval_ms: default_malloc_trim_interval_ms(),
            worker_threads: 0,
            max_connections: 1_024,
            max_concurrent_streams: 2_048,
            max_in_flight_requests: 2_048,
            request_timeout_ms: 10_000,
            shed_after_ms: DEFAULT_SHED_AFTER_MS,
            http2_keepalive_interval_ms: 10_000,
            http2_keepalive_timeout_ms: 20_000,
            snapshot_chunk_timeout_ms: 10_000,
            max_message_bytes: tally_api::MAX_MESSAGE_BYTES,
            disk_quota_bytes: 0,
            disk_reserve_bytes: default_disk_reserve_bytes(),
            disk_check_interval_ms: default_disk_check_interval_ms(),
            leader_placement_interval_ms: default_leader_placement_interval_ms(),
            max_rules_version: default_max_rules_version(),
            log_format: LogFormat::Pretty,
            clock_offset_ms: 0,
        }
    }
}

/// 512 MiB: room for a snapshot being written and the log's growth between two checks.
/// The parts of the memory budget given to the router's live families and the store's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySplit {
    pub live_families_bytes: usize,
    pub store_cache_bytes: usize,
    /// The part of `live_families_bytes` the filters may keep in memory.
    pub filter_bytes: usize,
}

fn default_memory_budget_bytes() -> u64 {
    1 << 30
}

fn default_spill_idle_entries() -> u64 {
    1_000
}

/// The most `worker_threads`: far past any core count a node is given.
pub const MAX_WORKER_THREADS: usize = 1_024;

/// The smallest `memory_budget_bytes`: below it the node's fixed costs alone exceed it.
pub const MIN_MEMORY_BUDGET_BYTES: u64 = 64 << 20;

fn default_disk_reserve_bytes() -> u64 {
    512 * 1024 * 1024
}

/// 10 s: a check reads two counters; a trim happens only after a burst.
fn default_malloc_trim_interval_ms() -> u64 {
    10_000
}

fn default_max_rules_version() -> u32 {
    tally_ledger::CURRENT_RULES
}

fn default_disk_check_interval_ms() -> u64 {
    1_000
}

/// 10 s: long enough that a region healing and failing again does not move leadership at
/// every heartbeat, short enough that leadership is back where it belongs soon after healing.
fn default_leader_placement_interval_ms() -> u64 {
    10_000
}

/// 2 s: below the default `propose_timeout_ms` (5 s), so a leader that cannot commit refuses
/// new writes before its queued ones time out UNKNOWN, and far above a healthy commit (tens of
/// ms at p99) or an fsync stall on a busy disk.
pub const DEFAULT_SHED_AFTER_MS: u64 = 2_000;

fn default_shed_after_ms() -> u64 {
    DEFAULT_SHED_AFTER_MS
}

/// The smallest quota accepted: below it the headroom could not hold one snapshot.
const MIN_DISK_QUOTA_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration could not be read: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// `TALLY_*` variables that belong to a command line, never to a node's settings (lower case,
/// without the prefix, as figment compares them).
const COMMAND_LINE_VARIABLES: &[&str] = &[
    "config",
    "tls_dir",
    "identity",
    "endpoints",
    "issuer_seed",
    "kernel_config",
];

impl NodeConfig {
    /// Defaults, then `file` (if given), then `TALLY_*` variables (`TALLY_NODE_ID=3`,
    /// `TALLY_TLS__CERT_FILE=/etc/tally/node-3.pem`).
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(file, false)
    }

    /// As [`NodeConfig::load`], with `serve --insecure` applied before validation.
    pub fn load_with(file: Option<&Path>, insecure: bool) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(NodeConfig::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file(file));
        }
        let mut config: NodeConfig = figment
            // `__` reaches into tables: TALLY_TLS__CERT_FILE sets `[tls] cert_file`. The
            // variables of the command lines (`tally-node --config`, the `tally` CLI, the
            // kernel node) are not settings: a container may set them beside a node's.
            .merge(
                Env::prefixed("TALLY_")
                    .ignore(COMMAND_LINE_VARIABLES)
                    .split("__"),
            )
            .extract()
            .map_err(Box::new)?;
        config.insecure |= insecure;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |reason: String| Err(ConfigError::Invalid(reason));
        if self.node_id == 0 {
            return invalid("node_id must be at least 1".to_owned());
        }
        if self.heartbeat_interval_ms == 0
            || self.heartbeat_interval_ms * 2 > self.election_timeout_min_ms
        {
            return invalid(
                "heartbeat_interval_ms must be positive and at most half the election timeout"
                    .to_owned(),
            );
        }
        if self.election_timeout_min_ms >= self.election_timeout_max_ms {
            return invalid(
                "election_timeout_min_ms must be below election_timeout_max_ms".to_owned(),
            );
        }
        let max = tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;
        if self.max_batch_commands == 0 || self.max_batch_commands > max {
            return invalid(format!("max_batch_commands must be 1..={max}"));
        }
        if self.propose_timeout_ms == 0
            || self.expiry_interval_ms == 0
            || self.snapshot_every_entries == 0
        {
            return invalid(
                "timeouts, intervals and snapshot_every_entries must be positive".to_owned(),
            );
        }
        if self.cluster_id.is_empty() || self.cluster_id.len() > 128 {
            return invalid("cluster_id must be 1-128 bytes".to_owned());
        }
        if self.max_live_families == 0 {
            return invalid("max_live_families must be positive".to_owned());
        }
        match (&self.tls, self.insecure) {
            (None, false) => {
                return invalid(
                    "no TLS configured: set [tls] ca_file, cert_file and key_file (`tally-node \
                     certs` issues them), or insecure = true for plaintext on a sealed network"
                        .to_owned(),
                )
            }
            (Some(_), true) => {
                return invalid("tls and insecure = true are exclusive".to_owned());
            }
            _ => {}
        }
        match tally_ledger::region::validate_region("region", &self.region) {
            Ok(()) => {}
            Err(tally_ledger::LedgerError::InvalidArgument { reason, .. }) => {
                return invalid(reason)
            }
            Err(other) => return invalid(other.to_string()),
        }
        if self.peer_listen_addr == self.listen_addr && self.listen_addr.port() != 0 {
            return invalid(
                "peer_listen_addr must differ from listen_addr: the peer port serves only Raft"
                    .to_owned(),
            );
        }
        self.validate_limits()
    }

    /// The server limits: each within its range, and consistent with each other.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        let within = |name: &str, value: u64, range: std::ops::RangeInclusive<u64>| {
            if range.contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::Invalid(format!(
                    "{name} must be {}..={}, got {value}",
                    range.start(),
                    range.end()
                )))
            }
        };
        within("max_connections", self.max_connections as u64, 1..=65_536)?;
        within(
            "max_in_flight_requests",
            self.max_in_flight_requests as u64,
            1..=65_536,
        )?;
        within(
            "max_concurrent_streams",
            u64::from(self.max_concurrent_streams),
            self.max_in_flight_requests as u64..=65_536,
        )?;
        within(
            "request_timeout_ms",
            self.request_timeout_ms,
            self.propose_timeout_ms + 1..=600_000,
        )?;
        if self.shed_after_ms != 0 {
            // Below 100 ms a healthy leader's ordinary commit latency would shed.
            within(
                "shed_after_ms (or 0 for no shedding)",
                self.shed_after_ms,
                100..=600_000,
            )?;
        }
        within(
            "http2_keepalive_interval_ms",
            self.http2_keepalive_interval_ms,
            100..=3_600_000,
        )?;
        within(
            "http2_keepalive_timeout_ms",
            self.http2_keepalive_timeout_ms,
            100..=3_600_000,
        )?;
        within(
            "snapshot_chunk_timeout_ms",
            self.snapshot_chunk_timeout_ms,
            100..=600_000,
        )?;
        within(
            "max_message_bytes",
            self.max_message_bytes as u64,
            1_048_576..=tally_api::MAX_MESSAGE_BYTES as u64,
        )?;
        within(
            "disk_check_interval_ms",
            self.disk_check_interval_ms,
            10..=600_000,
        )?;
        within(
            "leader_placement_interval_ms",
            self.leader_placement_interval_ms,
            100..=86_400_000,
        )?;
        within(
            "memory_budget_bytes",
            self.memory_budget_bytes,
            MIN_MEMORY_BUDGET_BYTES..=u64::MAX,
        )?;
        if let Some(filter_memory_bytes) = self.filter_memory_bytes {
            within(
                "filter_memory_bytes (at most half of memory_budget_bytes)",
                filter_memory_bytes,
                0..=self.memory_budget_bytes / 2,
            )?;
        }
        within(
            "worker_threads",
            self.worker_threads as u64,
            0..=MAX_WORKER_THREADS as u64,
        )?;
        if self.malloc_trim_interval_ms != 0 {
            within(
                "malloc_trim_interval_ms (or 0)",
                self.malloc_trim_interval_ms,
                100..=86_400_000,
            )?;
        }
        within(
            "spill_idle_entries",
            self.spill_idle_entries,
            0..=tally_ledger::limits::MAX_LOG_INDEX,
        )?;
        within(
            "max_rules_version",
            u64::from(self.max_rules_version),
            u64::from(tally_ledger::LEGACY_RULES)..=u64::from(tally_ledger::CURRENT_RULES),
        )?;
        if self.disk_quota_bytes != 0 {
            within(
                "disk_quota_bytes (or 0 for no quota)",
                self.disk_quota_bytes,
                MIN_DISK_QUOTA_BYTES..=u64::MAX,
            )?;
        }
        Ok(())
    }

    /// How `memory_budget_bytes` is shared: the live families' footprint, and the family
    /// store's page cache (see the field's docs).
    pub fn memory_split(&self) -> MemorySplit {
        let budget = usize::try_from(self.memory_budget_bytes).unwrap_or(usize::MAX);
        let filters = (self.filter_memory_bytes).map_or(budget / 8, |bytes| {
            usize::try_from(bytes).unwrap_or(usize::MAX)
        });
        MemorySplit {
            live_families_bytes: budget / 2,
            store_cache_bytes: budget / 8,
            filter_bytes: filters,
        }
    }

    /// The disk watcher's limits (docs/spec.md §5.6).
    pub fn disk_limits(&self) -> super::disk::DiskLimits {
        super::disk::DiskLimits {
            quota_bytes: self.disk_quota_bytes,
            reserve_bytes: self.disk_reserve_bytes,
            check_interval: std::time::Duration::from_millis(self.disk_check_interval_ms),
        }
    }

    pub fn advertised(&self) -> String {
        self.advertise_addr
            .clone()
            .unwrap_or_else(|| self.listen_addr.to_string())
    }

    pub fn peer_advertised(&self) -> String {
        self.peer_advertise_addr
            .clone()
            .unwrap_or_else(|| self.peer_listen_addr.to_string())
    }

    /// This node as the membership records it.
    pub fn member(&self) -> crate::raft::types::TallyNode {
        crate::raft::types::TallyNode::new(
            self.advertised(),
            self.peer_advertised(),
            self.region.clone(),
        )
    }
}

#[cfg(test)]
// figment's `Jail::expect_with` fixes the closure's error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    /// The defaults with TLS files named (validation does not read them).
    fn secure() -> NodeConfig {
        NodeConfig {
            tls: Some(tally_tls::TlsFiles::in_dir(Path::new("tls"), "node-1")),
            ..NodeConfig::default()
        }
    }

    #[test]
    fn a_node_without_tls_needs_an_explicit_insecure() {
        let message = NodeConfig::default()
            .validate()
            .expect_err("no tls")
            .to_string();
        assert!(message.contains("no TLS configured"), "{message}");
        let plaintext = NodeConfig {
            insecure: true,
            ..NodeConfig::default()
        };
        assert!(plaintext.validate().is_ok());
        let both = NodeConfig {
            insecure: true,
            ..secure()
        };
        assert!(both.validate().is_err());
        let same_port = NodeConfig {
            peer_listen_addr: secure().listen_addr,
            ..secure()
        };
        assert!(same_port.validate().is_err());
        let bad_region = NodeConfig {
            region: "eu west".to_owned(),
            ..secure()
        };
        assert!(bad_region.validate().is_err());
    }

    #[test]
    fn defaults_validate_and_bad_values_are_refused() {
        assert!(secure().validate().is_ok());
        let bad = NodeConfig {
            node_id: 0,
            ..secure()
        };
        assert!(bad.validate().is_err());
        let bad = NodeConfig {
            heartbeat_interval_ms: 300,
            ..secure()
        };
        assert!(bad.validate().is_err());
        let bad = NodeConfig {
            max_batch_commands: 5_000,
            ..secure()
        };
        assert!(bad.validate().is_err());
        let bad = NodeConfig {
            memory_budget_bytes: MIN_MEMORY_BUDGET_BYTES - 1,
            ..secure()
        };
        assert!(bad.validate().is_err());
        let split = NodeConfig {
            memory_budget_bytes: 1 << 30,
            ..secure()
        }
        .memory_split();
        assert_eq!(
            (
                split.live_families_bytes,
                split.store_cache_bytes,
                split.filter_bytes
            ),
            (512 << 20, 128 << 20, 128 << 20)
        );
        let config = NodeConfig {
            memory_budget_bytes: 1 << 30,
            filter_memory_bytes: Some(0),
            ..secure()
        };
        assert!(config.validate().is_ok());
        assert_eq!(config.memory_split().filter_bytes, 0, "every page on disk");
        let bad = NodeConfig {
            filter_memory_bytes: Some((1 << 29) + 1),
            ..config
        };
        assert!(bad.validate().is_err(), "more than the families' half");
    }

    #[test]
    fn server_limits_are_validated_and_name_the_setting() {
        let refused = |config: NodeConfig| match config.validate() {
            Err(ConfigError::Invalid(message)) => message,
            other => panic!("{config:?} must be refused, got {other:?}"),
        };
        let message = refused(NodeConfig {
            max_in_flight_requests: 0,
            ..secure()
        });
        assert!(
            message.starts_with("max_in_flight_requests must be 1..="),
            "{message}"
        );
        let message = refused(NodeConfig {
            max_connections: 0,
            ..secure()
        });
        assert!(message.starts_with("max_connections"), "{message}");
        let message = refused(NodeConfig {
            max_concurrent_streams: 100,
            max_in_flight_requests: 200,
            ..secure()
        });
        assert!(
            message.starts_with("max_concurrent_streams must be 200..="),
            "{message}"
        );
        let message = refused(NodeConfig {
            request_timeout_ms: 5_000,
            propose_timeout_ms: 5_000,
            ..secure()
        });
        assert!(
            message.starts_with("request_timeout_ms must be 5001..="),
            "{message}"
        );
        let message = refused(NodeConfig {
            shed_after_ms: 50,
            ..secure()
        });
        assert!(
            message.starts_with("shed_after_ms (or 0 for no shedding) must be 100..="),
            "{message}"
        );
        let off = NodeConfig {
            shed_after_ms: 0,
            ..secure()
        };
        assert!(off.validate().is_ok(), "0 turns shedding off");
        let message = refused(NodeConfig {
            max_message_bytes: 64 * 1024 * 1024,
            ..secure()
        });
        assert!(message.starts_with("max_message_bytes"), "{message}");
        let message = refused(NodeConfig {
            http2_keepalive_timeout_ms: 0,
            ..secure()
        });
        assert!(
            message.starts_with("http2_keepalive_timeout_ms"),
            "{message}"
        );
        let message = refused(NodeConfig {
            worker_threads: MAX_WORKER_THREADS + 1,
            ..secure()
        });
        assert!(
            message.starts_with("worker_threads must be 0..=1024"),
            "{message}"
        );
        for worker_threads in [0, 1, MAX_WORKER_THREADS] {
            let config = NodeConfig {
                worker_threads,
                ..secure()
            };
            assert!(config.validate().is_ok(), "{worker_threads} worker threads");
        }
        // Rules versions: none before the first, none newer than this release knows.
        let newest = tally_ledger::CURRENT_RULES;
        for max_rules_version in [0, newest + 1] {
            let message = refused(NodeConfig {
                max_rules_version,
                ..secure()
            });
            assert_eq!(
                message,
                format!("max_rules_version must be 1..={newest}, got {max_rules_version}")
            );
        }
        for max_rules_version in 1..=newest {
            let config = NodeConfig {
                max_rules_version,
                ..secure()
            };
            assert!(
                config.validate().is_ok(),
                "rules version {max_rules_version}"
            );
        }
        assert_eq!(
            secure().max_rules_version,
            newest,
            "the default is the newest"
        );
    }

    #[test]
    fn a_file_then_the_environment_override_defaults() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "node.toml",
                "node_id = 7\ncluster_id = \"prod\"\n[tls]\nca_file = \"ca.pem\"\n\
                 cert_file = \"node-7.pem\"\nkey_file = \"node-7.key\"\n",
            )?;
            jail.set_env("TALLY_CLUSTER_ID", "from-env");
            // A container may set the command lines' variables beside the node's settings.
            jail.set_env("TALLY_CONFIG", "node.toml");
            jail.set_env("TALLY_TLS_DIR", "/etc/tally/tls");
            jail.set_env("TALLY_IDENTITY", "operator");
            jail.set_env("TALLY_FILTER_MEMORY_BYTES", "0");
            let config =
                NodeConfig::load(Some(Path::new("node.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(config.node_id, 7);
            assert_eq!(config.cluster_id, "from-env");
            assert_eq!(
                config.filter_memory_bytes,
                Some(0),
                "as the chaos nodes set it"
            );
            assert_eq!(
                config.tls.map(|tls| tls.cert_file),
                Some(PathBuf::from("node-7.pem"))
            );
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_missing_files_are_errors() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("node.toml", "node_idd = 7\n")?;
            assert!(NodeConfig::load(Some(Path::new("node.toml"))).is_err());
            assert!(NodeConfig::load(Some(Path::new("missing.toml"))).is_err());
            Ok(())
        });
    }
}
