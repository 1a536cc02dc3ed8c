//! The rail over gRPC (`tally.rail.v1.PaymentRail`): [`RailServer`] puts any
//! [`PaymentAdapter`](super::PaymentAdapter) on a socket and [`RemoteRail`] is an adapter that
//! calls it, so N kernel processes share one rail and its idempotency by reference. Both
//! ways run mutual TLS unless configured insecure: the rail serves a certificate naming
//! `tally-rail` and admits callers with a `kernel` certificate of its CA
//! ([`crate::port::Gate`]).

mod client;
mod convert;
mod service;

pub use client::{rail_address, RemoteRail};
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
    // The cause in the message, not as a `source`, so `{:#}` does not print it twice.
    #[error("rail server credentials: {0}")]
    Port(crate::port::PortError),
}

impl From<crate::port::PortError> for RemoteRailError {
    fn from(error: crate::port::PortError) -> Self {
        RemoteRailError::Port(error)
    }
}
