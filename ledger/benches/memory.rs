//! Memory per applied command, the figure an operator sizes `retention_ms` with (docs/spec.md
//! §5.5): what a command costs while its full event is retained (until `not_after_ms +
//! retention_ms`), and what stays for ever once it is compacted (the dedupe row that keeps
//! replays exact, the archived hold). Counted by a global allocator that tracks live heap
//! bytes, spare capacity of the family's tables and deques included (the allocator's own
//! per-block overhead is not). Prints its figures; `cargo bench -p tally-ledger --bench memory`.

use tally_ledger::*;

mod common;

use common::{ctx_at, denied_call, tool_call, RequestIds, T0};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{freed_by_table, live};

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// Calls per run: enough that table growth steps average out.
const CALLS: u64 = 100_000;
/// Long enough that nothing is compacted while the calls apply, as with the default 24 h.
const RETENTION_MS: u64 = 24 * 3_600_000;

struct Footprint {
    full_bytes: usize,
    full_blocks: usize,
    compacted_bytes: usize,
    compacted_blocks: usize,
    snapshot_full: usize,
    snapshot_compacted: usize,
    /// The same state read back from its encoding (from the family store or a snapshot).
    decoded_full_bytes: usize,
    decoded_compacted_bytes: usize,
    /// `Family::footprint_bytes`, what the node's memory budget weighs.
    estimate_full_bytes: usize,
    estimate_compacted_bytes: usize,
    /// Read back and estimated once half the events are compacted: a family with a
    /// compaction backlog, as a restore's first expiry round finds a busy one.
    decoded_half_bytes: usize,
    estimate_half_bytes: usize,
    /// Per table of the family read back in full: name, rows, heap bytes freed by dropping it.
    tables_full: Vec<(&'static str, usize, usize)>,
}

/// Heap bytes of `family` decoded from its encoding: what a family read back takes.
fn decoded_bytes(family: &Family) -> usize {
    let encoded = family.to_snapshot_bytes();
    let (before, _) = live();
    let decoded = Family::from_snapshot_bytes(&encoded).expect("decodes");
    let (after, _) = live();
    assert_eq!(decoded.digest(), family.digest(), "read back unchanged");
    after - before
}

/// The heap bytes each table of `family` read back frees when dropped, with its rows.
fn by_table(family: &Family) -> Vec<(&'static str, usize, usize)> {
    freed_by_table(Family::from_snapshot_bytes(&family.to_snapshot_bytes()).expect("decodes"))
}

fn measure<const N: usize>(
    ids: RequestIds,
    call: fn(RequestIds, u64, u64) -> [Command; N],
) -> Footprint {
    let params = ClusterParams {
        retention_ms: RETENTION_MS,
        max_clock_step_ms: 10_000,
        ..ClusterParams::default()
    }
    .at_rules(tally_ledger::CURRENT_RULES);
    let mut log_index = 0;
    let mut ctx = |now_ms: u64| {
        log_index += 1;
        ctx_at(log_index, now_ms, params)
    };
    let (base_bytes, base_blocks) = live();
    let mut family = Family::new("fam".into());
    let mut end_ms = T0;
    for n in 0..CALLS {
        // Built per call and dropped after it: what stays is what the family keeps.
        end_ms = T0 + n;
        for command in call(ids, n, end_ms) {
            let decision = family.apply(&command, &ctx(end_ms));
            assert!(decision.is_ok(), "bench command failed: {decision:?}");
        }
    }
    assert_eq!(
        family.journal_len() as u64,
        N as u64 * CALLS,
        "nothing may be compacted before retention ends"
    );
    let (full_bytes, full_blocks) = live();
    let snapshot_full = family.to_snapshot_bytes().len();
    let decoded_full_bytes = decoded_bytes(&family);
    let estimate_full_bytes = family.footprint_bytes();
    let tables_full = by_table(&family);

    // Past every command's `not_after_ms + retention_ms`: each command compacts a bounded
    // number of items (MAX_COMPACTIONS_PER_COMMAND), so apply expiry sweeps until all is done.
    let after_ms = end_ms + 1_000 + RETENTION_MS + 1;
    let sweep = Command::ExpireHolds {
        family_id: "fam".into(),
        up_to_ms: after_ms,
    };
    let mut half = None;
    for _ in 0..(4 * CALLS) {
        if family.journal_len() == 0 && family.live_hold_count() == 0 {
            break;
        }
        if half.is_none() && family.journal_len() as u64 <= N as u64 * CALLS / 2 {
            half = Some((decoded_bytes(&family), family.footprint_bytes()));
        }
        // Each sweep is a batch of its own: the rows it moves out of memory go to the
        // node's store (here: nowhere) before the next, as in a node.
        family.start_batch(ColdFetch::default());
        family.apply(&sweep, &ctx(after_ms)).expect("sweep applies");
    }
    // A few more sweeps drain what the last items left due at the same time.
    for _ in 0..4 {
        family.start_batch(ColdFetch::default());
        family.apply(&sweep, &ctx(after_ms)).expect("sweep applies");
    }
    family.start_batch(ColdFetch::default());
    assert_eq!(family.journal_len(), 0, "every event compacted");
    assert_eq!(family.live_hold_count(), 0, "every hold archived");
    let (compacted_bytes, compacted_blocks) = live();
    let snapshot_compacted = family.to_snapshot_bytes().len();
    let decoded_compacted_bytes = decoded_bytes(&family);
    let estimate_compacted_bytes = family.footprint_bytes();
    drop(family);
    let (decoded_half_bytes, estimate_half_bytes) = half.expect("the sweeps pass half");
    Footprint {
        full_bytes: full_bytes - base_bytes,
        full_blocks: full_blocks - base_blocks,
        compacted_bytes: compacted_bytes - base_bytes,
        compacted_blocks: compacted_blocks - base_blocks,
        snapshot_full,
        snapshot_compacted,
        decoded_full_bytes,
        decoded_compacted_bytes,
        estimate_full_bytes,
        estimate_compacted_bytes,
        decoded_half_bytes,
        estimate_half_bytes,
        tables_full,
    }
}

fn report(what: &str, name: &str, commands: usize, f: &Footprint) {
    println!("ledger memory, {CALLS} {what}, {commands} commands), {name}:");
    println!(
        "  retained in full:  {:>6} bytes/command on the heap ({:.2} blocks/command); snapshot {} bytes/command",
        f.full_bytes / commands,
        f.full_blocks as f64 / commands as f64,
        f.snapshot_full / commands
    );
    println!(
        "  after compaction:  {:>6} bytes/command on the heap ({:.2} blocks/command); snapshot {} bytes/command",
        f.compacted_bytes / commands,
        f.compacted_blocks as f64 / commands as f64,
        f.snapshot_compacted / commands
    );
    println!(
        "  read back:         {:>6} bytes/command in full, {} after compaction (decoded from \
         the encoding, as from the store or a snapshot)",
        f.decoded_full_bytes / commands,
        f.decoded_compacted_bytes / commands
    );
    println!(
        "  estimated:         {:>6} bytes/command in full, {} after compaction (the footprint \
         the memory budget weighs)",
        f.estimate_full_bytes / commands,
        f.estimate_compacted_bytes / commands
    );
    println!(
        "  half compacted:    {:>6} bytes/command read back, {} estimated (a family with a \
         compaction backlog)",
        f.decoded_half_bytes / commands,
        f.estimate_half_bytes / commands
    );
    let tables: Vec<String> = (f.tables_full.iter())
        .filter(|(_, rows, _)| *rows > 0)
        .map(|(table, rows, bytes)| format!("{table} {rows} rows × {} B", bytes / rows))
        .collect();
    println!(
        "  by table:          {} (read back in full; a shared id counts in the last table \
         dropped)",
        tables.join(", ")
    );
}

fn main() {
    let calls = CALLS as usize;
    for (name, ids) in [
        ("counter-named requests", RequestIds::Sequential),
        (
            "UUID-named requests (as kernels name them)",
            RequestIds::Random,
        ),
    ] {
        let whole = measure(ids, tool_call);
        report(
            "calls (authorize+capture+reconcile",
            name,
            3 * calls,
            &whole,
        );
        let denied = measure(ids, denied_call);
        report("denied authorizes (one command each", name, calls, &denied);
    }
}
