//! The server's load limits: over a limit, work is refused at once rather than queued. A
//! queued request would wait until its deadline and answer UNKNOWN, and every UNKNOWN sends a
//! client into retries and `ResolveEvent` (docs/spec.md §10: load shed before proposing is a
//! definite UNAVAILABLE).
//!
//! - [`Admission`] wraps the `Budget` service: at most `max_in_flight_requests` requests are
//!   served at once on this node, and one more is answered UNAVAILABLE with
//!   `tally-outcome: definite` before anything is decoded or proposed. An admitted request
//!   still unanswered after `request_timeout_ms` is answered UNKNOWN (indefinite), which
//!   frees its slot even when a client never finishes sending.
//! - [`ConnectionCap`] admits at most `max_connections` accepted sockets; one more is closed
//!   at once.
//!
//! Both answers are built by `service::outcome::failure_status`, the one mapping.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::outcome::{failure_status, Failure};
use super::{take_ready, HttpFuture};
use crate::node::metrics::NodeMetrics;
use crate::node::proposer::Proposer;
use crate::node::write_error::WriteError;

/// The node-wide budget of in-flight requests, shared by every connection.
pub struct RequestLimits {
    slots: Arc<Semaphore>,
    limit: usize,
    timeout: Duration,
    metrics: Arc<NodeMetrics>,
    /// Names the leader in a refusal, as every UNAVAILABLE does.
    proposer: Arc<Proposer>,
}

impl RequestLimits {
    pub fn new(
        limit: usize,
        timeout: Duration,
        metrics: Arc<NodeMetrics>,
        proposer: Arc<Proposer>,
    ) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            timeout,
            metrics,
            proposer,
        })
    }

    fn shed(&self) -> http::Response<Body> {
        self.metrics.observe_shed();
        failure_status(
            Failure::Write(WriteError::Unavailable {
                leader: self.proposer.leader(),
                reason: format!(
                    "overloaded: {} requests in flight on this node; nothing was proposed, \
                     retry after a backoff",
                    self.limit
                ),
            }),
            None,
        )
        .into_http()
    }

    fn expired(&self) -> http::Response<Body> {
        self.metrics.observe_expired();
        failure_status(
            Failure::Write(WriteError::Unknown {
                reason: format!(
                    "no answer within the request timeout ({} ms)",
                    self.timeout.as_millis()
                ),
            }),
            None,
        )
        .into_http()
    }
}

/// A service behind the in-flight limit and the request timeout.
#[derive(Clone)]
pub struct Admission<S> {
    inner: S,
    limits: Arc<RequestLimits>,
}

impl<S> Admission<S> {
    pub fn new(inner: S, limits: Arc<RequestLimits>) -> Self {
        Self { inner, limits }
    }
}

impl<S: NamedService> NamedService for Admission<S> {
    const NAME: &'static str = S::NAME;
}

/// Decrements the in-flight gauge when the request is answered or dropped.
struct InFlight {
    _slot: OwnedSemaphorePermit,
    metrics: Arc<NodeMetrics>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.metrics.track_in_flight(false);
    }
}

impl<S> Service<http::Request<Body>> for Admission<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = HttpFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let Ok(slot) = Arc::clone(&self.limits.slots).try_acquire_owned() else {
            let refusal = self.limits.shed();
            return Box::pin(std::future::ready(Ok(refusal)));
        };
        self.limits.metrics.track_in_flight(true);
        let in_flight = InFlight {
            _slot: slot,
            metrics: Arc::clone(&self.limits.metrics),
        };
        let mut ready = take_ready(&mut self.inner);
        let limits = Arc::clone(&self.limits);
        Box::pin(async move {
            let _in_flight = in_flight;
            match tokio::time::timeout(limits.timeout, ready.call(request)).await {
                Ok(response) => response,
                Err(_) => Ok(limits.expired()),
            }
        })
    }
}

/// At most `max_connections` sockets served at once.
pub struct ConnectionCap {
    slots: Arc<Semaphore>,
    metrics: Arc<NodeMetrics>,
}

impl ConnectionCap {
    pub fn new(limit: usize, metrics: Arc<NodeMetrics>) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limit)),
            metrics,
        }
    }

    /// The socket with its slot, or `None` once it is closed because every slot is taken.
    pub fn admit(&self, stream: TcpStream) -> Option<CappedStream> {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(slot) => {
                self.metrics.track_connection(true);
                Some(CappedStream {
                    stream,
                    _slot: slot,
                    metrics: Arc::clone(&self.metrics),
                })
            }
            Err(_) => {
                self.metrics.observe_refused_connection();
                tracing::debug!(peer = ?stream.peer_addr().ok(), "connection refused: at max_connections");
                drop(stream);
                None
            }
        }
    }
}

/// An accepted socket holding its connection slot until the server drops it.
pub struct CappedStream {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    metrics: Arc<NodeMetrics>,
}

impl tally_tls::listener::Socket for CappedStream {
    fn peek<'a>(
        &'a self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        self.stream.peek(buf)
    }

    fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.peer_addr().ok()
    }
}

impl Drop for CappedStream {
    fn drop(&mut self) {
        self.metrics.track_connection(false);
    }
}

impl Connected for CappedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
