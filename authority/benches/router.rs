//! Router benchmarks: apply throughput (authorize + capture + reconcile) over 1, 100 and
//! 100,000 families; snapshot and restore of a router holding 1,000,000 accounts; memory per
//! passivated family. Each figure is also printed as a `SUMMARY` line for
//! docs/benchmarks.md.
//! Knobs: `TALLY_BENCH_WORKERS` (tokio workers, default 2), `TALLY_BENCH_APPLY_ONLY` (only the
//! 1- and 100-family apply benches).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use tally_authority::families::{
    EntryInput, EntryPayload, FamilyRouter, RouterConfig, RouterSnapshot,
};
use tally_ledger::{
    ClientCommand, ClusterParams, Command, CommandHeader, FamilyId, GrantLimits, LogPosition,
    Operation,
};
use tokio::runtime::Runtime;

const T0: u64 = 1_700_000_000_000;
/// Commands per `apply` call (341 authorize + capture + reconcile triples).
const BATCH: usize = 1_023;
const COMMANDS_PER_ENTRY: usize = 256;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::env::var("TALLY_BENCH_WORKERS")
                .ok()
                .and_then(|w| w.parse().ok())
                .unwrap_or(2),
        )
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn header(
    family_id: &FamilyId,
    capability: String,
    event_id: String,
    now_ms: u64,
) -> CommandHeader {
    CommandHeader {
        family_id: family_id.clone(),
        capability_id: capability.into(),
        grant_index: 0,
        event_id: event_id.into(),
        not_after_ms: now_ms + 1_000,
    }
}

fn limits() -> GrantLimits {
    GrantLimits::monetary(None, Some(100), None, "USD")
}

/// The three commands of one monetary call: authorize, capture, reconcile.
fn hold_triple(family_id: &FamilyId, hold: u64, now_ms: u64) -> [Command; 3] {
    let cap = format!("{family_id}-cap");
    let hold_id = format!("h{hold}");
    let cmd = |suffix: &str, op: Operation| {
        Command::Apply(ClientCommand {
            header: header(
                family_id,
                cap.clone(),
                format!("{hold_id}:{suffix}"),
                now_ms,
            ),
            op,
        })
    };
    [
        cmd(
            "authorize",
            Operation::AuthorizeHold {
                hold_id: hold_id.as_str().into(),
                requested_exposure_units: 50,
                limits: limits(),
                ancestors: vec![],
                hold_timeout_ms: None,
            },
        ),
        cmd(
            "capture",
            Operation::CaptureInvocation {
                hold_id: hold_id.as_str().into(),
                attempt_id: "attempt".into(),
            },
        ),
        cmd(
            "reconcile",
            Operation::ReconcileHold {
                hold_id: hold_id.as_str().into(),
                exposed_cost_units: 50,
                realized_spend_units: 30,
            },
        ),
    ]
}

/// Hands out log indexes and stamps in order.
struct Log {
    next_index: u64,
    now_ms: u64,
}

impl Log {
    fn new() -> Self {
        Self {
            next_index: 1,
            now_ms: T0,
        }
    }

    fn entry(&mut self, payload: EntryPayload, step_ms: u64) -> EntryInput {
        let entry = EntryInput {
            log_id: LogPosition {
                term: 1,
                index: self.next_index,
            },
            stamped_ms: self.now_ms,
            payload,
        };
        self.next_index += 1;
        self.now_ms += step_ms;
        entry
    }

    /// Entries of at most `COMMANDS_PER_ENTRY` commands each.
    fn entries(&mut self, commands: Vec<Command>, step_ms: u64) -> Vec<EntryInput> {
        let mut out = Vec::new();
        let mut commands = commands.into_iter().peekable();
        while commands.peek().is_some() {
            let chunk: Vec<Command> = commands.by_ref().take(COMMANDS_PER_ENTRY).collect();
            out.push(self.entry(EntryPayload::Commands(chunk), step_ms));
        }
        out
    }
}

fn short_retention() -> ClusterParams {
    ClusterParams {
        retention_ms: 1_000,
        ..ClusterParams::default()
    }
}

/// Round-robin authorize + capture + reconcile triples over `families` families.
struct Workload {
    families: Vec<FamilyId>,
    next_hold: u64,
    log: Log,
}

impl Workload {
    fn new(families: usize) -> Self {
        let families = (0..families)
            .map(|i| FamilyId::from(format!("fam-{i:06}")))
            .collect();
        Self {
            families,
            next_hold: 0,
            log: Log::new(),
        }
    }

    fn next_batch(&mut self) -> Vec<EntryInput> {
        let mut commands = Vec::with_capacity(BATCH);
        while commands.len() + 3 <= BATCH {
            let family = &self.families[(self.next_hold % self.families.len() as u64) as usize];
            commands.extend(hold_triple(family, self.next_hold, self.log.now_ms));
            self.next_hold += 1;
        }
        self.log.entries(commands, 100)
    }
}

