//! Replays fuzz/regressions/<target>/ and fuzz/corpus/<target>/, and the generated seeds,
//! for every target of this package (see `tally_fuzz_common::replay`). Plain `cargo test`
//! in fuzz/, no libFuzzer needed.

#[test]
fn token() {
    tally_fuzz_common::replay::replay(
        "token",
        tally_fuzz_kernel::token::run,
        tally_fuzz_kernel::token::seeds,
    );
}

#[test]
fn ticket() {
    tally_fuzz_common::replay::replay(
        "ticket",
        tally_fuzz_kernel::ticket::run,
        tally_fuzz_kernel::ticket::seeds,
    );
}

#[test]
fn receipt() {
    tally_fuzz_common::replay::replay(
        "receipt",
        tally_fuzz_kernel::receipt::run,
        tally_fuzz_kernel::receipt::seeds,
    );
}

#[test]
fn kernel_requests() {
    tally_fuzz_common::replay::replay(
        "kernel_requests",
        tally_fuzz_kernel::kernel_requests::run,
        tally_fuzz_kernel::kernel_requests::seeds,
    );
}
