#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("admin_wire", tally_fuzz_wire::admin_wire::seeds),
    |data: &[u8]| tally_fuzz_wire::admin_wire::run(data)
);
