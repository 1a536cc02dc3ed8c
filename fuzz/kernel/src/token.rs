//! Capability tokens (kernel-node/src/token/): the strict binary decoder
//! `CapabilityToken::from_bytes`, the text form `from_text` (what arrives in a `ToolCall`'s
//! `capability_token` and in HTTP headers), and `token::verify`.
//!
//! Input: a selector byte, then the token:
//! - `0`: binary; `1`: text;
//! - `2`: any msgpack token, re-signed: each link's issuer and subject are replaced by one of
//!   four known keys (chosen by the key's first byte, so equal keys stay equal and chain
//!   links survive) and each link is signed by its issuer, root first. Signatures then hold,
//!   and verification gets past them to the chain, window and narrowing rules, which is where
//!   its logic is.
//!
//! Asserts: a decoded token is its own canonical encoding (`to_bytes` gives back the input),
//! its text form round-trips, and chain accessors agree; `verify` never panics, refuses an
//! untrusted root, and whenever it accepts:
//! - the chain is at most `MAX_CHAIN_DEPTH` long with distinct ids, the window contains `now`,
//!   and `expires_at_ms` is the earliest expiry in the chain;
//! - every grant of the presented token lies within every ancestor grant it descends from
//!   (invocations, per-call and total cost, currency): delegation never widens;
//! - the ledger command the kernel builds from it (`AuthorizeHold` with the grant's limits and
//!   its ancestor accounts) passes the ledger's own `validate`: a token the kernel accepts is
//!   never one the authority refuses as malformed.

use tally_kernel::token::{verify, MAX_CHAIN_DEPTH};
use tally_kernel::{CapabilityToken, TrustList, VerifiedCapability};
use tally_ledger::{AccountKey, ClientCommand, CommandHeader, GrantLimits, Operation};

use crate::fixtures;
use tally_fuzz_common::seeds::selected;

pub fn run(data: &[u8]) {
    fixtures::with_decode_stack(data, run_here);
}

fn run_here(data: &[u8]) {
    let Some((selector, rest)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    match selector % 3 {
        0 => binary(rest),
        1 => text(rest),
        _ => resigned(rest),
    }
}

fn binary(data: &[u8]) {
    let Ok(token) = CapabilityToken::from_bytes(data) else {
        return;
    };
    let bytes = token.to_bytes().expect("a decoded token encodes");
    assert_eq!(bytes, data, "from_bytes accepted a non-canonical encoding");
    let text = token.to_text().expect("encodes as text");
    assert_eq!(
        CapabilityToken::from_text(&text).as_ref(),
        Ok(&token),
        "text round trip"
    );
    check(&token);
}

fn text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(token) = CapabilityToken::from_text(text) else {
        return;
    };
    let bytes = token.to_bytes().expect("a decoded token encodes");
    assert_eq!(CapabilityToken::from_bytes(&bytes).as_ref(), Ok(&token));
    let again = token.to_text().expect("encodes as text");
    assert_eq!(CapabilityToken::from_text(&again).as_ref(), Ok(&token));
    check(&token);
}

fn resigned(data: &[u8]) {
    let Ok(token) = rmp_serde::from_slice::<CapabilityToken>(data) else {
        return;
    };
    // Re-signing a chain far past the limit only costs time: verification refuses it by
    // depth before looking at signatures, which the other modes cover.
    if token.depth() > MAX_CHAIN_DEPTH + 2 {
        return;
    }
    let Some(token) = fixtures::resign(&token) else {
        return;
    };
    check(&token);
}

/// Accessors, then verification at a few instants with the root issuer trusted.
fn check(token: &CapabilityToken) {
    let chain = token.chain();
    assert_eq!(chain.len(), token.depth());
    assert_eq!(chain[0], token.root());
    assert_eq!(*chain.last().expect("non-empty"), token);
    let _ = token.family_id();
    let root = token.root();
    let trust = TrustList::new([root.body.issuer]);
    let latest_issue = chain.iter().map(|t| t.body.issued_at_ms).max().unwrap_or(0);
    for now in [token.body.issued_at_ms, latest_issue] {
        assert!(
            verify(token, &TrustList::default(), now, None).is_err(),
            "a token verified with no trusted issuer"
        );
        if let Ok(verified) = verify(token, &trust, now, None) {
            verified_invariants(token, &verified, now);
            let subject = token.body.subject;
            assert!(verify(token, &trust, now, Some(&subject.as_bytes()[..])).is_ok());
            let mut other = *subject.as_bytes();
            other[0] ^= 1;
            assert!(
                verify(token, &trust, now, Some(&other)).is_err(),
                "verified for a subject it does not name"
            );
        }
    }
}

