//! Who may call what on the client port (docs/architecture.md "Security"). Every request is
//! checked here before its service reads it: the client's certificate (verified against the
//! cluster's CA by rustls at the handshake) names a role, and the role decides the methods:
//!
//! | caller | may call |
//! |---|---|
//! | `kernel` | Budget commands, `ResolveEvent`, `Batch` and reads, within its namespaces |
//! | `reader` | Budget reads; `Admin.Status` and `Admin.StateDigest` |
//! | `operator` | every Admin method; `Admin.Status`, `Admin.StateDigest` |
//! | any client role | `Budget.Members` (the members and their regions) |
//! | a node | `Admin.ClockProbe` (peers compare clocks) |
//! | any certificate of the CA | health, reflection |
//!
//! No certificate answers UNAUTHENTICATED, a role that does not allow the method answers
//! PERMISSION_DENIED; both are definite (`tally-outcome: definite`) and nothing is proposed.
//! A kernel's namespaces are checked per command by the Budget service, which knows the
//! families ([`Caller`] rides in the request's extensions). Admin calls that change anything
//! are written to the audit log (target `tally::audit`): who, what, from where, when.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::identity_cache::IdentityCache;
use super::{take_ready, HttpFuture};
use tally_api::pb::ErrorDetail;
use tally_ledger::FamilyId;
use tally_tls::identity::{CertIdentity, Namespace, Role};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

/// The checked caller of a request, for the services' own checks (a kernel's namespaces).
#[derive(Clone, Debug)]
pub enum Caller {
    /// The node runs `--insecure`: nobody is checked.
    Unchecked,
    Node(u64),
    Client {
        name: String,
        role: Role,
        namespaces: Arc<[Namespace]>,
    },
}

impl Caller {
    fn describe(&self) -> String {
        match self {
            Caller::Unchecked => "an unchecked caller (--insecure)".to_owned(),
            Caller::Node(id) => format!("node {id}"),
            Caller::Client { name, role, .. } => format!("{role} {name:?}"),
        }
    }

    /// The caller of `request`, as [`Access`] stored it.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Status::from(ErrorDetail::unauthenticated("no checked caller")))
    }

    /// Whether `family` lies in the caller's namespaces (every family, for any caller but a
    /// namespace-bound kernel).
    pub fn covers(&self, family: &FamilyId) -> bool {
        match self {
            Caller::Client {
                role: Role::Kernel,
                namespaces,
                ..
            } => namespaces.iter().any(|ns| ns.covers(family.as_str())),
            _ => true,
        }
    }

    /// Refuses, definite, unless every family lies in the caller's namespaces.
    pub fn may_touch<'a>(
        &self,
        families: impl IntoIterator<Item = &'a FamilyId>,
    ) -> Result<(), Status> {
        let Some(outside) = families.into_iter().find(|family| !self.covers(family)) else {
            return Ok(());
        };
        let namespaces = match self {
            Caller::Client { namespaces, .. } => namespaces
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        };
        Err(Status::from(ErrorDetail::permission_denied(format!(
            "{} may not touch family {:?}: outside its namespaces ({namespaces})",
            self.describe(),
            outside.as_str(),
        ))))
    }
}

/// What a method is, for the table above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    BudgetWrite,
    BudgetRead,
    AdminRead,
    AdminChange,
    ClockProbe,
    /// Who the members are and where: any client may ask, to find its region's nodes.
    Directory,
    Open,
}

const BUDGET: &str = "tally.v1.Budget";
const ADMIN: &str = "tally.v1.Admin";
const BUDGET_READS: [&str; 6] = [
    "GetUsage",
    "ListUsages",
    "ListEvents",
    "GetEvent",
    "GetHold",
    "ListHolds",
];

/// The kind of the method at `path` (`/package.Service/Method`); unknown paths of the Budget
/// and Admin services count as writes and changes, so a new method is closed until listed.
fn kind(path: &str) -> Kind {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let service = parts.next().unwrap_or("");
    let method = parts.next().unwrap_or("");
    match service {
        BUDGET if BUDGET_READS.contains(&method) => Kind::BudgetRead,
        BUDGET if method == "Members" => Kind::Directory,
        BUDGET => Kind::BudgetWrite,
        ADMIN => match method {
            "Status" | "StateDigest" | "ListAlarms" => Kind::AdminRead,
            "ClockProbe" => Kind::ClockProbe,
            _ => Kind::AdminChange,
        },
        _ => Kind::Open,
    }
}

fn allowed(kind: Kind, caller: &Caller) -> bool {
    let role = match caller {
        Caller::Unchecked => return true,
        Caller::Node(_) => return matches!(kind, Kind::ClockProbe | Kind::Open),
        Caller::Client { role, .. } => *role,
    };
    match kind {
        Kind::BudgetWrite => role == Role::Kernel,
        Kind::BudgetRead => matches!(role, Role::Kernel | Role::Reader),
        Kind::AdminRead => matches!(role, Role::Operator | Role::Reader),
        Kind::AdminChange | Kind::ClockProbe => role == Role::Operator,
        Kind::Directory | Kind::Open => true,
    }
}

