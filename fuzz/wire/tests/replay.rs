//! Replays fuzz/regressions/<target>/ and fuzz/corpus/<target>/, and the generated seeds,
//! for every target of this package (see `tally_fuzz_common::replay`). Plain `cargo test`
//! in fuzz/, no libFuzzer needed.

#[test]
fn forward_commands() {
    tally_fuzz_common::replay::replay(
        "forward_commands",
        tally_fuzz_wire::forward_commands::run,
        tally_fuzz_wire::forward_commands::seeds,
    );
}

#[test]
fn family_snapshot() {
    tally_fuzz_common::replay::replay(
        "family_snapshot",
        tally_fuzz_wire::family_snapshot::run,
        tally_fuzz_wire::family_snapshot::seeds,
    );
}

#[test]
fn budget_wire() {
    tally_fuzz_common::replay::replay(
        "budget_wire",
        tally_fuzz_wire::budget_wire::run,
        tally_fuzz_wire::budget_wire::seeds,
    );
}

#[test]
fn admin_wire() {
    tally_fuzz_common::replay::replay(
        "admin_wire",
        tally_fuzz_wire::admin_wire::run,
        tally_fuzz_wire::admin_wire::seeds,
    );
}
