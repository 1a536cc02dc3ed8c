//! Admission tickets (kernel-node/src/pipeline/ticket.rs): `SignedTicket::from_bytes` (the
//! `ticket` bytes of `Complete`/`Abort`, strict: canonical encoding only), `from_text`, and
//! `SignedTicket::verify` against the trusted kernel keys.
//!
//! Input: a selector byte, then the ticket: `0` binary, `1` text, `2` any msgpack ticket,
//! re-signed by a known kernel key.
//!
//! Asserts: a decoded ticket is its own canonical encoding and its text form round-trips;
//! `verify` never panics and refuses an untrusted kernel key; a ticket signed by a trusted
//! kernel verifies, still verifies after its own encoding round trip, and stops verifying when
//! its signature, its kernel key or any signed field changes (here: the exposure and the
//! holder, which decide what `Complete` may settle and who may call it).

use tally_fuzz_common::seeds::selected;
use tally_kernel::pipeline::{SignedTicket, TicketError};
use tally_kernel::TrustList;

use crate::fixtures;

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

/// The checks on `ticket` bytes as a `Complete` or `Abort` carries them.
pub fn binary(data: &[u8]) {
    let Ok(ticket) = SignedTicket::from_bytes(data) else {
        return;
    };
    let bytes = ticket.to_bytes().expect("a decoded ticket encodes");
    assert_eq!(bytes, data, "from_bytes accepted a non-canonical encoding");
    let text = ticket.to_text().expect("encodes as text");
    assert_eq!(SignedTicket::from_text(&text).as_ref(), Ok(&ticket));
    check(&ticket);
}

fn text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(ticket) = SignedTicket::from_text(text) else {
        return;
    };
    let bytes = ticket.to_bytes().expect("a decoded ticket encodes");
    assert_eq!(SignedTicket::from_bytes(&bytes).as_ref(), Ok(&ticket));
    check(&ticket);
}

fn check(ticket: &SignedTicket) {
    assert_eq!(
        ticket.verify(&TrustList::default()),
        Err(TicketError::UntrustedKernel(ticket.kernel_key)),
    );
    let _ = ticket.verify(&TrustList::new([ticket.kernel_key]));
    let _ = ticket.ticket.capability.to_bytes();
    let _ = ticket.ticket.capability.family_id();
}

fn resigned(data: &[u8]) {
    let Ok(decoded) = rmp_serde::from_slice::<SignedTicket>(data) else {
        return;
    };
    let kernel = fixtures::key_for(&decoded.kernel_key);
    let Ok(signed) = decoded.ticket.clone().sign(&kernel) else {
        return;
    };
    let trust = TrustList::new([kernel.public_key()]);
    assert_eq!(
        signed.verify(&trust),
        Ok(()),
        "a freshly signed ticket does not verify"
    );
    let other = fixtures::key(kernel.public_key().as_bytes()[0].wrapping_add(1));
    if other.public_key() != kernel.public_key() {
        assert!(signed
            .verify(&TrustList::new([other.public_key()]))
            .is_err());
    }
    if let Ok(bytes) = signed.to_bytes() {
        let back = SignedTicket::from_bytes(&bytes)
            .unwrap_or_else(|e| panic!("a signed ticket's own bytes do not decode: {e}"));
        assert_eq!(back, signed, "ticket round trip");
        assert_eq!(
            back.verify(&trust),
            Ok(()),
            "a ticket stopped verifying after a round trip"
        );
        binary(&bytes);
    }
    let mut forged = signed.clone();
    forged.signature.0[0] ^= 1;
    assert!(
        forged.verify(&trust).is_err(),
        "a changed signature still verifies"
    );
    let mut forged = signed.clone();
    forged.ticket.exposure_units ^= 1;
    assert!(
        forged.verify(&trust).is_err(),
        "a changed exposure still verifies"
    );
    let mut forged = signed;
    forged.ticket.holder.0[31] ^= 1;
    assert!(
        forged.verify(&trust).is_err(),
        "a changed holder still verifies"
    );
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let ticket = fixtures::ticket();
    let bytes = ticket.to_bytes().expect("encodes");
    vec![
        ("binary".into(), selected(0, &bytes)),
        (
            "text".into(),
            selected(1, ticket.to_text().expect("text").as_bytes()),
        ),
        ("resign".into(), selected(2, &bytes)),
    ]
}
