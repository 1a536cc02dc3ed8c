//! The cluster's certificate authority: it issues node certificates (`tally:node:<id>`,
//! usable as server and as client, since nodes call each other), client certificates (a
//! role and, for kernels, namespaces) and the server certificates of the other Tally servers
//! (a kernel node's own port, `tally-kernel`; a payment rail, `tally-rail`), which name a DNS
//! name only and serve only. `tally-node dev` makes a CA and a full set on first run;
//! `tally-node certs` issues from an operator's CA for production.

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::identity::{CertIdentity, Namespace, Role};
use crate::SERVER_NAME;

/// Hosts a node certificate may name besides the defaults.
pub const MAX_HOSTS: usize = 32;

/// The DNS name a kernel node's server certificate carries and its callers verify.
pub const KERNEL_SERVER_NAME: &str = "tally-kernel";
/// The DNS name a payment rail's server certificate carries and kernels verify.
pub const RAIL_SERVER_NAME: &str = "tally-rail";

#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} already exists; refusing to overwrite it")]
    Exists { path: PathBuf },
    #[error("invalid request: {0}")]
    Invalid(String),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> IssueError + '_ {
    move |source| IssueError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A certificate and its private key, in PEM.
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl IssuedCert {
    /// Writes `dir/<name>.pem` and `dir/<name>.key` (mode 0600), refusing to overwrite.
    pub fn write(&self, dir: &Path, name: &str) -> Result<(), IssueError> {
        write_new(&dir.join(format!("{name}.pem")), &self.cert_pem, 0o644)?;
        write_new(&dir.join(format!("{name}.key")), &self.key_pem, 0o600)
    }
}

fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), IssueError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            IssueError::Exists {
                path: path.to_owned(),
            }
        } else {
            IssueError::Io {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_error(path))
}

