//! A kernel node's configuration: defaults, then a TOML file, then `TALLY_KERNEL_*`
//! environment variables (nested keys with `__`, e.g. `TALLY_KERNEL_RECONCILER__ENABLED`);
//! validated into typed parts and printed once at start-up (without the key seed).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::key_file::{read_key_file, KeyFileError};
use crate::keys::{KeyPair, PublicKey};
use crate::pipeline::{KernelConfig, MAX_POSSESSION_SKEW_MS};
use crate::port::{PortError, ServerTls};
use crate::reconciler::ReconcilerConfig;
use crate::token::TrustList;
use crate::tool::MAX_TOOL_SERVERS;

/// Trusted keys of each kind one node accepts.
pub const MAX_TRUSTED_KEYS: usize = 1_024;
/// Where `tally-node dev` writes its CA and certificates, and so where a kernel node looks for
/// them by default.
pub const DEFAULT_TLS_DIR: &str = "./tally-data/tls";
/// The longest certificate name (`<name>.pem` in a TLS directory).
pub const MAX_IDENTITY_BYTES: usize = 64;

/// Settings given on `tally-kernel serve`'s command line: they override the file and the
/// environment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServeFlags {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_identity: Option<String>,
    /// Only ever turns `insecure` on: a flag left off keeps the file's setting.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelNodeConfig {
    /// Where the gRPC `tally.kernel.v1.Kernel` service (and health) listens.
    pub listen_addr: SocketAddr,
    /// The CA and this node's server certificate for `listen_addr`: `<dir>/ca.pem` and
    /// `<dir>/<server_identity>.pem`/`.key`, a certificate naming `tally-kernel`
    /// (`tally-node dev` writes `kernel-server` to ./tally-data/tls). Callers must present a
    /// client certificate of this CA with role `agent` ([`crate::port::Gate`]).
    pub tls_dir: PathBuf,
    pub server_identity: String,
    /// Plaintext and no caller checks on `listen_addr`, for tools that cannot present a
    /// certificate; WARNed at start. The cluster and the rail have their own switches.
    pub insecure: bool,
    /// Where `/metrics` (Prometheus text) listens; none disables it.
    pub metrics_addr: Option<SocketAddr>,
    /// The node's signing key as a base64 seed, or a file holding one (`key_file` wins). The
    /// file must be private to its owner (mode 0600 or 0400; see [`crate::key_file`]).
    pub key_seed: Option<String>,
    pub key_file: Option<PathBuf>,
    /// Root issuers of capability tokens (base64 public keys).
    pub trusted_issuers: Vec<String>,
    /// Peer kernel nodes whose nonces and tickets this node accepts (its own is implied).
    pub trusted_kernel_keys: Vec<String>,
    /// Tally cluster endpoints (`host:port`).
    pub cluster_endpoints: Vec<String>,
    /// The cluster's CA and this kernel's client certificate: `<dir>/ca.pem` and
    /// `<dir>/<cluster_identity>.pem`/`.key` (a `kernel` certificate; `tally-node dev`
    /// writes ./tally-data/tls).
    pub cluster_tls_dir: PathBuf,
    pub cluster_identity: String,
    /// Plaintext to a cluster started with `--insecure`.
    pub cluster_insecure: bool,
    /// The region this kernel node runs in: it sends its commands and reads to a cluster node
    /// of the same region, which forwards writes to the leader. None: straight to the leader.
    #[serde(default)]
    pub region: Option<String>,
    pub rail: RailSettings,
    pub tool_servers: Vec<ToolServerSettings>,
    pub dispatch_deadline_ms: u64,
    pub command_lifetime_ms: u64,
    pub hold_timeout_ms: u64,
    pub preflight_hold_timeout_ms: u64,
    pub require_nonce: bool,
    pub nonce_ttl_ms: u64,
    /// How far a request's proof-of-possession `signed_at_ms` may lie from this node's clock,
    /// either side (docs/spec.md §9, "Proof of possession").
    pub possession_max_skew_ms: u64,
    pub client_attempt_timeout_ms: u64,
    pub client_retry_for_ms: u64,
    pub client_resolve_for_ms: u64,
    pub reconciler: ReconcilerSettings,
    /// JSON-lines receipt log; none keeps receipts only in replies.
    pub receipt_log: Option<PathBuf>,
    /// `pretty` or `json`.
    pub log_format: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RailSettings {
    /// `memory` (a demo rail in this process) or `remote` (a `tally.rail.v1` server).
    pub kind: String,
    /// `host:port` of a remote rail (`https://` or, with `insecure`, `http://` may prefix it).
    pub endpoint: Option<String>,
    pub call_timeout_ms: u64,
    /// The CA and the client certificate this kernel presents to a remote rail, whose server
    /// certificate must name `tally-rail`; none means the cluster's (`cluster_tls_dir`,
    /// `cluster_identity`), so one `kernel` certificate serves both.
    pub tls_dir: Option<PathBuf>,
    pub identity: Option<String>,
    /// Plaintext to a rail started insecure; WARNed at start.
    pub insecure: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolServerSettings {
    pub id: String,
    /// `http://host:port/path`.
    pub url: String,
    pub tools: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcilerSettings {
    pub enabled: bool,
    pub interval_ms: u64,
    pub stale_after_ms: u64,
    pub batch_limit: u32,
}

impl Default for KernelNodeConfig {
    fn default() -> Self {
        let pipeline = KernelConfig::default();
        let reconciler = ReconcilerConfig::default();
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 7501)),
            tls_dir: PathBuf::from(DEFAULT_TLS_DIR),
            server_identity: tally_tls::issue::DEV_KERNEL_SERVER.to_owned(),
            insecure: false,
            metrics_addr: None,
            key_seed: None,
            key_file: None,
            trusted_issuers: Vec::new(),
            trusted_kernel_keys: Vec::new(),
            cluster_endpoints: vec!["127.0.0.1:7401".to_owned()],
            cluster_tls_dir: PathBuf::from(DEFAULT_TLS_DIR),
            cluster_identity: "kernel".to_owned(),
            cluster_insecure: false,
            region: None,
            rail: RailSettings {
                kind: "memory".to_owned(),
                endpoint: None,
                call_timeout_ms: 5_000,
                tls_dir: None,
                identity: None,
                insecure: false,
            },
            tool_servers: Vec::new(),
            dispatch_deadline_ms: u64::try_from(pipeline.dispatch_deadline.as_millis())
                .unwrap_or(u64::MAX),
            command_lifetime_ms: pipeline.command_lifetime_ms,
            hold_timeout_ms: pipeline.hold_timeout_ms,
            preflight_hold_timeout_ms: pipeline.preflight_hold_timeout_ms,
            require_nonce: pipeline.require_nonce,
            nonce_ttl_ms: pipeline.nonce_ttl_ms,
            possession_max_skew_ms: pipeline.possession_max_skew_ms,
            client_attempt_timeout_ms: 5_000,
            client_retry_for_ms: 10_000,
            client_resolve_for_ms: 10_000,
            reconciler: ReconcilerSettings {
                enabled: true,
                interval_ms: u64::try_from(reconciler.interval.as_millis()).unwrap_or(u64::MAX),
                stale_after_ms: reconciler.stale_after_ms,
                batch_limit: reconciler.batch_limit,
            },
            receipt_log: None,
            log_format: "pretty".to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration could not be read: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
}

fn invalid<T>(reason: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid(reason.into()))
}

