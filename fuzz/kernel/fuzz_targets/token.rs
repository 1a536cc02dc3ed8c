#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("token", tally_fuzz_kernel::token::seeds),
    |data: &[u8]| tally_fuzz_kernel::token::run(data)
);
