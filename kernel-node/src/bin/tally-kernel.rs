//! `tally-kernel`: a stateless kernel node (`serve`), and the operator's tools for keys,
//! capability tokens and receipt logs. See `tally-kernel --help`.

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use tally_kernel::config::{KernelNodeConfig, ServeFlags};
use tally_kernel::money::Money;
use tally_kernel::pipeline::wall_clock_ms;
use tally_kernel::receipt::read_receipts;
use tally_kernel::{verify_receipt, CapabilityToken, Grant, KeyPair, PublicKey, TrustList};
use tally_tls::health_probe::probe_health;

#[derive(Parser)]
#[command(
    name = "tally-kernel",
    version,
    about = "Tally kernel node and its operator tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve `tally.kernel.v1.Kernel` (config: TOML file, then TALLY_KERNEL_* variables, then
    /// these flags). The port takes mutual TLS: its server certificate `kernel-server` and
    /// callers with an `agent` certificate of the same CA (`tally-node dev` writes both to
    /// ./tally-data/tls).
    Serve {
        #[arg(long, env = "TALLY_KERNEL_CONFIG")]
        config: Option<PathBuf>,
        /// The CA and this node's server certificate (config `tls_dir`; default
        /// ./tally-data/tls).
        #[arg(long)]
        tls_dir: Option<PathBuf>,
        /// The server certificate's name in the TLS directory, `<name>.pem`/`.key`; it must
        /// name `tally-kernel` (config `server_identity`; default kernel-server).
        #[arg(long)]
        server_identity: Option<String>,
        /// Serve plaintext and check no caller, for tools that cannot present a certificate
        /// (config `insecure`); announced with a WARN. The cluster and the rail are reached as
        /// their own settings say.
        #[arg(long)]
        insecure: bool,
        /// The region this kernel node runs in (config `region`): it talks to a cluster node
        /// of this region, which forwards writes to the leader.
        #[arg(long)]
        region: Option<String>,
    },
    /// Evaluate one monetary tool call end to end in front of a running cluster (start one
    /// with `tally-node dev`): issues a token, starts a tool server, a payment rail and a
    /// kernel node in-process, calls the node as an agent, and prints the verdicts, the
    /// signed receipts and the cluster's journal.
    Demo {
        /// Cluster endpoints, comma separated.
        #[arg(
            long,
            env = "TALLY_ENDPOINTS",
            value_delimiter = ',',
            default_value = "127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403"
        )]
        endpoints: Vec<String>,
        /// What the tool reports the call cost, in cents (at most the $1.00 charged).
        #[arg(long, default_value_t = 37)]
        cost_units: u64,
        /// The cluster's CA and the certificates every hop presents: `agent` to the kernel
        /// node, `kernel` to the cluster and the rail, `kernel-server` and `rail` as servers
        /// (`tally-node dev` writes them to ./tally-data/tls).
        #[arg(long, env = "TALLY_TLS_DIR", default_value = "./tally-data/tls")]
        tls_dir: std::path::PathBuf,
        /// Plaintext on every hop, for a cluster started with --insecure.
        #[arg(long)]
        insecure: bool,
    },
    /// Exit 0 if the kernel node at --endpoint reports SERVING on grpc.health.v1, 1 otherwise
    /// (NOT_SERVING once its receipt log failed): the exec probe of the container image and
    /// of Kubernetes, which works on the mutual-TLS port. Any certificate of the cluster's CA
    /// may ask: in a kernel's pod, its own `kernel` client certificate.
    Healthcheck {
        #[arg(long, default_value = "127.0.0.1:7500")]
        endpoint: String,
        /// Give up after this long.
        #[arg(long, default_value_t = 3_000)]
        timeout_ms: u64,
        /// Directory of the CA and the certificate presented.
        #[arg(long, env = "TALLY_TLS_DIR", default_value = "./tally-data/tls")]
        tls_dir: PathBuf,
        /// The certificate presented, `<tls-dir>/<identity>.pem`/`.key`.
        #[arg(long, default_value = "kernel")]
        identity: String,
        /// Plaintext, to a kernel node serving `--insecure`.
        #[arg(long)]
        insecure: bool,
    },
    /// Print a fresh key: its base64 seed (secret) and public key. With `--out`, write the
    /// seed to a new file created mode 0600 (what `key_file` requires) and print only the
    /// public key.
    Keygen {
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Capability tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Receipt logs.
    Receipts {
        #[command(subcommand)]
        command: ReceiptsCommand,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Issue a root token; prints its text form.
    Issue {
        /// The issuer's base64 key seed.
        #[arg(long, env = "TALLY_ISSUER_SEED", hide_env_values = true)]
        issuer_seed: String,
        /// The holder's base64 public key.
        #[arg(long)]
        subject: String,
        /// `server:tool`, or `server:tool:per_call:total:currency[:max_invocations]`.
        #[arg(long = "grant", required = true)]
        grants: Vec<String>,
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
    },
    /// Print a token's contents as JSON (no verification).
    Inspect { token: String },
    /// Verify a token's chain against trusted root issuers, now.
    Verify {
        token: String,
        #[arg(long = "trust", required = true)]
        trusted: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ReceiptsCommand {
    /// Check every receipt's signature in a JSON-lines receipt log.
    Verify {
        file: PathBuf,
        #[arg(long = "kernel-key", required = true)]
        kernel_keys: Vec<String>,
    },
}

fn parse_grant(spec: &str) -> anyhow::Result<Grant> {
    let parts: Vec<&str> = spec.split(':').collect();
    match parts.as_slice() {
        [server, tool] => Ok(Grant::tool(server, tool)),
        [server, tool, per_call, total, currency, rest @ ..] if rest.len() <= 1 => {
            let per_call: u64 = per_call.parse().context("per_call")?;
            let total: u64 = total.parse().context("total")?;
            let mut grant = Grant::tool(server, tool)
                .with_max_cost_per_invocation(Money::new(per_call, currency))
                .with_max_total_cost(Money::new(total, currency));
            if let [max] = rest {
                grant = grant.with_max_invocations(max.parse().context("max_invocations")?);
            }
            Ok(grant)
        }
        _ => bail!(
            "grant {spec:?}: expected server:tool[:per_call:total:currency[:max_invocations]]"
        ),
    }
}

fn trust_list(keys: &[String]) -> anyhow::Result<TrustList> {
    let keys = keys
        .iter()
        .map(|k| PublicKey::from_base64(k).with_context(|| format!("key {k:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(TrustList::new(keys))
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve(config: Option<PathBuf>, flags: ServeFlags) -> anyhow::Result<()> {
    let config = KernelNodeConfig::load_with(config.as_deref(), &flags)?;
    init_logging(config.log_format == "json");
    tracing::info!(config = ?config.redacted(), "configuration");
    tally_kernel::server::run(config, stop_signal()).await?;
    Ok(())
}

/// Ctrl-C, or SIGTERM: what `docker stop`, systemd and Kubernetes send to stop a process.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn healthcheck(
    endpoint: &str,
    timeout_ms: u64,
    tls_dir: &std::path::Path,
    identity: &str,
    insecure: bool,
) -> anyhow::Result<()> {
    let transport = tally_tls::Transport::from_dir(tls_dir, identity, insecure)?;
    let endpoint_of = transport.endpoint_to(endpoint, tally_tls::issue::KERNEL_SERVER_NAME)?;
    let probe = probe_health(endpoint_of, std::time::Duration::from_millis(timeout_ms))
        .await
        .map_err(|error| anyhow::anyhow!("{endpoint}: {error}"))?;
    if !probe.serving {
        bail!("{endpoint}: NOT_SERVING");
    }
    println!("{endpoint}: SERVING");
    Ok(())
}

fn token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Issue {
            issuer_seed,
            subject,
            grants,
            ttl_secs,
        } => {
            let issuer = KeyPair::from_seed_base64(issuer_seed.trim()).context("issuer seed")?;
            let subject = PublicKey::from_base64(&subject).context("subject")?;
            let grants = grants
                .iter()
                .map(|g| parse_grant(g))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let now = wall_clock_ms();
            let token = CapabilityToken::issue(
                &issuer,
                subject,
                grants,
                now,
                now.saturating_add(ttl_secs.saturating_mul(1_000)),
            )?;
            println!("{}", token.to_text()?);
        }
        TokenCommand::Inspect { token } => {
            let token = CapabilityToken::from_text(&token)?;
            let view = serde_json::json!({
                "id": token.id().as_str(),
                "family_id": token.family_id().as_str(),
                "depth": token.depth(),
                "body": token.body,
            });
            println!("{}", serde_json::to_string_pretty(&view)?);
        }
        TokenCommand::Verify { token, trusted } => {
            let token = CapabilityToken::from_text(&token)?;
            let verified =
                tally_kernel::token::verify(&token, &trust_list(&trusted)?, wall_clock_ms(), None)?;
            println!(
                "ok: capability {} in family {}, {} grant(s), expires at {} ms",
                verified.capability_id(),
                verified.family_id(),
                verified.grants().len(),
                verified.expires_at_ms()
            );
        }
    }
    Ok(())
}

fn receipts(command: ReceiptsCommand) -> anyhow::Result<()> {
    let ReceiptsCommand::Verify { file, kernel_keys } = command;
    let trusted = trust_list(&kernel_keys)?;
    let read = read_receipts(&file)?;
    for receipt in &read.receipts {
        verify_receipt(receipt, &trusted)
            .with_context(|| format!("receipt {}", receipt.receipt_id))?;
    }
    println!(
        "ok: {} receipt(s) verified{}",
        read.receipts.len(),
        if read.torn_tail {
            " (torn last line skipped)"
        } else {
            ""
        }
    );
    Ok(())
}

fn keygen(out: Option<PathBuf>) -> anyhow::Result<()> {
    let key = KeyPair::generate();
    match out {
        Some(path) => {
            tally_kernel::key_file::write_key_file(&path, &key)?;
            println!(
                "seed written to {} (mode 0600)\npublic_key: {}",
                path.display(),
                key.public_key().to_base64()
            );
        }
        None => println!(
            "seed: {}\npublic_key: {}",
            key.seed_base64(),
            key.public_key().to_base64()
        ),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            config,
            tls_dir,
            server_identity,
            insecure,
            region,
        } => {
            let flags = ServeFlags {
                tls_dir,
                server_identity,
                insecure,
                region,
            };
            serve(config, flags).await
        }
        Command::Demo {
            endpoints,
            cost_units,
            tls_dir,
            insecure,
        } => tally_kernel::demo::run(endpoints, &tls_dir, insecure, cost_units)
            .await
            .map_err(anyhow::Error::from),
        Command::Healthcheck {
            endpoint,
            timeout_ms,
            tls_dir,
            identity,
            insecure,
        } => healthcheck(&endpoint, timeout_ms, &tls_dir, &identity, insecure).await,
        Command::Keygen { out } => keygen(out),
        Command::Token { command } => token(command),
        Command::Receipts { command } => receipts(command),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tally-kernel: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
