//! The `ConsumeNonce` command for a nonce presented with a request. Its event id names the
//! attempt, so a second attempt (on this node or another) is a new command that the cluster
//! refuses as `NonceReplayed`, never a replay that would look like success.

use tally_ledger::{AttemptId, ClientCommand, CommandHeader, EventId, Operation};

use super::SignedExecutionNonce;

pub fn consume_event_id(nonce: &SignedExecutionNonce, attempt_id: &AttemptId) -> EventId {
    EventId::new(format!(
        "nonce:{}:consume:{attempt_id}",
        nonce.nonce.nonce_id
    ))
}

/// `header` names the family and account the request's hold is on; its event id is replaced.
pub fn consume_command(
    mut header: CommandHeader,
    nonce: &SignedExecutionNonce,
    attempt_id: &AttemptId,
) -> ClientCommand {
    header.event_id = consume_event_id(nonce, attempt_id);
    ClientCommand {
        header,
        op: Operation::ConsumeNonce {
            nonce_id: nonce.nonce.nonce_id.clone(),
            expires_at_ms: nonce.nonce.expires_at_ms,
        },
    }
}
