//! Accepting connections on the client and peer ports: each socket takes a slot of the
//! node's connection cap, and on a TLS port a plaintext client is answered with
//! UNAUTHENTICATED saying the port takes TLS (`tally_tls::listener`, shared with the kernel
//! node and the payment rail).

use std::sync::Arc;

use tally_api::pb::ErrorDetail;
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::service::limits::{CappedStream, ConnectionCap};

/// The sockets a server is to serve, from `listener`: each admitted by `connections`, and,
/// when `tls` is set, only those that start a TLS handshake. `port` names the port in the
/// answer to a plaintext client.
pub fn accepted(
    listener: TcpListener,
    connections: Arc<ConnectionCap>,
    tls: bool,
    port: &'static str,
) -> ReceiverStream<std::io::Result<CappedStream>> {
    let refusal = Status::from(ErrorDetail::unauthenticated(format!(
        "this is Tally's {port} port and it takes TLS with a client certificate of the \
         cluster's CA; this client connected in plaintext. Dial https:// with a certificate \
         (tally-node dev writes them to <data-dir>/tls), or start the cluster with --insecure \
         for plaintext"
    )));
    tally_tls::listener::incoming(
        listener,
        move |stream| connections.admit(stream),
        tls,
        refusal,
    )
}
