//! Checks shared by the fuzz targets. Every target is a plain function of the input bytes
//! that panics when an invariant breaks, so the libFuzzer binaries (`fuzz_targets/`), the
//! replay tests (`tests/replay.rs`) and the seed generator all call the same code.

pub mod harness;
pub mod replay;
pub mod roundtrip;
pub mod seeds;

/// Splits the first byte off as a selector (which decoder to run), the rest is the payload.
pub fn split_selector(data: &[u8]) -> Option<(u8, &[u8])> {
    data.split_first().map(|(&selector, rest)| (selector, rest))
}
