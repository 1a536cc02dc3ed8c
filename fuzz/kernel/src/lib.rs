//! Fuzz targets over `tally-kernel`: what a kernel node decodes and verifies from callers,
//! from other kernel nodes and from its own receipt log. Each module is one target: `run`
//! checks one input (and panics when an invariant breaks), `seeds` builds its seed corpus
//! from real encodings (`fixtures`).

pub mod fixtures;
pub mod kernel_requests;
pub mod receipt;
pub mod ticket;
pub mod token;
