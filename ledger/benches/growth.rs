//! The slowest single `Family::apply` while one family grows to millions of rows. A family
//! keeps a dedupe row for every command and an archived record for every hold for ever
//! (docs/spec.md §5.5), so its two tables only grow; every replica applies the same command at
//! the same log index, so one slow apply stalls that family on all of them at once. Prints,
//! per window of calls, the apply throughput and the slowest apply, then the slowest overall.
//!
//! `cargo bench -p tally-ledger --bench growth` (2,000,000 calls by default;
//! `TALLY_BENCH_GROWTH_CALLS=N` for another size, 10,000 to 10,000,000;
//! `TALLY_BENCH_GROWTH_IDS=counter` names requests by a counter instead of by UUIDs).

use std::time::{Duration, Instant};

use tally_ledger::*;

mod common;

use common::{ctx_at, tool_call, RequestIds, T0};

const DEFAULT_CALLS: u64 = 2_000_000;
const MIN_CALLS: u64 = 10_000;
/// About 12 GB of family at the top (a compacted call keeps ~1.2 KB on the heap, see the
/// memory bench).
const MAX_CALLS: u64 = 10_000_000;
/// Lines of the per-window table.
const WINDOWS: u64 = 8;

fn calls_asked() -> u64 {
    let Ok(text) = std::env::var("TALLY_BENCH_GROWTH_CALLS") else {
        return DEFAULT_CALLS;
    };
    match text.replace('_', "").parse::<u64>() {
        Ok(calls) if (MIN_CALLS..=MAX_CALLS).contains(&calls) => calls,
        _ => {
            eprintln!(
                "TALLY_BENCH_GROWTH_CALLS={text:?}: give a number of calls from {MIN_CALLS} to {MAX_CALLS}"
            );
            std::process::exit(2);
        }
    }
}

fn request_ids_asked() -> (RequestIds, &'static str) {
    match std::env::var("TALLY_BENCH_GROWTH_IDS").as_deref() {
        Err(_) | Ok("uuid") => (RequestIds::Random, "UUID-named requests"),
        Ok("counter") => (RequestIds::Sequential, "counter-named requests"),
        Ok(other) => {
            eprintln!("TALLY_BENCH_GROWTH_IDS={other:?}: give uuid or counter");
            std::process::exit(2);
        }
    }
}

/// The slowest apply seen so far: how long, and at which command.
#[derive(Clone, Copy, Default)]
struct Slowest {
    took: Duration,
    command: u64,
}

impl Slowest {
    fn note(&mut self, took: Duration, command: u64) {
        if took > self.took {
            *self = Self { took, command };
        }
    }
}

fn main() {
    let calls = calls_asked();
    let (ids, ids_name) = request_ids_asked();
    // Retention as in the apply bench: the journal stays small, the tables keep every row.
    let params = ClusterParams {
        retention_ms: 1_000,
        max_clock_step_ms: 10_000,
        ..ClusterParams::default()
    }
    .at_rules(tally_ledger::CURRENT_RULES);
    let window_calls = calls.div_ceil(WINDOWS);
    println!(
        "ledger growth: {calls} calls (authorize+capture+reconcile, {ids_name}) on one family"
    );
    println!(
        "  {:>11}  {:>12}  {:>12}  {:>18}  {:>16}",
        "calls", "dedupe rows", "holds", "apply commands/s", "slowest apply"
    );
    let mut family = Family::new("fam".into());
    let mut log_index = 0;
    let mut overall = Slowest::default();
    let mut window = Slowest::default();
    let mut window_time = Duration::ZERO;
    let mut window_commands = 0u64;
    for call in 0..calls {
        let now_ms = T0 + call;
        // Built outside the timing, as a node decodes a log entry before applying it.
        for command in tool_call(ids, call, now_ms) {
            log_index += 1;
            let ctx = ctx_at(log_index, now_ms, params);
            // Fresh ids only: the rows out of memory are dropped, as a node stores them.
            family.start_batch(ColdFetch::absent([&command]));
            let start = Instant::now();
            let decision = family.apply(&command, &ctx);
            let took = start.elapsed();
            assert!(decision.is_ok(), "bench command failed: {decision:?}");
            window.note(took, log_index);
            window_time += took;
            window_commands += 1;
        }
        let done = call + 1;
        if done % window_calls == 0 || done == calls {
            println!(
                "  {:>11}  {:>12}  {:>12}  {:>18.0}  {:>10.2} ms at command {}",
                done,
                3 * done,
                done,
                window_commands as f64 / window_time.as_secs_f64(),
                window.took.as_secs_f64() * 1e3,
                window.command
            );
            overall.note(window.took, window.command);
            window = Slowest::default();
            window_time = Duration::ZERO;
            window_commands = 0;
        }
    }
    println!(
        "SUMMARY slowest single apply over {} commands: {:.2} ms (command {}); family at the end: {} live holds, {} journal events",
        3 * calls,
        overall.took.as_secs_f64() * 1e3,
        overall.command,
        family.live_hold_count(),
        family.journal_len()
    );
}
