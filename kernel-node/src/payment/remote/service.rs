//! The rail's gRPC server side: a thin shell over any adapter. The rail's own answers travel
//! in the reply body; only requests it cannot read get a gRPC status.

use std::net::SocketAddr;
use std::sync::Arc;

use tally_tls::identity::Role;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::convert::{
    authorization_to_pb, capture_to_pb, failure_to_pb, money_from_pb, record_to_pb, refund_to_pb,
    release_status_to_pb,
};
use super::pb::payment_rail_server::{PaymentRail, PaymentRailServer};
use super::pb::{self, authorize_reply, capture_reply, lookup_reply, refund_reply, release_reply};
use super::{RemoteRailError, MAX_RAIL_MESSAGE_BYTES};
use crate::money::Money;
use crate::payment::{validate_reference, PaymentAdapter};
use crate::port::{self, Gate, ServerTls};

/// The rail's service name, as refusals name it.
const RAIL_SERVICE: &str = "tally.rail.v1.PaymentRail";

pub struct RailService {
    adapter: Arc<dyn PaymentAdapter>,
}

impl RailService {
    pub fn new(adapter: Arc<dyn PaymentAdapter>) -> Self {
        Self { adapter }
    }

    /// The tonic service, with message sizes bounded both ways.
    pub fn into_server(self) -> PaymentRailServer<Self> {
        PaymentRailServer::new(self)
            .max_decoding_message_size(MAX_RAIL_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RAIL_MESSAGE_BYTES)
    }
}

fn reference(reference: &str) -> Result<(), Status> {
    validate_reference(reference).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn amount(money: Option<pb::Money>) -> Result<Money, Status> {
    money_from_pb(money).map_err(Status::invalid_argument)
}

#[tonic::async_trait]
impl PaymentRail for RailService {
    async fn authorize(
        &self,
        request: Request<pb::AuthorizeRequest>,
    ) -> Result<Response<pb::AuthorizeReply>, Status> {
        let request = request.into_inner();
        reference(&request.reference)?;
        let amount = amount(request.amount)?;
        let result = match self.adapter.authorize(&request.reference, &amount).await {
            Ok(a) => authorize_reply::Result::Authorization(authorization_to_pb(&a)),
            Err(e) => authorize_reply::Result::Failure(failure_to_pb(&e)),
        };
        Ok(Response::new(pb::AuthorizeReply {
            result: Some(result),
        }))
    }

    async fn capture(
        &self,
        request: Request<pb::CaptureRequest>,
    ) -> Result<Response<pb::CaptureReply>, Status> {
        let request = request.into_inner();
        reference(&request.reference)?;
        let amount = amount(request.amount)?;
        let result = match self.adapter.capture(&request.reference, &amount).await {
            Ok(c) => capture_reply::Result::Capture(capture_to_pb(&c)),
            Err(e) => capture_reply::Result::Failure(failure_to_pb(&e)),
        };
        Ok(Response::new(pb::CaptureReply {
            result: Some(result),
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseReply>, Status> {
        let request = request.into_inner();
        reference(&request.reference)?;
        let result = match self.adapter.release(&request.reference).await {
            Ok(status) => release_reply::Result::Status(release_status_to_pb(status).into()),
            Err(e) => release_reply::Result::Failure(failure_to_pb(&e)),
        };
        Ok(Response::new(pb::ReleaseReply {
            result: Some(result),
        }))
    }

    async fn refund(
        &self,
        request: Request<pb::RefundRequest>,
    ) -> Result<Response<pb::RefundReply>, Status> {
        let request = request.into_inner();
        reference(&request.reference)?;
        let amount = amount(request.amount)?;
        let result = match self.adapter.refund(&request.reference, &amount).await {
            Ok(r) => refund_reply::Result::Refund(refund_to_pb(&r)),
            Err(e) => refund_reply::Result::Failure(failure_to_pb(&e)),
        };
        Ok(Response::new(pb::RefundReply {
            result: Some(result),
        }))
    }

    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupReply>, Status> {
        let request = request.into_inner();
        reference(&request.reference)?;
        let result = match self.adapter.lookup(&request.reference).await {
            Ok(Some(record)) => lookup_reply::Result::Record(record_to_pb(&record)),
            Ok(None) => lookup_reply::Result::NotFound(pb::NotFound {}),
            Err(e) => lookup_reply::Result::Failure(failure_to_pb(&e)),
        };
        Ok(Response::new(pb::LookupReply {
            result: Some(result),
        }))
    }
}

/// A running rail server. Dropping it stops the server too (its shutdown signal closes).
pub struct RailServer {
    local_addr: SocketAddr,
    tls: bool,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RailServer {
    /// Binds `addr` (port 0 picks a free port) and serves `adapter` on it, to kernels with a
    /// `kernel` certificate of the CA when `tls` is TLS (a server certificate naming
    /// `tally-rail`), to anyone when it is insecure.
    pub async fn start(
        adapter: Arc<dyn PaymentAdapter>,
        addr: SocketAddr,
        tls: ServerTls,
    ) -> Result<Self, RemoteRailError> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        if !tls.is_tls() {
            tracing::warn!(
                %local_addr,
                "the payment rail serves in plaintext and checks no caller (insecure)"
            );
        }
        let gate = Gate::role(RAIL_SERVICE, Role::Kernel, tls.is_tls());
        let service = InterceptedService::new(RailService::new(adapter).into_server(), gate);
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = tokio::spawn(
            tls.builder()?
                .add_service(service)
                .serve_with_incoming_shutdown(
                    port::incoming(listener, tls.is_tls(), "payment rail"),
                    async move {
                        let _ = stop.await;
                    },
                ),
        );
        Ok(Self {
            local_addr,
            tls: tls.is_tls(),
            shutdown,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `https://host:port` (or `http://` for an insecure rail), what
    /// [`RemoteRail::connect`](super::RemoteRail::connect) takes.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Stops accepting, lets in-flight calls finish, and waits for the server task.
    pub async fn shutdown(self) -> Result<(), RemoteRailError> {
        let _ = self.shutdown.send(());
        match self.task.await {
            Ok(result) => Ok(result?),
            Err(join) => Err(RemoteRailError::Io(std::io::Error::other(join.to_string()))),
        }
    }
}
