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
use counting_alloc::live;
use tally_ledger::*;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// Enough calls that a table's growth step is a small part of its size.
const CALLS: u64 = 20_000;
/// How far the estimate may stray from the bytes counted, either way.
const TOLERANCE: f64 = 0.10;

/// Heap bytes of the family built by `CALLS` calls and of the same family read back, and the
/// estimate.
fn measure<const N: usize>(
    ids: RequestIds,
    call: fn(RequestIds, u64, u64) -> [Command; N],
) -> (usize, usize, usize) {
    let params = ClusterParams {
        retention_ms: 24 * 3_600_000,
        max_clock_step_ms: 10_000,
        rules_version: CURRENT_RULES,
    };
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
    let estimate = family.footprint_bytes();
    assert_eq!(
        decoded.footprint_bytes(),
        estimate,
        "same rows, same estimate"
    );
    // What the memory bench calibrates the costs per row on: dropping table by table frees
    // the whole family but its fixed part, and names the rows each table held.
    let read_back = after_decode - before_decode;
    let (mut before, _) = live();
    let (mut freed, mut journal_rows) = (0, 0);
    decoded.drop_by_table(|table, rows| {
        let (after, _) = live();
        freed += before - after;
        before = after;
        if table == "journal" {
            journal_rows = rows;
        }
    });
    assert!(
        freed <= read_back && read_back - freed < 4_096,
        "the tables freed {freed} of the {read_back} bytes read back"
    );
    assert_eq!(
        journal_rows as u64,
        N as u64 * CALLS,
        "an event per command"
    );
    (after_build - before_build, read_back, estimate)
}

#[test]
fn the_estimate_is_within_a_tenth_of_the_bytes_a_family_holds() {
    let mut report = Vec::new();
    let mut strays = Vec::new();
    for (ids_name, ids) in [
        ("counter ids", RequestIds::Sequential),
        ("UUID ids", RequestIds::Random),
    ] {
        for (load, (built, read_back, estimate)) in [
            ("whole calls", measure(ids, tool_call)),
            ("denied authorizes", measure(ids, denied_call)),
        ] {
            for (how, counted) in [("built", built), ("read back", read_back)] {
                let ratio = estimate as f64 / counted as f64;
                let line = format!(
                    "{load}, {ids_name}, {how}: {counted} B counted, {estimate} B estimated \
                     ({ratio:.3}x)"
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