/// The caller of a request from its connection's certificate, parsed once per certificate
/// (`identities`); what the caller may do is decided afresh for every request.
fn authenticate(
    request: &http::Request<Body>,
    identities: &IdentityCache,
) -> Result<Caller, Status> {
    let certs = request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.peer_certs());
    let Some(der) = certs.as_ref().and_then(|certs| certs.first()) else {
        return Err(Status::from(ErrorDetail::unauthenticated(
            "this cluster requires a client certificate of its CA (mutual TLS); \
             `tally-node certs client` issues one",
        )));
    };
    match identities.identity(der.as_ref()) {
        Ok(CertIdentity::Node { id }) => Ok(Caller::Node(id)),
        Ok(CertIdentity::Client {
            name,
            role,
            namespaces,
        }) => Ok(Caller::Client {
            name,
            role,
            namespaces: namespaces.into(),
        }),
        Err(error) => Err(Status::from(ErrorDetail::unauthenticated(
            error.to_string(),
        ))),
    }
}

/// The client port's gate, shared by the services behind it.
pub struct AccessPolicy {
    /// False when the node runs `--insecure`.
    enforced: bool,
    /// The identities of the client port's certificates, parsed once each.
    identities: IdentityCache,
}

impl AccessPolicy {
    pub fn new(enforced: bool) -> Arc<Self> {
        Arc::new(Self {
            enforced,
            identities: IdentityCache::default(),
        })
    }

    fn check(&self, request: &http::Request<Body>) -> Result<Caller, Status> {
        let caller = if self.enforced {
            authenticate(request, &self.identities)?
        } else {
            Caller::Unchecked
        };
        let path = request.uri().path();
        let kind = kind(path);
        if !allowed(kind, &caller) {
            tracing::warn!(caller = %caller.describe(), method = path, "call refused");
            return Err(Status::from(ErrorDetail::permission_denied(format!(
                "{} may not call {path}",
                caller.describe()
            ))));
        }
        if kind == Kind::AdminChange {
            let from = request
                .extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
                .or_else(|| {
                    request
                        .extensions()
                        .get::<TcpConnectInfo>()
                        .and_then(TcpConnectInfo::remote_addr)
                });
            tracing::info!(
                target: "tally::audit",
                caller = %caller.describe(),
                method = path,
                from = ?from,
                at_ms = crate::node::clock::wall_clock_ms(),
                "admin call"
            );
        }
        Ok(caller)
    }
}

/// A service behind the client port's gate.
#[derive(Clone)]
pub struct Access<S> {
    inner: S,
    policy: Arc<AccessPolicy>,
}

impl<S> Access<S> {
    pub fn new(inner: S, policy: Arc<AccessPolicy>) -> Self {
        Self { inner, policy }
    }
}

impl<S: NamedService> NamedService for Access<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Access<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = HttpFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        match self.policy.check(&request) {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                let mut ready = take_ready(&mut self.inner);
                Box::pin(async move { ready.call(request).await })
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(role: Role) -> Caller {
        Caller::Client {
            name: "c".to_owned(),
            role,
            namespaces: vec![Namespace::Issuer("ab".to_owned())].into(),
        }
    }

    #[test]
    fn each_role_reaches_its_methods_only() {
        let cases = [
            (
                "/tally.v1.Budget/AuthorizeHold",
                [true, false, false, false],
            ),
            ("/tally.v1.Budget/Batch", [true, false, false, false]),
            ("/tally.v1.Budget/ResolveEvent", [true, false, false, false]),
            ("/tally.v1.Budget/ListHolds", [true, true, false, false]),
            ("/tally.v1.Budget/Members", [true, true, true, false]),
            ("/tally.v1.Admin/Status", [false, true, true, false]),
            ("/tally.v1.Admin/SetParams", [false, false, true, false]),
            ("/tally.v1.Admin/ListAlarms", [false, true, true, false]),
            ("/tally.v1.Admin/ClearAlarm", [false, false, true, false]),
            (
                "/tally.v1.Admin/ChangeMembership",
                [false, false, true, false],
            ),
            ("/tally.v1.Admin/ClockProbe", [false, false, true, true]),
            ("/tally.v1.Admin/SomethingNew", [false, false, true, false]),
            ("/grpc.health.v1.Health/Check", [true, true, true, true]),
        ];
        for (path, expected) in cases {
            let got = [
                allowed(kind(path), &client(Role::Kernel)),
                allowed(kind(path), &client(Role::Reader)),
                allowed(kind(path), &client(Role::Operator)),
                allowed(kind(path), &Caller::Node(1)),
            ];
            assert_eq!(got, expected, "{path}: kernel, reader, operator, node");
        }
    }

    #[test]
    fn a_kernel_touches_its_namespaces_only() {
        let kernel = client(Role::Kernel);
        assert!(kernel.may_touch([&FamilyId::from("ab:t1")]).is_ok());
        let refused = kernel
            .may_touch([&FamilyId::from("ab:t1"), &FamilyId::from("cd:t1")])
            .expect_err("outside");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(refused.message().contains("\"cd:t1\""), "{refused:?}");
        assert!(!kernel.covers(&FamilyId::from("cd:t1")));
        assert!(client(Role::Reader).covers(&FamilyId::from("cd:t1")));
    }
}
