#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("forward_commands", tally_fuzz_wire::forward_commands::seeds),
    |data: &[u8]| tally_fuzz_wire::forward_commands::run(data)
);
