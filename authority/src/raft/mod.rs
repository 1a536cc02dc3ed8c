//! openraft integration: type config, state machine over the family router, snapshot files,
//! and the network over tonic (which consults `faults::NetworkFaults`, inert outside tests).

mod append_stream;
pub mod network;
pub mod snapshot_file;
pub mod state_machine;
pub mod types;
pub mod vote_floor;
