//! docs/spec.md §9's deterministic ids: pure functions of the request, so every kernel node (and
//! every retry) names the same hold and the same events.

use tally_ledger::{BudgetCommitIndex, CapabilityId, EventId, HoldId};

/// Kernels refuse longer request ids (docs/spec.md §9).
pub const MAX_REQUEST_ID_BYTES: usize = 128;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("request_id is {0} bytes; at most {MAX_REQUEST_ID_BYTES} allowed")]
pub struct RequestIdTooLong(pub usize);

pub fn hold_id(
    request_id: &str,
    capability_id: &CapabilityId,
    grant_index: u32,
) -> Result<HoldId, RequestIdTooLong> {
    if request_id.len() > MAX_REQUEST_ID_BYTES {
        return Err(RequestIdTooLong(request_id.len()));
    }
    Ok(HoldId::new(format!(
        "budget-hold:{request_id}:{capability_id}:{grant_index}"
    )))
}

pub fn authorize_event(hold: &HoldId) -> EventId {
    EventId::new(format!("{hold}:authorize"))
}

pub fn capture_event(hold: &HoldId, authorize_index: BudgetCommitIndex) -> EventId {
    EventId::new(format!("{hold}:capture-invocation:{authorize_index}"))
}

pub fn rollback_event(hold: &HoldId, authorize_index: BudgetCommitIndex) -> EventId {
    EventId::new(format!("{hold}:authorize:rollback:{authorize_index}"))
}

pub fn cancel_event(hold: &HoldId, authorize_index: BudgetCommitIndex) -> EventId {
    EventId::new(format!("{hold}:cancel-captured:{authorize_index}"))
}

pub fn reconcile_event(hold: &HoldId) -> EventId {
    EventId::new(format!("{hold}:reconcile"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_spec_section_9() {
        let hold = hold_id("req-1", &"cap".into(), 2).expect("short id");
        assert_eq!(hold.as_str(), "budget-hold:req-1:cap:2");
        let index = BudgetCommitIndex::new(5, 1, 0);
        assert_eq!(
            capture_event(&hold, index).as_str(),
            format!("budget-hold:req-1:cap:2:capture-invocation:{}", index.0)
        );
        assert_eq!(
            cancel_event(&hold, index).as_str(),
            format!("budget-hold:req-1:cap:2:cancel-captured:{}", index.0)
        );
        assert_eq!(
            rollback_event(&hold, index).as_str(),
            format!("budget-hold:req-1:cap:2:authorize:rollback:{}", index.0)
        );
        assert_eq!(
            authorize_event(&hold).as_str(),
            "budget-hold:req-1:cap:2:authorize"
        );
        assert_eq!(
            reconcile_event(&hold).as_str(),
            "budget-hold:req-1:cap:2:reconcile"
        );
    }

    #[test]
    fn long_request_ids_are_refused() {
        assert_eq!(
            hold_id(&"r".repeat(129), &"cap".into(), 0),
            Err(RequestIdTooLong(129))
        );
        assert!(hold_id(&"r".repeat(128), &"cap".into(), 0).is_ok());
    }
}
