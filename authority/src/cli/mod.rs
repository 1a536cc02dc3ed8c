//! The `tally-node` command line: `serve`, `init`, `healthcheck`, `certs` and `dev` (a local
//! cluster in one command). `main` only parses and calls `run`.

pub mod backup;
pub mod certs;
pub mod dev;
pub mod logging;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tally_api::pb::admin_client::AdminClient;
use tally_api::pb::{self, InitializeRequest};
use tally_tls::health_probe::probe_health;
use tally_tls::Transport;

use crate::faults::NetworkFaults;
use crate::node::config::NodeConfig;

/// Tally authority node: a member of the Raft cluster that holds agent budgets.
#[derive(Debug, Parser)]
#[command(name = "tally-node", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: CliCommand,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Run one node. Settings come from defaults, then --config FILE (TOML), then TALLY_*
    /// environment variables (for example TALLY_NODE_ID=2, TALLY_LISTEN_ADDR=127.0.0.1:7402,
    /// TALLY_DATA_DIR=/var/lib/tally). The effective configuration is printed once at start.
    Serve {
        /// TOML file with node settings (node_id, listen_addr, peer_listen_addr, region,
        /// data_dir, cluster_id, [tls] ca_file/cert_file/key_file, ...).
        #[arg(long, env = "TALLY_CONFIG")]
        config: Option<PathBuf>,
        /// Plaintext on both ports, with no authentication: anyone who reaches a port can
        /// forge budget commands or take over the log. For sealed test networks only.
        #[arg(long)]
        insecure: bool,
        /// The configuration, once `Cli::runtime_worker_threads` has read it (before the
        /// runtime starts), so that `run` does not read it a second time.
        #[arg(skip)]
        loaded: Option<Box<NodeConfig>>,
    },
    /// Initialize a new cluster through one of its (running, empty) nodes, as an operator.
    Init {
        /// Client address of a node to initialize through, for example 127.0.0.1:7401.
        #[arg(long)]
        endpoint: String,
        /// Every initial member as ID=CLIENT_ADDR,PEER_ADDR,REGION, for example
        /// --member 1=10.0.0.1:7401,10.0.0.1:7601,eu-west.
        #[arg(long = "member", required = true, value_parser = parse_member)]
        members: Vec<(u64, pb::MemberAddress)>,
        #[command(flatten)]
        credentials: Credentials,
    },
    /// Exit 0 if the node at ENDPOINT reports SERVING on grpc.health.v1, 1 otherwise. Any
    /// certificate of the cluster's CA may ask (a node's own, in its pod).
    Healthcheck {
        #[arg(long, default_value = "127.0.0.1:7401")]
        endpoint: String,
        /// Give up after this long.
        #[arg(long, default_value_t = 3_000)]
        timeout_ms: u64,
        #[command(flatten)]
        credentials: Credentials,
    },
    /// Create a cluster CA and issue node and client certificates (production; `dev` makes
    /// its own).
    Certs(certs::CertsArgs),
    /// Start a local cluster of N nodes on 127.0.0.1 in this process, initialize it (first
    /// run) or restart it from its data dir (later runs), wait until it serves, print the
    /// endpoints and an example call, and stop everything on Ctrl-C or SIGTERM.
    Dev(dev::DevArgs),
    /// Copy this node's newest snapshot to a file: a backup of the whole cluster state up to
    /// that snapshot's log index. Safe while the node runs. With --endpoint, first asks the
    /// node (as an operator) for a snapshot of everything it has applied, and waits for it.
    Backup(backup::BackupArgs),
    /// Seed an empty data dir with a backup; a node started on it loads that state. To bring
    /// back a whole cluster, restore the same file into every member's data dir and start
    /// them with their old ids and addresses (docs/operations.md "Backup and restore").
    Restore(backup::RestoreArgs),
}

/// Which certificate a command-line call presents.
#[derive(Debug, clap::Args)]
pub struct Credentials {
    /// Directory of the CA and client certificates (`tally-node dev` writes
    /// ./tally-data/tls).
    #[arg(long, env = "TALLY_TLS_DIR", default_value = "./tally-data/tls")]
    pub tls_dir: PathBuf,
    /// The certificate to present: <tls-dir>/<identity>.pem and .key.
    #[arg(long, env = "TALLY_IDENTITY", default_value = "operator")]
    pub identity: String,
    /// Plaintext, for a cluster started with --insecure.
    #[arg(long)]
    pub insecure: bool,
}

impl Credentials {
    fn transport(&self) -> anyhow::Result<Transport> {
        Ok(Transport::from_dir(
            &self.tls_dir,
            &self.identity,
            self.insecure,
        )?)
    }
}

