//! The gRPC services a node serves: `Budget` (clients), `Admin` (operators) on the client
//! port, `Raft` (peers) on the peer port, and who may call them.

pub mod access;
pub mod admin;
pub mod budget;
pub mod limits;
pub mod outcome;
pub mod peer_auth;
pub mod raft;
pub mod read_gate;
pub mod snapshot_inbox;
