//! Journal records and `GetEvent`'s lookup (docs/spec.md §4, §7). Event kinds travel as the
//! snake_case strings docs/spec.md §4 names, so logs, metrics and the wire read alike.

use tally_ledger::{
    AccountImage, BudgetCommitIndex, Decision, EventKind, EventLookup, EventRecord, HoldStates,
};

use super::{optional_into, repeated_into, required, required_into};
use crate::error::WireError;
use crate::pb;

/// Parses a wire event kind (`"reserve_invocation"`, ...).
pub fn event_kind(name: &str) -> Result<EventKind, WireError> {
    EventKind::all()
        .into_iter()
        .find(|kind| kind.as_str() == name)
        .ok_or_else(|| WireError::invalid("kind", format!("unknown event kind {name:?}")))
}

impl From<&AccountImage> for pb::AccountImage {
    fn from(image: &AccountImage) -> Self {
        Self {
            key: Some((&image.key).into()),
            account: Some((&image.account).into()),
        }
    }
}

impl TryFrom<pb::AccountImage> for AccountImage {
    type Error = WireError;

    fn try_from(image: pb::AccountImage) -> Result<Self, WireError> {
        Ok(Self {
            key: required(image.key, "key")?.into(),
            account: required_into(image.account, "account")?,
        })
    }
}

impl From<&EventRecord> for pb::EventRecord {
    fn from(record: &EventRecord) -> Self {
        Self {
            event_id: record.event_id.to_string(),
            kind: record.kind.as_str().to_owned(),
            commit_index: record.commit_index.0,
            log_id: Some(record.log_id.into()),
            at_ms: record.at_ms,
            capability_id: record.capability_id.to_string(),
            grant_index: record.grant_index,
            hold_id: record.hold_id.as_ref().map(ToString::to_string),
            attempt_id: record.attempt_id.as_ref().map(ToString::to_string),
            nonce_id: record.nonce_id.as_ref().map(ToString::to_string),
            allowed: record.allowed,
            deny_reason: record.deny_reason.as_ref().map(Into::into),
            exposure_units: record.exposure_units,
            realized_units: record.realized_units,
            limits: record.limits.as_ref().map(Into::into),
            hold_before: record.hold_before.map(Into::into),
            hold_after: record.hold_after.map(Into::into),
            after_images: record.after_images.iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<pb::EventRecord> for EventRecord {
    type Error = WireError;

    fn try_from(record: pb::EventRecord) -> Result<Self, WireError> {
        Ok(Self {
            event_id: record.event_id.into(),
            kind: event_kind(&record.kind)?,
            commit_index: BudgetCommitIndex(record.commit_index),
            log_id: required(record.log_id, "log_id")?.into(),
            at_ms: record.at_ms,
            capability_id: record.capability_id.into(),
            grant_index: record.grant_index,
            hold_id: record.hold_id.map(Into::into),
            attempt_id: record.attempt_id.map(Into::into),
            nonce_id: record.nonce_id.map(Into::into),
            allowed: record.allowed,
            deny_reason: optional_into(record.deny_reason, "deny_reason")?,
            exposure_units: record.exposure_units,
            realized_units: record.realized_units,
            limits: record.limits.map(Into::into),
            hold_before: optional_into::<_, HoldStates>(record.hold_before, "hold_before")?,
            hold_after: optional_into::<_, HoldStates>(record.hold_after, "hold_after")?,
            after_images: repeated_into(record.after_images, "after_images")?,
        })
    }
}

impl From<&EventLookup> for pb::EventLookup {
    fn from(lookup: &EventLookup) -> Self {
        use pb::event_lookup::Lookup;
        let lookup = match lookup {
            EventLookup::Applied { decision, record } => Lookup::Applied(pb::AppliedEvent {
                decision: Some(decision.into()),
                record: record.as_ref().map(Into::into),
            }),
            EventLookup::Tombstoned => Lookup::Tombstoned(pb::Tombstoned {}),
            EventLookup::Unknown => Lookup::Unknown(pb::UnknownEvent {}),
        };
        Self {
            lookup: Some(lookup),
        }
    }
}

/// A missing lookup is an error, never `Unknown`: reading "no answer" as "not applied" is the
/// mistake docs/spec.md §7 forbids, so the wire must say which it is.
impl TryFrom<pb::EventLookup> for EventLookup {
    type Error = WireError;

    fn try_from(lookup: pb::EventLookup) -> Result<Self, WireError> {
        use pb::event_lookup::Lookup;
        Ok(match required(lookup.lookup, "lookup")? {
            Lookup::Applied(applied) => EventLookup::Applied {
                decision: required_into::<_, Decision>(applied.decision, "applied.decision")?,
                record: optional_into(applied.record, "applied.record")?,
            },
            Lookup::Tombstoned(pb::Tombstoned {}) => EventLookup::Tombstoned,
            Lookup::Unknown(pb::UnknownEvent {}) => EventLookup::Unknown,
        })
    }
}

impl pb::ListEventsReply {
    pub fn from_records(records: &[EventRecord]) -> Self {
        Self {
            events: records.iter().map(Into::into).collect(),
        }
    }

    pub fn into_records(self) -> Result<Vec<EventRecord>, WireError> {
        repeated_into(self.events, "events")
    }
}
