//! The one mapping from an error outcome to a gRPC status (docs/spec.md §10) and back. The
//! encoded `ErrorDetail` rides in the status details; the `tally-outcome` trailer and the
//! `x-tally-leader` hint ride in its metadata (sent as trailers on an error reply).

use prost::Message;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::convert::error::RemoteError;
use crate::error::WireError;
use crate::pb::{self, ErrorKind};
use crate::{LEADER_HEADER, OUTCOME_TRAILER};

/// The value of the `tally-outcome` trailer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Definiteness {
    /// Applied (a decision) or certainly not applied (a definite error).
    Definite,
    /// Maybe applied: retry the same event id or resolve it.
    Indefinite,
}

impl Definiteness {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Definite => "definite",
            Self::Indefinite => "indefinite",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "definite" => Some(Self::Definite),
            "indefinite" => Some(Self::Indefinite),
            _ => None,
        }
    }

    /// Sets the `tally-outcome` entry (a trailer on error replies; callers put it in the
    /// response metadata of a decision).
    pub fn insert_into(self, metadata: &mut MetadataMap) {
        metadata.insert(OUTCOME_TRAILER, MetadataValue::from_static(self.as_str()));
    }

    /// Reads the `tally-outcome` entry, if present and well formed.
    pub fn from_metadata(metadata: &MetadataMap) -> Option<Self> {
        metadata
            .get(OUTCOME_TRAILER)
            .and_then(|v| v.to_str().ok())
            .and_then(Self::parse)
    }
}

/// docs/spec.md §10's code for each error kind.
pub fn grpc_code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::Conflict => Code::AlreadyExists,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::Overflow => Code::OutOfRange,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Unknown => Code::Unknown,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::NoSpace => Code::ResourceExhausted,
        ErrorKind::Internal | ErrorKind::Unspecified => Code::Internal,
    }
}

impl From<pb::ErrorDetail> for Status {
    fn from(detail: pb::ErrorDetail) -> Self {
        let kind = ErrorKind::try_from(detail.kind).unwrap_or(ErrorKind::Internal);
        let mut message = format!("{}: {}", detail.reason, detail.message);
        if !detail.field.is_empty() {
            message = format!("{}: {} {}", detail.reason, detail.field, detail.message);
        }
        let mut metadata = MetadataMap::new();
        let definiteness = if detail.is_definite() {
            Definiteness::Definite
        } else {
            Definiteness::Indefinite
        };
        definiteness.insert_into(&mut metadata);
        if let Ok(leader) = detail.leader_address.parse::<MetadataValue<_>>() {
            if !detail.leader_address.is_empty() {
                metadata.insert(LEADER_HEADER, leader);
            }
        }
        Status::with_details_and_metadata(
            grpc_code(kind),
            message,
            detail.encode_to_vec().into(),
            metadata,
        )
    }
}

/// The Tally error detail a status carries.
pub fn error_detail(status: &Status) -> Result<pb::ErrorDetail, WireError> {
    if status.details().is_empty() {
        return Err(WireError::missing("details"));
    }
    pb::ErrorDetail::decode(status.details())
        .map_err(|e| WireError::invalid("details", format!("not an ErrorDetail: {e}")))
}

/// A status without a well-formed Tally detail came from the transport or a proxy, not
/// from the authority's mapping, so nothing is known about the command: `Transport`
/// (indefinite).
impl From<&Status> for RemoteError {
    fn from(status: &Status) -> Self {
        error_detail(status)
            .and_then(RemoteError::try_from)
            .unwrap_or_else(|_| RemoteError::Transport {
                code: status.code() as i32,
                message: status.message().to_owned(),
            })
    }
}

impl From<Status> for RemoteError {
    fn from(status: Status) -> Self {
        Self::from(&status)
    }
}

/// The leader named in a reply's `x-tally-leader` header: on an UNAVAILABLE error, or on a
/// write a follower answered by forwarding it.
pub fn leader_header(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata
        .get(LEADER_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|address| !address.is_empty())
        .map(str::to_owned)
}

/// The leader hint of an UNAVAILABLE reply, from the header or the detail.
pub fn leader_hint(status: &Status) -> Option<String> {
    leader_header(status.metadata()).or_else(|| {
        error_detail(status)
            .ok()
            .map(|d| d.leader_address)
            .filter(|address| !address.is_empty())
    })
}
