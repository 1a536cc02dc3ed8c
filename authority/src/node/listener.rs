//! Accepting connections on the client and peer ports: the connection cap, TCP_NODELAY, and,
//! on a TLS port, a clear answer to a plaintext client.
//!
//! Without the sniff, a plaintext gRPC client that dials a TLS port sees only "h2 protocol
//! error" or "connection reset": nothing says it needs TLS and a certificate. So each socket's
//! first byte is peeked: a TLS record starts with 0x16 (handshake), and every such socket goes
//! to the TLS server as before. Anything else is answered here, in plain HTTP/2, with a real
//! gRPC status on every request it sends: UNAUTHENTICATED, definite, saying that the port
//! takes TLS with a client certificate. Nothing behind the port is reached.
//!
//! The sniff runs in its own task per socket, so a client that connects and sends nothing
//! holds only its own connection slot, for at most `FIRST_BYTE_TIMEOUT`, and never the
//! accept loop.

use std::sync::Arc;
use std::time::Duration;

use tally_api::pb::ErrorDetail;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::service::limits::{CappedStream, ConnectionCap};

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// How long a new socket may stay silent before it is closed unserved.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a plaintext client is answered before its connection is closed.
const PLAINTEXT_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests answered on one plaintext connection before it is closed.
const PLAINTEXT_MAX_REQUESTS: usize = 16;

/// The sockets a server is to serve, from `listener`: each admitted by `connections`, and, when
/// `tls` is set, only those that start a TLS handshake (the others are answered here).
pub fn accepted(
    listener: TcpListener,
    connections: Arc<ConnectionCap>,
    tls: bool,
    port: &'static str,
) -> ReceiverStream<std::io::Result<CappedStream>> {
    // Bounded by the connection cap's own limit in effect: every socket in the channel holds
    // a slot. The channel's size only bounds how far accepting runs ahead of the server.
    let (sockets, incoming) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            // The server dropped its end (shut down): stop accepting and free the port.
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = sockets.closed() => return,
            };
            let admitted = match accepted {
                Ok((stream, _)) => {
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "could not set TCP_NODELAY");
                    }
                    match connections.admit(stream) {
                        Some(stream) => stream,
                        None => continue,
                    }
                }
                Err(error) => {
                    // Out of file descriptors and the like: the server decides, as before.
                    if sockets.send(Err(error)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            if !tls {
                if sockets.send(Ok(admitted)).await.is_err() {
                    return;
                }
                continue;
            }
            let sockets = sockets.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                match tokio::time::timeout(FIRST_BYTE_TIMEOUT, admitted.peek(&mut first)).await {
                    Ok(Ok(1)) if first[0] == TLS_HANDSHAKE_RECORD => {
                        let _ = sockets.send(Ok(admitted)).await;
                    }
                    Ok(Ok(1)) => refuse_plaintext(admitted, port).await,
                    // Closed, failed or silent before its first byte: nothing to serve.
                    _ => {}
                }
            });
        }
    });
    ReceiverStream::new(incoming)
}

/// Answers every request of a plaintext HTTP/2 connection with UNAUTHENTICATED, then closes
/// it. A client speaking something else than HTTP/2 fails the handshake and is closed.
async fn refuse_plaintext(stream: CappedStream, port: &'static str) {
    let peer = stream.peer_addr();
    tracing::info!(?peer, port, "plaintext connection on a TLS port refused");
    let status = Status::from(ErrorDetail::unauthenticated(format!(
        "this is Tally's {port} port and it takes TLS with a client certificate of the \
         cluster's CA; this client connected in plaintext. Dial https:// with a certificate \
         (tally-node dev writes them to <data-dir>/tls), or start the cluster with --insecure \
         for plaintext"
    )));
    let answer = async move {
        let mut connection = h2::server::handshake(stream).await.ok()?;
        for _ in 0..PLAINTEXT_MAX_REQUESTS {
            let (_, mut respond) = connection.accept().await?.ok()?;
            let (parts, _) = status.clone().into_http::<()>().into_parts();
            let response = tonic::codegen::http::Response::from_parts(parts, ());
            respond.send_response(response, true).ok()?;
        }
        connection.graceful_shutdown();
        // Let the last answers out before the connection is dropped.
        std::future::poll_fn(|cx| connection.poll_closed(cx))
            .await
            .ok()
    };
    let _ = tokio::time::timeout(PLAINTEXT_ANSWER_TIMEOUT, answer).await;
}
