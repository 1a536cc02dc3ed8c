//! How a caller reaches a Tally port: mutual TLS with its own certificate, or plaintext for
//! a node started with `--insecure`. Every place that opens a channel (clients, peers, the
//! CLI, the harnesses) builds its endpoint here, so none can forget the TLS half.

use std::sync::Arc;

use tonic::transport::Endpoint;

use std::path::Path;

use crate::files::{TlsError, TlsFiles, TlsMaterial};
use crate::SERVER_NAME;

#[derive(Clone, Debug)]
pub enum Transport {
    Tls(Arc<TlsMaterial>),
    /// Plaintext, no authentication: only against nodes started `--insecure`.
    Insecure,
}

impl PartialEq for Transport {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Transport::Tls(a), Transport::Tls(b)) => Arc::ptr_eq(a, b),
            (Transport::Insecure, Transport::Insecure) => true,
            _ => false,
        }
    }
}

impl Eq for Transport {}

impl Transport {
    pub fn tls(material: TlsMaterial) -> Self {
        Transport::Tls(Arc::new(material))
    }

    /// An endpoint for the cluster node at `address` (`host:port`), not yet connected.
    pub fn endpoint(&self, address: &str) -> Result<Endpoint, tonic::transport::Error> {
        self.endpoint_to(address, SERVER_NAME)
    }

    /// An endpoint for another Tally server at `address` (`host:port`), not yet connected:
    /// over TLS its certificate must name `server_name` (`tally-kernel` for a kernel node,
    /// `tally-rail` for a payment rail; see [`crate::issue`]).
    pub fn endpoint_to(
        &self,
        address: &str,
        server_name: &str,
    ) -> Result<Endpoint, tonic::transport::Error> {
        match self {
            Transport::Tls(material) => Endpoint::from_shared(format!("https://{address}"))?
                .tls_config(material.client_config_for(server_name)),
            Transport::Insecure => Endpoint::from_shared(format!("http://{address}")),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }

    /// What a command-line tool connects with: plaintext when `insecure`, else the
    /// certificate `identity` (`operator`, `kernel`, `reader`, `agent`, `node-1`...) in `tls_dir`, the
    /// layout `tally-node dev` and `tally-node certs` write.
    pub fn from_dir(tls_dir: &Path, identity: &str, insecure: bool) -> Result<Self, TlsError> {
        if insecure {
            return Ok(Transport::Insecure);
        }
        let files = TlsFiles::in_dir(tls_dir, identity);
        if !files.cert_file.exists() {
            return Err(TlsError::NoCredentials {
                dir: tls_dir.to_owned(),
                identity: identity.to_owned(),
            });
        }
        Ok(Transport::tls(files.load()?))
    }
}
