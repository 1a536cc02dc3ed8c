//! Signed receipts: every decision, allow or deny, yields one, signed by the kernel node's key
//! and naming the exact cluster events and payment reference behind it, so an auditor (or a
//! reconciler on any node) can check the kernel's story against the cluster journal.

mod canonical;
mod cross_check;
mod log;
mod metadata;
mod model;

pub use canonical::canonical_json;
pub use cross_check::{
    cross_check, event_refs, CheckedEvent, CrossCheckError, EventClaim, EventRef, JournalLookup,
    JournalResolution,
};
pub use log::{read_receipts, ReadReceipts, ReceiptLog, ReceiptLogError, MAX_RECEIPT_LINE_BYTES};
pub use metadata::{
    BudgetAuthorityMetadata, BudgetStep, ExecutionNonceMetadata, FinancialMetadata,
    ReceiptMetadata, StepRecord,
};
pub use model::{verify_receipt, Receipt, ReceiptDraft, ReceiptError, Verdict};

/// Canonical metadata JSON, in bytes.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;
/// A denial reason is a sentence, not a dump.
pub const MAX_REASON_BYTES: usize = 1024;
/// Server and tool names, as in tokens.
pub const MAX_NAME_BYTES: usize = crate::token::MAX_NAME_BYTES;
/// Metadata nesting depth.
pub const MAX_METADATA_DEPTH: usize = 32;

/// Prepended to the signed bytes so a receipt signature never verifies as a token's.
pub(crate) const RECEIPT_SIGNING_DOMAIN: &[u8] = b"tally-receipt-v1\0";
