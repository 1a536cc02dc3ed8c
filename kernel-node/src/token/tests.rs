//! Token tests: each builds a real chain with real keys and checks one refusal reason.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use tally_ledger::{AccountKey, GrantLimits};

use super::*;
use crate::keys::KeyPair;
use crate::money::Money;

const NOW: u64 = 1_000_000;
const HOUR: u64 = 3_600_000;

struct World {
    authority: KeyPair,
    agent: KeyPair,
    trust: TrustList,
}

fn world() -> World {
    let authority = KeyPair::from_seed(&[1; 32]);
    World {
        trust: TrustList::new([authority.public_key()]),
        authority,
        agent: KeyPair::from_seed(&[2; 32]),
    }
}

fn root(w: &World, grants: Vec<Grant>) -> CapabilityToken {
    CapabilityToken::issue(&w.authority, w.agent.public_key(), grants, NOW, NOW + HOUR)
        .expect("issue")
}

fn monetary() -> Grant {
    Grant::monetary("cost-srv", "compute", 100, 1000, "USD").with_max_invocations(10)
}

/// A child signed as is (no narrowing check), so `verify` is what must catch it.
fn raw_child(parent: &CapabilityToken, holder: &KeyPair, grants: Vec<Grant>) -> CapabilityToken {
    let body = TokenBody {
        id: format!("child-of-{}", parent.id())
            .chars()
            .take(100)
            .collect::<String>()
            .into(),
        issuer: holder.public_key(),
        subject: KeyPair::from_seed(&[9; 32]).public_key(),
        issued_at_ms: NOW,
        expires_at_ms: NOW + HOUR,
        grants,
        parent: Some(Box::new(parent.clone())),
    };
    CapabilityToken::sign_body(body, holder).expect("sign")
}

#[test]
fn sign_verify_round_trip_through_text() {
    let w = world();
    let token = root(&w, vec![monetary()]);
    let text = token.to_text().expect("text");
    let decoded = CapabilityToken::from_text(&text).expect("decode");
    assert_eq!(decoded, token);
    let verified = verify(
        &decoded,
        &w.trust,
        NOW + 1,
        Some(w.agent.public_key().as_bytes()),
    )
    .expect("valid");
    assert_eq!(verified.capability_id(), token.id());
    assert_eq!(
        verified.family_id().as_str(),
        format!(
            "{}:{}",
            family_namespace(&w.authority.public_key()),
            token.id()
        )
    );
    assert_eq!(
        verified.grant_limits(0),
        Some(GrantLimits::monetary(
            Some(10),
            Some(100),
            Some(1000),
            "USD"
        ))
    );
    assert_eq!(verified.ancestor_accounts(0), Some(vec![]));
    assert_eq!(verified.grant_limits(1), None);
    assert_eq!(
        verified.account(0),
        Some(AccountKey::new(token.id().clone(), 0))
    );
}

#[test]
fn tampered_body_byte_is_bad_signature() {
    let w = world();
    let token = root(&w, vec![monetary()]);
    let mut bytes = token.to_bytes().expect("bytes");
    let at = bytes
        .windows(7)
        .position(|window| window == b"compute")
        .expect("tool name in encoding");
    bytes[at + 4] = b's'; // "compute" -> "compste": still decodes, no longer signed
    let tampered = CapabilityToken::from_bytes(&bytes).expect("still decodes");
    assert_eq!(tampered.body.grants[0].tool, "compste");
    assert!(matches!(
        verify(&tampered, &w.trust, NOW, None),
        Err(TokenError::BadSignature { .. })
    ));
}

