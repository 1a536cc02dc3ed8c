#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("snapshot_file", tally_fuzz_authority::snapshot_file::seeds),
    |data: &[u8]| tally_fuzz_authority::snapshot_file::run(data)
);
