#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("raft_rpc", tally_fuzz_authority::raft_rpc::seeds),
    |data: &[u8]| tally_fuzz_authority::raft_rpc::run(data)
);
