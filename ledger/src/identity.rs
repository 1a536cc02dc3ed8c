//! Canonical command identity (SPEC.md §5.1): what makes two commands "the same command".
//! Not part of it: `attempt_id`, `hold_timeout_ms`, `not_after_ms`, a nonce's expiry.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::command::{ClientCommand, Operation};
use crate::ids::AttemptId;

/// A client command with everything outside its identity blanked and ancestors sorted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity(ClientCommand);

/// What the dedupe table keeps of an identity: all of it while the event is retained, its
/// digest after compaction (SPEC.md §5.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredIdentity {
    Full(Box<Identity>),
    Digest(#[serde(with = "serde_bytes_array")] [u8; 32]),
}

impl Identity {
    pub fn of(command: &ClientCommand) -> Self {
        let mut normalized = command.clone();
        normalized.header.not_after_ms = 0;
        match &mut normalized.op {
            Operation::AuthorizeHold {
                ancestors,
                hold_timeout_ms,
                ..
            } => {
                ancestors.sort_by(|a, b| a.account.cmp(&b.account));
                *hold_timeout_ms = None;
            }
            Operation::CaptureInvocation { attempt_id, .. } => *attempt_id = AttemptId::new(""),
            Operation::ConsumeNonce { expires_at_ms, .. } => *expires_at_ms = 0,
            _ => {}
        }
        Self(normalized)
    }

    /// Every identity field by name, with a canonical rendering of its value.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let h = &self.0.header;
        let mut fields = vec![
            ("kind", self.0.op.name().to_owned()),
            ("family_id", h.family_id.to_string()),
            ("capability_id", h.capability_id.to_string()),
            ("grant_index", h.grant_index.to_string()),
            ("event_id", h.event_id.to_string()),
        ];
        let hold = |id: &crate::ids::HoldId| ("hold_id", id.to_string());
        match &self.0.op {
            Operation::AuthorizeHold {
                hold_id,
                requested_exposure_units,
                limits,
                ancestors,
                ..
            } => {
                fields.push(hold(hold_id));
                fields.push((
                    "requested_exposure_units",
                    requested_exposure_units.to_string(),
                ));
                fields.push(("currency", format!("{:?}", limits.currency)));
                fields.push(("limits", limits_text(limits)));
                fields.push(("ancestors", format!("{ancestors:?}")));
            }
            Operation::CaptureInvocation { hold_id, .. }
            | Operation::CancelCapturedBeforeDispatch { hold_id } => fields.push(hold(hold_id)),
            Operation::ReverseHold {
                hold_id,
                exposure_units,
            } => {
                fields.push(hold(hold_id));
                fields.push(("exposure_units", exposure_units.to_string()));
            }
            Operation::ReleaseHold {
                hold_id,
                released_exposure_units,
            } => {
                fields.push(hold(hold_id));
                fields.push((
                    "released_exposure_units",
                    released_exposure_units.to_string(),
                ));
            }
            Operation::ReconcileHold {
                hold_id,
                exposed_cost_units,
                realized_spend_units,
            } => {
                fields.push(hold(hold_id));
                fields.push(("exposed_cost_units", exposed_cost_units.to_string()));
                fields.push(("realized_spend_units", realized_spend_units.to_string()));
            }
            Operation::TryIncrement { limits } => {
                fields.push(("currency", format!("{:?}", limits.currency)));
                fields.push(("limits", limits_text(limits)));
            }
            Operation::TryChargeCost { cost_units, limits } => {
                fields.push(("cost_units", cost_units.to_string()));
                fields.push(("currency", format!("{:?}", limits.currency)));
                fields.push(("limits", limits_text(limits)));
            }
            Operation::ReverseChargeCost { cost_units }
            | Operation::ReduceChargeCost { cost_units } => {
                fields.push(("cost_units", cost_units.to_string()))
            }
            Operation::SettleChargeCost {
                exposed_cost_units,
                realized_spend_units,
            } => {
                fields.push(("exposed_cost_units", exposed_cost_units.to_string()));
                fields.push(("realized_spend_units", realized_spend_units.to_string()));
            }
            Operation::ConsumeNonce { nonce_id, .. } => {
                fields.push(("nonce_id", nonce_id.to_string()))
            }
        }
        fields
    }

    /// Names of the fields that differ; a differing kind makes every other field moot.
    pub fn differing_fields(&self, other: &Identity) -> Vec<String> {
        if self.0.op.name() != other.0.op.name() {
            return vec!["kind".to_owned()];
        }
        self.fields()
            .into_iter()
            .zip(other.fields())
            .filter(|(a, b)| a.1 != b.1)
            .map(|(a, _)| a.0.to_owned())
            .collect()
    }

    /// SHA-256 of the canonical msgpack encoding of the normalized command.
    pub fn digest(&self) -> [u8; 32] {
        // Streamed into the hasher: the same bytes as `rmp_serde::to_vec`, without the heap buffer.
        let mut hasher = HashWriter::new();
        rmp_serde::encode::write(&mut hasher, &self.0).expect("a command always encodes");
        hasher.finish()
    }
}

/// Feeds encoded bytes into SHA-256 through a stack buffer: the encoder writes a marker or a
/// field at a time, and one hasher update per small write costs more than the hashing.
struct HashWriter {
    hasher: Sha256,
    buf: [u8; 256],
    len: usize,
}

impl HashWriter {
    fn new() -> Self {
        Self {
            hasher: Sha256::new(),
            buf: [0; 256],
            len: 0,
        }
    }

    fn finish(mut self) -> [u8; 32] {
        self.hasher.update(&self.buf[..self.len]);
        self.hasher.finalize().into()
    }
}

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.len + bytes.len() > self.buf.len() {
            self.hasher.update(&self.buf[..self.len]);
            self.len = 0;
            if bytes.len() > self.buf.len() {
                self.hasher.update(bytes);
                return Ok(bytes.len());
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn limits_text(limits: &crate::account::GrantLimits) -> String {
    format!(
        "max_invocations={:?} max_cost_per_invocation_units={:?} max_total_cost_units={:?}",
        limits.max_invocations, limits.max_cost_per_invocation_units, limits.max_total_cost_units
    )
}

impl StoredIdentity {
    /// `Ok(())` when `candidate` is the same command, else the differing field names.
    pub fn compare(&self, candidate: &Identity) -> Result<(), Vec<String>> {
        match self {
            Self::Full(stored) => {
                let differing = stored.differing_fields(candidate);
                if differing.is_empty() {
                    Ok(())
                } else {
                    Err(differing)
                }
            }
            Self::Digest(digest) if *digest == candidate.digest() => Ok(()),
            Self::Digest(_) => Err(vec!["identity".to_owned()]),
        }
    }

    pub fn compacted(&self) -> Self {
        match self {
            Self::Full(identity) => Self::Digest(identity.digest()),
            Self::Digest(digest) => Self::Digest(*digest),
        }
    }
}

/// Fixed-size digests as msgpack binary, not as an array of 32 integers.
mod serde_bytes_array {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8; 32], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<[u8; 32], D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(deserializer)?;
        <[u8; 32]>::try_from(bytes.as_slice())
            .map_err(|_| serde::de::Error::invalid_length(bytes.len(), &"32 bytes"))
    }
}