fn bench_apply(c: &mut Criterion, rt: &Runtime, summary: &mut Vec<String>) {
    let mut group = c.benchmark_group("router_apply");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(BATCH as u64 / 3 * 3));
    for families in [1usize, 100, 100_000] {
        if std::env::var_os("TALLY_BENCH_APPLY_ONLY").is_some() && families > 100 {
            continue;
        }
        let config = RouterConfig::default();
        let mut router = FamilyRouter::new(config).expect("config");
        let mut work = Workload::new(families);
        let params = work
            .log
            .entry(EntryPayload::SetParams(short_retention().into()), 1);
        rt.block_on(router.apply(vec![params])).expect("set params");
        // Touch every family once so the measurement is steady state, not first creation.
        let warm_batches = families.div_ceil(BATCH / 3);
        for _ in 0..warm_batches {
            let batch = work.next_batch();
            rt.block_on(router.apply(batch)).expect("warm-up apply");
        }
        let (mut commands, mut elapsed) = (0u64, Duration::ZERO);
        group.bench_function(BenchmarkId::from_parameter(families), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let batch = work.next_batch();
                    let n: usize = batch
                        .iter()
                        .map(|e| match &e.payload {
                            EntryPayload::Commands(c) => c.len(),
                            _ => 0,
                        })
                        .sum();
                    let start = Instant::now();
                    let out = rt.block_on(router.apply(batch)).expect("apply");
                    total += start.elapsed();
                    black_box(out);
                    commands += n as u64;
                }
                elapsed += total;
                total
            })
        });
        let line = format!(
            "SUMMARY apply authorize+capture+reconcile, {families} families, batches of {BATCH}: \
             {:.0} commands/s (live actors {}, passivated {}, max_live {})",
            commands as f64 / elapsed.as_secs_f64(),
            router.live_actors(),
            router.passivated_families(),
            config.max_live_actors,
        );
        eprintln!("{line}");
        summary.push(line);
        rt.block_on(router.shutdown());
    }
    group.finish();
}

/// A router holding `families × accounts_per_family` accounts, each with one compacted
/// `TryIncrement` event.
fn million_accounts(rt: &Runtime, families: usize, accounts_per_family: usize) -> FamilyRouter {
    let config = RouterConfig {
        max_live_actors: families,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::new(config).expect("config");
    let mut log = Log::new();
    let params = log.entry(EntryPayload::SetParams(short_retention().into()), 1);
    rt.block_on(router.apply(vec![params])).expect("set params");
    let ids: Vec<FamilyId> = (0..families)
        .map(|i| FamilyId::from(format!("fam-{i:06}")))
        .collect();
    let total = families * accounts_per_family;
    let per_entry = 4 * COMMANDS_PER_ENTRY;
    let mut n = 0;
    while n < total {
        let mut entries = Vec::new();
        for _ in 0..16 {
            let mut commands = Vec::with_capacity(per_entry);
            while commands.len() < per_entry && n < total {
                let family = &ids[n % families];
                let account = n / families;
                commands.push(Command::Apply(ClientCommand {
                    header: header(
                        family,
                        format!("cap-{account}"),
                        format!("inc-{n}"),
                        log.now_ms,
                    ),
                    op: Operation::TryIncrement {
                        limits: GrantLimits::invocations(1_000),
                    },
                }));
                n += 1;
            }
            // 10 s per entry: a family's next command comes after its events' retention.
            entries.push(log.entry(EntryPayload::Commands(commands), 10_000));
        }
        rt.block_on(router.apply(entries)).expect("build apply");
    }
    router
}

fn bench_snapshot(c: &mut Criterion, rt: &Runtime, summary: &mut Vec<String>) {
    let (families, per_family) = (10_000, 100);
    let start = Instant::now();
    let router = million_accounts(rt, families, per_family);
    let build = start.elapsed();
    let snapshot = rt.block_on(router.snapshot()).expect("snapshot");
    let bytes = snapshot.to_bytes().expect("encode");
    let digest = rt.block_on(router.digest()).expect("digest");
    assert_eq!(
        snapshot.digest(),
        digest,
        "snapshot and router digests differ"
    );

    let mut group = c.benchmark_group("router_snapshot_1m_accounts");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(8));
    let mut snapshot_times = Vec::new();
    group.bench_function("snapshot_and_encode", |b| {
        b.iter(|| {
            let start = Instant::now();
            let snap = rt.block_on(router.snapshot()).expect("snapshot");
            let encoded = snap.to_bytes().expect("encode");
            snapshot_times.push(start.elapsed());
            black_box(encoded)
        })
    });
    // What the apply path waits for: the cut alone (the encoding runs beside it).
    let mut cut_times: Vec<Duration> = (0..10)
        .map(|_| {
            let start = Instant::now();
            let cut = rt.block_on(router.cut()).expect("cut");
            let elapsed = start.elapsed();
            drop(cut);
            elapsed
        })
        .collect();
    let mut restore_times = Vec::new();
    group.bench_function("decode_and_restore", |b| {
        b.iter(|| {
            let start = Instant::now();
            let snap = RouterSnapshot::from_bytes(&bytes).expect("decode");
            let restored = FamilyRouter::restore(RouterConfig::default(), snap).expect("restore");
            restore_times.push(start.elapsed());
            black_box(restored)
        })
    });
    group.finish();
    let restored = FamilyRouter::restore(
        RouterConfig::default(),
        RouterSnapshot::from_bytes(&bytes).expect("decode"),
    )
    .expect("restore");
    let start = Instant::now();
    let restored_digest = rt.block_on(restored.digest()).expect("digest");
    let digest_time = start.elapsed();
    assert_eq!(restored_digest, digest, "restore changed the digest");
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times.get(times.len() / 2).copied().unwrap_or_default()
    };
    let line = format!(
        "SUMMARY snapshot of {} accounts in {families} families: {} bytes ({:.1} bytes/account); \
         snapshot+encode {:?} (median), of which the cut that holds up apply {:?} (median), \
         decode+restore {:?} (median), digest of restored (all passivated) {:?}; built in {:?}",
        families * per_family,
        bytes.len(),
        bytes.len() as f64 / (families * per_family) as f64,
        median(&mut snapshot_times),
        median(&mut cut_times),
        median(&mut restore_times),
        digest_time,
        build,
    );
    eprintln!("{line}");
    summary.push(line);
    rt.block_on(router.shutdown());
}

