//! The evaluation pipeline of docs/spec.md §9, pure of transport: a tool call comes in, a
//! verdict and a signed receipt go out. Budgets live in the cluster (through a
//! [`BudgetLedger`]), money on the rail (a [`PaymentAdapter`]), so a kernel node keeps nothing
//! that matters: any node can evaluate any request, and two nodes evaluating the same one race
//! only in the cluster, where exactly one attempt owns the capture.
//!
//! [`PaymentAdapter`]: crate::payment::PaymentAdapter

mod authorize;
mod capture;
mod cleanup;
mod dispatch;
mod evaluation;
mod kernel;
mod ledger;
mod nonce_step;
mod payment;
pub mod possession;
pub mod reasons;
mod receipt_gate;
mod request;
mod ticket;
mod ticket_calls;
mod two_phase;

pub use kernel::{Kernel, KernelConfig};
pub use ledger::BudgetLedger;
pub use possession::{
    Method, Possession, PossessionError, DEFAULT_POSSESSION_SKEW_MS, MAX_POSSESSION_SKEW_MS,
};
pub use request::{Arguments, KernelError, Response, ToolCallRequest};
pub use ticket::{AdmissionTicket, SignedTicket, TicketError, MAX_TICKET_BYTES};
pub use ticket_calls::{AbortCall, CompleteCall, DispatchCall, TicketCall};
pub use two_phase::Admission;

/// The node's wall clock: token windows, nonce lifetimes and command deadlines
/// (`not_after_ms`); the cluster judges those on its own clock.
pub use tally_client::wall_clock_ms;
