//! `tally-node`: see `tally-node --help`.

use clap::Parser;

/// Counts the heap bytes in use, so the trimmer never walks the heaps to learn them
/// (heap_count.rs says why).
#[global_allocator]
static HEAP: tally_authority::heap_count::CountingAllocator =
    tally_authority::heap_count::CountingAllocator;

fn main() -> std::process::ExitCode {
    // Before the runtime starts its threads (allocator.rs says why).
    tally_authority::allocator::limit_malloc_arenas();
    let mut cli = tally_authority::cli::Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    match cli.runtime_worker_threads() {
        Ok(Some(threads)) => {
            builder.worker_threads(threads);
        }
        Ok(None) => {}
        Err(error) => {
            eprintln!("tally-node: {error:#}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tally-node: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tally_authority::cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tally-node: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
