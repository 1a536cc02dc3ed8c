//! The `tally-chaos` command line: `tally-chaos run --profile ci|soak [--seed N]
//! [--duration-s S] [--out DIR] [--node-binary PATH] [--kernel-binary PATH | --no-kernels]`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::profile::{Profile, ProfileName};
use crate::run::RunOptions;

/// Tally's chaos harness: a 3-node cluster of real processes behind fault-injecting proxies,
/// a seeded workload and seeded nemeses, then a check of docs/spec.md §11 against the history.
#[derive(Debug, Parser)]
#[command(name = "tally-chaos", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: CliCommand,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// One run; exits 0 when every invariant held, 1 on a violation, 2 when the run failed.
    Run {
        #[arg(long, value_enum, default_value = "ci")]
        profile: ProfileName,
        /// Seeds the workload and the fault schedule (default: from the clock; printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Seconds of workload and faults (ci: 90, soak: 1800).
        #[arg(long)]
        duration_s: Option<u64>,
        /// Where data dirs, node logs and reports go (default `target/chaos/<profile>-<seed>`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The node binary (default: chaos-node next to this binary).
        #[arg(long)]
        node_binary: Option<PathBuf>,
        /// The kernel binary (default: chaos-kernel next to this binary).
        #[arg(long)]
        kernel_binary: Option<PathBuf>,
        /// Run without the kernel layer (cluster workload only).
        #[arg(long)]
        no_kernels: bool,
        /// Voters: 3 (a region each), 5 (east 2, central 2, west 1, so a region cut off takes
        /// two nodes) or 7.
        #[arg(long, default_value_t = 3, value_parser = parse_nodes)]
        nodes: u64,
    },
}

/// `--nodes`: an odd count from 3 to 7 (an even one adds a node and no fault tolerance).
fn parse_nodes(text: &str) -> Result<u64, String> {
    let nodes: u64 = text.parse().map_err(|e| format!("`{text}`: {e}"))?;
    if !(3..=7).contains(&nodes) || nodes.is_multiple_of(2) {
        return Err(format!("{nodes}: 3, 5 or 7 voters"));
    }
    Ok(nodes)
}

impl CliCommand {
    pub fn into_options(self) -> anyhow::Result<RunOptions> {
        let CliCommand::Run {
            profile,
            seed,
            duration_s,
            out,
            node_binary,
            kernel_binary,
            no_kernels,
            nodes,
        } = self;
        let seed = seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
        });
        let node_binary = match node_binary {
            Some(path) => path,
            None => std::env::current_exe()?
                .parent()
                .map(|dir| dir.join("chaos-node"))
                .ok_or_else(|| anyhow::anyhow!("cannot locate chaos-node"))?,
        };
        anyhow::ensure!(
            node_binary.exists(),
            "node binary {} not found (cargo build -p tally-chaos builds it)",
            node_binary.display()
        );
        let kernel_binary = if no_kernels {
            None
        } else {
            let path = match kernel_binary {
                Some(path) => path,
                None => std::env::current_exe()?
                    .parent()
                    .map(|dir| dir.join("chaos-kernel"))
                    .ok_or_else(|| anyhow::anyhow!("cannot locate chaos-kernel"))?,
            };
            anyhow::ensure!(
                path.exists(),
                "kernel binary {} not found (cargo build -p tally-chaos --bins builds it)",
                path.display()
            );
            Some(path)
        };
        let out = out.unwrap_or_else(|| {
            PathBuf::from("target/chaos").join(format!("{}-{seed}", profile.as_str()))
        });
        let mut profile = Profile::new(profile, duration_s);
        profile.nodes = nodes;
        Ok(RunOptions {
            profile,
            seed,
            out,
            node_binary,
            kernel_binary,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_is_an_odd_count_from_three_to_seven_and_bad_ones_say_why() {
        assert_eq!(parse_nodes("5"), Ok(5));
        for bad in ["1", "4", "9", "x"] {
            assert!(parse_nodes(bad).is_err(), "{bad}");
        }
        assert!(parse_nodes("4").unwrap_err().contains("3, 5 or 7"));
    }
}