fn parse_member(value: &str) -> Result<(u64, pb::MemberAddress), String> {
    let usage = "expected ID=CLIENT_ADDR,PEER_ADDR,REGION";
    let (id, rest) = value.split_once('=').ok_or(usage)?;
    let id: u64 = id.parse().map_err(|_| format!("{id:?} is not a node id"))?;
    let parts: Vec<&str> = rest.split(',').collect();
    let [address, peer_address, region] = parts[..] else {
        return Err(usage.to_owned());
    };
    if address.is_empty() || peer_address.is_empty() || region.is_empty() {
        return Err(format!("{usage}: no part may be empty"));
    }
    Ok((
        id,
        pb::MemberAddress {
            address: address.to_owned(),
            peer_address: peer_address.to_owned(),
            region: region.to_owned(),
        },
    ))
}

impl Cli {
    /// The async runtime's worker threads this command asks for (`None`: tokio's default).
    /// `serve` reads its node's configuration here, before the runtime exists, and keeps it
    /// for `run`: one read, so the runtime and the node are sized from the same settings.
    pub fn runtime_worker_threads(&mut self) -> anyhow::Result<Option<usize>> {
        match &mut self.command {
            CliCommand::Serve {
                config,
                insecure,
                loaded,
            } => {
                let config = NodeConfig::load_with(config.as_deref(), *insecure)?;
                let threads = (config.worker_threads > 0).then_some(config.worker_threads);
                *loaded = Some(Box::new(config));
                Ok(threads)
            }
            _ => Ok(None),
        }
    }
}

/// Runs the parsed command; the exit code is the caller's business.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        CliCommand::Serve {
            config,
            insecure,
            loaded,
        } => {
            let config = match loaded {
                Some(loaded) => *loaded,
                None => NodeConfig::load_with(config.as_deref(), insecure)?,
            };
            logging::init(config.log_format);
            #[cfg(feature = "failpoints")]
            if crate::failpoints::enabled() {
                for (name, actions) in crate::failpoints::configure_from_env()? {
                    eprintln!("failpoint {name} armed: {actions}");
                }
            }
            println!("tally-node configuration:\n{}", toml_text(&config));
            println!(
                "async runtime worker threads: {} (worker_threads, docs/sizing.md \"Cores\")",
                tokio::runtime::Handle::current().metrics().num_workers()
            );
            let node = crate::node::start(config, Arc::<NetworkFaults>::default()).await?;
            wait_for_signal().await;
            tracing::info!("shutting down");
            node.shutdown().await;
            Ok(())
        }
        CliCommand::Init {
            endpoint,
            members,
            credentials,
        } => {
            let channel = credentials
                .transport()?
                .endpoint(&endpoint)?
                .connect()
                .await?;
            let mut client = AdminClient::new(channel);
            let nodes: BTreeMap<u64, pb::MemberAddress> = members.into_iter().collect();
            let count = nodes.len();
            client
                .initialize(InitializeRequest {
                    members: BTreeMap::new(),
                    nodes,
                })
                .await?;
            println!("initialized a cluster of {count} members");
            Ok(())
        }
        CliCommand::Certs(args) => certs::run(args),
        CliCommand::Healthcheck {
            endpoint,
            timeout_ms,
            credentials,
        } => {
            let transport = credentials.transport()?;
            let timeout = Duration::from_millis(timeout_ms);
            let probe = probe_health(transport.endpoint(&endpoint)?, timeout)
                .await
                .map_err(|error| anyhow::anyhow!("{endpoint}: {error}"))?;
            // Bounded like the probe: a probe's caller kills it when its own timeout passes.
            let detail = tokio::time::timeout(timeout, alarm_detail(probe.channel))
                .await
                .unwrap_or_default();
            if !probe.serving {
                anyhow::bail!("{endpoint}: NOT_SERVING{detail}");
            }
            println!("{endpoint}: SERVING{detail}");
            Ok(())
        }
        CliCommand::Dev(args) => dev::run(args).await,
        CliCommand::Backup(args) => backup::backup(args).await,
        CliCommand::Restore(args) => backup::restore(args),
    }
}

/// The raised alarms, as a suffix of the health line. A raised alarm leaves the node SERVING
/// (reads and commands on existing holds go on; see `Health::is_healthy`), so it is shown
/// here. An identity that may not list alarms (a kernel's) gets no detail, not an error.
pub async fn alarm_detail(channel: tonic::transport::Channel) -> String {
    let mut admin = AdminClient::new(channel);
    let Ok(reply) = admin.list_alarms(pb::ListAlarmsRequest {}).await else {
        return String::new();
    };
    let alarms = reply.into_inner().alarms;
    if alarms.is_empty() {
        return String::new();
    }
    let named: Vec<String> = alarms
        .iter()
        .map(|alarm| {
            let kind =
                pb::AlarmKind::try_from(alarm.kind).map_or("unknown", |kind| kind.as_str_name());
            format!("{kind} raised by node {}: {}", alarm.node_id, alarm.reason)
        })
        .collect();
    format!(
        " (alarm: {}; new holds, charges and nonces are refused until `tally alarm clear`)",
        named.join("; ")
    )
}

fn toml_text(config: &NodeConfig) -> String {
    toml::to_string_pretty(config).unwrap_or_else(|e| format!("{config:?} ({e})"))
}

/// Ctrl-C or SIGTERM.
pub async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
