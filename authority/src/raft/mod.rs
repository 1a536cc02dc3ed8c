//! openraft integration: type config, state machine over the family router, snapshot files,
//! and the network over tonic (with a fault switchboard for tests).

pub mod network;
pub mod snapshot_file;
pub mod state_machine;
pub mod types;
