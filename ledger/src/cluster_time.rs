//! Cluster time (docs/spec.md §6): the leader's stamp, clamped so it never goes back and one bad
//! clock cannot leap it forward. And the replicated parameters, with the ranges a change must
//! stay within.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::error::LedgerError;
use crate::region::validate_preferred_leader_regions;

const SECOND_MS: u64 = 1_000;
const DAY_MS: u64 = 86_400_000;

/// `retention_ms` may be set to 1 s ..= 365 days. Below a second a replay of a command still in
/// flight could miss its full event; beyond a year memory grows with no use (docs/spec.md §5.5).
pub const RETENTION_MS: RangeInclusive<u64> = SECOND_MS..=365 * DAY_MS;

/// `max_clock_step_ms` may be set to 1 s ..= 10 min. Below a second a busy leader's honest
/// stamps would be clamped and cluster time would fall behind; beyond ten minutes one bad clock
/// could expire every hold at once (docs/spec.md §6).
pub const MAX_CLOCK_STEP_MS: RangeInclusive<u64> = SECOND_MS..=600 * SECOND_MS;

/// The rules every release applied before rules were versioned: a log replayed from its
/// first entry, and a state from an older release, start here.
pub const LEGACY_RULES: u32 = 1;

/// The newest rules this release applies. Version 2: a denied authorize's claim on its
/// `hold_id` leaves memory with its command's compact row (docs/spec.md §5.5).
pub const CURRENT_RULES: u32 = 2;

/// Replicated parameters: changed only through the log, so every replica compacts alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterParams {
    /// How long after `not_after_ms` a full event (and a terminal hold) stays in memory.
    pub retention_ms: u64,
    /// The most cluster time may advance in one log entry.
    pub max_clock_step_ms: u64,
    /// Which version of the rules that decide what leaves memory applies. Raised only through
    /// the log (once every member runs a release that knows the new rules), so every replica
    /// switches at the same entry. Last, and left out of the encoding at the legacy version,
    /// so a state that never raised it encodes as before versions existed.
    #[serde(default = "legacy_rules", skip_serializing_if = "is_legacy_rules")]
    pub rules_version: u32,
}

fn legacy_rules() -> u32 {
    LEGACY_RULES
}

fn is_legacy_rules(version: &u32) -> bool {
    *version == LEGACY_RULES
}

impl ClusterParams {
    /// Version 2: a denied authorize's claim leaves memory with its command.
    pub fn denied_claims_leave_memory(&self) -> bool {
        self.rules_version >= 2
    }
}

/// The parameters a log starts with. The legacy rules, not the current ones: a log written by
/// an older release replays to the same state on every replica only if it replays under the
/// rules that wrote it; a new cluster's leader raises them through the log.
impl Default for ClusterParams {
    fn default() -> Self {
        Self {
            retention_ms: 24 * 3_600_000,
            max_clock_step_ms: 10_000,
            rules_version: LEGACY_RULES,
        }
    }
}

/// A change of the named parameters; `None` keeps the value in force. The log carries the
/// change, not the resulting struct, and it is applied on top of the parameters in force when
/// its entry applies: two changes of different fields proposed at once both hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ParamsChange {
    pub retention_ms: Option<u64>,
    pub max_clock_step_ms: Option<u64>,
    /// The ordered regions the leader should be in (`Some(vec![])` clears the preference).
    /// Not a budget rule, so it is not part of [`ClusterParams`] (which every command's
    /// `ApplyCtx` copies): the authority keeps it beside them. Last, and left out of the
    /// encoding when unnamed, so a change of the other fields encodes as before it existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preferred_leader_regions: Option<Vec<String>>,
}

impl ParamsChange {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Refuses an empty change and any named value outside its range, naming the field and
    /// the range. Checked before proposing; an entry applies what it carries, so a log
    /// written before these ranges existed replays unchanged.
    pub fn validate(&self) -> Result<(), LedgerError> {
        if self.is_empty() {
            return Err(LedgerError::invalid(
                "params",
                "name at least one parameter to change (retention_ms, max_clock_step_ms, \
                 preferred_leader_regions)",
            ));
        }
        check("retention_ms", self.retention_ms, &RETENTION_MS)?;
        check(
            "max_clock_step_ms",
            self.max_clock_step_ms,
            &MAX_CLOCK_STEP_MS,
        )?;
        match &self.preferred_leader_regions {
            Some(regions) => validate_preferred_leader_regions(regions),
            None => Ok(()),
        }
    }

    /// The parameters after this change: unnamed fields keep their value in `current`.
    pub fn apply_to(&self, current: ClusterParams) -> ClusterParams {
        ClusterParams {
            retention_ms: self.retention_ms.unwrap_or(current.retention_ms),
            max_clock_step_ms: self.max_clock_step_ms.unwrap_or(current.max_clock_step_ms),
            rules_version: current.rules_version,
        }
    }
}

/// A whole parameter struct is the change that names every field (what the log carried
/// before changes were named field by field).
impl From<ClusterParams> for ParamsChange {
    fn from(params: ClusterParams) -> Self {
        Self {
            retention_ms: Some(params.retention_ms),
            max_clock_step_ms: Some(params.max_clock_step_ms),
            preferred_leader_regions: None,
        }
    }
}

