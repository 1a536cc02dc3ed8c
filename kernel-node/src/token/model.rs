//! The token's data: a signed body naming issuer, subject, validity window and grants, plus
//! (for a delegated token) the whole parent token, so a chain verifies with no lookups.

use serde::{Deserialize, Serialize};
use tally_ledger::{CapabilityId, FamilyId, GrantLimits};

use crate::keys::{PublicKey, Signature};
use crate::money::Money;

/// A grant's server or tool that matches any name; only a parent may hold it for a child to
/// narrow to a concrete name.
pub const WILDCARD: &str = "*";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityToken {
    pub body: TokenBody,
    /// ed25519 by `body.issuer` over the canonical encoding of `body`.
    pub signature: Signature,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBody {
    pub id: CapabilityId,
    pub issuer: PublicKey,
    pub subject: PublicKey,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
    pub grants: Vec<Grant>,
    /// The token this one was delegated from; its subject is this token's issuer.
    pub parent: Option<Box<CapabilityToken>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub server: String,
    pub tool: String,
    pub max_invocations: Option<u32>,
    pub max_cost_per_invocation: Option<Money>,
    pub max_total_cost: Option<Money>,
    /// In a delegated token: the parent grant this one narrows. `None` in a root token.
    pub parent_grant_index: Option<u32>,
}

impl Grant {
    /// Access to one tool with no limits.
    pub fn tool(server: &str, tool: &str) -> Self {
        Self {
            server: server.to_owned(),
            tool: tool.to_owned(),
            max_invocations: None,
            max_cost_per_invocation: None,
            max_total_cost: None,
            parent_grant_index: None,
        }
    }

    /// The seed's `make_monetary_grant(server, tool, per_call, total, currency)`.
    pub fn monetary(server: &str, tool: &str, per_call: u64, total: u64, currency: &str) -> Self {
        Self::tool(server, tool)
            .with_max_cost_per_invocation(Money::new(per_call, currency))
            .with_max_total_cost(Money::new(total, currency))
    }

    pub fn with_max_invocations(mut self, max: u32) -> Self {
        self.max_invocations = Some(max);
        self
    }

    pub fn with_max_cost_per_invocation(mut self, max: Money) -> Self {
        self.max_cost_per_invocation = Some(max);
        self
    }

    pub fn with_max_total_cost(mut self, max: Money) -> Self {
        self.max_total_cost = Some(max);
        self
    }

    /// Marks this grant as narrowing grant `index` of the parent token.
    pub fn narrowing(mut self, index: u32) -> Self {
        self.parent_grant_index = Some(index);
        self
    }

    pub fn matches(&self, server: &str, tool: &str) -> bool {
        (self.server == WILDCARD || self.server == server)
            && (self.tool == WILDCARD || self.tool == tool)
    }

    /// The grant's one currency (structure checks make both cost limits agree).
    pub fn currency(&self) -> Option<&str> {
        self.max_cost_per_invocation
            .as_ref()
            .or(self.max_total_cost.as_ref())
            .map(|m| m.currency.as_str())
    }

    /// The ledger's view of this grant: the limits its account is pinned to.
    pub fn limits(&self) -> GrantLimits {
        GrantLimits {
            max_invocations: self.max_invocations,
            max_cost_per_invocation_units: self.max_cost_per_invocation.as_ref().map(|m| m.units),
            max_total_cost_units: self.max_total_cost.as_ref().map(|m| m.units),
            currency: self.currency().map(Into::into),
        }
    }
}

impl CapabilityToken {
    pub fn id(&self) -> &CapabilityId {
        &self.body.id
    }

    /// The family every hold of this chain lives in (docs/spec.md §8): the root token's id,
    /// namespaced by the root issuer's key (see [`super::family_id`]).
    pub fn family_id(&self) -> FamilyId {
        let root = &self.root().body;
        super::family::family_id(&root.issuer, &root.id)
    }

    pub fn root(&self) -> &CapabilityToken {
        let mut token = self;
        while let Some(parent) = &token.body.parent {
            token = parent;
        }
        token
    }

    /// Tokens in the chain, root included.
    pub fn depth(&self) -> usize {
        self.chain().len()
    }

    /// The chain from the root down to this token.
    pub fn chain(&self) -> Vec<&CapabilityToken> {
        let mut chain = vec![self];
        let mut token = self;
        while let Some(parent) = &token.body.parent {
            chain.push(parent);
            token = parent;
        }
        chain.reverse();
        chain
    }
}
