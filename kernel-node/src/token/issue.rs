//! Minting tokens: root tokens by a trusted issuer, delegated tokens by a token's subject.
//! Both check what `verify` would, so a kernel never hands out a token it would refuse.

use rand::RngCore as _;
use tally_ledger::CapabilityId;

use super::attenuation::check_narrows;
use super::error::TokenError;
use super::model::{CapabilityToken, Grant, TokenBody};
use super::structure::{check_body, check_id};
use super::{MAX_CHAIN_DEPTH, TOKEN_SIGNING_DOMAIN};
use crate::keys::{KeyPair, PublicKey};

impl CapabilityToken {
    /// A root token with a fresh random id, valid from `issued_at_ms` to `expires_at_ms`.
    pub fn issue(
        issuer: &KeyPair,
        subject: PublicKey,
        grants: Vec<Grant>,
        issued_at_ms: u64,
        expires_at_ms: u64,
    ) -> Result<Self, TokenError> {
        Self::issue_with_id(
            issuer,
            fresh_id(),
            subject,
            grants,
            issued_at_ms,
            expires_at_ms,
        )
    }

    pub fn issue_with_id(
        issuer: &KeyPair,
        id: CapabilityId,
        subject: PublicKey,
        grants: Vec<Grant>,
        issued_at_ms: u64,
        expires_at_ms: u64,
    ) -> Result<Self, TokenError> {
        let body = TokenBody {
            id,
            issuer: issuer.public_key(),
            subject,
            issued_at_ms,
            expires_at_ms,
            grants,
            parent: None,
        };
        check_body(&body)?;
        let token = Self::sign_body(body, issuer)?;
        token.to_bytes()?;
        Ok(token)
    }

    /// A child of `self`, signed by `holder` (who must be `self`'s subject), whose grants each
    /// name the parent grant they narrow.
    pub fn delegate(
        &self,
        holder: &KeyPair,
        subject: PublicKey,
        grants: Vec<Grant>,
        issued_at_ms: u64,
        expires_at_ms: u64,
    ) -> Result<Self, TokenError> {
        if holder.public_key() != self.body.subject {
            return Err(TokenError::BrokenChain {
                id: self.body.id.to_string(),
                detail: "only the token's subject may delegate it".into(),
            });
        }
        let depth = self.depth() + 1;
        if depth > MAX_CHAIN_DEPTH {
            return Err(TokenError::TooDeep {
                depth,
                max: MAX_CHAIN_DEPTH,
            });
        }
        let body = TokenBody {
            id: fresh_id(),
            issuer: holder.public_key(),
            subject,
            issued_at_ms,
            expires_at_ms,
            grants,
            parent: Some(Box::new(self.clone())),
        };
        check_body(&body)?;
        check_narrows(&body, &self.body)?;
        let token = Self::sign_body(body, holder)?;
        token.to_bytes()?;
        Ok(token)
    }

    /// Signs `body` as is, with no checks: `verify` is what decides. Tools and tests use it to
    /// build tokens that `issue`/`delegate` would refuse.
    pub fn sign_body(body: TokenBody, issuer: &KeyPair) -> Result<Self, TokenError> {
        check_id(body.id.as_str())?;
        let signature = issuer.sign(TOKEN_SIGNING_DOMAIN, &body.signing_bytes()?);
        Ok(Self { body, signature })
    }
}

impl TokenBody {
    /// The canonical encoding the signature covers: msgpack of the body (structs as arrays,
    /// smallest integer forms), which is a pure function of the body's value.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, TokenError> {
        rmp_serde::to_vec(self).map_err(|e| TokenError::malformed(format!("encode: {e}")))
    }
}

/// `cap-` and 128 random bits in hex: unguessable, and safe inside hold ids.
fn fresh_id() -> CapabilityId {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    CapabilityId::new(format!("cap-{hex}"))
}
