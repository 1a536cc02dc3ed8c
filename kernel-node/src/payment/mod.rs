//! Payment rails (docs/spec.md §9): the kernel authorizes funds after it owns the budget capture
//! and captures them after reconcile. The payment reference is the `request_id`, so any kernel
//! node can find (and finish or release) an authorization another node started.

mod adapter;
mod faulty;
mod memory;
mod model;
pub mod remote;

pub use adapter::PaymentAdapter;
pub use faulty::{Fault, FaultyRail, RailOp, MAX_SCRIPTED_FAULTS};
pub use memory::{InMemoryRail, ReferenceCounts};
pub use model::{
    validate_reference, Authorization, Capture, PaymentError, Refund, ReleaseStatus,
    SettlementRecord, SettlementStatus, MAX_REFERENCE_BYTES,
};
pub use remote::{RailServer, RemoteRail, RemoteRailError};
