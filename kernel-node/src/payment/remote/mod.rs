//! The rail over gRPC (`tally.rail.v1.PaymentRail`): [`RailServer`] puts any
//! [`PaymentAdapter`](super::PaymentAdapter) on a socket and [`RemoteRail`] is an adapter that
//! calls it, so N kernel processes share one rail and its idempotency by reference.

mod client;
mod convert;
mod service;

pub use client::RemoteRail;
pub use service::{RailServer, RailService};

/// Generated prost messages and tonic client/server of package `tally.rail.v1`.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tally.rail.v1.rs"));
}

/// Largest rail message either side accepts: every message is a reference and an amount.
pub const MAX_RAIL_MESSAGE_BYTES: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RemoteRailError {
    #[error("invalid rail endpoint {endpoint:?}: {detail}")]
    Endpoint { endpoint: String, detail: String },
    #[error("rail server i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("rail server: {0}")]
    Transport(#[from] tonic::transport::Error),
}
