//! Cluster alarms (docs/spec.md §5.6), raised and cleared only through the log so that every
//! replica refuses alike from the same entry on. Today there is one kind, `NoSpace`: a node
//! whose disk runs short has it raised, and while it is raised the ledger refuses commands
//! that open new exposure. Alarms are replicated state: they are in the router snapshot and
//! the state digest.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use tally_ledger::LogPosition;

/// At most this many alarms are kept (one per kind and node). A cluster has at most a few
/// members, so the bound is never reached in practice; a raise beyond it is dropped, which
/// loses only the naming (the kind is already raised by another node).
pub const MAX_ALARMS: usize = 64;
/// A raise's reason is cut to this many bytes, so an entry and the snapshot stay small.
pub const MAX_ALARM_REASON_BYTES: usize = 512;

/// Append variants at the end: the log keeps every alarm ever raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AlarmKind {
    /// A node is short of disk: commands that open new exposure are refused.
    NoSpace,
}

impl AlarmKind {
    /// The stable snake_case name, for the wire, the CLI and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSpace => "no_space",
        }
    }

    /// Every kind, for parsing names back and for metrics.
    pub const ALL: [AlarmKind; 1] = [AlarmKind::NoSpace];

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for AlarmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one `Alarm` log entry does. Append variants at the end and never change one's payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AlarmChange {
    /// `node_id` has the alarm raised, saying why. A raise of an alarm already raised by the
    /// same node keeps the first one (its reason and position): raising is idempotent, so a
    /// node re-raising at every check adds nothing.
    Raise {
        kind: AlarmKind,
        node_id: u64,
        reason: String,
    },
    /// An operator clears the alarm: for one node, or (`None`) for every node.
    Clear {
        kind: AlarmKind,
        node_id: Option<u64>,
    },
}

impl AlarmChange {
    /// A raise with its reason cut to `MAX_ALARM_REASON_BYTES`.
    pub fn raise(kind: AlarmKind, node_id: u64, reason: &str) -> Self {
        Self::Raise {
            kind,
            node_id,
            reason: truncated(reason).to_owned(),
        }
    }
}

impl fmt::Display for AlarmChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Raise {
                kind,
                node_id,
                reason,
            } => write!(f, "raise {kind} for node {node_id}: {reason}"),
            Self::Clear {
                kind,
                node_id: Some(node_id),
            } => write!(f, "clear {kind} for node {node_id}"),
            Self::Clear {
                kind,
                node_id: None,
            } => write!(f, "clear {kind} for every node"),
        }
    }
}

fn truncated(reason: &str) -> &str {
    tally_api::text::bounded(reason, MAX_ALARM_REASON_BYTES)
}

/// One raised alarm: why, and the entry that raised it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaisedAlarm {
    pub reason: String,
    pub raised_at: LogPosition,
    /// Cluster time of the raising entry.
    pub raised_at_ms: u64,
}

/// The raised alarms, by kind and node, in that order (an ordered map, so equal states
/// encode to equal bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alarms {
    raised: BTreeMap<(AlarmKind, u64), RaisedAlarm>,
}

impl Alarms {
    pub fn is_empty(&self) -> bool {
        self.raised.is_empty()
    }

    /// Whether `NoSpace` is raised by any node: the ledger's `ApplyCtx::no_space`.
    pub fn no_space(&self) -> bool {
        self.is_raised(AlarmKind::NoSpace)
    }

    pub fn is_raised(&self, kind: AlarmKind) -> bool {
        self.raised.keys().any(|(raised, _)| *raised == kind)
    }

    /// Every raised alarm: kind, node, and the raise.
    pub fn iter(&self) -> impl Iterator<Item = (AlarmKind, u64, &RaisedAlarm)> {
        self.raised
            .iter()
            .map(|((kind, node_id), alarm)| (*kind, *node_id, alarm))
    }

    pub fn len(&self) -> usize {
        self.raised.len()
    }

    /// Applies a committed change at `at` (cluster time `now_ms`). Deterministic: every
    /// replica reaches the same alarms from the same entries.
    pub fn apply(&mut self, change: &AlarmChange, at: LogPosition, now_ms: u64) {
        match change {
            AlarmChange::Raise {
                kind,
                node_id,
                reason,
            } => {
                let key = (*kind, *node_id);
                if self.raised.contains_key(&key) || self.raised.len() >= MAX_ALARMS {
                    return;
                }
                self.raised.insert(
                    key,
                    RaisedAlarm {
                        reason: truncated(reason).to_owned(),
                        raised_at: at,
                        raised_at_ms: now_ms,
                    },
                );
            }
            AlarmChange::Clear { kind, node_id } => self.raised.retain(|(raised, node), _| {
                *raised != *kind || node_id.is_some_and(|only| only != *node)
            }),
        }
        assert!(
            self.raised.len() <= MAX_ALARMS,
            "{} alarms kept, at most {MAX_ALARMS}",
            self.raised.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(index: u64) -> LogPosition {
        LogPosition { term: 1, index }
    }

    #[test]
    fn raising_is_idempotent_and_clearing_takes_one_node_or_all() {
        let mut alarms = Alarms::default();
        assert!(!alarms.no_space());
        alarms.apply(
            &AlarmChange::raise(AlarmKind::NoSpace, 2, "first"),
            at(1),
            10,
        );
        alarms.apply(
            &AlarmChange::raise(AlarmKind::NoSpace, 2, "again"),
            at(2),
            20,
        );
        alarms.apply(
            &AlarmChange::raise(AlarmKind::NoSpace, 3, "other"),
            at(3),
            30,
        );
        assert!(alarms.no_space());
        let raised: Vec<_> = alarms
            .iter()
            .map(|(_, node, a)| (node, a.reason.clone()))
            .collect();
        assert_eq!(raised, [(2, "first".to_owned()), (3, "other".to_owned())]);
        alarms.apply(
            &AlarmChange::Clear {
                kind: AlarmKind::NoSpace,
                node_id: Some(2),
            },
            at(4),
            40,
        );
        assert_eq!(alarms.len(), 1);
        assert!(alarms.no_space(), "node 3's alarm is still raised");
        alarms.apply(
            &AlarmChange::Clear {
                kind: AlarmKind::NoSpace,
                node_id: None,
            },
            at(5),
            50,
        );
        assert!(alarms.is_empty());
    }

    #[test]
    fn reasons_and_counts_are_bounded() {
        let long = "é".repeat(MAX_ALARM_REASON_BYTES);
        let AlarmChange::Raise { reason, .. } = AlarmChange::raise(AlarmKind::NoSpace, 1, &long)
        else {
            panic!("a raise");
        };
        assert!(reason.len() <= MAX_ALARM_REASON_BYTES);
        let mut alarms = Alarms::default();
        for node in 0..(MAX_ALARMS as u64 + 5) {
            alarms.apply(
                &AlarmChange::raise(AlarmKind::NoSpace, node, "x"),
                at(node + 1),
                0,
            );
        }
        assert_eq!(alarms.len(), MAX_ALARMS);
        assert_eq!(AlarmKind::parse("no_space"), Some(AlarmKind::NoSpace));
    }
}
