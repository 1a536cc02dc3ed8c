#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("receipt", tally_fuzz_kernel::receipt::seeds),
    |data: &[u8]| tally_fuzz_kernel::receipt::run(data)
);
