//! What a reconciler can read off a listed hold: the request behind it (the hold's family
//! comes with it in the list page).

use tally_ledger::Hold;

/// The `request_id` (the payment reference) of a pipeline hold
/// `budget-hold:{request_id}:{capability_id}:{grant_index}`.
pub fn request_id_of(hold: &Hold) -> Option<String> {
    let suffix = format!(":{}:{}", hold.capability_id, hold.grant_index);
    hold.hold_id
        .as_str()
        .strip_prefix("budget-hold:")?
        .strip_suffix(&suffix)
        .filter(|request_id| !request_id.is_empty())
        .map(str::to_owned)
}
