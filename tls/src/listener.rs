//! Accepting connections on a TLS port, for every Tally server (the cluster's client and
//! peer ports, the kernel node's port, the payment rail): TCP_NODELAY on every socket, an
//! optional admission step (the cluster's connection cap), and a clear answer to a plaintext
//! client.
//!
//! Without that answer a plaintext gRPC client dialing a TLS port sees only "h2 protocol
//! error" or "connection reset": nothing says it needs TLS and a certificate. So each socket's
//! first byte is peeked: a TLS record starts with 0x16 (handshake), and every such socket goes
//! on to the TLS server. Anything else is answered here, in plain HTTP/2, with the caller's
//! refusal status (UNAUTHENTICATED, definite, saying the port takes TLS) on every request it
//! sends; nothing behind the port is reached.
//!
//! The peek runs in a task per socket, so a client that connects and sends nothing holds only
//! its own connection, for at most [`FIRST_BYTE_TIMEOUT`], never the accept loop. tonic sets
//! TCP_NODELAY only on listeners it binds itself; without it every small reply waits on Nagle
//! and delayed ACKs.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// How long a new socket may stay silent before it is closed unserved.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a plaintext client is answered before its connection is closed.
const PLAINTEXT_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests answered on one plaintext connection before it is closed.
const PLAINTEXT_MAX_REQUESTS: usize = 16;
/// Sockets accepted ahead of the server. Each one holds whatever `admit` gave it (the
/// cluster's connection slot), so this only bounds how far accepting runs ahead.
const ACCEPT_BACKLOG: usize = 64;

/// An accepted socket whose first bytes can be read without consuming them.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn peek<'a>(&'a self, buf: &'a mut [u8])
        -> impl Future<Output = io::Result<usize>> + Send + 'a;

    fn peer_addr(&self) -> Option<SocketAddr>;
}

impl Socket for TcpStream {
    fn peek<'a>(
        &'a self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        TcpStream::peek(self, buf)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        TcpStream::peer_addr(self).ok()
    }
}

/// The sockets a server is to serve, from `listener`: each one `admit` accepts (`None`
/// closes it at once), and, when `tls` is set, only those that start a TLS handshake; the
/// others are answered `refusal` here. Accepting stops, and the port is freed, when the
/// server drops the stream.
pub fn incoming<S, A>(
    listener: TcpListener,
    mut admit: A,
    tls: bool,
    refusal: Status,
) -> ReceiverStream<io::Result<S>>
where
    S: Socket,
    A: FnMut(TcpStream) -> Option<S> + Send + 'static,
{
    let (sockets, incoming) = mpsc::channel(ACCEPT_BACKLOG);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = sockets.closed() => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: the server decides.
                    if sockets.send(Err(error)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "could not set TCP_NODELAY");
            }
            let Some(admitted) = admit(stream) else {
                continue;
            };
            if !tls {
                if sockets.send(Ok(admitted)).await.is_err() {
                    return;
                }
                continue;
            }
            let sockets = sockets.clone();
            let refusal = refusal.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                match tokio::time::timeout(FIRST_BYTE_TIMEOUT, admitted.peek(&mut first)).await {
                    Ok(Ok(1)) if first[0] == TLS_HANDSHAKE_RECORD => {
                        let _ = sockets.send(Ok(admitted)).await;
                    }
                    Ok(Ok(1)) => refuse_plaintext(admitted, refusal).await,
                    // Closed, failed or silent before its first byte: nothing to serve.
                    _ => {}
                }
            });
        }
    });
    ReceiverStream::new(incoming)
}

/// Answers every request of a plaintext HTTP/2 connection with `refusal`, then closes it. A
/// client speaking something other than HTTP/2 fails the handshake and is closed.
async fn refuse_plaintext<S: Socket>(stream: S, refusal: Status) {
    tracing::info!(peer = ?stream.peer_addr(), "plaintext connection on a TLS port refused");
    let answer = async move {
        let mut connection = h2::server::handshake(stream).await.ok()?;
        for _ in 0..PLAINTEXT_MAX_REQUESTS {
            let (_, mut respond) = connection.accept().await?.ok()?;
            let (parts, _) = refusal.clone().into_http::<()>().into_parts();
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
