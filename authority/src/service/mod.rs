//! The gRPC services a node serves: `Budget` (clients), `Admin` (operators), `Raft` (peers).

pub mod admin;
pub mod budget;
pub mod limits;
pub mod outcome;
pub mod raft;
pub mod read_gate;
