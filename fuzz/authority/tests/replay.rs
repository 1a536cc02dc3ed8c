//! Replays fuzz/regressions/<target>/ and fuzz/corpus/<target>/, and the generated seeds,
//! for every target of this package (see `tally_fuzz_common::replay`). Plain `cargo test`
//! in fuzz/, no libFuzzer needed.

#[test]
fn raft_entry() {
    tally_fuzz_common::replay::replay(
        "raft_entry",
        tally_fuzz_authority::raft_entry::run,
        tally_fuzz_authority::raft_entry::seeds,
    );
}

#[test]
fn raft_rpc() {
    tally_fuzz_common::replay::replay(
        "raft_rpc",
        tally_fuzz_authority::raft_rpc::run,
        tally_fuzz_authority::raft_rpc::seeds,
    );
}

#[test]
fn router_snapshot() {
    tally_fuzz_common::replay::replay(
        "router_snapshot",
        tally_fuzz_authority::router_snapshot::run,
        tally_fuzz_authority::router_snapshot::seeds,
    );
}

#[test]
fn snapshot_file() {
    tally_fuzz_common::replay::replay(
        "snapshot_file",
        tally_fuzz_authority::snapshot_file::run,
        tally_fuzz_authority::snapshot_file::seeds,
    );
}
