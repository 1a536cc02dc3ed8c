//! Known keys, re-signing, and the real tokens, tickets, receipts and nonces the seed corpora
//! are made of. Everything is deterministic (fixed seeds and ids), so regenerating the
//! corpus gives the same files.
//!
//! The struct literals here (`TokenBody`, `AdmissionTicket`, `NonceBinding`,
//! `ExecutionNonce`) are the only places the fuzz crate spells out those types' fields: when a
//! field is added, this file is what to update.

use serde_json::json;
use tally_kernel::nonce::{ExecutionNonce, NonceBinding, SignedExecutionNonce};
use tally_kernel::pipeline::{AdmissionTicket, SignedTicket};
use tally_kernel::receipt::{BudgetAuthorityMetadata, BudgetStep, FinancialMetadata, ReceiptDraft};
use tally_kernel::token::{MAX_CHAIN_DEPTH, MAX_TOKEN_BYTES};
use tally_kernel::{
    CapabilityToken, Grant, KeyPair, Money, PublicKey, Receipt, TokenBody, Verdict,
};
use tally_ledger::{BudgetCommitIndex, GrantLimits};

/// The fixtures' clock.
pub const NOW: u64 = 1_700_000_000_000;
/// Keys the re-signing modes map every key onto.
pub const KEYS: u8 = 4;

/// Known key `i` (of [`KEYS`]).
pub fn key(i: u8) -> KeyPair {
    KeyPair::from_seed(&[i % KEYS + 1; 32])
}

/// The known key standing in for `public` (a function of the key, so equal keys map to the
/// same known key and chain links survive re-signing).
pub fn key_for(public: &PublicKey) -> KeyPair {
    key(public.as_bytes()[0])
}

/// `token` with every link's issuer and subject mapped onto known keys and every link signed
/// by its issuer, root first; `None` when a link cannot be signed (a malformed id).
pub fn resign(token: &CapabilityToken) -> Option<CapabilityToken> {
    let parent = match &token.body.parent {
        Some(parent) => Some(Box::new(resign(parent)?)),
        None => None,
    };
    let issuer = key_for(&token.body.issuer);
    let mut body = token.body.clone();
    body.parent = parent;
    body.issuer = issuer.public_key();
    body.subject = key_for(&token.body.subject).public_key();
    CapabilityToken::sign_body(body, &issuer).ok()
}

/// A token delegated from `parent` by its holder, known key `holder`, to known key `subject`.
fn child(
    parent: &CapabilityToken,
    holder: u8,
    id: &str,
    subject: u8,
    grants: Vec<Grant>,
    issued_at_ms: u64,
    expires_at_ms: u64,
) -> CapabilityToken {
    let holder = key(holder);
    let body = TokenBody {
        id: id.into(),
        issuer: holder.public_key(),
        subject: key(subject).public_key(),
        issued_at_ms,
        expires_at_ms,
        grants,
        parent: Some(Box::new(parent.clone())),
    };
    CapabilityToken::sign_body(body, &holder).expect("a fixture token signs")
}

/// A root token, delegations of it (valid and not), a chain at the depth limit and one past
/// it, and an expired token.
pub fn tokens() -> Vec<(String, CapabilityToken)> {
    let root = CapabilityToken::issue_with_id(
        &key(0),
        "root-1".into(),
        key(1).public_key(),
        vec![
            Grant::monetary("cost-srv", "compute", 100, 1_000, "USD").with_max_invocations(50),
            Grant::tool("*", "*"),
            Grant::tool("search", "web").with_max_invocations(10),
        ],
        NOW,
        NOW + 3_600_000,
    )
    .expect("a fixture root issues");
    let delegated = child(
        &root,
        1,
        "child-1",
        2,
        vec![
            Grant::monetary("cost-srv", "compute", 50, 500, "USD")
                .with_max_invocations(10)
                .narrowing(0),
            Grant::tool("fs", "read").narrowing(1),
        ],
        NOW + 1_000,
        NOW + 1_800_000,
    );
    let grandchild = child(
        &delegated,
        2,
        "grandchild-1",
        3,
        vec![Grant::monetary("cost-srv", "compute", 20, 100, "USD")
            .with_max_invocations(5)
            .narrowing(0)],
        NOW + 2_000,
        NOW + 900_000,
    );
    let widened = child(
        &root,
        1,
        "widened-1",
        2,
        vec![Grant::monetary("cost-srv", "compute", 200, 500, "USD").narrowing(0)],
        NOW + 1_000,
        NOW + 1_800_000,
    );
    let mut deep = root.clone();
    let mut deepest = Vec::new();
    for depth in 2..=MAX_CHAIN_DEPTH + 1 {
        deep = child(
            &deep,
            (depth - 1) as u8,
            &format!("link-{depth}"),
            depth as u8,
            vec![Grant::tool("search", "web")
                .with_max_invocations(10)
                .narrowing(if depth == 2 { 2 } else { 0 })],
            NOW + depth as u64,
            NOW + 3_600_000,
        );
        if depth >= MAX_CHAIN_DEPTH {
            deepest.push((format!("depth-{depth}"), deep.clone()));
        }
    }
    let expired = CapabilityToken::issue_with_id(
        &key(0),
        "expired-1".into(),
        key(1).public_key(),
        vec![Grant::tool("search", "web")],
        NOW - 7_200_000,
        NOW - 3_600_000,
    )
    .expect("issues");
    let mut tokens = vec![
        ("root".into(), root),
        ("delegated".into(), delegated),
        ("grandchild".into(), grandchild),
        ("widened".into(), widened),
        ("expired".into(), expired),
    ];
    tokens.extend(deepest);
    tokens
}