/// Bytes per passivated family holding one account and one compacted, reconciled hold.
fn passivated_memory(rt: &Runtime, summary: &mut Vec<String>) {
    let families = 100_000;
    let config = RouterConfig {
        max_live_actors: families,
        ..RouterConfig::default()
    };
    let mut router = FamilyRouter::new(config).expect("config");
    let mut log = Log::new();
    let params = log.entry(EntryPayload::SetParams(short_retention().into()), 1);
    rt.block_on(router.apply(vec![params])).expect("set params");
    let ids: Vec<FamilyId> = (0..families)
        .map(|i| FamilyId::from(format!("fam-{i:06}")))
        .collect();
    for chunk in ids.chunks(5_000) {
        let commands = chunk
            .iter()
            .flat_map(|f| hold_triple(f, 0, log.now_ms))
            .collect();
        let entries = log.entries(commands, 1);
        rt.block_on(router.apply(entries)).expect("holds");
    }
    // Past not_after (now + 1 s) + retention (1 s), 10 s per entry.
    let blanks: Vec<_> = (0..2)
        .map(|_| log.entry(EntryPayload::Blank, 10_000))
        .collect();
    rt.block_on(router.apply(blanks)).expect("advance time");
    for chunk in ids.chunks(5_000) {
        let commands = chunk
            .iter()
            .map(|f| Command::ExpireHolds {
                family_id: f.clone(),
                up_to_ms: log.now_ms,
            })
            .collect();
        let entries = log.entries(commands, 1);
        rt.block_on(router.apply(entries))
            .expect("compaction touch");
    }
    let start = Instant::now();
    let passivated = rt.block_on(router.passivate_idle(0)).expect("passivate");
    let passivate_time = start.elapsed();
    assert_eq!(passivated, families);
    // A snapshot cut takes a reference to each passivated family's bytes, not a copy.
    let start = Instant::now();
    let cut = rt.block_on(router.cut()).expect("cut");
    let cut_time = start.elapsed();
    drop(cut);
    let sample = tally_ledger::Family::from_snapshot_bytes(
        &rt.block_on(router.snapshot()).expect("snapshot").families[&ids[0]],
    )
    .expect("decode");
    assert_eq!(sample.journal_len(), 0, "the journal was not compacted");
    assert_eq!(sample.live_hold_count(), 0, "the hold was not archived");
    let line = format!(
        "SUMMARY passivated family (1 account, 1 compacted reconciled hold), {families} families: \
         {:.1} bytes/family ({} bytes total); passivating all took {:?}; a snapshot cut of \
         them {:?}",
        router.passivated_bytes() as f64 / families as f64,
        router.passivated_bytes(),
        passivate_time,
        cut_time,
    );
    eprintln!("{line}");
    summary.push(line);
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let rt = runtime();
    let mut summary = Vec::new();
    bench_apply(&mut criterion, &rt, &mut summary);
    if std::env::var_os("TALLY_BENCH_APPLY_ONLY").is_none() {
        bench_snapshot(&mut criterion, &rt, &mut summary);
        passivated_memory(&rt, &mut summary);
    }
    criterion.final_summary();
    eprintln!("\n==== router bench summary ====");
    for line in summary {
        eprintln!("{line}");
    }
}
