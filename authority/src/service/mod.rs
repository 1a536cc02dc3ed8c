//! The gRPC services a node serves: `Budget` (clients), `Admin` (operators) on the client
//! port, `Raft` (peers) on the peer port, and who may call them.

pub mod access;
pub mod admin;
pub mod budget;
pub mod identity_cache;
pub mod limits;
pub mod outcome;
pub mod peer_auth;
pub mod raft;
pub mod read_gate;
pub mod snapshot_inbox;

/// The future every tower wrapper of the client port (`Access`, `Admission`) answers with.
pub(crate) type HttpFuture = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<
                    tonic::codegen::http::Response<tonic::body::Body>,
                    std::convert::Infallible,
                >,
            > + Send,
    >,
>;

/// Takes the inner service that `poll_ready` made ready, leaving a fresh clone for the next
/// call: tower's rule for wrappers that move the service into a future.
pub(crate) fn take_ready<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    std::mem::replace(inner, fresh)
}
