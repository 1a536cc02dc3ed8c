//! How the kernel node's own gRPC port and a payment rail's port take callers
//! (docs/architecture.md "Security"): mutual TLS with a server certificate of the cluster's CA
//! ([`ServerTls`]), a check of the caller's role on every request ([`Gate`]), and a clear
//! refusal of a plaintext client ([`incoming`]). Plaintext is possible only when a node is
//! configured `insecure`, and is announced with a WARN at start.

mod gate;
mod listener;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tally_tls::files::ServerTlsMaterial;
use tally_tls::TlsFiles;

pub use gate::Gate;
pub use listener::incoming;

#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error(
        "no server certificate {identity:?} in {dir} (looked for {identity}.pem): start \
         `tally-node dev` (it writes a CA and the kernel-server and rail certificates to \
         ./tally-data/tls), point the TLS directory at your certificates, or configure the \
         port insecure (plaintext, no authentication)"
    )]
    NoServerCertificate { dir: PathBuf, identity: String },
    #[error(transparent)]
    Tls(#[from] tally_tls::TlsError),
}

/// How a server port is reached.
#[derive(Clone, Debug)]
pub enum ServerTls {
    /// Mutual TLS: this server's certificate, and callers' certificates of the same CA.
    Tls(Arc<ServerTlsMaterial>),
    /// Plaintext, nobody checked: only for a port configured `insecure`.
    Insecure,
}

impl ServerTls {
    /// Plaintext when `insecure`; else `dir/ca.pem` and the server certificate
    /// `dir/<identity>.pem`/`.key`, which must name `server_name`
    /// ([`tally_tls::issue::KERNEL_SERVER_NAME`], [`tally_tls::issue::RAIL_SERVER_NAME`]).
    pub fn from_dir(
        dir: &Path,
        identity: &str,
        server_name: &str,
        insecure: bool,
    ) -> Result<Self, PortError> {
        if insecure {
            return Ok(ServerTls::Insecure);
        }
        let files = TlsFiles::in_dir(dir, identity);
        if !files.cert_file.exists() {
            return Err(PortError::NoServerCertificate {
                dir: dir.to_owned(),
                identity: identity.to_owned(),
            });
        }
        Ok(ServerTls::Tls(Arc::new(files.load_server(server_name)?)))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ServerTls::Tls(_))
    }

    /// A tonic server builder for this port: with the TLS config, or plain.
    pub fn builder(&self) -> Result<tonic::transport::Server, tonic::transport::Error> {
        let builder = tonic::transport::Server::builder();
        match self {
            ServerTls::Tls(material) => builder.tls_config(material.server_config()),
            ServerTls::Insecure => Ok(builder),
        }
    }
}
