//! Who may call a service behind a kernel-side port, checked on every request before the
//! service reads it. The caller's certificate was verified against the CA by rustls at the
//! handshake (client certificates are optional there, so a caller without one gets a status
//! instead of a reset); here its role is read and compared:
//!
//! | port | service | may call |
//! |---|---|---|
//! | kernel node | `tally.kernel.v1.Kernel` | `agent` |
//! | kernel node | `grpc.health.v1.Health` | any certificate of the CA |
//! | rail | `tally.rail.v1.PaymentRail` | `kernel` |
//!
//! Tool callers get a role of their own, `agent`, rather than `kernel` or `operator`: the
//! certificate handed to every tool-calling process then grants nothing on the cluster but
//! health, where a `kernel` certificate would write budgets and an `operator` one change the
//! cluster. The rail takes the kernels' own cluster certificate, since only kernel nodes pay.
//!
//! No certificate (or one naming no Tally identity) answers UNAUTHENTICATED, another role
//! PERMISSION_DENIED; both are definite (`tally-outcome: definite`), as on the cluster's
//! ports: nothing was read, held or paid, and the call may go elsewhere once fixed.

use tally_api::pb::ErrorDetail;
use tally_tls::identity::{self, CertIdentity, Role};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// An interceptor that admits callers of one role (or any certificate of the CA).
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    /// What the refusals call the service.
    service: &'static str,
    check: Check,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// The port is insecure: nobody is checked.
    Nobody,
    /// Any certificate of the CA.
    AnyCertificate,
    Role(Role),
}

impl Gate {
    /// Callers of `role` only; everyone when `enforced` is false (an insecure port).
    pub fn role(service: &'static str, role: Role, enforced: bool) -> Self {
        Self {
            service,
            check: if enforced {
                Check::Role(role)
            } else {
                Check::Nobody
            },
        }
    }

    /// Any caller with a certificate of the CA (health checks); everyone when `enforced` is
    /// false.
    pub fn any_certificate(service: &'static str, enforced: bool) -> Self {
        Self {
            service,
            check: if enforced {
                Check::AnyCertificate
            } else {
                Check::Nobody
            },
        }
    }

    fn admit(&self, request: &Request<()>) -> Result<(), Status> {
        let required = match self.check {
            Check::Nobody => return Ok(()),
            Check::AnyCertificate => None,
            Check::Role(role) => Some(role),
        };
        let wanted = required.map_or("any role", Role::as_str);
        let certs = request.peer_certs();
        let Some(der) = certs.as_ref().and_then(|certs| certs.first()) else {
            return Err(Status::from(ErrorDetail::unauthenticated(format!(
                "{} requires a client certificate of its CA (mutual TLS) with role {wanted}; \
                 `tally-node dev` writes one to ./tally-data/tls, `tally-node certs client \
                 --role {wanted}` issues one",
                self.service
            ))));
        };
        let identity = identity::parse(der.as_ref()).map_err(|error| {
            Status::from(ErrorDetail::unauthenticated(format!(
                "{}: {error}",
                self.service
            )))
        })?;
        let Some(required) = required else {
            return Ok(());
        };
        match identity {
            CertIdentity::Client { role, .. } if role == required => Ok(()),
            other => {
                tracing::warn!(
                    caller = %other.describe(),
                    service = self.service,
                    "call refused"
                );
                Err(Status::from(ErrorDetail::permission_denied(format!(
                    "{} may not call {}: only {required} certificates may",
                    other.describe(),
                    self.service
                ))))
            }
        }
    }
}

impl Interceptor for Gate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.admit(&request)?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_insecure_port_checks_nobody_and_a_secure_one_wants_a_certificate() {
        let request = Request::new(());
        assert!(Gate::role("svc", Role::Agent, false)
            .admit(&request)
            .is_ok());
        assert!(Gate::any_certificate("svc", false).admit(&request).is_ok());
        for gate in [
            Gate::role("svc", Role::Agent, true),
            Gate::any_certificate("svc", true),
        ] {
            let refused = gate.admit(&request).expect_err("no certificate");
            assert_eq!(refused.code(), tonic::Code::Unauthenticated);
            assert_eq!(
                tally_api::status::Definiteness::from_metadata(refused.metadata()),
                Some(tally_api::status::Definiteness::Definite)
            );
        }
    }
}
