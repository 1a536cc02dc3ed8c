//! The one place where every outcome of a request becomes a gRPC reply (docs/spec.md §10): a
//! decision is OK and definite; ledger errors, node-level write failures and malformed input
//! become an `ErrorDetail` and, through `tally_api::status`, a status with the
//! `tally-outcome` trailer and the leader hint.

use tally_api::pb;
use tally_api::status::Definiteness;
use tally_api::WireError;
use tally_ledger::{Decision, EventId, LedgerError, LogPosition};
use tonic::{Response, Status};

use crate::node::write_error::WriteError;

/// Why a request produced no decision.
#[derive(Debug)]
pub enum Failure {
    /// The ledger refused (validation, conflict, precondition, overflow): definite.
    Ledger(LedgerError),
    /// The node could not get an answer (unavailable, unknown, internal).
    Write(WriteError),
    /// The request itself was malformed: definite, nothing proposed.
    Wire(WireError),
}

impl From<LedgerError> for Failure {
    fn from(error: LedgerError) -> Self {
        Self::Ledger(error)
    }
}

impl From<WriteError> for Failure {
    fn from(error: WriteError) -> Self {
        Self::Write(error)
    }
}

impl From<WireError> for Failure {
    fn from(error: WireError) -> Self {
        Self::Wire(error)
    }
}

/// The error detail of `failure`, naming `event_id` when the command had one.
pub fn failure_detail(failure: &Failure, event_id: Option<&EventId>) -> pb::ErrorDetail {
    let detail = match failure {
        Failure::Ledger(error) => pb::ErrorDetail::from(error),
        Failure::Wire(error) => pb::ErrorDetail::from(error),
        Failure::Write(WriteError::Invalid { reason }) => {
            pb::ErrorDetail::from(&LedgerError::invalid("request", reason.clone()))
        }
        Failure::Write(WriteError::Unavailable { leader, reason }) => pb::ErrorDetail::unavailable(
            leader.as_ref().map(|(id, _)| *id),
            leader
                .as_ref()
                .map(|(_, address)| address.as_str())
                .filter(|a| !a.is_empty()),
            reason.clone(),
        ),
        Failure::Write(WriteError::Unknown { reason }) => match event_id {
            Some(event_id) => pb::ErrorDetail::unknown(event_id, reason.clone()),
            None => pb::ErrorDetail::unknown(&EventId::new(""), reason.clone()),
        },
        Failure::Write(WriteError::Internal { reason }) => {
            pb::ErrorDetail::internal(reason.clone())
        }
    };
    match event_id {
        Some(event_id) => detail.with_event_id(event_id),
        None => detail,
    }
}

pub fn failure_status(failure: Failure, event_id: Option<&EventId>) -> Status {
    Status::from(failure_detail(&failure, event_id))
}

/// What every decision is stamped with (docs/spec.md §6).
#[derive(Clone, Debug)]
pub struct Stamp {
    pub cluster_id: String,
    /// The entry that carried the command, for decisions that name no event of their own.
    pub entry: LogPosition,
}

pub fn decision_message(decision: &Decision, stamp: &Stamp) -> pb::Decision {
    let log_id = decision.log_id.unwrap_or(stamp.entry);
    let mut message = pb::Decision::from(decision);
    message.cluster = Some(pb::ClusterStamp::raft_linearizable(
        stamp.cluster_id.clone(),
        log_id.term,
        log_id.index,
    ));
    message
}

/// An OK reply, marked definite.
pub fn definite<T>(message: T) -> Response<T> {
    let mut response = Response::new(message);
    Definiteness::Definite.insert_into(response.metadata_mut());
    response
}
