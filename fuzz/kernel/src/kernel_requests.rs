//! `tally.kernel.v1.Kernel` requests and the execution nonce. The wire → pipeline
//! conversions (`request_from_pb`, `ticket_from_pb`, `money_from_pb`, `nonce_from_pb` in
//! kernel-node/src/server/convert.rs) are private, so this target decodes each request with
//! prost and runs the public decoders those conversions call, in the same order and with the
//! same bounds: the token text, `Arguments::from_json`, the strict nonce decoding, the
//! ticket bytes and the money check.
//!
//! Input: a selector byte, then: `0` a `ToolCall`, `1` a `CompleteRequest`, `2` an
//! `AbortRequest` (protobuf); `3` execution-nonce bytes; `4` arguments JSON text; `5` a
//! msgpack nonce re-signed by a known kernel key.
//!
//! Asserts: prost round trips; the token and ticket checks of the `token` and `ticket`
//! targets on what the requests carry; a nonce that decodes re-encodes to bytes that decode to
//! it (and the strict check accepts exactly its canonical bytes); `nonce::verify` never panics;
//! a freshly signed nonce verifies for its own binding while unexpired, is refused once
//! expired, for another request id or subject, and by an untrusted kernel; the consume command
//! built from it validates or is refused without panicking; arguments hash identically
//! however their keys are ordered (the hash of their canonical JSON's reparse is the same).

use std::fmt::Debug;

use prost::Message;
use serde_json::Value;
use tally_fuzz_common::seeds::selected;
use tally_kernel::nonce::{
    consume_command, parameter_hash, verify, NonceError, SignedExecutionNonce,
};
use tally_kernel::pipeline::Arguments;
use tally_kernel::receipt::canonical_json;
use tally_kernel::server::pb;
use tally_kernel::{CapabilityToken, Money, TrustList};
use tally_ledger::CommandHeader;

use crate::fixtures;

/// Largest nonce the server accepts (`MAX_NONCE_BYTES` in server/convert.rs).
const MAX_NONCE_BYTES: usize = 8 * 1024;

fn decode<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let again = message.encode_to_vec();
    let back = M::decode(again.as_slice()).expect("prost: our own encoding does not decode");
    assert_eq!(back, message, "prost: decode(encode(m)) != m");
    Some(message)
}

pub fn run(data: &[u8]) {
    let Some((selector, rest)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    match selector % 6 {
        0 => {
            if let Some(call) = decode::<pb::ToolCall>(rest) {
                if let Ok(token) = CapabilityToken::from_text(&call.capability_token) {
                    let bytes = token.to_bytes().expect("a decoded token encodes");
                    crate::token::run(&selected(0, &bytes));
                }
                arguments(&call.arguments_json);
                if let Some(bytes) = &call.execution_nonce {
                    if bytes.len() <= MAX_NONCE_BYTES {
                        nonce(bytes);
                    }
                }
            }
        }
        1 => {
            if let Some(request) = decode::<pb::CompleteRequest>(rest) {
                crate::ticket::binary(&request.ticket);
                if let Some(cost) = request.actual_cost {
                    let money = Money::new(cost.units, &cost.currency);
                    let _ = money.validate();
                }
            }
        }
        2 => {
            if let Some(request) = decode::<pb::AbortRequest>(rest) {
                crate::ticket::binary(&request.ticket);
            }
        }
        3 => nonce(rest),
        4 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                arguments(text);
            }
        }
        _ => resigned_nonce(rest),
    }
}

fn arguments(text: &str) {
    let Ok(arguments) = Arguments::from_json(text) else {
        return;
    };
    let value = arguments.value();
    let Ok(canonical) = canonical_json(value) else {
        return;
    };
    let reparsed: Value = serde_json::from_str(&canonical)
        .unwrap_or_else(|e| panic!("canonical JSON does not parse: {e}\n{canonical}"));
    assert_eq!(
        canonical_json(&reparsed).as_deref().ok(),
        Some(canonical.as_str()),
        "canonical JSON is not a fixpoint"
    );
    assert_eq!(
        parameter_hash(&reparsed).ok(),
        parameter_hash(value).ok(),
        "reordering the arguments changed their hash"
    );
}

