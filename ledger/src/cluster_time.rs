//! Cluster time (docs/spec.md §6): the leader's stamp, clamped so it never goes back and one bad
//! clock cannot leap it forward. And the replicated parameters, with the ranges a change must
//! stay within.

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::error::LedgerError;
use crate::limits::{MAX_COMPACTIONS_PER_CLIENT_COMMAND, MAX_COMPACTIONS_PER_COMMAND};
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
/// `hold_id` leaves memory with its command's compact row (docs/spec.md §5.5). Version 3: an
/// item waiting for compaction falls due at its keep-until time plus the retention in force
/// when it is popped, so a lowered retention compacts what was queued before it too.
pub const CURRENT_RULES: u32 = 3;

/// The first rules version under which a retention change moves every queued item's due time.
const RETENTION_FOLLOWS_CHANGES: u32 = 3;

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
    /// From rules version 3: the retention the compaction queues' keys count in, fixed to the
    /// retention in force when version 3 was raised. A key is `keep_until_ms` plus it, so
    /// items queued under version 2 (whose keys are their due times under that retention)
    /// keep their keys, the order of keys is the order of due times under any retention, and
    /// a retention change moves every item's due time without touching the queue. `None`
    /// before version 3, and then left out of the encoding (last, after `rules_version`,
    /// which is encoded whenever this is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyed_retention_ms: Option<u64>,
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

    /// Raises the rules to `version` (never lowers them). Crossing into version 3 fixes the
    /// queues' key retention to the retention in force, which every queued key was computed
    /// with unless retention changed within the last retention window: those few keep the
    /// due time they had, as they would have under version 2.
    pub fn raise_rules(&mut self, version: u32) {
        if self.rules_version < RETENTION_FOLLOWS_CHANGES && version >= RETENTION_FOLLOWS_CHANGES {
            self.keyed_retention_ms = Some(self.retention_ms);
        }
        self.rules_version = self.rules_version.max(version);
    }

    /// These parameters with the rules raised to `version`, as the log would raise them.
    pub fn at_rules(mut self, version: u32) -> Self {
        self.raise_rules(version);
        self
    }

    /// The compaction key of an item kept until `keep_until_ms` and then for the retention.
    pub fn compaction_key(&self, keep_until_ms: u64) -> u64 {
        match self.keyed_retention() {
            Some(keyed_ms) => keep_until_ms.saturating_add(keyed_ms),
            None => keep_until_ms.saturating_add(self.retention_ms),
        }
    }

    /// The compaction key of an item due at `due_ms` whatever the retention (a nonce's
    /// expiry). Under version 3 a later lower retention makes it due early; its compaction
    /// then queues it again (`compaction.rs`). Never due before `due_ms`: a key that would be
    /// negative is 0, which falls due later than `due_ms`.
    pub fn compaction_key_at(&self, due_ms: u64) -> u64 {
        clamp_ms(i128::from(due_ms) + self.key_minus_due_ms())
    }

    /// How many compaction steps may follow one command: `maintenance` for the leader's
    /// `ExpireHolds`. From rules version 3 a client command does fewer.
    pub fn max_compactions(&self, maintenance: bool) -> usize {
        if maintenance || self.rules_version < RETENTION_FOLLOWS_CHANGES {
            MAX_COMPACTIONS_PER_COMMAND
        } else {
            MAX_COMPACTIONS_PER_CLIENT_COMMAND
        }
    }

    /// How much earlier every item waiting for compaction falls due after the parameters go
    /// from `self` to `after`: the retention lowered by, from rules version 3, else 0.
    pub fn compaction_brought_forward_ms(&self, after: &ClusterParams) -> u64 {
        if after.rules_version < RETENTION_FOLLOWS_CHANGES {
            return 0;
        }
        self.retention_ms.saturating_sub(after.retention_ms)
    }

    /// When an item with compaction key `key` falls due under the retention in force.
    pub fn compaction_due_ms(&self, key: u64) -> u64 {
        clamp_ms(i128::from(key) - self.key_minus_due_ms())
    }

    /// Keys below this are due at `now_ms` (an item is due once cluster time is past its due
    /// time); `None` when nothing can be, because every key's due time is after `now_ms`.
    pub fn compaction_horizon(&self, now_ms: u64) -> Option<u64> {
        let horizon = i128::from(now_ms) + self.key_minus_due_ms();
        (horizon >= 0).then(|| clamp_ms(horizon))
    }

    /// A key less its due time under the retention in force: the key retention less the
    /// retention from version 3, 0 before (keys are due times).
    fn key_minus_due_ms(&self) -> i128 {
        self.keyed_retention().map_or(0, |keyed_ms| {
            i128::from(keyed_ms) - i128::from(self.retention_ms)
        })
    }

    fn keyed_retention(&self) -> Option<u64> {
        if self.rules_version < RETENTION_FOLLOWS_CHANGES {
            return None;
        }
        let keyed_ms = self.keyed_retention_ms;
        assert!(
            keyed_ms.is_some(),
            "rules version {} raised without fixing the queues' key retention",
            self.rules_version
        );
        keyed_ms
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
            keyed_retention_ms: None,
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
            keyed_retention_ms: current.keyed_retention_ms,
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

/// `ms` within `0..=u64::MAX`.
fn clamp_ms(ms: i128) -> u64 {
    u64::try_from(ms.max(0)).unwrap_or(u64::MAX)
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
            keyed_retention_ms: None,
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

    /// Under version 3 a key's due time follows the retention in force: raised, everything
    /// falls due later; lowered, earlier, by the same amount. Before it, keys are due times.
    /// A state at version 2 encodes as before version 3 existed.
    #[test]
    fn from_rules_version_3_due_times_follow_the_retention_in_force() {
        let mut params = ClusterParams {
            rules_version: 2,
            ..ClusterParams::default()
        };
        let day_ms = 24 * 3_600_000;
        let now_ms = 5 * day_ms;
        assert_eq!(params.compaction_key(now_ms), now_ms + day_ms);
        assert_eq!(params.compaction_horizon(now_ms), Some(now_ms));
        let before_v3 = rmp_serde::to_vec(&params).expect("encodes");
        params.raise_rules(3);
        assert_eq!(params.keyed_retention_ms, Some(day_ms));
        assert_eq!(params.compaction_key(now_ms), now_ms + day_ms, "same keys");
        assert_eq!(params.compaction_due_ms(now_ms + day_ms), now_ms + day_ms);
        params.retention_ms = 10_000;
        let key = params.compaction_key(now_ms);
        assert_eq!(params.compaction_due_ms(key), now_ms + 10_000);
        assert_eq!(params.compaction_horizon(now_ms + 10_001), Some(key + 1));
        assert_eq!(params.compaction_key_at(now_ms), now_ms + day_ms - 10_000);
        assert_eq!(
            params.compaction_due_ms(params.compaction_key_at(now_ms)),
            now_ms
        );
        params.retention_ms = 2 * day_ms;
        assert_eq!(params.compaction_due_ms(key), now_ms + 2 * day_ms);
        assert_eq!(
            params.compaction_horizon(day_ms - 1),
            None,
            "nothing due yet"
        );
        assert_eq!(params.compaction_key_at(day_ms - 1), 0, "never due early");
        assert_eq!(params.compaction_due_ms(0), day_ms);
        params.raise_rules(2);
        assert_eq!(
            (params.rules_version, params.keyed_retention_ms),
            (3, Some(day_ms))
        );
        let raised = rmp_serde::to_vec(&params).expect("encodes");
        let decoded: ClusterParams = rmp_serde::from_slice(&raised).expect("decodes");
        assert_eq!(decoded, params);
        let v2: ClusterParams = rmp_serde::from_slice(&before_v3).expect("decodes");
        assert_eq!((v2.rules_version, v2.keyed_retention_ms), (2, None));
        assert_eq!(before_v3.len() + 5, raised.len(), "one u32 field more");
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
