//! `chaos-kernel`: `tally-kernel serve` built next to `tally-chaos`, so `cargo build -p
//! tally-chaos --bins` builds everything a run starts. Only the chaos harness runs it:
//! `chaos-kernel serve --config FILE` (the config TOML, then `TALLY_KERNEL_*` variables).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use tally_kernel::config::KernelNodeConfig;

#[derive(Parser)]
#[command(name = "chaos-kernel")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve `tally.kernel.v1.Kernel` as `tally-kernel serve` does.
    Serve {
        #[arg(long, env = "TALLY_KERNEL_CONFIG")]
        config: Option<PathBuf>,
    },
}

async fn serve(config: Option<PathBuf>) -> anyhow::Result<()> {
    let config = KernelNodeConfig::load(config.as_deref())?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    tracing::info!(config = ?config.redacted(), "configuration");
    tally_kernel::server::run(config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Command::Serve { config } = Cli::parse().command;
    match serve(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("chaos-kernel: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