fn nonce(bytes: &[u8]) {
    let Ok(signed) = rmp_serde::from_slice::<SignedExecutionNonce>(bytes) else {
        return;
    };
    let canonical = tally_fuzz_common::roundtrip::msgpack("execution nonce", &signed);
    let _strict_accepts = canonical == bytes;
    let trust = TrustList::new([signed.kernel_key]);
    let _ = verify(
        &signed,
        &trust,
        &signed.nonce.bound_to,
        signed.nonce.issued_at_ms,
    );
    assert!(
        verify(&signed, &TrustList::default(), &signed.nonce.bound_to, 0).is_err(),
        "a nonce verified with no trusted kernel"
    );
    consume(&signed);
}

fn consume(signed: &SignedExecutionNonce) {
    let header = CommandHeader {
        family_id: signed.nonce.bound_to.family_id.as_str().into(),
        capability_id: signed.nonce.bound_to.capability_id.as_str().into(),
        grant_index: 0,
        event_id: "unset".into(),
        not_after_ms: signed.nonce.expires_at_ms,
    };
    let command = consume_command(header, signed, &"att-1".into());
    let _ = command.validate();
}

fn resigned_nonce(bytes: &[u8]) {
    let Ok(decoded) = rmp_serde::from_slice::<SignedExecutionNonce>(bytes) else {
        return;
    };
    let kernel = fixtures::key_for(&decoded.kernel_key);
    let signed = fixtures::sign_nonce(decoded.nonce.clone(), &kernel);
    let trust = TrustList::new([kernel.public_key()]);
    let binding = &signed.nonce.bound_to;
    let (issued, expires) = (signed.nonce.issued_at_ms, signed.nonce.expires_at_ms);
    for now in [issued, expires.saturating_sub(1)] {
        let result = verify(&signed, &trust, binding, now);
        if now < expires {
            assert_eq!(result, Ok(()), "a fresh nonce does not verify at {now}");
        }
    }
    assert!(matches!(
        verify(&signed, &trust, binding, expires),
        Err(NonceError::Expired { .. })
    ));
    let valid_at = issued.min(expires.saturating_sub(1));
    if valid_at < expires {
        let mut other = binding.clone();
        other.request_id.push('x');
        assert!(matches!(
            verify(&signed, &trust, &other, valid_at),
            Err(NonceError::BindingMismatch { .. })
        ));
        let mut other = binding.clone();
        other.subject.0[0] ^= 1;
        assert!(verify(&signed, &trust, &other, valid_at).is_err());
        let stranger =
            TrustList::new([
                fixtures::key(kernel.public_key().as_bytes()[0].wrapping_add(1)).public_key(),
            ]);
        if !stranger.contains(&kernel.public_key()) {
            assert!(verify(&signed, &stranger, binding, valid_at).is_err());
        }
    }
    nonce(&rmp_serde::to_vec(&signed).expect("encodes"));
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let (_, token) = fixtures::tokens().swap_remove(1);
    let nonce = rmp_serde::to_vec(&fixtures::nonce()).expect("encodes");
    let ticket = fixtures::ticket().to_bytes().expect("encodes");
    let call = pb::ToolCall {
        request_id: "req-1".into(),
        capability_token: token.to_text().expect("text"),
        server: "cost-srv".into(),
        tool: "compute".into(),
        arguments_json: r#"{"n": 1, "b": [true, null, "s"]}"#.into(),
        execution_nonce: Some(nonce.clone()),
        ..Default::default()
    };
    let money = fixtures::money();
    vec![
        ("tool-call".into(), selected(0, &call.encode_to_vec())),
        (
            "complete".into(),
            selected(
                1,
                &pb::CompleteRequest {
                    ticket: ticket.clone(),
                    actual_cost: Some(pb::Money {
                        units: money.units,
                        currency: money.currency,
                    }),
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
        ),
        (
            "abort".into(),
            selected(
                2,
                &pb::AbortRequest {
                    ticket,
                    before_dispatch: true,
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
        ),
        ("nonce".into(), selected(3, &nonce)),
        (
            "arguments".into(),
            selected(4, br#"{"b": {"y": [1, -2], "x": "s\"q"}, "a": null}"#),
        ),
        ("nonce-resign".into(), selected(5, &nonce)),
    ]
}
