//! Raft payloads on the wire: rmp-serde bytes behind a version byte, so openraft's types need
//! no protobuf twin and a node meeting a newer format fails with a typed error instead of
//! misreading it (docs/architecture.md, "Wire").

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::WireError;
use crate::pb;

/// The format this node writes and the only one it reads.
pub const RAFT_WIRE_VERSION: u8 = 1;

/// The version byte followed by the compact rmp-serde encoding of `value`.
pub fn encode_raft<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, WireError> {
    let mut out = vec![RAFT_WIRE_VERSION];
    rmp_serde::encode::write(&mut out, value).map_err(|e| WireError::Payload {
        reason: format!("encode: {e}"),
    })?;
    Ok(out)
}

/// Reads what `encode_raft` wrote; any other version is refused.
pub fn decode_raft<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    let (&version, body) = bytes
        .split_first()
        .ok_or_else(|| WireError::missing("payload"))?;
    if version != RAFT_WIRE_VERSION {
        return Err(WireError::UnknownVersion {
            found: version,
            expected: RAFT_WIRE_VERSION,
        });
    }
    rmp_serde::from_slice(body).map_err(|e| WireError::Payload {
        reason: format!("decode: {e}"),
    })
}

impl pb::RaftBytes {
    /// Wraps `value` as a versioned payload.
    pub fn from_value<T: Serialize + ?Sized>(value: &T) -> Result<Self, WireError> {
        Ok(Self {
            payload: encode_raft(value)?.into(),
        })
    }

    /// Unwraps a versioned payload.
    pub fn to_value<T: DeserializeOwned>(&self) -> Result<T, WireError> {
        decode_raft(&self.payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_ledger::{ClientCommand, Command, CommandHeader, Operation};

    fn command() -> Command {
        Command::Apply(ClientCommand {
            header: CommandHeader {
                family_id: "fam".into(),
                capability_id: "cap".into(),
                grant_index: 2,
                event_id: "ev".into(),
                not_after_ms: 9,
            },
            op: Operation::CancelCapturedBeforeDispatch {
                hold_id: "h".into(),
            },
        })
    }

    #[test]
    fn round_trips_through_raft_bytes() {
        let bytes = pb::RaftBytes::from_value(&command()).expect("encode");
        assert_eq!(bytes.payload[0], RAFT_WIRE_VERSION);
        assert_eq!(bytes.to_value::<Command>().expect("decode"), command());
    }

    #[test]
    fn unknown_version_is_a_typed_error() {
        let mut bytes = encode_raft(&command()).expect("encode");
        bytes[0] = 2;
        assert_eq!(
            decode_raft::<Command>(&bytes),
            Err(WireError::UnknownVersion {
                found: 2,
                expected: RAFT_WIRE_VERSION
            })
        );
    }

    #[test]
    fn empty_and_garbage_payloads_are_refused() {
        assert_eq!(
            decode_raft::<Command>(&[]),
            Err(WireError::missing("payload"))
        );
        assert!(matches!(
            decode_raft::<Command>(&[RAFT_WIRE_VERSION, 0xc1]),
            Err(WireError::Payload { .. })
        ));
    }
}
