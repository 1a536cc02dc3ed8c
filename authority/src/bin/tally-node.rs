//! `tally-node`: see `tally-node --help`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = tally_authority::cli::Cli::parse();
    match tally_authority::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tally-node: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
