//! A Tally authority node: the replicated state machine (one ractor actor per budget family,
//! the pure ledger inside each), openraft over a log of segment files and gRPC, and the
//! Budget, Admin and Raft services.

pub mod allocator;
pub mod background;
pub mod cli;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod families;
pub mod faults;
pub mod heap_count;
pub mod node;
pub mod raft;
pub mod service;
#[cfg(feature = "testing")]
pub mod testing;
mod unpoisoned;
pub mod writeback_file;
