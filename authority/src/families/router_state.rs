//! The router's own replicated scalars: the last applied log id, cluster time and the
//! cluster parameters. Every replica advances them identically from the log alone.

use serde::{Deserialize, Serialize};
use tally_ledger::cluster_time::advance;
use tally_ledger::{ClusterParams, LogPosition};

use super::entry::{EntryInput, EntryPayload};
use super::error::RouterError;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterState {
    pub last_applied: Option<LogPosition>,
    /// Milliseconds; 0 until the first entry bootstraps the clock.
    pub cluster_time_ms: u64,
    pub params: ClusterParams,
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
        if let EntryPayload::SetParams(change) = &entry.payload {
            self.params = change.apply_to(self.params);
        }
        Ok(self.cluster_time_ms)
    }

    pub fn last_applied_index(&self) -> u64 {
        self.last_applied.map_or(0, |id| id.index)
    }
}
