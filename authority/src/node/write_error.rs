//! How a write can fail at the node, before any ledger decision: the distinction docs/spec.md §10
//! cares about is whether the command may have been proposed.

use serde::{Deserialize, Serialize};

use crate::raft::types::NodeId;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum WriteError {
    /// Definite: nothing was proposed (no leader, or this node could not reach it before
    /// sending). The client may try another node; `leader` names the one to try.
    #[error("unavailable: {reason}")]
    Unavailable {
        leader: Option<(NodeId, String)>,
        reason: String,
    },
    /// Indefinite: the command was proposed or forwarded and its fate is unknown (deadline,
    /// leadership lost, entry discarded, transport error after sending). Resolve it.
    #[error("outcome unknown: {reason}")]
    Unknown { reason: String },
    /// Refused before proposing: too many commands, or a command clients may not send.
    #[error("invalid: {reason}")]
    Invalid { reason: String },
    /// A node fault (storage, fatal Raft error).
    #[error("internal: {reason}")]
    Internal { reason: String },
}
