//! `tally`: see `tally --help`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = tally_client::cli::Cli::parse();
    match tally_client::cli::run(cli).await {
        Ok(code) => std::process::ExitCode::from(code),
        Err(error) => {
            eprintln!("tally: {error:#}");
            std::process::ExitCode::from(1)
        }
    }
}
