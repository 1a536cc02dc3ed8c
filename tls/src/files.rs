//! A holder's TLS files (the cluster's CA certificate, its own certificate and key, in PEM)
//! and the tonic configs made from them. Keys readable by anyone but their owner are refused:
//! on Kubernetes a Secret mounted with `fsGroup` is made 0440, so the keys are copied into an
//! in-memory volume with mode 0600 by an init container (deploy/k8s).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::identity::{self, CertIdentity, IdentityError};
use crate::SERVER_NAME;

/// The largest PEM file read: a certificate chain is a few KB.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Where one holder's TLS files are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The cluster CA's certificate: peers and clients must chain to it.
    pub ca_file: PathBuf,
    /// This holder's certificate.
    pub cert_file: PathBuf,
    /// This holder's private key (mode 0600 or stricter).
    pub key_file: PathBuf,
}

impl TlsFiles {
    /// `dir/ca.pem`, `dir/<name>.pem` and `dir/<name>.key`: the layout `tally-node dev` and
    /// `tally-node certs` write.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        Self {
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join(format!("{name}.pem")),
            key_file: dir.join(format!("{name}.key")),
        }
    }

    /// The `TALLY_TLS__*` variables that point `tally-node serve` at these files.
    pub fn node_env(&self) -> [(&'static str, &Path); 3] {
        [
            ("TALLY_TLS__CA_FILE", self.ca_file.as_path()),
            ("TALLY_TLS__CERT_FILE", self.cert_file.as_path()),
            ("TALLY_TLS__KEY_FILE", self.key_file.as_path()),
        ]
    }

    /// Reads and checks the files: the key's mode, the certificate's Tally identity.
    pub fn load(&self) -> Result<TlsMaterial, TlsError> {
        let ca_pem = read_pem(&self.ca_file)?;
        let cert_pem = read_pem(&self.cert_file)?;
        check_private(&self.key_file)?;
        let key_pem = read_pem(&self.key_file)?;
        let der = first_certificate_der(&cert_pem).ok_or_else(|| TlsError::NoCertificate {
            path: self.cert_file.clone(),
        })?;
        let identity = identity::parse(&der).map_err(|source| TlsError::Identity {
            path: self.cert_file.clone(),
            source,
        })?;
        Ok(TlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
            identity,
        })
    }

    /// Reads and checks the files of a server that is not a cluster node (a kernel node's own
    /// port, a payment rail): its certificate must name `server_name` as a DNS name, the name
    /// its callers verify. Checked here so that a client certificate given by mistake fails at
    /// start with its path, not at every caller's handshake.
    pub fn load_server(&self, server_name: &str) -> Result<ServerTlsMaterial, TlsError> {
        let ca_pem = read_pem(&self.ca_file)?;
        let cert_pem = read_pem(&self.cert_file)?;
        check_private(&self.key_file)?;
        let key_pem = read_pem(&self.key_file)?;
        let der = first_certificate_der(&cert_pem).ok_or_else(|| TlsError::NoCertificate {
            path: self.cert_file.clone(),
        })?;
        if !names_dns(&der, server_name) {
            return Err(TlsError::WrongServerName {
                path: self.cert_file.clone(),
                server_name: server_name.to_owned(),
            });
        }
        Ok(ServerTlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
        })
    }
}

/// Whether the DER certificate carries `name` among its DNS subject alternative names.
fn names_dns(der: &[u8], name: &str) -> bool {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    san.value.general_names.iter().any(
        |general| matches!(general, GeneralName::DNSName(dns) if dns.eq_ignore_ascii_case(name)),
    )
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_PEM_BYTES} bytes; is it a PEM file?")]
    TooLarge { path: PathBuf },
    #[error(
        "{path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}` \
         (on Kubernetes, copy the key out of the Secret volume with mode 0600: see deploy/k8s)"
    )]
    KeyExposed { path: PathBuf, mode: u32 },
    #[error(
        "no certificate {identity:?} in {dir} (looked for {identity}.pem): start `tally-node \
         dev` (it writes a CA and certificates there), point --tls-dir at your certificates, or \
         pass --insecure for a cluster started with --insecure"
    )]
    NoCredentials { dir: PathBuf, identity: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error(
        "{path} does not name {server_name:?} (a DNS subject alternative name), the name this \
         server's callers verify: is it a client certificate? `tally-node dev` writes the \
         server certificates (kernel-server, rail) next to the others"
    )]
    WrongServerName { path: PathBuf, server_name: String },
    #[error("{path}: {source}")]
    Identity {
        path: PathBuf,
        source: IdentityError,
    },
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    let read = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let len = std::fs::metadata(path).map_err(read)?.len();
    if len > MAX_PEM_BYTES {
        return Err(TlsError::TooLarge {
            path: path.to_owned(),
        });
    }
    std::fs::read(path).map_err(read)
}

#[cfg(unix)]
fn check_private(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyExposed {
            path: path.to_owned(),
            mode: mode & 0o777,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_path: &Path) -> Result<(), TlsError> {
    Ok(())
}

/// The DER bytes of the first `CERTIFICATE` block of a PEM file.
pub fn first_certificate_der(pem: &[u8]) -> Option<Vec<u8>> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    (block.label == "CERTIFICATE").then_some(block.contents)
}

/// Loaded TLS files, ready to build tonic configs.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    /// Who this holder's own certificate names.
    pub identity: CertIdentity,
}

impl TlsMaterial {
    /// A server that asks every client for a certificate of the CA. A client without one
    /// still completes the handshake, so the server can answer it UNAUTHENTICATED with a
    /// reason instead of a reset connection; a certificate of another CA fails the handshake.
    pub fn server_config(&self) -> ServerTlsConfig {
        server_config(&self.ca_pem, &self.cert_pem, &self.key_pem)
    }

    /// A client that trusts only the cluster's CA and presents this holder's certificate.
    pub fn client_config(&self) -> ClientTlsConfig {
        self.client_config_for(SERVER_NAME)
    }

    /// [`client_config`](Self::client_config) for a server that is not a cluster node: the
    /// server's certificate must name `server_name` (`tally-kernel` for a kernel node,
    /// `tally-rail` for a rail; [`crate::issue`]).
    pub fn client_config_for(&self, server_name: &str) -> ClientTlsConfig {
        crate::install_crypto_provider();
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .domain_name(server_name)
    }
}

/// Loaded TLS files of a server that is not a cluster node ([`TlsFiles::load_server`]): its
/// certificate names a DNS name rather than a Tally identity, since it is never a caller.
#[derive(Clone, Debug)]
pub struct ServerTlsMaterial {
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl ServerTlsMaterial {
    /// As [`TlsMaterial::server_config`]: client certificates of the CA are asked for but
    /// optional at the handshake, so the server can refuse a caller without one with a status.
    pub fn server_config(&self) -> ServerTlsConfig {
        server_config(&self.ca_pem, &self.cert_pem, &self.key_pem)
    }
}

fn server_config(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> ServerTlsConfig {
    crate::install_crypto_provider();
    ServerTlsConfig::new()
        .identity(Identity::from_pem(cert_pem, key_pem))
        .client_ca_root(Certificate::from_pem(ca_pem))
        .client_auth_optional(true)
}