/// A signed admission ticket for the delegated token.
pub fn ticket() -> SignedTicket {
    let (_, token) = tokens().swap_remove(1);
    AdmissionTicket {
        request_id: "req-1".into(),
        server: "cost-srv".into(),
        tool: "compute".into(),
        holder: token.body.subject,
        family_id: token.family_id(),
        capability_id: token.id().clone(),
        capability: token,
        grant_index: 0,
        hold_id: "budget-hold:req-1:child-1:0".into(),
        authorize_commit_index: BudgetCommitIndex::new(7, 0, 0).0,
        capture_event_id: "budget-capture:req-1".into(),
        capture_commit_index: BudgetCommitIndex::new(8, 0, 0).0,
        attempt_id: "att-1".into(),
        payment_reference: Some("req-1".into()),
        exposure_units: 50,
        limits: GrantLimits::monetary(Some(10), Some(50), Some(500), "USD"),
        issued_at_ms: NOW + 5_000,
    }
    .sign(&key(0))
    .expect("a fixture ticket signs")
}

/// Receipts as the pipeline signs them: an allow with full budget and payment metadata, a
/// deny with a reason, and one with an ambiguous step.
pub fn receipts() -> Vec<(String, Receipt)> {
    let mut budget = BudgetAuthorityMetadata::new("budget-hold:req-1:child-1:0".into());
    budget
        .grant_index(0)
        .cluster("tally-dev", 3, "raft_linearizable")
        .committed(
            BudgetStep::Authorize,
            "budget-authorize:req-1".into(),
            BudgetCommitIndex::new(7, 0, 0),
        )
        .committed(
            BudgetStep::InvocationCapture,
            "budget-capture:req-1".into(),
            BudgetCommitIndex::new(8, 0, 0),
        )
        .attempt(BudgetStep::InvocationCapture, "att-1".into());
    let mut ambiguous = budget.clone();
    ambiguous.ambiguous(BudgetStep::Reconcile, "budget-reconcile:req-1".into());
    let financial = FinancialMetadata::new("req-1").to_value();
    let draft = |verdict, metadata, reason: Option<&str>| {
        let mut draft = ReceiptDraft::new("req-1", "cost-srv", "compute", verdict, NOW + 6_000)
            .with_metadata(metadata);
        draft.receipt_id = "rcpt-00000000000000000000000000000001".into();
        if let Some(reason) = reason {
            draft = draft.with_reason(reason);
        }
        draft.capability_id = Some("child-1".into());
        draft.family_id = Some("fam".into());
        draft.sign(&key(0)).expect("a fixture receipt signs")
    };
    vec![
        (
            "allow".into(),
            draft(
                Verdict::Allow,
                json!({"budget_authority": budget.to_value(), "financial": financial}),
                None,
            ),
        ),
        (
            "deny".into(),
            draft(Verdict::Deny, json!({}), Some("payment declined")),
        ),
        (
            "ambiguous".into(),
            draft(
                Verdict::Allow,
                json!({"budget_authority": ambiguous.to_value(), "a": [1, -2, "x", null, true]}),
                None,
            ),
        ),
    ]
}