#[test]
fn tampered_signature_or_parent_is_bad_signature() {
    let w = world();
    let token = root(&w, vec![monetary()]);
    let mut forged = token.clone();
    forged.signature.0[10] ^= 1;
    assert!(matches!(
        verify(&forged, &w.trust, NOW, None),
        Err(TokenError::BadSignature { .. })
    ));
    let child = token
        .delegate(
            &w.agent,
            w.agent.public_key(),
            vec![monetary().narrowing(0)],
            NOW,
            NOW + HOUR,
        )
        .expect("delegate");
    let mut forged_parent = child.clone();
    if let Some(parent) = forged_parent.body.parent.as_mut() {
        parent.body.expires_at_ms += 1;
    }
    assert!(matches!(
        verify(&forged_parent, &w.trust, NOW, None),
        Err(TokenError::BadSignature { .. })
    ));
}

#[test]
fn expired_root_or_child_is_refused() {
    let w = world();
    let token = CapabilityToken::issue(
        &w.authority,
        w.agent.public_key(),
        vec![monetary()],
        NOW,
        NOW + 10,
    )
    .expect("issue");
    let child = token
        .delegate(
            &w.agent,
            w.agent.public_key(),
            vec![monetary().narrowing(0)],
            NOW,
            NOW + HOUR,
        )
        .expect("delegate");
    assert!(verify(&child, &w.trust, NOW + 9, None).is_ok());
    let expired_root = verify(&child, &w.trust, NOW + 10, None);
    assert_eq!(
        expired_root,
        Err(TokenError::Expired {
            id: token.id().to_string(),
            expires_at_ms: NOW + 10,
            now_ms: NOW + 10
        })
    );
    let long_root = root(&w, vec![monetary()]);
    let short_child = long_root
        .delegate(
            &w.agent,
            w.agent.public_key(),
            vec![monetary().narrowing(0)],
            NOW,
            NOW + 5,
        )
        .expect("delegate");
    assert!(matches!(
        verify(&short_child, &w.trust, NOW + 6, None),
        Err(TokenError::Expired { id, .. }) if id == short_child.id().as_str()
    ));
    let future = CapabilityToken::issue(
        &w.authority,
        w.agent.public_key(),
        vec![monetary()],
        NOW + HOUR,
        NOW + 2 * HOUR,
    )
    .expect("issue");
    assert!(matches!(
        verify(&future, &w.trust, NOW, None),
        Err(TokenError::NotYetValid { .. })
    ));
}

#[test]
fn unknown_issuer_and_wrong_subject_are_refused() {
    let w = world();
    let stranger = KeyPair::from_seed(&[3; 32]);
    let token = CapabilityToken::issue(
        &stranger,
        w.agent.public_key(),
        vec![monetary()],
        NOW,
        NOW + HOUR,
    )
    .expect("issue");
    assert_eq!(
        verify(&token, &w.trust, NOW, None),
        Err(TokenError::UnknownIssuer {
            issuer: stranger.public_key()
        })
    );
    let token = root(&w, vec![monetary()]);
    assert!(matches!(
        verify(
            &token,
            &w.trust,
            NOW,
            Some(stranger.public_key().as_bytes())
        ),
        Err(TokenError::WrongSubject { .. })
    ));
}

fn widened_field(w: &World, child_grant: Grant) -> Result<VerifiedCapability, TokenError> {
    let parent = root(w, vec![Grant::tool("other", "x"), monetary()]);
    let child = raw_child(
        &parent,
        &w.agent,
        vec![Grant::tool("other", "x").narrowing(0), child_grant],
    );
    verify(&child, &w.trust, NOW, None)
}

fn assert_widened(result: Result<VerifiedCapability, TokenError>, expected: &'static str) {
    match result {
        Err(TokenError::WidenedGrant { index, field, .. }) => {
            assert_eq!((index, field), (1, expected));
        }
        other => panic!("expected WidenedGrant({expected}), got {other:?}"),
    }
}

