//! Fuzz targets over `tally-authority`: what a node reads from its Raft log, from its peers
//! and from its snapshot files. Each module is one target: `run` checks one input (and
//! panics when an invariant breaks), `seeds` builds its seed corpus from real encodings.

pub mod raft_entry;
pub mod raft_rpc;
pub mod router_snapshot;
pub mod snapshot_file;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls `future` once: the router's snapshot and digest only await live actors, and a
/// restored router has none, so they are ready at once (`None` if not).
pub fn ready<F: Future>(future: F) -> Option<F::Output> {
    let mut context = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut context) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}
