//! Accepting connections on a kernel-side port: on a TLS port a plaintext client is answered
//! with UNAUTHENTICATED saying the port takes TLS (`tally_tls::listener`, shared with the
//! cluster's ports).

use tally_api::pb::ErrorDetail;
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// The sockets a server is to serve, from `listener`; when `tls` is set, only those that start
/// a TLS handshake (the others are answered here). `port` names the port in the answer.
pub fn incoming(
    listener: TcpListener,
    tls: bool,
    port: &'static str,
) -> ReceiverStream<std::io::Result<TcpStream>> {
    let refusal = Status::from(ErrorDetail::unauthenticated(format!(
        "this is a Tally {port} port and it takes TLS with a client certificate of its CA; this \
         client connected in plaintext. Dial https:// with a certificate (tally-node dev writes \
         them to ./tally-data/tls), or configure the server insecure for plaintext"
    )));
    tally_tls::listener::incoming(listener, Some, tls, refusal)
}