#[test]
fn widened_child_grants_name_the_field() {
    let w = world();
    let narrower = Grant::monetary("cost-srv", "compute", 50, 500, "USD")
        .with_max_invocations(5)
        .narrowing(1);
    assert!(widened_field(&w, narrower.clone()).is_ok());
    let mut higher = narrower.clone();
    higher.max_total_cost = Some(Money::new(1001, "USD"));
    assert_widened(widened_field(&w, higher), "max_total_cost");
    let mut more_calls = narrower.clone();
    more_calls.max_invocations = Some(11);
    assert_widened(widened_field(&w, more_calls), "max_invocations");
    let mut other_tool = narrower.clone();
    other_tool.tool = "mine_bitcoin".into();
    assert_widened(widened_field(&w, other_tool), "tool");
    let mut other_server = narrower.clone();
    other_server.server = "other".into();
    assert_widened(widened_field(&w, other_server), "server");
    let mut dropped = narrower.clone();
    dropped.max_cost_per_invocation = None;
    assert_widened(widened_field(&w, dropped), "max_cost_per_invocation");
    let mut dropped_count = narrower.clone();
    dropped_count.max_invocations = None;
    assert_widened(widened_field(&w, dropped_count), "max_invocations");
    let euros = Grant::monetary("cost-srv", "compute", 50, 500, "EUR")
        .with_max_invocations(5)
        .narrowing(1);
    assert_widened(widened_field(&w, euros), "currency");
    let mut no_parent = narrower.clone();
    no_parent.parent_grant_index = Some(7);
    assert_widened(widened_field(&w, no_parent), "parent_grant_index");
    let mut unnamed = narrower;
    unnamed.parent_grant_index = None;
    assert_widened(widened_field(&w, unnamed), "parent_grant_index");
}

#[test]
fn delegate_refuses_widening_and_strangers() {
    let w = world();
    let token = root(&w, vec![monetary()]);
    let wider = Grant::monetary("cost-srv", "compute", 100, 2000, "USD")
        .with_max_invocations(10)
        .narrowing(0);
    assert!(matches!(
        token.delegate(&w.agent, w.agent.public_key(), vec![wider], NOW, NOW + HOUR),
        Err(TokenError::WidenedGrant {
            field: "max_total_cost",
            ..
        })
    ));
    let stranger = KeyPair::from_seed(&[3; 32]);
    assert!(matches!(
        token.delegate(
            &stranger,
            w.agent.public_key(),
            vec![monetary().narrowing(0)],
            NOW,
            NOW + HOUR
        ),
        Err(TokenError::BrokenChain { .. })
    ));
}

#[test]
fn wildcard_parent_may_be_narrowed_to_a_tool() {
    let w = world();
    let token = root(&w, vec![Grant::tool("*", "*").with_max_invocations(3)]);
    let child = token
        .delegate(
            &w.agent,
            w.agent.public_key(),
            vec![Grant::tool("srv-a", "read_file")
                .with_max_invocations(3)
                .narrowing(0)],
            NOW,
            NOW + HOUR,
        )
        .expect("narrowing a wildcard");
    let verified = verify(&child, &w.trust, NOW, None).expect("valid");
    assert_eq!(verified.matching_grants("srv-a", "read_file"), vec![0]);
    assert!(verified.matching_grants("srv-a", "write_file").is_empty());
    // A child may not widen a concrete parent back to a wildcard.
    let wild = raw_child(
        &child,
        &w.agent,
        vec![Grant::tool("*", "*").with_max_invocations(1).narrowing(0)],
    );
    assert!(matches!(
        verify(&wild, &w.trust, NOW, None),
        Err(TokenError::WidenedGrant {
            field: "server",
            ..
        })
    ));
}

#[test]
fn child_must_be_issued_by_the_parents_subject() {
    let w = world();
    let token = root(&w, vec![monetary()]);
    let stranger = KeyPair::from_seed(&[3; 32]);
    let child = raw_child(&token, &stranger, vec![monetary().narrowing(0)]);
    assert!(matches!(
        verify(&child, &w.trust, NOW, None),
        Err(TokenError::BrokenChain { .. })
    ));
}

