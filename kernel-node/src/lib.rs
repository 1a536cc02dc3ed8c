//! The kernel node (docs/architecture.md, `kernel-node/`): the docs/spec.md §9 evaluation
//! pipeline and its server, ed25519 capability tokens with delegation, payment adapters keyed
//! by the request id, execution nonces, the reconciler, and signed receipts. The node
//! keeps no state of its own that matters: budgets live in the cluster, payments on the rail,
//! and receipts are signed facts about both that anyone with the kernel's public key can check.

pub mod key_file;
pub mod keys;
pub mod money;
pub mod payment;
pub mod receipt;
pub mod token;

pub use keys::{KeyError, KeyPair, PublicKey, Signature};
pub use money::{Money, MoneyError, MAX_CURRENCY_BYTES};
pub use payment::{
    Authorization, Capture, FaultyRail, InMemoryRail, PaymentAdapter, PaymentError, Refund,
    ReleaseStatus, RemoteRail, SettlementRecord, SettlementStatus,
};
pub use receipt::{verify_receipt, Receipt, ReceiptError, ReceiptLog, Verdict};
pub use token::{CapabilityToken, Grant, TokenBody, TokenError, TrustList, VerifiedCapability};
pub mod config;
pub mod demo;
pub mod nonce;
pub mod pipeline;
pub mod port;
pub mod reconciler;
pub mod server;
pub mod tool;
