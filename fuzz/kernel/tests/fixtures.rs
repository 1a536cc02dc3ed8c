//! The seed fixtures are what their names say, so the fuzzer starts from inputs that reach
//! the deep checks (a verifying chain, a verifying ticket, receipt and nonce).

use tally_fuzz_kernel::fixtures;
use tally_kernel::token::verify;
use tally_kernel::{verify_receipt, TrustList};

#[test]
fn tokens_verify_exactly_when_their_name_says_so() {
    let trust = TrustList::new([fixtures::key(0).public_key()]);
    for (name, token) in fixtures::tokens() {
        let now = fixtures::NOW + 10_000;
        let result = verify(&token, &trust, now, None);
        let should = !matches!(name.as_str(), "widened" | "expired" | "depth-9");
        assert_eq!(result.is_ok(), should, "{name}: {result:?}");
        // Re-signing maps keys onto the same known keys, so it keeps a valid chain valid.
        let resigned = fixtures::resign(&token).expect("re-signs");
        let root = fixtures::key_for(&token.root().body.issuer).public_key();
        let result = verify(&resigned, &TrustList::new([root]), now, None);
        assert_eq!(result.is_ok(), should, "{name} re-signed: {result:?}");
    }
}

#[test]
fn ticket_receipts_and_nonce_verify() {
    let trust = TrustList::new([fixtures::key(0).public_key()]);
    assert_eq!(fixtures::ticket().verify(&trust), Ok(()));
    for (name, receipt) in fixtures::receipts() {
        assert_eq!(verify_receipt(&receipt, &trust), Ok(()), "{name}");
    }
    let _ = fixtures::nonce();
}