fn check(field: &str, value: Option<u64>, range: &RangeInclusive<u64>) -> Result<(), LedgerError> {
    match value {
        Some(value) if !range.contains(&value) => Err(LedgerError::invalid(
            field,
            format!(
                "must be within {}..={} ms, got {value}",
                range.start(),
                range.end()
            ),
        )),
        _ => Ok(()),
    }
}

/// `max(previous, min(stamped, previous + max_step))`; the first stamp (previous = 0)
/// bootstraps the clock.
pub fn advance(previous_ms: u64, stamped_ms: u64, max_step_ms: u64) -> u64 {
    if previous_ms == 0 {
        return stamped_ms;
    }
    previous_ms.max(stamped_ms.min(previous_ms.saturating_add(max_step_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_goes_back_and_never_leaps() {
        assert_eq!(advance(0, 1_000_000, 10_000), 1_000_000);
        assert_eq!(advance(1_000_000, 999_000, 10_000), 1_000_000);
        assert_eq!(advance(1_000_000, 1_005_000, 10_000), 1_005_000);
        assert_eq!(advance(1_000_000, 9_000_000, 10_000), 1_010_000);
        assert_eq!(advance(u64::MAX - 1, u64::MAX, 10_000), u64::MAX);
    }

    #[test]
    fn a_change_keeps_unnamed_fields_and_a_whole_struct_names_every_field() {
        let current = ClusterParams::default();
        let retention = ParamsChange {
            retention_ms: Some(3_600_000),
            ..ParamsChange::default()
        };
        let step = ParamsChange {
            max_clock_step_ms: Some(5_000),
            ..ParamsChange::default()
        };
        let both = step.apply_to(retention.apply_to(current));
        assert_eq!(both.retention_ms, 3_600_000);
        assert_eq!(both.max_clock_step_ms, 5_000);
        assert_eq!(retention.apply_to(step.apply_to(current)), both);
        let whole = ClusterParams {
            retention_ms: 7,
            max_clock_step_ms: u64::MAX,
            rules_version: LEGACY_RULES,
        };
        assert_eq!(ParamsChange::from(whole).apply_to(current), whole);
    }

    #[test]
    fn out_of_range_and_empty_changes_are_refused_naming_the_field_and_range() {
        let refused = |change: ParamsChange| match change.validate() {
            Err(LedgerError::InvalidArgument { field, reason }) => format!("{field} {reason}"),
            other => panic!("{change:?} must be refused, got {other:?}"),
        };
        assert!(refused(ParamsChange::default()).starts_with("params "));
        for bad in [0, 999, 365 * DAY_MS + 1, u64::MAX] {
            let message = refused(ParamsChange {
                retention_ms: Some(bad),
                ..ParamsChange::default()
            });
            assert_eq!(
                message,
                format!("retention_ms must be within 1000..=31536000000 ms, got {bad}")
            );
        }
        for bad in [0, 999, 600_001, u64::MAX] {
            let message = refused(ParamsChange {
                max_clock_step_ms: Some(bad),
                ..ParamsChange::default()
            });
            assert_eq!(
                message,
                format!("max_clock_step_ms must be within 1000..=600000 ms, got {bad}")
            );
        }
        for (retention, step) in [(1_000, 1_000), (365 * DAY_MS, 600_000)] {
            let change = ParamsChange {
                retention_ms: Some(retention),
                max_clock_step_ms: Some(step),
                preferred_leader_regions: None,
            };
            assert_eq!(change.validate(), Ok(()));
        }
        assert_eq!(
            ParamsChange::from(ClusterParams::default()).validate(),
            Ok(())
        );
        let regions = |regions: &[&str]| ParamsChange {
            preferred_leader_regions: Some(regions.iter().map(|r| (*r).to_owned()).collect()),
            ..ParamsChange::default()
        };
        assert_eq!(regions(&[]).validate(), Ok(()), "clearing is a change");
        assert_eq!(regions(&["eu-west", "us-east"]).validate(), Ok(()));
        assert_eq!(
            refused(regions(&["eu-west", "eu-west"])),
            "preferred_leader_regions region \"eu-west\" is named twice"
        );
    }

    /// A change that names no region encodes byte for byte as before the field existed, so
    /// entries and digests of such changes are unchanged; old bytes decode with it unnamed.
    #[test]
    fn a_change_without_regions_encodes_as_before_regions_existed() {
        #[derive(Serialize)]
        struct BeforeRegions {
            retention_ms: Option<u64>,
            max_clock_step_ms: Option<u64>,
        }
        let old = BeforeRegions {
            retention_ms: Some(3_600_000),
            max_clock_step_ms: None,
        };
        let old_bytes = rmp_serde::to_vec(&old).expect("encodes");
        let change = ParamsChange {
            retention_ms: Some(3_600_000),
            ..ParamsChange::default()
        };
        assert_eq!(rmp_serde::to_vec(&change).expect("encodes"), old_bytes);
        let decoded: ParamsChange = rmp_serde::from_slice(&old_bytes).expect("decodes");
        assert_eq!(decoded, change);
        let with_regions = ParamsChange {
            preferred_leader_regions: Some(vec!["eu-west".to_owned()]),
            ..change
        };
        let bytes = rmp_serde::to_vec(&with_regions).expect("encodes");
        let decoded: ParamsChange = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(decoded, with_regions);
    }
}
