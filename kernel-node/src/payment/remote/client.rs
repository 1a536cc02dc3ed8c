//! [`RemoteRail`]: a [`PaymentAdapter`] that calls a [`RailServer`](super::RailServer). Transport
//! failures are never definite denials: a request that timed out may have been performed, and
//! the reference lets a retry or a `lookup` find out.

use std::time::Duration;

use async_trait::async_trait;
use tally_client::Transport;
use tally_tls::issue::RAIL_SERVER_NAME;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::convert::{
    authorization_from_pb, capture_from_pb, failure_from_pb, malformed_reply, money_to_pb,
    record_from_pb, refund_from_pb, release_status_from_pb,
};
use super::pb::payment_rail_client::PaymentRailClient;
use super::pb::{self, authorize_reply, capture_reply, lookup_reply, refund_reply, release_reply};
use super::{RemoteRailError, MAX_RAIL_MESSAGE_BYTES};
use crate::money::Money;
use crate::payment::{
    validate_reference, Authorization, Capture, PaymentAdapter, PaymentError, Refund,
    ReleaseStatus, SettlementRecord,
};

/// Connection attempts give up after this, whatever the call timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct RemoteRail {
    client: PaymentRailClient<Channel>,
}

/// The `host:port` of a rail `endpoint`: `host:port`, or with the scheme that matches how it
/// is reached (`https://` over TLS, `http://` plaintext). A scheme that contradicts the
/// transport is refused rather than silently overridden: it is a config mistake either way.
pub fn rail_address(endpoint: &str, tls: bool) -> Result<&str, String> {
    let (address, scheme_tls) = if let Some(rest) = endpoint.strip_prefix("https://") {
        (rest, Some(true))
    } else if let Some(rest) = endpoint.strip_prefix("http://") {
        (rest, Some(false))
    } else {
        (endpoint, None)
    };
    match scheme_tls {
        Some(true) if !tls => Err(format!(
            "{endpoint:?} says https but the rail is configured insecure (plaintext)"
        )),
        Some(false) if tls => Err(format!(
            "{endpoint:?} says http (plaintext) but the rail is reached over TLS; write \
             host:port, or configure the rail insecure for a rail started without TLS"
        )),
        _ if address.is_empty() || address.contains('/') => {
            Err(format!("{endpoint:?} is not host:port"))
        }
        _ => Ok(address),
    }
}

