//! One file per command: each checks in docs/spec.md §4's order, then writes its effect.

mod authorize;
mod cancel;
mod capture;
mod expire;
mod hold_lookup;
mod legacy;
mod nonce;
mod reconcile;
mod release;
mod replay;
mod resolve;
mod reverse;