/// The kernel's nonce signing domain (`NONCE_SIGNING_DOMAIN`, crate-private in
/// kernel-node/src/nonce/mod.rs), so fixtures have fixed ids; `nonce()` checks it still
/// verifies.
pub const NONCE_SIGNING_DOMAIN: &[u8] = b"tally-execution-nonce-v1\0";

/// Signs `nonce` as kernel `kernel` would.
pub fn sign_nonce(nonce: ExecutionNonce, kernel: &KeyPair) -> SignedExecutionNonce {
    let bytes = rmp_serde::to_vec(&nonce).expect("a nonce encodes");
    SignedExecutionNonce {
        signature: kernel.sign(NONCE_SIGNING_DOMAIN, &bytes),
        kernel_key: kernel.public_key(),
        nonce,
    }
}

/// A nonce for request `req-1` of the delegated token, signed by known key 0.
pub fn nonce() -> SignedExecutionNonce {
    let binding = NonceBinding {
        subject: key(2).public_key(),
        request_id: "req-1".into(),
        family_id: "fam".into(),
        capability_id: "child-1".into(),
        server: "cost-srv".into(),
        tool: "compute".into(),
        parameter_hash: tally_kernel::nonce::parameter_hash(&json!({"n": 1})).expect("hashes"),
    };
    let signed = sign_nonce(
        ExecutionNonce {
            nonce_id: "nonce-00000000000000000000000000000001".into(),
            bound_to: binding.clone(),
            issued_at_ms: NOW,
            expires_at_ms: NOW + 60_000,
        },
        &key(0),
    );
    let trust = tally_kernel::TrustList::new([key(0).public_key()]);
    assert_eq!(
        tally_kernel::nonce::verify(&signed, &trust, &binding, NOW),
        Ok(()),
        "NONCE_SIGNING_DOMAIN in fuzz/kernel/src/fixtures.rs no longer matches the kernel's"
    );
    signed
}

/// A money value as the wire carries it.
pub fn money() -> Money {
    Money::new(42, "USD")
}

/// The deepest token whose encoding fits `MAX_TOKEN_BYTES` (with room to spare for a ticket
/// around it): a self-issued chain of 400-odd links. Cloning and encoding it recurse that
/// deep: call this on a thread with a large stack.
pub fn deepest_token() -> CapabilityToken {
    let mut token = CapabilityToken::issue_with_id(
        &key(0),
        "r".into(),
        key(0).public_key(),
        vec![Grant::tool("s", "t")],
        NOW,
        NOW + 1,
    )
    .expect("issues");
    loop {
        let body = TokenBody {
            id: "r".into(),
            issuer: key(0).public_key(),
            subject: key(0).public_key(),
            issued_at_ms: NOW,
            expires_at_ms: NOW + 1,
            grants: Vec::new(),
            parent: Some(Box::new(token.clone())),
        };
        let next = CapabilityToken::sign_body(body, &key(0)).expect("signs");
        match rmp_serde::to_vec(&next) {
            Ok(bytes) if bytes.len() <= MAX_TOKEN_BYTES - 256 => token = next,
            _ => break,
        }
    }
    token
}

/// Stack a request handler may spend decoding one token or ticket: a tokio worker has 2 MiB
/// in all, and the runtime, hyper and tonic sit below the handler.
pub const DECODE_STACK_BUDGET: usize = 512 * 1024;

/// Longest input the fuzzers generate (`-max_len` in scripts/fuzz); longer ones come from
/// `regressions/`.
pub const MAX_FUZZ_LEN: usize = 8192;

/// Runs `check(data)` here, or for an input longer than any the fuzzers generate (a committed
/// regression), on a thread with [`DECODE_STACK_BUDGET`] of stack, so that deep nesting shows
/// as the stack overflow it would cause on a tokio worker (an overflow aborts the process,
/// which libFuzzer and the replay report as a crash).
pub fn with_decode_stack(data: &[u8], check: fn(&[u8])) {
    if data.len() <= MAX_FUZZ_LEN {
        return check(data);
    }
    let owned = data.to_vec();
    let outcome = std::thread::Builder::new()
        .name("decode-stack-budget".into())
        .stack_size(DECODE_STACK_BUDGET)
        .spawn(move || check(&owned))
        .expect("spawn a decoding thread")
        .join();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
