//! The router's own replicated scalars: the last applied log id, cluster time, the cluster
//! parameters and the raised alarms. Every replica advances them identically from the log
//! alone.

use serde::{Deserialize, Serialize};
use tally_ledger::cluster_time::advance;
use tally_ledger::{ClusterParams, LogPosition};

use super::alarms::Alarms;
use super::entry::{EntryInput, EntryPayload};
use super::error::RouterError;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterState {
    pub last_applied: Option<LogPosition>,
    /// Milliseconds; 0 until the first entry bootstraps the clock.
    pub cluster_time_ms: u64,
    pub params: ClusterParams,
    /// The raised alarms (docs/spec.md §5.6). Last, and left out of the encoding while none
    /// is raised: a state without alarms encodes (and digests) exactly as before alarms
    /// existed, and a snapshot written before them decodes with none.
    #[serde(default, skip_serializing_if = "Alarms::is_empty")]
    pub alarms: Alarms,
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
        self.last_applied = Some(entry.log_id);
        self.cluster_time_ms = advance(
            self.cluster_time_ms,
            entry.stamped_ms,
            self.params.max_clock_step_ms,
        );
        match &entry.payload {
            EntryPayload::SetParams(change) => self.params = change.apply_to(self.params),
            EntryPayload::Alarm(change) => {
                self.alarms
                    .apply(change, entry.log_id, self.cluster_time_ms)
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
    use tally_ledger::{ClusterParams, LogPosition};

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
}
