//! The router's own replicated scalars: the last applied log id, cluster time, the cluster
//! parameters, the raised alarms and the preferred leader regions. Every replica advances
//! them identically from the log alone.

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use tally_ledger::cluster_time::advance;
use tally_ledger::{ClusterParams, LogPosition, CURRENT_RULES};

use super::alarms::Alarms;
use super::entry::{EntryInput, EntryPayload};
use super::error::RouterError;

/// Encoded as a msgpack array (see the `Serialize` impl below for which trailing fields are
/// left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct RouterState {
    pub last_applied: Option<LogPosition>,
    /// Milliseconds; 0 until the first entry bootstraps the clock.
    pub cluster_time_ms: u64,
    pub params: ClusterParams,
    /// The raised alarms (docs/spec.md §5.6). Left out of the encoding while none is raised
    /// and no leader region is preferred: such a state encodes (and digests) exactly as before
    /// alarms existed, and a snapshot written before them decodes with none.
    #[serde(default)]
    pub alarms: Alarms,
    /// The regions the cluster prefers its leader in, best first; empty: no preference. Last,
    /// and left out of the encoding while empty, so a state without a preference encodes as
    /// before the preference existed.
    #[serde(default)]
    pub preferred_leader_regions: Vec<String>,
}

/// The fields in order, leaving out the trailing ones that hold nothing. In the array
/// encoding a field can only be left out when every field after it is too, so the alarms are
/// written (empty) whenever a preference follows them.
impl Serialize for RouterState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let with_regions = !self.preferred_leader_regions.is_empty();
        let with_alarms = with_regions || !self.alarms.is_empty();
        let len = 3 + usize::from(with_alarms) + usize::from(with_regions);
        let mut state = serializer.serialize_struct("RouterState", len)?;
        state.serialize_field("last_applied", &self.last_applied)?;
        state.serialize_field("cluster_time_ms", &self.cluster_time_ms)?;
        state.serialize_field("params", &self.params)?;
        if with_alarms {
            state.serialize_field("alarms", &self.alarms)?;
        } else {
            state.skip_field("alarms")?;
        }
        if with_regions {
            state.serialize_field("preferred_leader_regions", &self.preferred_leader_regions)?;
        } else {
            state.skip_field("preferred_leader_regions")?;
        }
        state.end()
    }
}

impl RouterState {
    /// Takes an entry into account: checks log order, clamps its stamp into cluster time
    /// (with the parameters in force *before* the entry) and applies a parameter change.
    /// Returns the cluster time the entry's commands apply at.
    pub fn enter(&mut self, entry: &EntryInput) -> Result<u64, RouterError> {
        if let Some(last) = self.last_applied {
            if entry.log_id.index <= last.index {
                return Err(RouterError::LogOrder {
                    last,
                    got: entry.log_id,
                });
            }
        }
        if let EntryPayload::RaiseRules(version) = &entry.payload {
            if *version > CURRENT_RULES {
                return Err(RouterError::RulesUnknown {
                    at: entry.log_id,
                    version: *version,
                    supported: CURRENT_RULES,
                });
            }
        }
        self.last_applied = Some(entry.log_id);
        self.cluster_time_ms = advance(
            self.cluster_time_ms,
            entry.stamped_ms,
            self.params.max_clock_step_ms,
        );
        match &entry.payload {
            EntryPayload::SetParams(change) => {
                self.params = change.apply_to(self.params);
                if let Some(regions) = &change.preferred_leader_regions {
                    self.preferred_leader_regions.clone_from(regions);
                }
            }
            EntryPayload::Alarm(change) => {
                self.alarms
                    .apply(change, entry.log_id, self.cluster_time_ms)
            }
            EntryPayload::RaiseRules(version) => {
                self.params.raise_rules(*version);
            }
            EntryPayload::Blank | EntryPayload::Commands(_) => {}
        }
        Ok(self.cluster_time_ms)
    }

