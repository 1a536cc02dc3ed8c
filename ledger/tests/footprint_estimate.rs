//! The memory budget weighs families by `Family::footprint_bytes`, an estimate from row counts
//! (docs/sizing.md, "The memory budget"). If it drifts from what a family really holds, a
//! node's families take more (or less) than their share of the budget while every figure says
//! otherwise. This holds the estimate to the heap bytes a family read back takes (as from the
//! family store or a snapshot) and a family built by commands takes, counted by a global
//! allocator, for whole tool calls and for denied authorizes, with ids named by counters and by
//! UUIDs as kernels name them.

#[path = "../benches/common/mod.rs"]
mod common;
#[path = "../benches/common/counting_alloc.rs"]
mod counting_alloc;

use common::{ctx_at, denied_call, tool_call, RequestIds, T0};
use counting_alloc::{freed_by_table, live};
use tally_ledger::*;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// Enough calls that a table's growth step is a small part of its size.
const CALLS: u64 = 20_000;
/// How far the estimate may stray from the bytes counted, either way.
const TOLERANCE: f64 = 0.10;

/// What one load's family takes and is estimated at.
struct Counted {
    /// The family as its commands built it.
    built_bytes: usize,
    /// The same family decoded from its encoding.
    read_back_bytes: usize,
    estimate_bytes: usize,
}

/// The family `CALLS` calls build, counted as built and as read back, and estimated. Dropping
/// the family read back table by table (what the memory bench calibrates the costs per row
/// on) must free it all but its fixed part and name each table with `rows`.
fn measure<const N: usize>(
    ids: RequestIds,
    call: fn(RequestIds, u64, u64) -> [Command; N],
    rows: [(&str, u64); 7],
) -> Counted {
    let params = ClusterParams {
        retention_ms: 24 * 3_600_000,
        max_clock_step_ms: 10_000,
        ..ClusterParams::default()
    }
    .at_rules(CURRENT_RULES);
    let (before_build, _) = live();
    let mut family = Family::new("fam".into());
    let mut log_index = 0;
    for n in 0..CALLS {
        for command in call(ids, n, T0 + n) {
            log_index += 1;
            let decision = family.apply(&command, &ctx_at(log_index, T0 + n, params));
            assert!(decision.is_ok(), "call {n} failed: {decision:?}");
        }
    }
    let (after_build, _) = live();
    let encoded = family.to_snapshot_bytes();
    let (before_decode, _) = live();
    let decoded = Family::from_snapshot_bytes(&encoded).expect("decodes");
    let (after_decode, _) = live();
    assert_eq!(decoded.digest(), family.digest(), "read back unchanged");
    let read_back_bytes = after_decode - before_decode;

    let dropped = freed_by_table(decoded);
    let named: Vec<(&str, u64)> = (dropped.iter())
        .map(|(table, table_rows, _)| (*table, *table_rows as u64))
        .collect();
    assert_eq!(named, rows, "each table named with its rows, in order");
    let freed_bytes: usize = dropped.iter().map(|(_, _, bytes)| bytes).sum();
    assert!(
        freed_bytes <= read_back_bytes && read_back_bytes - freed_bytes < 4_096,
        "the tables freed {freed_bytes} of the {read_back_bytes} bytes read back"
    );
    Counted {
        built_bytes: after_build - before_build,
        read_back_bytes,
        estimate_bytes: family.footprint_bytes(),
    }
}

/// One test in this binary: the allocator counts the whole process, so a second test running
/// beside it on another thread (`cargo test`) would be counted too.
#[test]
fn the_estimate_is_within_a_tenth_of_the_bytes_a_family_holds() {
    // Rows of a whole call (3 commands) and of a denied authorize, times the calls.
    let whole_calls = [
        ("journal", 3 * CALLS),
        ("dedupe", 3 * CALLS),
        ("holds", CALLS),
        ("accounts", 1),
        ("nonces", 0),
        ("expiry", 0),
        ("compaction queue", 4 * CALLS),
    ];
    let denials = [
        ("journal", CALLS),
        ("dedupe", CALLS),
        ("holds", CALLS),
        ("accounts", 0),
        ("nonces", 0),
        ("expiry", 0),
        ("compaction queue", CALLS),
    ];
    let mut report = Vec::new();
    let mut strays = Vec::new();
    for (ids_name, ids) in [
        ("counter ids", RequestIds::Sequential),
        ("UUID ids", RequestIds::Random),
    ] {
        for (load, counted) in [
            ("whole calls", measure(ids, tool_call, whole_calls)),
            ("denied authorizes", measure(ids, denied_call, denials)),
        ] {
            let estimate_bytes = counted.estimate_bytes;
            for (how, counted_bytes) in [
                ("built", counted.built_bytes),
                ("read back", counted.read_back_bytes),
            ] {
                let ratio = estimate_bytes as f64 / counted_bytes as f64;
                let line = format!(
                    "{load}, {ids_name}, {how}: {counted_bytes} B counted, {estimate_bytes} B \
                     estimated ({ratio:.3}x)"
                );
                if (ratio - 1.0).abs() > TOLERANCE {
                    strays.push(line.clone());
                }
                report.push(line);
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(
        strays.is_empty(),
        "the estimate strays more than {TOLERANCE} from the bytes counted (recalibrate \
         ledger/src/footprint.rs with `cargo bench -p tally-ledger --bench memory`):\n{}",
        strays.join("\n")
    );
}
