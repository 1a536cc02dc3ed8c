//! The kernel node's network shell: the gRPC `tally.kernel.v1.Kernel` service over the
//! pipeline, gRPC health, a Prometheus `/metrics` endpoint, the background reconciler, and
//! `start`/`run` to bring them up from a [`KernelNodeConfig`](crate::config::KernelNodeConfig).

mod convert;
mod metrics;
mod run;
mod service;
mod signing;

/// Generated prost messages and tonic client/server of package `tally.kernel.v1`.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tally.kernel.v1.rs"));
}

pub use metrics::{Metrics, MAX_METRICS_REQUEST_BYTES};
pub use run::{build_kernel, run, start, RunningKernel, ServerError};
pub use service::KernelService;
pub use signing::{sign_abort, sign_complete, sign_tool_call, SignRequestError};

/// Largest message either side accepts: a token (64 KiB), arguments and a receipt.
pub const MAX_KERNEL_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
