//! What a certificate says about its holder. Tally's CA writes it into URI subject
//! alternative names, which every X.509 tool shows and nothing else interprets:
//!
//! - `tally:node:<id>`: a cluster node with that Raft node id (peer port, and clock probes);
//! - `tally:role:<kernel|reader|operator|agent>`: a client and what it may call;
//! - `tally:namespace:<issuer key hex>` or `tally:namespace:*`: the budget families a kernel
//!   may touch (family ids start with `<issuer key hex>:`).
//!
//! The chain is verified by rustls against the cluster's CA before any of this is read.

use std::fmt;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// At most this many namespaces in one certificate.
pub const MAX_NAMESPACES: usize = 64;
/// A namespace is an issuer key in hex (64 characters); anything longer is refused.
pub const MAX_NAMESPACE_BYTES: usize = 128;

const NODE_PREFIX: &str = "tally:node:";
const ROLE_PREFIX: &str = "tally:role:";
const NAMESPACE_PREFIX: &str = "tally:namespace:";

/// What a client may do on the client port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Budget commands, `ResolveEvent` and reads, within its namespaces.
    Kernel,
    /// Reads only.
    Reader,
    /// The `Admin` service.
    Operator,
    /// A tool caller: the `tally.kernel.v1.Kernel` service of a kernel node, and nothing on the
    /// cluster but health. Agents get a role of their own so that the certificate handed to
    /// every tool-calling process grants no budget writes (`kernel`) and no reads of other
    /// tenants' usage (`reader`).
    Agent,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Kernel => "kernel",
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Agent => "agent",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "kernel" => Some(Role::Kernel),
            "reader" => Some(Role::Reader),
            "operator" => Some(Role::Operator),
            "agent" => Some(Role::Agent),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which budget families a kernel certificate reaches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Namespace {
    /// Every family: the dev cluster's kernel, or a single-tenant deployment.
    Any,
    /// Families of one root issuer: ids starting with `<issuer key hex>:`.
    Issuer(String),
}

impl Namespace {
    pub fn parse(value: &str) -> Result<Self, IdentityError> {
        if value == "*" {
            return Ok(Namespace::Any);
        }
        let valid = !value.is_empty()
            && value.len() <= MAX_NAMESPACE_BYTES
            && value.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid {
            return Err(IdentityError::Malformed(format!(
                "namespace {value:?} is neither `*` nor an issuer key in hex (at most \
                 {MAX_NAMESPACE_BYTES} characters)"
            )));
        }
        Ok(Namespace::Issuer(value.to_ascii_lowercase()))
    }

    /// Whether `family_id` (`<issuer key hex>:<token id>`) lies in this namespace.
    pub fn covers(&self, family_id: &str) -> bool {
        match self {
            Namespace::Any => true,
            Namespace::Issuer(key) => family_id
                .strip_prefix(key.as_str())
                .is_some_and(|rest| rest.starts_with(':')),
        }
    }

    pub fn as_uri(&self) -> String {
        match self {
            Namespace::Any => format!("{NAMESPACE_PREFIX}*"),
            Namespace::Issuer(key) => format!("{NAMESPACE_PREFIX}{key}"),
        }
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Namespace::Any => f.write_str("*"),
            Namespace::Issuer(key) => f.write_str(key),
        }
    }
}

/// The holder a verified certificate names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertIdentity {
    Node {
        id: u64,
    },
    Client {
        /// The subject's common name, for the audit log.
        name: String,
        role: Role,
        namespaces: Vec<Namespace>,
    },
}

impl CertIdentity {
    /// The certificate's name as logs and refusals show it.
    pub fn describe(&self) -> String {
        match self {
            CertIdentity::Node { id } => format!("node {id}"),
            CertIdentity::Client { name, role, .. } => format!("{role} {name:?}"),
        }
    }

