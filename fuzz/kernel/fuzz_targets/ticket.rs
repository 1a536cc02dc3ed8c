#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("ticket", tally_fuzz_kernel::ticket::seeds),
    |data: &[u8]| tally_fuzz_kernel::ticket::run(data)
);
