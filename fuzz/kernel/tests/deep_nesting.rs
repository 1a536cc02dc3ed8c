//! Regression test for a finding of the token target's review (issue 22, item 6): a token's
//! nesting (`body.parent`) is bounded at decode time only by `MAX_TOKEN_BYTES`, not by
//! `MAX_CHAIN_DEPTH`, so a 64 KiB token nests 417 levels and `CapabilityToken::from_bytes`
//! (and `SignedTicket::from_bytes`, whose ticket carries a token) recurse that deep before
//! any signature is checked. Measured: release needs between 1 and 1.25 MiB of stack for it,
//! debug overflows tokio's default 2 MiB worker stack, which aborts the whole process.
//! Fixed in tally-kernel by bounding msgpack nesting while decoding (`MAX_TOKEN_NESTING_LEVELS`,
//! `MAX_TICKET_NESTING_LEVELS`): both inputs are now refused with `TooDeeplyNested`.
//!
//! Asserts that decoding, re-encoding, verifying, comparing and dropping the deepest token (and
//! a ticket carrying it) fit in `fixtures::DECODE_STACK_BUDGET` (512 KiB), a budget that
//! leaves most of a tokio worker's stack to the runtime and the gRPC stack under the handler.
//! The same inputs are committed as fuzz/regressions/token/deep-nesting and
//! fuzz/regressions/ticket/deep-nesting, which the fuzz targets decode on a thread of that
//! size too (set `TALLY_FUZZ_WRITE_REGRESSIONS=1` to rewrite them). Runs on a thread of that size, so a
//! failure is a stack overflow that aborts the test binary (run it alone:
//! `cargo test -p tally-fuzz-kernel --test deep_nesting`). `WORKER_STACK_KIB` overrides the
//! budget, to measure.

use tally_fuzz_kernel::fixtures::{self, deepest_token, key, DECODE_STACK_BUDGET, NOW};
use tally_kernel::pipeline::SignedTicket;
use tally_kernel::token::verify;
use tally_kernel::{CapabilityToken, TrustList};

fn on_large_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(256 * 1024 * 1024)
        .spawn(f)
        .expect("spawns")
        .join()
        .expect("runs")
}

/// With `TALLY_FUZZ_WRITE_REGRESSIONS` set, writes `bytes` (binary mode, selector 0) as
/// fuzz/regressions/<target>/deep-nesting.
fn write_regression(target: &str, bytes: &[u8]) {
    if std::env::var_os("TALLY_FUZZ_WRITE_REGRESSIONS").is_none() {
        return;
    }
    let dir = tally_fuzz_common::replay::fuzz_root()
        .join("regressions")
        .join(target);
    std::fs::create_dir_all(&dir).expect("create the regressions directory");
    std::fs::write(
        dir.join("deep-nesting"),
        tally_fuzz_common::seeds::selected(0, bytes),
    )
    .expect("write the regression");
}

fn within_budget(what: &str, f: impl FnOnce() + Send + 'static) {
    let kib: usize = std::env::var("WORKER_STACK_KIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DECODE_STACK_BUDGET / 1024);
    eprintln!("{what}: on a {kib} KiB stack (an overflow aborts here)");
    std::thread::Builder::new()
        .stack_size(kib * 1024)
        .spawn(f)
        .expect("spawns")
        .join()
        .expect("the decoder did not panic");
}

#[test]
fn the_deepest_token_decodes_within_a_bounded_stack() {
    let (bytes, depth) = on_large_stack(|| {
        let token = deepest_token();
        let bytes = token.to_bytes().expect("encodes");
        let depth = token.depth();
        std::mem::forget(token);
        (bytes, depth)
    });
    eprintln!("token: depth {depth} in {} bytes", bytes.len());
    write_regression("token", &bytes);
    within_budget("token", move || {
        let result = CapabilityToken::from_bytes(&bytes);
        if let Ok(token) = &result {
            let _ = verify(token, &TrustList::new([key(0).public_key()]), NOW, None);
            assert!(token.clone() == *token);
        }
        drop(result);
    });
}

#[test]
fn a_ticket_carrying_the_deepest_token_decodes_within_a_bounded_stack() {
    let bytes = on_large_stack(|| {
        let mut ticket = fixtures::ticket();
        ticket.ticket.capability = deepest_token();
        let ticket = ticket.ticket.sign(&key(0)).expect("signs");
        let bytes = ticket.to_bytes().expect("fits MAX_TICKET_BYTES");
        std::mem::forget(ticket);
        bytes
    });
    eprintln!("ticket: {} bytes", bytes.len());
    write_regression("ticket", &bytes);
    within_budget("ticket", move || {
        let result = SignedTicket::from_bytes(&bytes);
        if let Ok(ticket) = &result {
            let _ = ticket.verify(&TrustList::new([key(0).public_key()]));
        }
        drop(result);
    });
}