impl RemoteRail {
    /// A client for the rail at `endpoint` (see [`rail_address`]), reached with `transport`:
    /// over TLS the rail's certificate must name `tally-rail` and this kernel presents its
    /// own. Connects lazily, so a rail that is down shows up as `Unavailable` on the first
    /// call, not here.
    pub fn connect(
        endpoint: &str,
        transport: &Transport,
        call_timeout: Duration,
    ) -> Result<Self, RemoteRailError> {
        let bad = |detail: String| RemoteRailError::Endpoint {
            endpoint: endpoint.to_owned(),
            detail,
        };
        let address = rail_address(endpoint, transport.is_tls()).map_err(bad)?;
        let channel = transport
            .endpoint_to(address, RAIL_SERVER_NAME)
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(call_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        let client = PaymentRailClient::new(channel)
            .max_decoding_message_size(MAX_RAIL_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RAIL_MESSAGE_BYTES);
        Ok(Self { client })
    }
}

/// `Unavailable` (nothing reached the rail, as far as tonic knows) stays `Unavailable`, and so
/// does a refusal of this kernel's credentials (the rail's gate answers before its adapter
/// runs); everything else, timeouts included, is a `RailError` whose outcome is unknown.
fn status_error(status: Status) -> PaymentError {
    match status.code() {
        Code::Unavailable => PaymentError::Unavailable(status.message().to_owned()),
        Code::Unauthenticated | Code::PermissionDenied => PaymentError::Unavailable(format!(
            "the rail refused this kernel's credentials ({:?}): {}",
            status.code(),
            status.message()
        )),
        code => PaymentError::RailError(format!(
            "rail call failed ({code:?}): {}; outcome unknown",
            status.message()
        )),
    }
}

#[async_trait]
impl PaymentAdapter for RemoteRail {
    async fn authorize(
        &self,
        reference: &str,
        amount: &Money,
    ) -> Result<Authorization, PaymentError> {
        validate_reference(reference)?;
        let reply = self
            .client
            .clone()
            .authorize(pb::AuthorizeRequest {
                reference: reference.to_owned(),
                amount: Some(money_to_pb(amount)),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        match reply.result {
            Some(authorize_reply::Result::Authorization(a)) => authorization_from_pb(a),
            Some(authorize_reply::Result::Failure(f)) => Err(failure_from_pb(f)),
            None => Err(malformed_reply("empty authorize reply")),
        }
    }

    async fn capture(&self, reference: &str, amount: &Money) -> Result<Capture, PaymentError> {
        validate_reference(reference)?;
        let reply = self
            .client
            .clone()
            .capture(pb::CaptureRequest {
                reference: reference.to_owned(),
                amount: Some(money_to_pb(amount)),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        match reply.result {
            Some(capture_reply::Result::Capture(c)) => capture_from_pb(c),
            Some(capture_reply::Result::Failure(f)) => Err(failure_from_pb(f)),
            None => Err(malformed_reply("empty capture reply")),
        }
    }

    async fn release(&self, reference: &str) -> Result<ReleaseStatus, PaymentError> {
        validate_reference(reference)?;
        let reply = self
            .client
            .clone()
            .release(pb::ReleaseRequest {
                reference: reference.to_owned(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        match reply.result {
            Some(release_reply::Result::Status(status)) => Ok(release_status_from_pb(status)),
            Some(release_reply::Result::Failure(f)) => Err(failure_from_pb(f)),
            None => Err(malformed_reply("empty release reply")),
        }
    }

    async fn refund(&self, reference: &str, amount: &Money) -> Result<Refund, PaymentError> {
        validate_reference(reference)?;
        let reply = self
            .client
            .clone()
            .refund(pb::RefundRequest {
                reference: reference.to_owned(),
                amount: Some(money_to_pb(amount)),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        match reply.result {
            Some(refund_reply::Result::Refund(r)) => refund_from_pb(r),
            Some(refund_reply::Result::Failure(f)) => Err(failure_from_pb(f)),
            None => Err(malformed_reply("empty refund reply")),
        }
    }

    async fn lookup(&self, reference: &str) -> Result<Option<SettlementRecord>, PaymentError> {
        validate_reference(reference)?;
        let reply = self
            .client
            .clone()
            .lookup(pb::LookupRequest {
                reference: reference.to_owned(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        match reply.result {
            Some(lookup_reply::Result::Record(r)) => record_from_pb(r).map(Some),
            Some(lookup_reply::Result::NotFound(_)) => Ok(None),
            Some(lookup_reply::Result::Failure(f)) => Err(failure_from_pb(f)),
            None => Err(malformed_reply("empty lookup reply")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::payment::remote::RailServer;
    use crate::payment::{Fault, FaultyRail, InMemoryRail, RailOp, SettlementStatus};
    use crate::port::ServerTls;

    fn usd(units: u64) -> Money {
        Money::new(units, "USD")
    }

    /// A dev CA and certificates, as `tally-node dev` writes them.
    fn certs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        tally_tls::issue::ensure_dev_certs(dir.path(), "rail-test", 1).expect("certs");
        dir
    }

    /// The kernel's side: its `kernel` certificate.
    fn kernel_transport(certs: &tempfile::TempDir) -> Transport {
        Transport::from_dir(certs.path(), "kernel", false).expect("kernel certificate")
    }

    async fn start(adapter: Arc<dyn PaymentAdapter>, certs: &tempfile::TempDir) -> RailServer {
        let tls = ServerTls::from_dir(
            certs.path(),
            tally_tls::issue::DEV_RAIL_SERVER,
            RAIL_SERVER_NAME,
            false,
        )
        .expect("rail certificate");
        RailServer::start(adapter, "127.0.0.1:0".parse().expect("addr"), tls)
            .await
            .expect("start rail server")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_kernels_share_one_rail_end_to_end() {
        let certs = certs();
        let rail = Arc::new(InMemoryRail::with_funds(1_000));
        let server = start(rail.clone(), &certs).await;
        let timeout = Duration::from_secs(10);
        let transport = kernel_transport(&certs);
        let kernel_a =
            RemoteRail::connect(&server.endpoint(), &transport, timeout).expect("client a");
        let kernel_b =
            RemoteRail::connect(&server.endpoint(), &transport, timeout).expect("client b");

        let amount = usd(100);
        let (a, b) = tokio::join!(
            kernel_a.authorize("req-1", &amount),
            kernel_b.authorize("req-1", &amount)
        );
        assert_eq!(
            a.expect("a"),
            b.expect("b"),
            "same authorization for one reference"
        );
        assert_eq!(rail.counts("req-1").authorizations, 1);

        let capture = kernel_b.capture("req-1", &usd(80)).await.expect("capture");
        assert_eq!(kernel_a.capture("req-1", &usd(80)).await, Ok(capture));
        let record = kernel_a
            .lookup("req-1")
            .await
            .expect("lookup")
            .expect("known");
        assert_eq!(record.status, SettlementStatus::Captured);
        assert_eq!(record.captured_units, 80);
        kernel_a.refund("req-1", &usd(80)).await.expect("refund");
        assert_eq!(kernel_b.lookup("req-9").await, Ok(None));

        assert_eq!(
            kernel_a.authorize("req-2", &usd(5_000)).await,
            Err(PaymentError::InsufficientFunds),
            "a definite denial stays definite over the wire"
        );
        kernel_a
            .authorize("req-3", &usd(10))
            .await
            .expect("authorize");
        assert_eq!(kernel_b.release("req-3").await, Ok(ReleaseStatus::Released));
        assert_eq!(
            kernel_a.release("req-3").await,
            Ok(ReleaseStatus::AlreadyReleased)
        );
        assert_eq!(kernel_a.release("req-4").await, Ok(ReleaseStatus::NotFound));
        assert!(matches!(
            kernel_a.authorize(&"r".repeat(129), &usd(1)).await,
            Err(PaymentError::RailError(_))
        ));
        server.shutdown().await.expect("shutdown");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scripted_faults_travel_and_a_dead_rail_is_not_a_denial() {
        let rail = Arc::new(InMemoryRail::new());
        let faulty = Arc::new(FaultyRail::new(rail.clone()));
        faulty.fail_next(RailOp::Authorize, 1, PaymentError::Declined("card".into()));
        faulty.push(RailOp::Release, Fault::Pending);
        let certs = certs();
        let server = start(faulty.clone(), &certs).await;
        let transport = kernel_transport(&certs);
        let client = RemoteRail::connect(&server.endpoint(), &transport, Duration::from_secs(10))
            .expect("client");
        assert_eq!(
            client.authorize("req-1", &usd(10)).await,
            Err(PaymentError::Declined("card".into()))
        );
        client
            .authorize("req-1", &usd(10))
            .await
            .expect("second try");
        assert_eq!(
            client.release("req-1").await,
            Ok(ReleaseStatus::Unconfirmed)
        );
        let addr = server.endpoint();
        server.shutdown().await.expect("shutdown");

        let orphan =
            RemoteRail::connect(&addr, &transport, Duration::from_secs(2)).expect("client");
        let error = orphan
            .authorize("req-2", &usd(10))
            .await
            .expect_err("nobody listens");
        assert!(!error.is_definite_denial(), "{error:?}");
        assert!(RemoteRail::connect("not a uri", &transport, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn an_endpoint_scheme_must_agree_with_the_transport() {
        assert_eq!(rail_address("127.0.0.1:9", true), Ok("127.0.0.1:9"));
        assert_eq!(rail_address("https://127.0.0.1:9", true), Ok("127.0.0.1:9"));
        assert_eq!(rail_address("http://127.0.0.1:9", false), Ok("127.0.0.1:9"));
        assert_eq!(rail_address("127.0.0.1:9", false), Ok("127.0.0.1:9"));
        assert!(rail_address("http://127.0.0.1:9", true).is_err());
        assert!(rail_address("https://127.0.0.1:9", false).is_err());
        assert!(rail_address("https://", true).is_err());
        assert!(rail_address("https://host:1/path", true).is_err());
    }
}
