//! Replicated cluster parameters (docs/spec.md §5.5, §6), changed only through the log.

use tally_ledger::{ClusterParams, ParamsChange};

use crate::pb;

impl From<ClusterParams> for pb::ClusterParams {
    fn from(params: ClusterParams) -> Self {
        Self {
            retention_ms: params.retention_ms,
            max_clock_step_ms: params.max_clock_step_ms,
            // Kept beside the budget parameters by the authority, which fills them in.
            preferred_leader_regions: Vec::new(),
            rules_version: params.rules_version,
        }
    }
}

/// The fields a request names, and only those: the log carries this change and applies it on
/// top of the parameters in force at that point, so concurrent changes of different fields
/// both hold. Ranges are checked by `ParamsChange::validate`.
impl From<&pb::SetParamsRequest> for ParamsChange {
    fn from(request: &pb::SetParamsRequest) -> Self {
        Self {
            retention_ms: request.retention_ms,
            max_clock_step_ms: request.max_clock_step_ms,
            preferred_leader_regions: request
                .preferred_leader_regions
                .as_ref()
                .map(|list| list.regions.clone()),
        }
    }
}

impl From<&ParamsChange> for pb::SetParamsRequest {
    fn from(change: &ParamsChange) -> Self {
        Self {
            retention_ms: change.retention_ms,
            max_clock_step_ms: change.max_clock_step_ms,
            preferred_leader_regions: change.preferred_leader_regions.as_ref().map(|regions| {
                pb::RegionList {
                    regions: regions.clone(),
                }
            }),
        }
    }
}
