//! Fault injection for tests: a switchboard for the Raft network (cut, isolate) and one for
//! the client service (lose a request before it is proposed, lose a reply after commit).
//!
//! The armed switchboards are compiled only with the `testing` feature, which the test crates
//! turn on. A production build gets inert stand-ins whose checks are constant `false`, so the
//! request path carries no lock, no atomic and no branch for them.

#[cfg(feature = "testing")]
mod network;
#[cfg(feature = "testing")]
mod service;
#[cfg(feature = "testing")]
pub use network::NetworkFaults;
#[cfg(feature = "testing")]
pub use service::ServiceFaults;

#[cfg(not(feature = "testing"))]
mod inert;
#[cfg(not(feature = "testing"))]
pub use inert::{NetworkFaults, ServiceFaults};
