//! Tally's mutual TLS (docs/architecture.md "Security"): who a certificate names
//! ([`identity`]), PEM files turned into tonic's server and client configs ([`files`]), and
//! the certificate authority that issues node and client certificates ([`issue`]), and how a
//! TLS port accepts sockets and answers plaintext clients ([`listener`]), and the health probe
//! the `healthcheck` commands run over it ([`health_probe`]).
//!
//! rustls runs with the ring provider only; [`install_crypto_provider`] installs it as the
//! process default before any TLS config is built, because tonic's server builds its rustls
//! config from the process default.

pub mod files;
pub mod health_probe;
pub mod identity;
pub mod issue;
pub mod listener;
pub mod transport;

pub use files::{TlsError, TlsFiles, TlsMaterial};
pub use identity::{CertIdentity, IdentityError, Namespace, Role};
pub use issue::{CertAuthority, IssueError, IssuedCert};
pub use transport::Transport;

/// The DNS name every node certificate carries and every client verifies: nodes are reached
/// by IP, container name or region-local host name alike, and what the client checks is that
/// the peer holds a node certificate of the cluster's own CA.
pub const SERVER_NAME: &str = "tally-node";

/// Installs ring as rustls' process-wide crypto provider (idempotent). Call it before building
/// any TLS config.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
