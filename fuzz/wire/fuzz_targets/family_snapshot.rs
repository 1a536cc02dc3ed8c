#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("family_snapshot", tally_fuzz_wire::family_snapshot::seeds),
    |data: &[u8]| tally_fuzz_wire::family_snapshot::run(data)
);
