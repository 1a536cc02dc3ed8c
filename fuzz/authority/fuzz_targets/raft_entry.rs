#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("raft_entry", tally_fuzz_authority::raft_entry::seeds),
    |data: &[u8]| tally_fuzz_authority::raft_entry::run(data)
);