/// A chain of `depth` tokens, every holder delegating to the next key.
fn chain(w: &World, depth: usize) -> (Vec<CapabilityToken>, Vec<KeyPair>) {
    let keys: Vec<KeyPair> = (0..=depth as u8)
        .map(|i| KeyPair::from_seed(&[100 + i; 32]))
        .collect();
    let first = CapabilityToken::issue(
        &w.authority,
        keys[0].public_key(),
        vec![monetary(), Grant::tool("srv-a", "read_file")],
        NOW,
        NOW + HOUR,
    )
    .expect("root");
    let mut tokens = vec![first];
    for level in 1..depth {
        let parent = &tokens[level - 1];
        let next = parent
            .delegate(
                &keys[level - 1],
                keys[level].public_key(),
                vec![
                    Grant::tool("srv-a", "read_file").narrowing(if level == 1 { 1 } else { 0 }),
                    Grant::monetary("cost-srv", "compute", 100, 1000 - level as u64, "USD")
                        .with_max_invocations(10)
                        .narrowing(if level == 1 { 0 } else { 1 }),
                ],
                NOW,
                NOW + HOUR,
            )
            .expect("delegate");
        tokens.push(next);
    }
    (tokens, keys)
}

#[test]
fn chain_of_eight_verifies_and_nine_is_too_deep() {
    let w = world();
    let (tokens, keys) = chain(&w, MAX_CHAIN_DEPTH);
    let leaf = tokens.last().expect("leaf");
    assert_eq!(leaf.depth(), 8);
    let verified = verify(leaf, &w.trust, NOW, None).expect("8 tokens are fine");
    let root_family = family_id(&w.authority.public_key(), tokens[0].id());
    assert_eq!(verified.family_id(), &root_family);
    assert_eq!(leaf.family_id(), root_family);
    assert_eq!(verified.ancestor_accounts(1).map(|a| a.len()), Some(7));
    let grants = vec![Grant::tool("srv-a", "read_file").narrowing(0)];
    assert_eq!(
        leaf.delegate(
            &keys[7],
            keys[8].public_key(),
            grants.clone(),
            NOW,
            NOW + HOUR
        ),
        Err(TokenError::TooDeep { depth: 9, max: 8 })
    );
    let ninth = raw_child(leaf, &keys[7], grants);
    assert_eq!(
        verify(&ninth, &w.trust, NOW, None),
        Err(TokenError::TooDeep { depth: 9, max: 8 })
    );
}

#[test]
fn ancestor_accounts_are_listed_nearest_first() {
    let w = world();
    let (tokens, _) = chain(&w, 3);
    let verified = verify(&tokens[2], &w.trust, NOW, None).expect("valid");
    let ancestors = verified.ancestor_accounts(1).expect("grant 1");
    let accounts: Vec<AccountKey> = ancestors.iter().map(|a| a.account.clone()).collect();
    assert_eq!(
        accounts,
        vec![
            AccountKey::new(tokens[1].id().clone(), 1),
            AccountKey::new(tokens[0].id().clone(), 0),
        ]
    );
    assert_eq!(
        ancestors[0].limits,
        GrantLimits::monetary(Some(10), Some(100), Some(999), "USD")
    );
    assert_eq!(
        ancestors[1].limits,
        GrantLimits::monetary(Some(10), Some(100), Some(1000), "USD")
    );
    assert_eq!(
        verified.grant_limits(1),
        Some(GrantLimits::monetary(Some(10), Some(100), Some(998), "USD"))
    );
    let read = verified.ancestor_accounts(0).expect("grant 0");
    assert_eq!(
        read.iter().map(|a| a.account.clone()).collect::<Vec<_>>(),
        vec![
            AccountKey::new(tokens[1].id().clone(), 0),
            AccountKey::new(tokens[0].id().clone(), 1),
        ]
    );
    assert_eq!(verified.family_id(), &tokens[0].family_id());
}