    pub fn last_applied_index(&self) -> u64 {
        self.last_applied.map_or(0, |id| id.index)
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;
    use tally_ledger::{ClusterParams, LogPosition, ParamsChange};

    use super::RouterState;
    use crate::families::alarms::{AlarmChange, AlarmKind};
    use crate::families::entry::{EntryInput, EntryPayload};

    /// `RouterState` as it was before alarms existed (snapshot format version 1).
    #[derive(Serialize)]
    struct BeforeAlarms {
        last_applied: Option<LogPosition>,
        cluster_time_ms: u64,
        params: ClusterParams,
    }

    /// With no alarm raised the state encodes (and so digests) byte for byte as before
    /// alarms existed, and such bytes decode with none; a raised alarm is encoded and kept.
    #[test]
    fn a_state_without_alarms_encodes_as_before_and_a_raised_one_round_trips() {
        let mut state = RouterState::default();
        state
            .enter(&EntryInput {
                log_id: LogPosition { term: 1, index: 1 },
                stamped_ms: 1_000,
                payload: EntryPayload::Blank,
            })
            .expect("in order");
        let old = BeforeAlarms {
            last_applied: state.last_applied,
            cluster_time_ms: state.cluster_time_ms,
            params: state.params,
        };
        let old_bytes = rmp_serde::to_vec(&old).expect("encodes");
        assert_eq!(rmp_serde::to_vec(&state).expect("encodes"), old_bytes);
        let decoded: RouterState = rmp_serde::from_slice(&old_bytes).expect("decodes");
        assert_eq!(decoded, state);

        state
            .enter(&EntryInput {
                log_id: LogPosition { term: 1, index: 2 },
                stamped_ms: 2_000,
                payload: EntryPayload::Alarm(AlarmChange::raise(AlarmKind::NoSpace, 3, "full")),
            })
            .expect("in order");
        assert!(state.alarms.no_space());
        let bytes = rmp_serde::to_vec(&state).expect("encodes");
        assert_ne!(bytes, old_bytes);
        let decoded: RouterState = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(decoded, state);
    }

    /// A preference set through the log is kept, survives the encoding with or without
    /// alarms, and a later change of another field leaves it alone; clearing empties it and
    /// the state encodes as before the preference existed.
    #[test]
    fn a_preference_applies_from_the_log_and_round_trips_with_or_without_alarms() {
        let mut state = RouterState::default();
        let mut index = 0;
        let mut enter = |state: &mut RouterState, payload: EntryPayload| {
            index += 1;
            state
                .enter(&EntryInput {
                    log_id: LogPosition { term: 1, index },
                    stamped_ms: 1_000 * index,
                    payload,
                })
                .expect("in order");
        };
        let regions = |r: &[&str]| ParamsChange {
            preferred_leader_regions: Some(r.iter().map(|r| (*r).to_owned()).collect()),
            ..ParamsChange::default()
        };
        enter(&mut state, EntryPayload::Blank);
        let without = rmp_serde::to_vec(&state).expect("encodes");
        enter(
            &mut state,
            EntryPayload::SetParams(regions(&["eu-west", "us-east"])),
        );
        assert_eq!(state.preferred_leader_regions, ["eu-west", "us-east"]);
        let retention = ParamsChange {
            retention_ms: Some(3_600_000),
            ..ParamsChange::default()
        };
        enter(&mut state, EntryPayload::SetParams(retention));
        assert_eq!(state.preferred_leader_regions, ["eu-west", "us-east"]);
        assert_eq!(state.params.retention_ms, 3_600_000);
        let bytes = rmp_serde::to_vec(&state).expect("encodes");
        let decoded: RouterState = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(decoded, state);

        enter(
            &mut state,
            EntryPayload::Alarm(AlarmChange::raise(AlarmKind::NoSpace, 3, "full")),
        );
        let bytes = rmp_serde::to_vec(&state).expect("encodes");
        let decoded: RouterState = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(decoded, state);

        enter(&mut state, EntryPayload::SetParams(regions(&[])));
        assert!(state.preferred_leader_regions.is_empty());
        state.alarms = Default::default();
        let cleared = rmp_serde::to_vec(&state).expect("encodes");
        // A msgpack array of 3: the fields that existed before alarms and preferences.
        assert_eq!((without[0], cleared[0]), (0x93, 0x93));
        let decoded: RouterState = rmp_serde::from_slice(&cleared).expect("decodes");
        assert_eq!(decoded, state);
    }

    /// The rules rise through the log and never fall; a version this release does not know
    /// stops the node rather than apply on under older rules. A state at the legacy rules
    /// encodes as before versions existed; a raised one round-trips.
    #[test]
    fn rules_rise_through_the_log_and_an_unknown_version_is_fatal() {
        use tally_ledger::{CURRENT_RULES, LEGACY_RULES};

        let entry = |index: u64, payload: EntryPayload| EntryInput {
            log_id: LogPosition { term: 1, index },
            stamped_ms: 1_000 * index,
            payload,
        };
        let mut state = RouterState::default();
        assert_eq!(state.params.rules_version, LEGACY_RULES);
        state
            .enter(&entry(1, EntryPayload::Blank))
            .expect("in order");
        let legacy = BeforeAlarms {
            last_applied: state.last_applied,
            cluster_time_ms: state.cluster_time_ms,
            params: ClusterParams {
                rules_version: LEGACY_RULES,
                ..state.params
            },
        };
        assert_eq!(
            rmp_serde::to_vec(&state).expect("encodes"),
            rmp_serde::to_vec(&legacy).expect("encodes")
        );
        let params_before =
            rmp_serde::to_vec(&(state.params.retention_ms, state.params.max_clock_step_ms))
                .expect("encodes");
        assert_eq!(
            rmp_serde::to_vec(&state.params).expect("encodes"),
            params_before,
            "legacy parameters encode as the two fields they had"
        );

        state
            .enter(&entry(2, EntryPayload::RaiseRules(CURRENT_RULES)))
            .expect("known rules");
        assert_eq!(state.params.rules_version, CURRENT_RULES);
        state
            .enter(&entry(3, EntryPayload::RaiseRules(LEGACY_RULES)))
            .expect("an older version is no change");
        assert_eq!(state.params.rules_version, CURRENT_RULES, "never lowered");
        let bytes = rmp_serde::to_vec(&state).expect("encodes");
        let decoded: RouterState = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(decoded, state);

        let unknown = state.enter(&entry(4, EntryPayload::RaiseRules(CURRENT_RULES + 1)));
        let error = unknown.expect_err("a version newer than this release");
        assert!(error.is_fatal(), "{error}");
        assert!(error.to_string().contains("upgrade this node"), "{error}");
        assert_eq!(
            state.last_applied_index(),
            3,
            "the refused entry changed nothing"
        );
    }
}
