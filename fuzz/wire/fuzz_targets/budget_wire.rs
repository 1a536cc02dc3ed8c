#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("budget_wire", tally_fuzz_wire::budget_wire::seeds),
    |data: &[u8]| tally_fuzz_wire::budget_wire::run(data)
);
