//! Verification of a presented token: every signature in the chain, a trusted root issuer,
//! linked issuers and subjects, every token's validity window, and narrowing at every link.
//! What comes out ([`VerifiedCapability`]) is all the pipeline needs to name accounts and
//! limits in ledger commands.

use std::collections::BTreeSet;

use tally_ledger::{AccountKey, AncestorAccount, CapabilityId, FamilyId, GrantLimits};

use super::attenuation::check_narrows;
use super::error::TokenError;
use super::model::{CapabilityToken, Grant};
use super::structure::check_body;
use super::{MAX_CHAIN_DEPTH, MAX_CLOCK_SKEW_MS, TOKEN_SIGNING_DOMAIN};
use crate::keys::PublicKey;

/// Root issuers this kernel accepts (its own key, and any authority it delegates to).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustList {
    keys: BTreeSet<PublicKey>,
}

impl TrustList {
    pub fn new(keys: impl IntoIterator<Item = PublicKey>) -> Self {
        Self {
            keys: keys.into_iter().collect(),
        }
    }

    pub fn trust(&mut self, key: PublicKey) {
        self.keys.insert(key);
    }

    pub fn contains(&self, key: &PublicKey) -> bool {
        self.keys.contains(key)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// One verified link of the chain: what ancestors' accounts are built from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Link {
    id: CapabilityId,
    grants: Vec<Grant>,
}

/// A token that passed [`verify`], with its chain flattened for account lookups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedCapability {
    token: CapabilityToken,
    family_id: FamilyId,
    /// Root first, the presented token last.
    chain: Vec<Link>,
    expires_at_ms: u64,
}

/// Verifies `token` at `now_ms`. With `expected_subject`, the presented (leaf) token must be
/// held by that key: the caller has proved possession of it.
pub fn verify(
    token: &CapabilityToken,
    trust: &TrustList,
    now_ms: u64,
    expected_subject: Option<&[u8]>,
) -> Result<VerifiedCapability, TokenError> {
    let chain = bounded_chain(token)?;
    for link in &chain {
        check_body(&link.body)?;
    }
    for link in &chain {
        link.body
            .issuer
            .verify(
                TOKEN_SIGNING_DOMAIN,
                &link.body.signing_bytes()?,
                &link.signature,
            )
            .map_err(|_| TokenError::BadSignature {
                id: link.body.id.to_string(),
            })?;
    }
    let root = chain[0];
    if !trust.contains(&root.body.issuer) {
        return Err(TokenError::UnknownIssuer {
            issuer: root.body.issuer,
        });
    }
    check_links(&chain)?;
    for link in &chain {
        check_window(link, now_ms)?;
    }
    for pair in chain.windows(2) {
        check_narrows(&pair[1].body, &pair[0].body)?;
    }
    if let Some(expected) = expected_subject {
        if token.body.subject.as_bytes().as_slice() != expected {
            return Err(TokenError::WrongSubject {
                id: token.body.id.to_string(),
            });
        }
    }
    Ok(VerifiedCapability {
        family_id: super::family::family_id(&root.body.issuer, &root.body.id),
        expires_at_ms: chain
            .iter()
            .map(|t| t.body.expires_at_ms)
            .min()
            .unwrap_or(token.body.expires_at_ms),
        chain: chain
            .iter()
            .map(|t| Link {
                id: t.body.id.clone(),
                grants: t.body.grants.clone(),
            })
            .collect(),
        token: token.clone(),
    })
}

/// Root first; refuses a chain over [`MAX_CHAIN_DEPTH`] before looking at anything else.
fn bounded_chain(token: &CapabilityToken) -> Result<Vec<&CapabilityToken>, TokenError> {
    let mut chain = vec![token];
    let mut current = token;
    while let Some(parent) = &current.body.parent {
        chain.push(parent);
        if chain.len() > MAX_CHAIN_DEPTH {
            return Err(TokenError::TooDeep {
                depth: token.depth(),
                max: MAX_CHAIN_DEPTH,
            });
        }
        current = parent;
    }
    chain.reverse();
    Ok(chain)
}