    /// The URI SANs that encode this identity.
    pub fn uris(&self) -> Vec<String> {
        match self {
            CertIdentity::Node { id } => vec![format!("{NODE_PREFIX}{id}")],
            CertIdentity::Client {
                role, namespaces, ..
            } => std::iter::once(format!("{ROLE_PREFIX}{role}"))
                .chain(namespaces.iter().map(Namespace::as_uri))
                .collect(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("the certificate cannot be parsed: {0}")]
    Unparsable(String),
    #[error("the certificate names no Tally identity (no tally:node: or tally:role: URI)")]
    Anonymous,
    #[error("the certificate's Tally identity is malformed: {0}")]
    Malformed(String),
}

/// Reads the identity out of a DER certificate (already verified against the CA).
pub fn parse(der: &[u8]) -> Result<CertIdentity, IdentityError> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| IdentityError::Unparsable(e.to_string()))?;
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut uris = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for general in &san.value.general_names {
            if let GeneralName::URI(uri) = general {
                uris.push(*uri);
            }
        }
    }
    from_uris(name, &uris)
}

fn from_uris(name: String, uris: &[&str]) -> Result<CertIdentity, IdentityError> {
    let mut node = None;
    let mut role = None;
    let mut namespaces = Vec::new();
    for uri in uris {
        if let Some(id) = uri.strip_prefix(NODE_PREFIX) {
            let id: u64 = id
                .parse()
                .map_err(|_| IdentityError::Malformed(format!("node id in {uri:?}")))?;
            if node.replace(id).is_some() {
                return Err(IdentityError::Malformed("two node ids".to_owned()));
            }
        } else if let Some(value) = uri.strip_prefix(ROLE_PREFIX) {
            let parsed = Role::parse(value)
                .ok_or_else(|| IdentityError::Malformed(format!("unknown role in {uri:?}")))?;
            if role.replace(parsed).is_some() {
                return Err(IdentityError::Malformed("two roles".to_owned()));
            }
        } else if let Some(value) = uri.strip_prefix(NAMESPACE_PREFIX) {
            if namespaces.len() == MAX_NAMESPACES {
                return Err(IdentityError::Malformed(format!(
                    "more than {MAX_NAMESPACES} namespaces"
                )));
            }
            namespaces.push(Namespace::parse(value)?);
        }
    }
    match (node, role) {
        (Some(_), Some(_)) => Err(IdentityError::Malformed(
            "both a node id and a client role".to_owned(),
        )),
        (Some(id), None) => Ok(CertIdentity::Node { id }),
        (None, Some(role)) => Ok(CertIdentity::Client {
            name,
            role,
            namespaces,
        }),
        (None, None) => Err(IdentityError::Anonymous),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_cover_their_issuers_families_only() {
        let ns = Namespace::parse("ABcd").expect("hex");
        assert!(ns.covers("abcd:token-1"));
        assert!(
            !ns.covers("abcde:token-1"),
            "a longer key is another issuer"
        );
        assert!(!ns.covers("abcd"), "the separator is required");
        assert!(!ns.covers("ffff:token-1"));
        assert!(Namespace::Any.covers("anything"));
        assert!(Namespace::parse("not hex").is_err());
        assert!(Namespace::parse("").is_err());
    }

    #[test]
    fn uris_round_trip() {
        let kernel = CertIdentity::Client {
            name: "k".to_owned(),
            role: Role::Kernel,
            namespaces: vec![Namespace::Any, Namespace::Issuer("ab".to_owned())],
        };
        let uris = kernel.uris();
        let refs: Vec<&str> = uris.iter().map(String::as_str).collect();
        assert_eq!(from_uris("k".to_owned(), &refs), Ok(kernel));
        let node = CertIdentity::Node { id: 7 };
        let uris = node.uris();
        let refs: Vec<&str> = uris.iter().map(String::as_str).collect();
        assert_eq!(from_uris(String::new(), &refs), Ok(node));
    }

    #[test]
    fn ambiguous_or_anonymous_certificates_are_refused() {
        assert_eq!(from_uris(String::new(), &[]), Err(IdentityError::Anonymous));
        assert!(from_uris(String::new(), &["tally:node:1", "tally:role:kernel"]).is_err());
        assert!(from_uris(String::new(), &["tally:node:1", "tally:node:2"]).is_err());
        assert!(from_uris(String::new(), &["tally:role:root"]).is_err());
        assert!(from_uris(String::new(), &["tally:node:x"]).is_err());
    }
}