/// Two trusted issuers that happen to pick the same token id mint two families: the ids
/// differ (each under its issuer's namespace), so the cluster keeps two budgets.
#[test]
fn two_issuers_with_the_same_token_id_get_separate_families() {
    let w = world();
    let other = KeyPair::from_seed(&[4; 32]);
    let mut trust = w.trust.clone();
    trust.trust(other.public_key());
    let issue = |issuer: &KeyPair| {
        CapabilityToken::issue_with_id(
            issuer,
            "cap-shared".into(),
            w.agent.public_key(),
            vec![monetary()],
            NOW,
            NOW + HOUR,
        )
        .expect("issue")
    };
    let (ours, theirs) = (issue(&w.authority), issue(&other));
    assert_eq!(ours.id(), theirs.id());
    let ours = verify(&ours, &trust, NOW, None).expect("valid");
    let theirs = verify(&theirs, &trust, NOW, None).expect("valid");
    assert_ne!(ours.family_id(), theirs.family_id());
    for (verified, issuer) in [(&ours, &w.authority), (&theirs, &other)] {
        let (namespace, root) = verified
            .family_id()
            .as_str()
            .split_once(':')
            .expect("namespaced");
        assert_eq!(namespace, family_namespace(&issuer.public_key()));
        assert_eq!(root, "cap-shared");
    }
}

#[test]
fn malformed_and_oversized_encodings_are_refused() {
    let w = world();
    let token = root(&w, vec![monetary()]);
    let mut bytes = token.to_bytes().expect("bytes");
    bytes.push(0);
    assert!(matches!(
        CapabilityToken::from_bytes(&bytes),
        Err(TokenError::Malformed(_))
    ));
    assert!(matches!(
        CapabilityToken::from_bytes(&vec![0x90; MAX_TOKEN_BYTES + 1]),
        Err(TokenError::TooLarge { .. })
    ));
    assert!(matches!(
        CapabilityToken::from_text(&"A".repeat(MAX_TOKEN_BYTES * 2)),
        Err(TokenError::TooLarge { .. })
    ));
    assert!(matches!(
        CapabilityToken::from_text("!!!"),
        Err(TokenError::Malformed(_))
    ));
    let too_many = vec![Grant::tool("a", "b"); MAX_GRANTS_PER_TOKEN + 1];
    assert!(matches!(
        CapabilityToken::issue(
            &w.authority,
            w.agent.public_key(),
            too_many,
            NOW,
            NOW + HOUR
        ),
        Err(TokenError::Malformed(_))
    ));
    assert!(matches!(
        CapabilityToken::issue_with_id(
            &w.authority,
            "a:b".into(),
            w.agent.public_key(),
            vec![monetary()],
            NOW,
            NOW + HOUR
        ),
        Err(TokenError::Malformed(_))
    ));
    let mixed = Grant::tool("a", "b")
        .with_max_cost_per_invocation(Money::new(1, "USD"))
        .with_max_total_cost(Money::new(1, "EUR"));
    assert!(matches!(
        CapabilityToken::issue(
            &w.authority,
            w.agent.public_key(),
            vec![mixed],
            NOW,
            NOW + HOUR
        ),
        Err(TokenError::Malformed(_))
    ));
}

#[test]
fn a_chain_of_eight_with_money_at_the_root_decodes() {
    // The nesting bound must admit the deepest valid shape: eight links, the root's grants
    // carrying money amounts at the innermost level.
    let w = world();
    let (tokens, _) = chain(&w, MAX_CHAIN_DEPTH);
    let leaf = tokens.last().expect("leaf");
    let bytes = leaf.to_bytes().expect("encodes");
    assert_eq!(CapabilityToken::from_bytes(&bytes).as_ref(), Ok(leaf));
    let text = leaf.to_text().expect("text");
    assert_eq!(CapabilityToken::from_text(&text).as_ref(), Ok(leaf));
}