/// A certificate's name in a TLS directory: a plain file name, so a setting cannot reach
/// outside the directory.
fn identity_name(what: &str, name: &str) -> Result<(), ConfigError> {
    let plain = !name.is_empty()
        && name.len() <= MAX_IDENTITY_BYTES
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if plain {
        Ok(())
    } else {
        invalid(format!(
            "{what} {name:?} must name a certificate in its TLS directory: 1 to \
             {MAX_IDENTITY_BYTES} letters, digits, '.', '-' or '_', not starting with '.' \
             (e.g. kernel-server)"
        ))
    }
}

fn keys(what: &str, texts: &[String]) -> Result<Vec<PublicKey>, ConfigError> {
    if texts.len() > MAX_TRUSTED_KEYS {
        return invalid(format!("{what}: at most {MAX_TRUSTED_KEYS} keys"));
    }
    texts
        .iter()
        .map(|text| {
            PublicKey::from_base64(text)
                .map_err(|e| ConfigError::Invalid(format!("{what}: {text:?}: {e}")))
        })
        .collect()
}

impl KernelNodeConfig {
    /// Defaults, then `file` (if given), then `TALLY_KERNEL_*` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(file, &ServeFlags::default())
    }

    /// [`load`](Self::load), then the command line's `flags`.
    pub fn load_with(file: Option<&Path>, flags: &ServeFlags) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Self::default()));
        if let Some(file) = file {
            if !file.exists() {
                return invalid(format!("config file {} does not exist", file.display()));
            }
            figment = figment.merge(Toml::file(file));
        }
        let config: Self = figment
            .merge(Env::prefixed("TALLY_KERNEL_").split("__"))
            .merge(Serialized::globals(flags))
            .extract()
            .map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cluster_endpoints.is_empty() {
            return invalid("cluster_endpoints must name at least one node");
        }
        if let Some(region) = &self.region {
            if let Err(error) = tally_ledger::region::validate_region("region", region) {
                return invalid(error.to_string());
            }
        }
        if self.tool_servers.len() > MAX_TOOL_SERVERS {
            return invalid(format!("at most {MAX_TOOL_SERVERS} tool servers"));
        }
        for server in &self.tool_servers {
            crate::tool::HttpToolServer::new(&server.id, server.tools.clone(), &server.url)
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        identity_name("server_identity", &self.server_identity)?;
        identity_name("cluster_identity", &self.cluster_identity)?;
        if let Some(identity) = &self.rail.identity {
            identity_name("rail.identity", identity)?;
        }
        match (self.rail.kind.as_str(), &self.rail.endpoint) {
            ("memory", _) => {}
            ("remote", Some(endpoint)) => {
                crate::payment::remote::rail_address(endpoint, !self.rail.insecure)
                    .map_err(|e| ConfigError::Invalid(format!("rail.endpoint: {e}")))?;
            }
            ("remote", None) => return invalid("rail.kind = remote needs rail.endpoint"),
            (other, _) => return invalid(format!("rail.kind {other:?}: memory or remote")),
        }
        if !matches!(self.log_format.as_str(), "pretty" | "json") {
            return invalid("log_format must be pretty or json");
        }
        if self.dispatch_deadline_ms == 0 || self.command_lifetime_ms == 0 {
            return invalid("dispatch_deadline_ms and command_lifetime_ms must be positive");
        }
        if self.hold_timeout_ms == 0
            || self.hold_timeout_ms > tally_ledger::limits::MAX_HOLD_TIMEOUT_MS
            || self.preflight_hold_timeout_ms == 0
            || self.preflight_hold_timeout_ms > tally_ledger::limits::MAX_HOLD_TIMEOUT_MS
        {
            return invalid("hold timeouts must be 1 ms to the ledger's maximum");
        }
        if self.nonce_ttl_ms == 0 || self.nonce_ttl_ms > crate::nonce::MAX_NONCE_TTL_MS {
            return invalid("nonce_ttl_ms must be 1 ms to the ledger's maximum nonce lifetime");
        }
        if self.possession_max_skew_ms == 0 || self.possession_max_skew_ms > MAX_POSSESSION_SKEW_MS
        {
            return invalid(format!(
                "possession_max_skew_ms must be 1 to {MAX_POSSESSION_SKEW_MS} ms"
            ));
        }
        // A reconciler must never finish a hold whose owner may still be running the call:
        // a hold is captured within its timeout, then dispatched within the deadline.
        let busy_for = self
            .hold_timeout_ms
            .saturating_add(self.dispatch_deadline_ms)
            .saturating_add(self.command_lifetime_ms);
        if self.reconciler.enabled && self.reconciler.stale_after_ms <= busy_for {
            return invalid(format!(
                "reconciler.stale_after_ms must exceed hold_timeout_ms + dispatch_deadline_ms + command_lifetime_ms ({busy_for})"
            ));
        }
        keys("trusted_issuers", &self.trusted_issuers)?;
        keys("trusted_kernel_keys", &self.trusted_kernel_keys)?;
        self.keypair()?;
        Ok(())
    }

    /// The node's key: `key_file`, else `key_seed`; a node without one cannot sign.
    pub fn keypair(&self) -> Result<KeyPair, ConfigError> {
        match (&self.key_file, &self.key_seed) {
            (Some(path), _) => Ok(read_key_file(path)?),
            (None, Some(seed)) => KeyPair::from_seed_base64(seed.trim())
                .map_err(|e| ConfigError::Invalid(format!("node key: {e}"))),
            (None, None) => invalid("key_seed or key_file is required"),
        }
    }

    pub fn token_issuers(&self) -> Result<TrustList, ConfigError> {
        Ok(TrustList::new(keys(
            "trusted_issuers",
            &self.trusted_issuers,
        )?))
    }

    pub fn kernel_keys(&self) -> Result<Vec<PublicKey>, ConfigError> {
        keys("trusted_kernel_keys", &self.trusted_kernel_keys)
    }

    pub fn pipeline(&self) -> KernelConfig {
        KernelConfig {
            dispatch_deadline: Duration::from_millis(self.dispatch_deadline_ms),
            command_lifetime_ms: self.command_lifetime_ms,
            hold_timeout_ms: self.hold_timeout_ms,
            preflight_hold_timeout_ms: self.preflight_hold_timeout_ms,
            require_nonce: self.require_nonce,
            nonce_ttl_ms: self.nonce_ttl_ms,
            possession_max_skew_ms: self.possession_max_skew_ms,
        }
    }

    /// How this kernel reaches the cluster; fails if its certificate cannot be loaded.
    pub fn client(&self) -> Result<tally_client::ClientConfig, tally_tls::TlsError> {
        let transport = tally_client::Transport::from_dir(
            &self.cluster_tls_dir,
            &self.cluster_identity,
            self.cluster_insecure,
        )?;
        let mut client = tally_client::ClientConfig::new(self.cluster_endpoints.clone(), transport);
        client.attempt_timeout = Duration::from_millis(self.client_attempt_timeout_ms);
        client.retry_for = Duration::from_millis(self.client_retry_for_ms);
        client.resolve_for = Duration::from_millis(self.client_resolve_for_ms);
        client.region.clone_from(&self.region);
        Ok(client)
    }

    /// How this node's own port takes callers; fails if its certificate cannot be loaded.
    pub fn server_tls(&self) -> Result<ServerTls, PortError> {
        ServerTls::from_dir(
            &self.tls_dir,
            &self.server_identity,
            tally_tls::issue::KERNEL_SERVER_NAME,
            self.insecure,
        )
    }

    /// How this kernel reaches a remote rail; fails if its certificate cannot be loaded.
    pub fn rail_transport(&self) -> Result<tally_client::Transport, tally_tls::TlsError> {
        tally_client::Transport::from_dir(
            self.rail.tls_dir.as_ref().unwrap_or(&self.cluster_tls_dir),
            self.rail
                .identity
                .as_ref()
                .unwrap_or(&self.cluster_identity),
            self.rail.insecure,
        )
    }

    pub fn reconciler(&self) -> ReconcilerConfig {
        ReconcilerConfig {
            stale_after_ms: self.reconciler.stale_after_ms,
            batch_limit: self.reconciler.batch_limit,
            interval: Duration::from_millis(self.reconciler.interval_ms),
            command_lifetime_ms: self.command_lifetime_ms,
        }
    }

    /// What is printed at start-up: everything but the key seed.
    pub fn redacted(&self) -> Self {
        Self {
            key_seed: self.key_seed.as_ref().map(|_| "<redacted>".to_owned()),
            ..self.clone()
        }
    }
}

