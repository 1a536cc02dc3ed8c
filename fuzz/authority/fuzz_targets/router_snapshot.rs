#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("router_snapshot", tally_fuzz_authority::router_snapshot::seeds),
    |data: &[u8]| tally_fuzz_authority::router_snapshot::run(data)
);
