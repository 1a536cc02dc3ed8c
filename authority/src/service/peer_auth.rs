//! Who may speak Raft to this node (docs/architecture.md "Security"): on the peer port every
//! rpc must come from a certificate of the cluster's CA that names a node (`tally:node:<id>`)
//! which is a current member, and a vote, an append or a snapshot must come from the node the
//! request claims as its candidate or leader. tonic's server takes no custom certificate
//! verifier, so the chain is checked by rustls at the handshake and the name here, on every
//! rpc, from `peer_certs()`. The certificate is parsed once ([`IdentityCache`]); the
//! membership check runs on every rpc, since membership changes.

use std::sync::Arc;

use tally_tls::identity::CertIdentity;
use tonic::{Request, Status};

use super::identity_cache::IdentityCache;
use crate::raft::types::{NodeId, Raft};

/// Checks callers of the peer port; `None` when the node runs `--insecure`.
#[derive(Clone)]
pub struct PeerAuth {
    raft: Raft,
    enforced: bool,
    /// The identities of the peer port's certificates, parsed once each.
    identities: Arc<IdentityCache>,
}

impl PeerAuth {
    pub fn new(raft: Raft, enforced: bool) -> Self {
        Self {
            raft,
            enforced,
            identities: Arc::default(),
        }
    }

    /// The calling node's id, once its certificate is checked against the membership. `None`
    /// when checks are off (`--insecure`).
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Option<NodeId>, Status> {
        if !self.enforced {
            return Ok(None);
        }
        let certs = request.peer_certs().ok_or_else(|| {
            refused(
                true,
                "the peer port requires a node certificate of the cluster's CA",
            )
        })?;
        let der = certs
            .first()
            .ok_or_else(|| refused(true, "no certificate presented"))?;
        let id = match self.identities.identity(der.as_ref()) {
            Ok(CertIdentity::Node { id }) => id,
            Ok(other) => {
                return Err(refused(
                    false,
                    &format!(
                        "{} may not call the peer port: only cluster nodes may",
                        other.describe()
                    ),
                ))
            }
            Err(error) => return Err(refused(true, &error.to_string())),
        };
        let (known, empty) = crate::raft::types::with_metrics(&self.raft, |metrics| {
            let membership = metrics.membership_config.membership();
            (
                membership.get_node(&id).is_some(),
                membership.nodes().next().is_none(),
            )
        });
        // A node that has no membership yet (a new learner before its first append) cannot
        // tell members apart; it accepts any node of the CA, which the operator issued.
        if !known && !empty {
            return Err(refused(
                false,
                &format!("node {id} is not a member of this cluster"),
            ));
        }
        Ok(Some(id))
    }

    /// Refuses a vote, append or snapshot whose claimed sender is not the caller.
    pub fn claims(caller: Option<NodeId>, claimed: NodeId, what: &str) -> Result<(), Status> {
        match caller {
            Some(id) if id != claimed => Err(refused(
                false,
                &format!("node {id}'s certificate cannot send a {what} as node {claimed}"),
            )),
            _ => Ok(()),
        }
    }
}

fn refused(unauthenticated: bool, message: &str) -> Status {
    let detail = if unauthenticated {
        tally_api::pb::ErrorDetail::unauthenticated(message)
    } else {
        tally_api::pb::ErrorDetail::permission_denied(message)
    };
    tracing::warn!(message, "peer port call refused");
    Status::from(detail)
}