fn verified_invariants(token: &CapabilityToken, verified: &VerifiedCapability, now: u64) {
    let chain = token.chain();
    assert_eq!(verified.token(), token);
    assert_eq!(verified.depth(), chain.len());
    assert!(
        verified.depth() <= MAX_CHAIN_DEPTH,
        "verified a chain too deep"
    );
    assert_eq!(verified.capability_id(), token.id());
    assert_eq!(verified.subject(), token.body.subject);
    assert_eq!(verified.family_id(), &token.family_id());
    let earliest = chain
        .iter()
        .map(|t| t.body.expires_at_ms)
        .min()
        .expect("non-empty");
    assert_eq!(verified.expires_at_ms(), earliest);
    assert!(now < earliest, "verified an expired chain at {now}");
    let mut ids: Vec<_> = chain.iter().map(|t| t.body.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), chain.len(), "a verified chain repeats an id");
    for (index, grant) in (0u32..).zip(verified.grants()) {
        assert_eq!(
            verified.account(index),
            Some(AccountKey::new(token.id().clone(), index))
        );
        let limits = verified.grant_limits(index).expect("the grant exists");
        assert_eq!(limits, grant.limits());
        let ancestors = verified
            .ancestor_accounts(index)
            .expect("every grant of a verified token has its ancestors");
        assert_eq!(
            ancestors.len(),
            chain.len() - 1,
            "one ancestor account per parent"
        );
        for ancestor in &ancestors {
            within(&limits, &ancestor.limits, token);
        }
        for exposure in [0, 1] {
            if exposure > 0 && limits.currency.is_none() {
                continue;
            }
            let command = ClientCommand {
                header: CommandHeader {
                    family_id: verified.family_id().clone(),
                    capability_id: token.id().clone(),
                    grant_index: index,
                    event_id: "budget-authorize:req-1".into(),
                    not_after_ms: now + 60_000,
                },
                op: Operation::AuthorizeHold {
                    hold_id: format!("budget-hold:req-1:{}:{index}", token.id()).into(),
                    requested_exposure_units: exposure,
                    limits: limits.clone(),
                    ancestors: ancestors.clone(),
                    hold_timeout_ms: Some(30_000),
                },
            };
            if let Err(error) = command.validate() {
                panic!(
                    "the kernel accepted grant {index} of token {} but the ledger refuses its \
                     hold: {error}\n{command:?}",
                    token.id()
                );
            }
        }
    }
}

/// `child` stays inside `ancestor` on every limit the ancestor sets.
fn within(child: &GrantLimits, ancestor: &GrantLimits, token: &CapabilityToken) {
    let id = token.id();
    if let Some(max) = ancestor.max_invocations {
        assert!(
            child.max_invocations.is_some_and(|c| c <= max),
            "token {id}: invocations {:?} exceed an ancestor's {max}",
            child.max_invocations
        );
    }
    if let Some(max) = ancestor.max_cost_per_invocation_units {
        assert!(
            child
                .max_cost_per_invocation_units
                .is_some_and(|c| c <= max),
            "token {id}: per-call cost {:?} exceeds an ancestor's {max}",
            child.max_cost_per_invocation_units
        );
    }
    if let Some(max) = ancestor.max_total_cost_units {
        assert!(
            child.max_total_cost_units.is_some_and(|c| c <= max),
            "token {id}: total cost {:?} exceeds an ancestor's {max}",
            child.max_total_cost_units
        );
    }
    if let (Some(mine), Some(theirs)) = (&child.currency, &ancestor.currency) {
        assert_eq!(
            mine, theirs,
            "token {id}: currency differs from an ancestor's"
        );
    }
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for (name, token) in fixtures::tokens() {
        let bytes = token.to_bytes().expect("encodes");
        seeds.push((format!("{name}-binary"), selected(0, &bytes)));
        seeds.push((
            format!("{name}-text"),
            selected(1, token.to_text().expect("text").as_bytes()),
        ));
        seeds.push((format!("{name}-resign"), selected(2, &bytes)));
    }
    seeds
}
