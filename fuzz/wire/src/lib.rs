//! Fuzz targets over `tally-ledger` and `tally-api` only. Each module is one target: `run`
//! checks one input (and panics when an invariant breaks), `seeds` builds its seed corpus
//! from real encodings.

pub mod admin_wire;
pub mod budget_wire;
pub mod family_snapshot;
pub mod forward_commands;