/// Each child is issued by its parent's subject, and no id repeats (ancestor accounts must be
/// distinct for the ledger).
fn check_links(chain: &[&CapabilityToken]) -> Result<(), TokenError> {
    let mut seen = BTreeSet::new();
    for token in chain {
        if !seen.insert(token.body.id.as_str()) {
            return Err(TokenError::BrokenChain {
                id: token.body.id.to_string(),
                detail: "token id repeats in its own chain".into(),
            });
        }
    }
    for pair in chain.windows(2) {
        if pair[1].body.issuer != pair[0].body.subject {
            return Err(TokenError::BrokenChain {
                id: pair[1].body.id.to_string(),
                detail: format!(
                    "issued by {}, but its parent {} is held by {}",
                    pair[1].body.issuer, pair[0].body.id, pair[0].body.subject
                ),
            });
        }
    }
    Ok(())
}

fn check_window(token: &CapabilityToken, now_ms: u64) -> Result<(), TokenError> {
    let body = &token.body;
    if now_ms >= body.expires_at_ms {
        return Err(TokenError::Expired {
            id: body.id.to_string(),
            expires_at_ms: body.expires_at_ms,
            now_ms,
        });
    }
    if body.issued_at_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
        return Err(TokenError::NotYetValid {
            id: body.id.to_string(),
            issued_at_ms: body.issued_at_ms,
            now_ms,
        });
    }
    Ok(())
}

impl VerifiedCapability {
    pub fn token(&self) -> &CapabilityToken {
        &self.token
    }

    /// The budget family (docs/spec.md §8): the root token's id under its issuer's namespace.
    pub fn family_id(&self) -> &FamilyId {
        &self.family_id
    }

    pub fn capability_id(&self) -> &CapabilityId {
        &self.token.body.id
    }

    pub fn subject(&self) -> PublicKey {
        self.token.body.subject
    }

    /// The earliest expiry in the chain: no hold should outlive it.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// Tokens in the chain, root included.
    pub fn depth(&self) -> usize {
        self.chain.len()
    }

    pub fn grants(&self) -> &[Grant] {
        &self.token.body.grants
    }

    pub fn grant(&self, index: u32) -> Option<&Grant> {
        self.token.body.grants.get(usize::try_from(index).ok()?)
    }

    /// Indexes of the grants that cover `server`/`tool`, in token order: the order the
    /// pipeline tries them in (docs/spec.md §9).
    pub fn matching_grants(&self, server: &str, tool: &str) -> Vec<u32> {
        (0u32..)
            .zip(self.grants())
            .filter(|(_, grant)| grant.matches(server, tool))
            .map(|(index, _)| index)
            .collect()
    }

    pub fn grant_limits(&self, index: u32) -> Option<GrantLimits> {
        self.grant(index).map(Grant::limits)
    }

    pub fn account(&self, index: u32) -> Option<AccountKey> {
        self.grant(index)
            .map(|_| AccountKey::new(self.capability_id().clone(), index))
    }

    /// The ancestor grant accounts a hold on grant `index` also reserves on (docs/spec.md §8),
    /// nearest parent first, up to the root. Empty for a root token.
    pub fn ancestor_accounts(&self, index: u32) -> Option<Vec<AncestorAccount>> {
        let mut grant = self.grant(index)?;
        let mut ancestors = Vec::with_capacity(self.chain.len().saturating_sub(1));
        for link in self.chain.iter().rev().skip(1) {
            // Verification guaranteed every delegated grant names an existing parent grant.
            let parent_index = grant.parent_grant_index?;
            grant = link.grants.get(usize::try_from(parent_index).ok()?)?;
            ancestors.push(AncestorAccount {
                account: AccountKey::new(link.id.clone(), parent_index),
                limits: grant.limits(),
            });
        }
        Some(ancestors)
    }
}