#[cfg(test)]
// figment's `Jail::expect_with` fixes the closure's error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn toml_then_env_override_defaults() {
        figment::Jail::expect_with(|jail| {
            let seed = KeyPair::from_seed(&[7; 32]).seed_base64();
            jail.create_file(
                "kernel.toml",
                &format!(
                    "key_seed = \"{seed}\"\nrequire_nonce = true\n[[tool_servers]]\nid = \"srv\"\nurl = \"http://127.0.0.1:9/x\"\ntools = [\"t\"]\n"
                ),
            )?;
            jail.set_env("TALLY_KERNEL_DISPATCH_DEADLINE_MS", "1234");
            jail.set_env("TALLY_KERNEL_RECONCILER__ENABLED", "false");
            let config = KernelNodeConfig::load(Some(Path::new("kernel.toml")))
                .map_err(|e| figment::Error::from(e.to_string()))?;
            assert!(config.require_nonce);
            assert_eq!(config.dispatch_deadline_ms, 1234);
            assert!(!config.reconciler.enabled);
            assert_eq!(config.tool_servers.len(), 1);
            assert_eq!(config.redacted().key_seed.as_deref(), Some("<redacted>"));
            Ok(())
        });
    }

    #[test]
    fn invalid_configs_are_refused() {
        let mut config = KernelNodeConfig::default();
        assert!(config.validate().is_err(), "no key");
        config.key_seed = Some(KeyPair::from_seed(&[1; 32]).seed_base64());
        assert!(config.validate().is_ok());
        config.rail.kind = "remote".into();
        assert!(config.validate().is_err());
        config.rail.kind = "memory".into();
        config.reconciler.stale_after_ms = config.hold_timeout_ms;
        assert!(
            config.validate().is_err(),
            "reconciler would race live owners"
        );
        config.reconciler.stale_after_ms = KernelNodeConfig::default().reconciler.stale_after_ms;
        config.possession_max_skew_ms = 0;
        assert!(config.validate().is_err(), "no freshness window");
        config.possession_max_skew_ms = MAX_POSSESSION_SKEW_MS + 1;
        assert!(config.validate().is_err(), "too wide a freshness window");
        config.possession_max_skew_ms = KernelNodeConfig::default().possession_max_skew_ms;
        config.server_identity = "../node-1".into();
        assert!(config.validate().is_err(), "outside the TLS directory");
        config.server_identity = String::new();
        assert!(config.validate().is_err(), "no certificate named");
        config.server_identity = "kernel-server".into();
        config.rail.kind = "remote".into();
        config.rail.endpoint = Some("http://127.0.0.1:9".into());
        let error = config.validate().expect_err("plaintext scheme, TLS rail");
        assert!(error.to_string().contains("rail.endpoint"), "{error}");
        config.rail.insecure = true;
        assert!(config.validate().is_ok(), "an insecure rail");
        config.rail.endpoint = Some("127.0.0.1:9".into());
        config.rail.insecure = false;
        assert!(config.validate().is_ok(), "host:port over TLS");
        config.rail.identity = Some("a/b".into());
        assert!(config.validate().is_err());
        config.rail = KernelNodeConfig::default().rail;
        config.trusted_issuers = vec!["not a key".into()];
        assert!(config.validate().is_err());
    }

    #[test]
    fn command_line_flags_override_file_and_environment() {
        figment::Jail::expect_with(|jail| {
            let seed = KeyPair::from_seed(&[8; 32]).seed_base64();
            jail.create_file(
                "kernel.toml",
                &format!("key_seed = \"{seed}\"\ntls_dir = \"/from/file\"\n"),
            )?;
            jail.set_env("TALLY_KERNEL_SERVER_IDENTITY", "from-env");
            let file = Some(Path::new("kernel.toml"));
            let config = KernelNodeConfig::load(file).map_err(|e| e.to_string())?;
            assert_eq!(config.tls_dir, PathBuf::from("/from/file"));
            assert_eq!(config.server_identity, "from-env");
            assert!(!config.insecure);
            let flags = ServeFlags {
                tls_dir: Some(PathBuf::from("/from/flag")),
                server_identity: Some("from-flag".to_owned()),
                insecure: true,
                region: Some("eu-west".to_owned()),
            };
            let config = KernelNodeConfig::load_with(file, &flags).map_err(|e| e.to_string())?;
            assert_eq!(config.tls_dir, PathBuf::from("/from/flag"));
            assert_eq!(config.server_identity, "from-flag");
            assert!(config.insecure);
            assert_eq!(config.region.as_deref(), Some("eu-west"));
            let plaintext = KernelNodeConfig {
                cluster_insecure: true,
                ..config
            };
            assert_eq!(
                plaintext
                    .client()
                    .map_err(|e| e.to_string())?
                    .region
                    .as_deref(),
                Some("eu-west"),
                "the cluster client prefers the kernel's region"
            );
            let bad = ServeFlags {
                region: Some("eu west".to_owned()),
                ..flags
            };
            let refused = KernelNodeConfig::load_with(file, &bad).expect_err("bad region");
            assert!(refused.to_string().contains("region must be"), "{refused}");
            Ok(())
        });
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_readable_by_others_fails_validation() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("kernel.key");
        crate::key_file::write_key_file(&path, &KeyPair::from_seed(&[6; 32])).expect("write");
        let config = KernelNodeConfig {
            key_file: Some(path.clone()),
            ..KernelNodeConfig::default()
        };
        assert!(config.validate().is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let error = config.validate().expect_err("0644 key");
        assert!(
            matches!(
                error,
                ConfigError::KeyFile(KeyFileError::Exposed { mode: 0o644, .. })
            ),
            "{error}"
        );
        assert!(error.to_string().contains("chmod 600"), "{error}");
    }
}
