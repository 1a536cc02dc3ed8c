#![no_main]

libfuzzer_sys::fuzz_target!(
    init: tally_fuzz_common::seeds::write_if_asked("kernel_requests", tally_fuzz_kernel::kernel_requests::seeds),
    |data: &[u8]| tally_fuzz_kernel::kernel_requests::run(data)
);
