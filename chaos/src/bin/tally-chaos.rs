//! `tally-chaos`: see `tally-chaos --help`.

use clap::Parser;
use tally_chaos::cli::Cli;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let _ = tracing_subscriber_init();
    let cli = Cli::parse();
    let options = match cli.command.into_options() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("tally-chaos: {error:#}");
            return std::process::ExitCode::from(2);
        }
    };
    eprintln!(
        "tally-chaos: profile {} seed {} for {} s, out {}",
        options.profile.name.as_str(),
        options.seed,
        options.profile.duration_s,
        options.out.display()
    );
    match tally_chaos::run::run(&options).await {
        Ok(report) => {
            print!("{}", tally_chaos::report::summary(&report));
            if report.passed() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("tally-chaos: the run failed: {error:#}");
            eprintln!("replay: {}", options.repro());
            std::process::ExitCode::from(2)
        }
    }
}

/// Warnings from the harness to stderr; `RUST_LOG` overrides.
fn tracing_subscriber_init() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init()
}
