//! `chaos-node`: `tally-node` with the failpoints compiled in (`FAILPOINTS=...` arms them at
//! start-up). Only the chaos harness runs it.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The one binary that may arm them (see `tally_authority::failpoints::enable`).
    tally_authority::failpoints::enable();
    let cli = tally_authority::cli::Cli::parse();
    match tally_authority::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("chaos-node: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
