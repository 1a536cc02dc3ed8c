//! Pure `Family::apply` throughput: authorize + capture + reconcile on fresh holds, one core,
//! no I/O. Commands are built before the clock starts, so only apply is measured. Cluster time
//! advances and retention is short, so compaction runs as it would in production and the
//! family stays bounded.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tally_ledger::*;

mod common;

use common::{ctx_at, tool_call, RequestIds, T0};

struct Driver {
    ids: RequestIds,
    family: Family,
    log_index: u64,
    calls: u64,
}

impl Driver {
    fn new(ids: RequestIds) -> Self {
        Self {
            ids,
            family: Family::new("fam".into()),
            log_index: 0,
            calls: 0,
        }
    }

    fn now_ms(&self) -> u64 {
        // One millisecond of cluster time per call: with 1 s deadlines and 1 s retention
        // about 2,000 calls stay in full; older ones are compacted as they would be.
        T0 + self.calls
    }

    /// Runs `calls` tool calls and returns the time spent inside `apply` only.
    fn run(&mut self, calls: u64) -> Duration {
        let params = ClusterParams {
            retention_ms: 1_000,
            max_clock_step_ms: 10_000,
            ..ClusterParams::default()
        }
        .at_rules(tally_ledger::CURRENT_RULES);
        let mut prepared = Vec::with_capacity(calls as usize);
        for _ in 0..calls {
            let now_ms = self.now_ms();
            // Every id is fresh, so a node's lookups among the rows out of memory (dropped
            // here, as a node stores them) all find nothing; built outside the timing.
            let commands: Vec<(Command, ColdFetch)> = tool_call(self.ids, self.calls, now_ms)
                .into_iter()
                .map(|command| {
                    let fetch = ColdFetch::absent([&command]);
                    (command, fetch)
                })
                .collect();
            prepared.push((now_ms, commands));
            self.calls += 1;
        }
        let start = Instant::now();
        for (now_ms, commands) in &mut prepared {
            for (command, fetch) in commands {
                self.log_index += 1;
                let ctx = ctx_at(self.log_index, *now_ms, params);
                self.family.start_batch(std::mem::take(fetch));
                let decision = self.family.apply(command, &ctx);
                assert!(decision.is_ok(), "bench command failed: {decision:?}");
            }
        }
        let elapsed = start.elapsed();
        drop(prepared);
        elapsed
    }
}

fn apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("ledger");
    group.throughput(Throughput::Elements(3));
    group.measurement_time(Duration::from_secs(5));
    let mut driver = Driver::new(RequestIds::Sequential);
    group.bench_function("apply authorize+capture+reconcile (3 commands)", |b| {
        b.iter_custom(|iters| driver.run(iters))
    });
    group.finish();
    eprintln!(
        "ledger bench: family after {} calls holds {} journal events, {} live holds, {} bytes encoded",
        driver.calls,
        driver.family.journal_len(),
        driver.family.live_hold_count(),
        driver.family.to_snapshot_bytes().len()
    );
}

/// Fixed work from a fresh family: 20,000 calls (60,000 commands) per iteration. Unlike the
/// steady-state bench above, every sample measures the same state sizes, so runs compare.
fn fresh_family(c: &mut Criterion) {
    const CALLS: u64 = 20_000;
    let mut group = c.benchmark_group("ledger fresh family");
    group.throughput(Throughput::Elements(3 * CALLS));
    group.sample_size(10);
    for (name, ids) in [
        (
            "20k calls (authorize+capture+reconcile)",
            RequestIds::Sequential,
        ),
        ("20k calls, random request ids", RequestIds::Random),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| Driver::new(ids).run(CALLS)).sum())
        });
    }
    group.finish();
}

fn snapshot(c: &mut Criterion) {
    let mut driver = Driver::new(RequestIds::Sequential);
    driver.run(10_000);
    let bytes = driver.family.to_snapshot_bytes();
    let mut group = c.benchmark_group("ledger snapshot");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("encode family after 10k calls", |b| {
        b.iter(|| driver.family.to_snapshot_bytes())
    });
    group.bench_function("decode family after 10k calls", |b| {
        b.iter(|| Family::from_snapshot_bytes(&bytes).expect("decodes"))
    });
    group.finish();
}

criterion_group!(benches, apply, fresh_family, snapshot);
criterion_main!(benches);
