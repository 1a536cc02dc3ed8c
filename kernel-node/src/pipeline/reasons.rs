//! Denial reasons that callers and tests match on exactly (the seed's strings where it has
//! them). Everything else is a sentence built where the denial happens.

pub const CAPTURE_UNCONFIRMED: &str = "budget invocation capture could not be confirmed";
pub const CANCEL_UNCONFIRMED: &str = "captured budget cancellation could not be confirmed";
pub const PRE_DISPATCH_CLEANUP_UNCONFIRMED: &str = "pre-dispatch cleanup could not be confirmed";
pub const PREFLIGHT_CLEANUP_UNCONFIRMED: &str =
    "execution nonce preflight cleanup could not be confirmed";
pub const AUTHORIZE_UNCONFIRMED: &str = "budget authorization could not be confirmed";
pub const PAYMENT_UNCONFIRMED: &str = "payment authorization could not be confirmed";
pub const ALREADY_CAPTURED: &str =
    "this request's budget hold was already captured; retry with a fresh request_id";
pub const CAPTURED_BY_ANOTHER_ATTEMPT: &str =
    "another attempt of this request owns the budget capture";
pub const TERMINALLY_REVERSED: &str =
    "this request's budget hold was already released; retry with a fresh request_id";
pub const BUDGET_UNAVAILABLE: &str = "budget authority unavailable";
pub const NONCE_REQUIRED: &str =
    "execution nonce required: retry the same request with the attached nonce";
pub const DISPATCH_DEADLINE: &str =
    "tool call exceeded its dispatch deadline; the tool may have run, so budget and payment are retained";
/// Prefix of every denial for a missing, stale or wrong proof of possession; nothing was
/// written to the cluster for such a call.
pub const POSSESSION_REJECTED: &str = "proof of possession rejected";