/// A CA able to sign: its certificate (PEM) and its key.
pub struct CertAuthority {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl CertAuthority {
    /// A new self-signed CA named after the cluster, valid for `days`.
    pub fn generate(cluster: &str, days: u32) -> Result<Self, IssueError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(&format!("Tally CA {cluster}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, days)?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA in `dir` (`ca.pem`, `ca.key`).
    pub fn load(dir: &Path) -> Result<Self, IssueError> {
        let cert_path = dir.join("ca.pem");
        let key_path = dir.join("ca.key");
        let cert_pem = std::fs::read_to_string(&cert_path).map_err(io_error(&cert_path))?;
        let key_pem = std::fs::read_to_string(&key_path).map_err(io_error(&key_path))?;
        let key = KeyPair::from_pem(&key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)?;
        Ok(Self { cert_pem, issuer })
    }

    /// Writes `dir/ca.pem` and `dir/ca.key` (0600), refusing to overwrite.
    pub fn write(&self, dir: &Path) -> Result<(), IssueError> {
        write_new(&dir.join("ca.pem"), &self.cert_pem, 0o644)?;
        write_new(
            &dir.join("ca.key"),
            &self.issuer.key().serialize_pem(),
            0o600,
        )
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A node certificate for `id`, naming `tally-node`, `localhost`, 127.0.0.1 and `hosts`.
    pub fn issue_node(
        &self,
        id: u64,
        hosts: &[String],
        days: u32,
    ) -> Result<IssuedCert, IssueError> {
        self.issue(
            &format!("tally node {id}"),
            host_names(SERVER_NAME, hosts)?,
            CertIdentity::Node { id }.uris(),
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            days,
        )
    }

    /// A client certificate for `name` with `role`; kernels also carry their namespaces.
    pub fn issue_client(
        &self,
        name: &str,
        role: Role,
        namespaces: Vec<Namespace>,
        days: u32,
    ) -> Result<IssuedCert, IssueError> {
        if name.is_empty() || name.len() > 64 {
            return Err(IssueError::Invalid(
                "a client name is 1 to 64 characters".to_owned(),
            ));
        }
        if role == Role::Kernel && namespaces.is_empty() {
            return Err(IssueError::Invalid(
                "a kernel certificate needs at least one namespace (an issuer key in hex, or *)"
                    .to_owned(),
            ));
        }
        if role != Role::Kernel && !namespaces.is_empty() {
            return Err(IssueError::Invalid(format!(
                "namespaces apply to kernel certificates only, not {role}"
            )));
        }
        if namespaces.len() > crate::identity::MAX_NAMESPACES {
            return Err(IssueError::Invalid(format!(
                "at most {} namespaces",
                crate::identity::MAX_NAMESPACES
            )));
        }
        let identity = CertIdentity::Client {
            name: name.to_owned(),
            role,
            namespaces,
        };
        self.issue(
            name,
            Vec::new(),
            identity.uris(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            days,
        )
    }

    /// A server certificate for a Tally server that is not a cluster node, named `name`
    /// (its common name): DNS `server_name` ([`KERNEL_SERVER_NAME`], [`RAIL_SERVER_NAME`]),
    /// `localhost`, 127.0.0.1 and `hosts`. It carries no Tally identity and server
    /// authentication only, so it can never be presented as a caller.
    pub fn issue_server(
        &self,
        name: &str,
        server_name: &str,
        hosts: &[String],
        days: u32,
    ) -> Result<IssuedCert, IssueError> {
        if name.is_empty() || name.len() > 64 {
            return Err(IssueError::Invalid(
                "a server name is 1 to 64 characters".to_owned(),
            ));
        }
        self.issue(
            name,
            host_names(server_name, hosts)?,
            Vec::new(),
            vec![ExtendedKeyUsagePurpose::ServerAuth],
            days,
        )
    }

    fn issue(
        &self,
        common_name: &str,
        dns_or_ip: Vec<String>,
        uris: Vec<String>,
        usages: Vec<ExtendedKeyUsagePurpose>,
        days: u32,
    ) -> Result<IssuedCert, IssueError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(dns_or_ip)?;
        params.distinguished_name = name(common_name);
        for uri in uris {
            params.subject_alt_names.push(SanType::URI(uri.try_into()?));
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages;
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, days)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// `server_name`, `localhost`, 127.0.0.1 and at most [`MAX_HOSTS`] more.
fn host_names(server_name: &str, hosts: &[String]) -> Result<Vec<String>, IssueError> {
    if hosts.len() > MAX_HOSTS {
        return Err(IssueError::Invalid(format!(
            "at most {MAX_HOSTS} hosts, {} given",
            hosts.len()
        )));
    }
    let mut names = vec![
        server_name.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    names.extend(hosts.iter().cloned());
    names.dedup();
    Ok(names)
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, "Tally");
    name
}

fn validity(params: &mut CertificateParams, days: u32) -> Result<(), IssueError> {
    if days == 0 || days > 3_650 {
        return Err(IssueError::Invalid("validity is 1 to 3650 days".to_owned()));
    }
    let now = std::time::SystemTime::now();
    // An hour of slack for clocks slightly behind the issuer's.
    params.not_before = (now - std::time::Duration::from_secs(3_600)).into();
    params.not_after = (now + std::time::Duration::from_secs(u64::from(days) * 86_400)).into();
    Ok(())
}

/// Dev certificates are valid this long: a dev data dir outlives many restarts.
pub const DEV_DAYS: u32 = 3_650;
/// The file name (`<name>.pem`, `<name>.key`) of a dev set's kernel server certificate,
/// what a kernel node serves with by default.
pub const DEV_KERNEL_SERVER: &str = "kernel-server";
/// The file name of a dev set's payment rail server certificate.
pub const DEV_RAIL_SERVER: &str = "rail";

/// The certificates of a dev cluster in `dir`: a CA, `node-<i>` for each node;
/// `operator`, `kernel` (namespace `*`), `reader` and `agent` clients; and the servers
/// `kernel-server` (a kernel node's own port, [`KERNEL_SERVER_NAME`]) and `rail` (a payment
/// rail, [`RAIL_SERVER_NAME`]). Creates whatever is missing, even beside an existing CA (a dev
/// directory from before a certificate was added gains it), and answers whether anything was
/// created; existing files are kept (a restart reuses them).
pub fn ensure_dev_certs(dir: &Path, cluster: &str, nodes: u64) -> Result<bool, IssueError> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_error(dir))?;
    }
    let mut created = false;
    let ca = if dir.join("ca.pem").exists() {
        CertAuthority::load(dir)?
    } else {
        let ca = CertAuthority::generate(cluster, DEV_DAYS)?;
        ca.write(dir)?;
        created = true;
        ca
    };
    for id in 1..=nodes {
        let name = format!("node-{id}");
        if !dir.join(format!("{name}.pem")).exists() {
            ca.issue_node(id, &[], DEV_DAYS)?.write(dir, &name)?;
            created = true;
        }
    }
    let clients = [
        ("operator", Role::Operator, vec![]),
        ("kernel", Role::Kernel, vec![Namespace::Any]),
        ("reader", Role::Reader, vec![]),
        ("agent", Role::Agent, vec![]),
    ];
    for (name, role, namespaces) in clients {
        if !dir.join(format!("{name}.pem")).exists() {
            ca.issue_client(name, role, namespaces, DEV_DAYS)?
                .write(dir, name)?;
            created = true;
        }
    }
    let servers = [
        (DEV_KERNEL_SERVER, KERNEL_SERVER_NAME),
        (DEV_RAIL_SERVER, RAIL_SERVER_NAME),
    ];
    for (name, server_name) in servers {
        if !dir.join(format!("{name}.pem")).exists() {
            ca.issue_server(name, server_name, &[], DEV_DAYS)?
                .write(dir, name)?;
            created = true;
        }
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::TlsFiles;

    #[test]
    fn a_dev_set_loads_with_the_identities_it_was_issued_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(ensure_dev_certs(dir.path(), "test", 2).expect("issued"));
        assert!(!ensure_dev_certs(dir.path(), "test", 2).expect("kept"));
        let node = TlsFiles::in_dir(dir.path(), "node-2")
            .load()
            .expect("loads");
        assert_eq!(node.identity, CertIdentity::Node { id: 2 });
        let kernel = TlsFiles::in_dir(dir.path(), "kernel")
            .load()
            .expect("loads");
        assert_eq!(
            kernel.identity,
            CertIdentity::Client {
                name: "kernel".to_owned(),
                role: Role::Kernel,
                namespaces: vec![Namespace::Any],
            }
        );
    }

    #[test]
    fn server_certificates_name_their_server_and_no_caller() {
        let dir = tempfile::tempdir().expect("tempdir");
        ensure_dev_certs(dir.path(), "test", 1).expect("issued");
        let kernel_server = TlsFiles::in_dir(dir.path(), DEV_KERNEL_SERVER);
        kernel_server
            .load_server(KERNEL_SERVER_NAME)
            .expect("names tally-kernel");
        assert!(
            matches!(kernel_server.load(), Err(crate::TlsError::Identity { .. })),
            "a server certificate names no caller"
        );
        TlsFiles::in_dir(dir.path(), DEV_RAIL_SERVER)
            .load_server(RAIL_SERVER_NAME)
            .expect("names tally-rail");
        let error = TlsFiles::in_dir(dir.path(), "kernel")
            .load_server(KERNEL_SERVER_NAME)
            .expect_err("a client certificate");
        assert!(
            matches!(error, crate::TlsError::WrongServerName { .. }),
            "{error}"
        );
        let agent = TlsFiles::in_dir(dir.path(), "agent").load().expect("loads");
        assert!(matches!(
            agent.identity,
            CertIdentity::Client {
                role: Role::Agent,
                ..
            }
        ));
    }

    #[test]
    fn certificates_added_later_are_made_beside_an_existing_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        ensure_dev_certs(dir.path(), "test", 1).expect("issued");
        let ca_before = std::fs::read(dir.path().join("ca.pem")).expect("ca");
        let kernel_before = std::fs::read(dir.path().join("kernel.pem")).expect("kernel");
        // A dev directory from before the kernel port took TLS.
        for name in ["agent", DEV_KERNEL_SERVER, DEV_RAIL_SERVER] {
            for ext in ["pem", "key"] {
                std::fs::remove_file(dir.path().join(format!("{name}.{ext}"))).expect("rm");
            }
        }
        assert!(ensure_dev_certs(dir.path(), "test", 1).expect("completed"));
        assert_eq!(
            std::fs::read(dir.path().join("ca.pem")).expect("ca"),
            ca_before
        );
        assert_eq!(
            std::fs::read(dir.path().join("kernel.pem")).expect("kernel"),
            kernel_before
        );
        TlsFiles::in_dir(dir.path(), DEV_KERNEL_SERVER)
            .load_server(KERNEL_SERVER_NAME)
            .expect("made from the existing CA");
        TlsFiles::in_dir(dir.path(), "agent").load().expect("made");
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        ensure_dev_certs(dir.path(), "test", 1).expect("issued");
        let files = TlsFiles::in_dir(dir.path(), "operator");
        std::fs::set_permissions(&files.key_file, std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        let error = files.load().expect_err("refused");
        assert!(error.to_string().contains("chmod 600"), "{error}");
    }

    #[test]
    fn a_reloaded_ca_issues_certificates_that_chain_to_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        CertAuthority::generate("test", 1)
            .expect("ca")
            .write(dir.path())
            .expect("written");
        let ca = CertAuthority::load(dir.path()).expect("loads");
        ca.issue_client("ops", Role::Operator, vec![], 1)
            .expect("issued")
            .write(dir.path(), "ops")
            .expect("written");
        assert!(ca.issue_client("k", Role::Kernel, vec![], 1).is_err());
        assert!(ca
            .issue_client("r", Role::Reader, vec![Namespace::Any], 1)
            .is_err());
        let loaded = TlsFiles::in_dir(dir.path(), "ops").load().expect("loads");
        assert!(matches!(
            loaded.identity,
            CertIdentity::Client {
                role: Role::Operator,
                ..
            }
        ));
    }
}