#[test]
fn a_token_nested_past_the_limit_is_refused_while_decoding() {
    let w = world();
    let (tokens, keys) = chain(&w, MAX_CHAIN_DEPTH);
    let mut token = tokens.last().expect("leaf").clone();
    // Two links past the longest chain: `raw_child` skips `delegate`'s depth check, as an
    // attacker's encoder would.
    for holder in [&keys[7], &KeyPair::from_seed(&[9; 32])] {
        token = raw_child(
            &token,
            holder,
            vec![Grant::tool("srv-a", "read_file").narrowing(0)],
        );
    }
    let bytes = token.to_bytes().expect("10 links fit MAX_TOKEN_BYTES");
    assert_eq!(
        CapabilityToken::from_bytes(&bytes),
        Err(TokenError::TooDeeplyNested {
            max_levels: MAX_TOKEN_NESTING_LEVELS
        })
    );
}

/// The encoding of a token whose `parent` nests as often as `MAX_TOKEN_BYTES` allows (400-odd
/// links, the fuzzers' token/deep-nesting regression), built as bytes: a value that deep
/// would overflow the test's own stack when encoded, cloned or dropped.
pub(crate) fn deeply_nested_token_bytes() -> Vec<u8> {
    let key = KeyPair::from_seed(&[3; 32]);
    let root = CapabilityToken::issue(
        &key,
        key.public_key(),
        vec![Grant::tool("s", "t")],
        NOW,
        NOW + HOUR,
    )
    .expect("root");
    let innermost = rmp_serde::to_vec(&root).expect("encodes");
    // A link is `[body, signature]` with `body = [id, issuer, subject, issued_at_ms,
    // expires_at_ms, grants, parent]`: everything up to `parent` goes before the nested token,
    // the signature after it.
    let mut body_head = rmp_serde::to_vec(&(
        "r",
        key.public_key(),
        key.public_key(),
        NOW,
        NOW + HOUR,
        Vec::<Grant>::new(),
        None::<()>,
    ))
    .expect("encodes");
    assert_eq!(
        body_head.pop(),
        Some(0xc0),
        "the trailing nil is the absent parent"
    );
    let link_head = [&[0x92][..], &body_head].concat();
    let link_tail = rmp_serde::to_vec(&root.signature).expect("encodes");
    let links = (MAX_TOKEN_BYTES - innermost.len()) / (link_head.len() + link_tail.len());
    let mut bytes = link_head.repeat(links);
    bytes.extend_from_slice(&innermost);
    bytes.extend_from_slice(&link_tail.repeat(links));
    assert!(links > 400 && bytes.len() <= MAX_TOKEN_BYTES);
    bytes
}

/// Stack a request handler may spend decoding a token (the fuzzers use the same budget): a
/// tokio worker has 2 MiB in all, most of it for the runtime and the gRPC stack below.
pub(crate) const DECODE_STACK_BUDGET_BYTES: usize = 512 * 1024;

/// Runs `f` on a thread with [`DECODE_STACK_BUDGET_BYTES`] of stack; overflowing it aborts the
/// test binary (the failure this guards against).
pub(crate) fn on_decode_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(DECODE_STACK_BUDGET_BYTES)
        .spawn(f)
        .expect("spawns")
        .join()
        .expect("decodes without panicking")
}

#[test]
fn a_token_nested_as_deep_as_its_size_allows_is_refused_within_a_bounded_stack() {
    let bytes = deeply_nested_token_bytes();
    let text = URL_SAFE_NO_PAD.encode(&bytes);
    let (from_bytes, from_text) = on_decode_stack(move || {
        (
            CapabilityToken::from_bytes(&bytes),
            CapabilityToken::from_text(&text),
        )
    });
    let refused = Err(TokenError::TooDeeplyNested {
        max_levels: MAX_TOKEN_NESTING_LEVELS,
    });
    assert_eq!(from_bytes, refused);
    assert_eq!(from_text, refused);
}
