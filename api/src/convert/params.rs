//! Replicated cluster parameters (docs/spec.md §5.5, §6), changed only through the log.

use tally_ledger::ClusterParams;

use crate::pb;

impl From<ClusterParams> for pb::ClusterParams {
    fn from(params: ClusterParams) -> Self {
        Self {
            retention_ms: params.retention_ms,
            max_clock_step_ms: params.max_clock_step_ms,
        }
    }
}

impl From<pb::ClusterParams> for ClusterParams {
    fn from(params: pb::ClusterParams) -> Self {
        Self {
            retention_ms: params.retention_ms,
            max_clock_step_ms: params.max_clock_step_ms,
        }
    }
}

impl pb::SetParamsRequest {
    /// The parameters after this request: unset fields keep their current value.
    pub fn apply_to(&self, current: ClusterParams) -> ClusterParams {
        ClusterParams {
            retention_ms: self.retention_ms.unwrap_or(current.retention_ms),
            max_clock_step_ms: self.max_clock_step_ms.unwrap_or(current.max_clock_step_ms),
        }
    }
}
