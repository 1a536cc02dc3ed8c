//! Checks a receipt's story against the cluster journal: every event the receipt names with a
//! commit index must be applied at exactly that index, and every event it calls ambiguous must
//! by now be resolvable (applied or tombstoned). The lookup is a trait so the caller decides
//! how to reach the journal: an async caller fetches [`event_refs`] first, then passes a map.

use std::collections::BTreeMap;

use serde_json::Value;
use tally_ledger::{BudgetCommitIndex, EventId, EventLookup};

use super::model::Receipt;

/// How a receipt checker reads the cluster journal (`GetEvent`, docs/spec.md §7).
pub trait JournalLookup {
    fn lookup_event(&self, event_id: &EventId) -> EventLookup;
}

impl<F: Fn(&EventId) -> EventLookup> JournalLookup for F {
    fn lookup_event(&self, event_id: &EventId) -> EventLookup {
        self(event_id)
    }
}

/// Pre-fetched answers; an event not in the map is `Unknown`.
impl JournalLookup for BTreeMap<EventId, EventLookup> {
    fn lookup_event(&self, event_id: &EventId) -> EventLookup {
        self.get(event_id).cloned().unwrap_or(EventLookup::Unknown)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventClaim {
    Committed(BudgetCommitIndex),
    Ambiguous,
}

/// One event a receipt names, and where in the metadata it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRef {
    /// e.g. `budget_authority.invocation_capture`.
    pub path: String,
    pub event_id: EventId,
    pub claim: EventClaim,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalResolution {
    Applied(Option<BudgetCommitIndex>),
    Tombstoned,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedEvent {
    pub event: EventRef,
    pub resolution: JournalResolution,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CrossCheckError {
    #[error("receipt metadata at {path}: {detail}")]
    Malformed { path: String, detail: String },
    #[error("event {event_id}: receipt says commit index {receipt}, journal says {journal:?}")]
    WrongCommitIndex {
        event_id: EventId,
        receipt: u64,
        journal: Option<u64>,
    },
    #[error("event {event_id}: receipt says committed, journal says {found}")]
    NotApplied {
        event_id: EventId,
        found: &'static str,
    },
    #[error("event {event_id}: receipt says ambiguous and the journal cannot resolve it yet")]
    Unresolved { event_id: EventId },
}

/// Every event `metadata` names: each object under `budget_authority` with an `event_id`, and
/// `execution_nonce` if it has one.
pub fn event_refs(metadata: &Value) -> Result<Vec<EventRef>, CrossCheckError> {
    let mut refs = Vec::new();
    if let Some(budget) = metadata.get("budget_authority") {
        let steps = budget
            .as_object()
            .ok_or_else(|| CrossCheckError::Malformed {
                path: "budget_authority".into(),
                detail: "not an object".into(),
            })?;
        for (key, step) in steps {
            if step.get("event_id").is_some() {
                refs.push(event_ref(format!("budget_authority.{key}"), step)?);
            }
        }
    }
    if let Some(nonce) = metadata.get("execution_nonce") {
        if nonce.get("event_id").is_some() {
            refs.push(event_ref("execution_nonce".into(), nonce)?);
        }
    }
    Ok(refs)
}

fn event_ref(path: String, step: &Value) -> Result<EventRef, CrossCheckError> {
    let malformed = |detail: &str| CrossCheckError::Malformed {
        path: path.clone(),
        detail: detail.into(),
    };
    let event_id = step
        .get("event_id")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("event_id is not a string"))?;
    let ambiguous = step.as_object().is_some_and(|fields| {
        fields
            .iter()
            .any(|(key, value)| key.ends_with("_ambiguous") && value == &Value::Bool(true))
    });
    let index = match step.get("budget_commit_index") {
        None => None,
        Some(value) => Some(
            value
                .as_u64()
                .ok_or_else(|| malformed("budget_commit_index is not an integer"))?,
        ),
    };
    let claim = match (index, ambiguous) {
        (Some(index), false) => EventClaim::Committed(BudgetCommitIndex(index)),
        (None, true) => EventClaim::Ambiguous,
        (Some(_), true) => return Err(malformed("an ambiguous event carries a commit index")),
        (None, false) => return Err(malformed("neither a commit index nor an ambiguity flag")),
    };
    Ok(EventRef {
        path,
        event_id: EventId::new(event_id),
        claim,
    })
}

/// Checks every event `receipt` names against `journal`; returns how each one resolved.
pub fn cross_check(
    receipt: &Receipt,
    journal: &impl JournalLookup,
) -> Result<Vec<CheckedEvent>, CrossCheckError> {
    event_refs(&receipt.metadata)?
        .into_iter()
        .map(|event| {
            let resolution = check_one(&event, journal.lookup_event(&event.event_id))?;
            Ok(CheckedEvent { event, resolution })
        })
        .collect()
}

fn check_one(event: &EventRef, found: EventLookup) -> Result<JournalResolution, CrossCheckError> {
    let event_id = event.event_id.clone();
    match (event.claim, found) {
        (EventClaim::Committed(index), EventLookup::Applied { decision, .. }) => {
            if decision.commit_index != Some(index) {
                return Err(CrossCheckError::WrongCommitIndex {
                    event_id,
                    receipt: index.0,
                    journal: decision.commit_index.map(|i| i.0),
                });
            }
            Ok(JournalResolution::Applied(Some(index)))
        }
        (EventClaim::Committed(_), EventLookup::Tombstoned) => Err(CrossCheckError::NotApplied {
            event_id,
            found: "tombstoned",
        }),
        (EventClaim::Committed(_), EventLookup::Unknown) => Err(CrossCheckError::NotApplied {
            event_id,
            found: "unknown",
        }),
        (EventClaim::Ambiguous, EventLookup::Applied { decision, .. }) => {
            Ok(JournalResolution::Applied(decision.commit_index))
        }
        (EventClaim::Ambiguous, EventLookup::Tombstoned) => Ok(JournalResolution::Tombstoned),
        (EventClaim::Ambiguous, EventLookup::Unknown) => {
            Err(CrossCheckError::Unresolved { event_id })
        }
    }
}

#[cfg(test)]
mod tests {
    use tally_ledger::{Decision, HoldId, Outcome};

    use super::*;
    use crate::keys::KeyPair;
    use crate::receipt::{
        BudgetAuthorityMetadata, BudgetStep, ReceiptDraft, ReceiptMetadata, Verdict,
    };

    fn applied(event_id: &EventId, index: BudgetCommitIndex) -> EventLookup {
        EventLookup::Applied {
            decision: Decision {
                event_id: event_id.clone(),
                outcome: Outcome::Incremented,
                commit_index: Some(index),
                log_id: None,
                replayed: false,
            },
            record: None,
        }
    }

    struct Fixture {
        receipt: Receipt,
        authorize: EventId,
        capture: EventId,
        authorize_index: BudgetCommitIndex,
    }

    /// A receipt with a committed authorize and an ambiguous capture.
    fn fixture() -> Fixture {
        let hold = HoldId::new("budget-hold:req-1:cap-1:0");
        let authorize = EventId::new(format!("{hold}:authorize"));
        let authorize_index = BudgetCommitIndex::new(9, 0, 0);
        let capture = EventId::new(format!("{hold}:capture-invocation:{}", authorize_index.0));
        let mut budget = BudgetAuthorityMetadata::new(hold);
        budget
            .committed(BudgetStep::Authorize, authorize.clone(), authorize_index)
            .ambiguous(BudgetStep::InvocationCapture, capture.clone());
        let metadata = ReceiptMetadata {
            budget_authority: Some(budget),
            ..ReceiptMetadata::default()
        };
        let receipt = ReceiptDraft::new("req-1", "cost-srv", "compute", Verdict::Deny, 1)
            .with_metadata(metadata.to_value())
            .sign(&KeyPair::from_seed(&[4; 32]))
            .expect("sign");
        Fixture {
            receipt,
            authorize,
            capture,
            authorize_index,
        }
    }

    #[test]
    fn a_consistent_receipt_passes_and_reports_resolutions() {
        let f = fixture();
        let mut journal = BTreeMap::new();
        journal.insert(
            f.authorize.clone(),
            applied(&f.authorize, f.authorize_index),
        );
        journal.insert(f.capture.clone(), EventLookup::Tombstoned);
        let checked = cross_check(&f.receipt, &journal).expect("consistent");
        assert_eq!(checked.len(), 2);
        let capture = checked
            .iter()
            .find(|c| c.event.event_id == f.capture)
            .expect("capture checked");
        assert_eq!(capture.resolution, JournalResolution::Tombstoned);
        assert_eq!(capture.event.claim, EventClaim::Ambiguous);
    }

    #[test]
    fn a_wrong_commit_index_is_caught() {
        let f = fixture();
        let wrong = BudgetCommitIndex::new(10, 0, 0);
        let lookup = |id: &EventId| {
            if id == &f.authorize {
                applied(id, wrong)
            } else {
                EventLookup::Tombstoned
            }
        };
        assert_eq!(
            cross_check(&f.receipt, &lookup),
            Err(CrossCheckError::WrongCommitIndex {
                event_id: f.authorize.clone(),
                receipt: f.authorize_index.0,
                journal: Some(wrong.0),
            })
        );
    }

    #[test]
    fn a_missing_event_is_caught() {
        let f = fixture();
        let only_capture = |id: &EventId| {
            if id == &f.capture {
                EventLookup::Tombstoned
            } else {
                EventLookup::Unknown
            }
        };
        assert_eq!(
            cross_check(&f.receipt, &only_capture),
            Err(CrossCheckError::NotApplied {
                event_id: f.authorize.clone(),
                found: "unknown",
            })
        );
        let tombstoned = |_: &EventId| EventLookup::Tombstoned;
        assert!(matches!(
            cross_check(&f.receipt, &tombstoned),
            Err(CrossCheckError::NotApplied {
                found: "tombstoned",
                ..
            })
        ));
    }

    #[test]
    fn an_unresolvable_ambiguous_event_is_reported() {
        let f = fixture();
        let mut journal = BTreeMap::new();
        journal.insert(
            f.authorize.clone(),
            applied(&f.authorize, f.authorize_index),
        );
        assert_eq!(
            cross_check(&f.receipt, &journal),
            Err(CrossCheckError::Unresolved {
                event_id: f.capture.clone()
            })
        );
    }

    #[test]
    fn contradictory_metadata_is_malformed() {
        let both = serde_json::json!({"budget_authority": {"authorize": {
            "event_id": "e", "budget_commit_index": 5, "authorize_ambiguous": true}}});
        assert!(matches!(
            event_refs(&both),
            Err(CrossCheckError::Malformed { .. })
        ));
        let neither = serde_json::json!({"budget_authority": {"authorize": {"event_id": "e"}}});
        assert!(matches!(
            event_refs(&neither),
            Err(CrossCheckError::Malformed { .. })
        ));
        let nonce =
            serde_json::json!({"execution_nonce": {"event_id": "n", "budget_commit_index": 3}});
        assert_eq!(
            event_refs(&nonce),
            Ok(vec![EventRef {
                path: "execution_nonce".into(),
                event_id: EventId::new("n"),
                claim: EventClaim::Committed(BudgetCommitIndex(3)),
            }])
        );
    }
}
