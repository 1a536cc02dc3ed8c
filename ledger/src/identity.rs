//! Canonical command identity (docs/spec.md §5.1): what makes two commands "the same command".
//! Not part of it: `attempt_id`, `hold_timeout_ms`, `not_after_ms`, a nonce's expiry.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::account::{AccountKey, GrantLimits};
use crate::command::{ClientCommand, Operation};
use crate::ids::AttemptId;
use crate::tables::identity_fields::{Field, FieldHasher, FieldHashes};

/// A client command with everything outside its identity blanked and ancestors sorted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity(ClientCommand);

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

    /// SHA-256 of the canonical identity encoding (see `digest_of`).
    pub fn digest(&self) -> [u8; 32] {
        digest_of(&self.0)
    }
}

/// Version of the identity encoding. Stored digests depend on it: a change to the encoding
/// must bump it (and needs a migration of stored digests).
const IDENTITY_ENCODING_VERSION: u8 = 1;

/// SHA-256 of `command`'s canonical identity (docs/spec.md §5.1), straight from the command: the
/// fields outside the identity are skipped and ancestors are visited sorted by account, so
/// this equals the digest of `Identity::of(command)` without building it.
///
/// The encoding is hand-written and fixed: a version byte, a one-byte operation code, then
/// the identity fields in a fixed order per operation. Integers are unsigned LEB128 of
/// minimal length (one value, one encoding); strings are their byte length then the bytes;
/// an `Option` is a `0` byte, or a `1` byte then the value; a list is its length then its
/// items. Every field boundary is therefore unambiguous, and equal identities (and only
/// those) encode to equal bytes. Short integers keep a typical command within one SHA-256
/// block. The `event_id` is not part of it: a digest is only ever compared with commands of
/// the same id.
pub(crate) fn digest_of(command: &ClientCommand) -> [u8; 32] {
    encode_identity(command, false).0
}

/// The identity digest of `command` and, from the same pass, the hash of each field's part of
/// the encoding (see `identity_fields.rs`).
pub(crate) fn identity_hashes(command: &ClientCommand) -> ([u8; 32], FieldHashes) {
    encode_identity(command, true)
}

/// Encodes the identity into SHA-256 and, when `with_fields`, into the per-field hashes.
fn encode_identity(command: &ClientCommand, with_fields: bool) -> ([u8; 32], FieldHashes) {
    let code = operation_code(&command.op);
    let mut out = HashWriter::new(code, with_fields);
    let h = &command.header;
    out.u8(IDENTITY_ENCODING_VERSION);
    out.u8(code);
    out.field(Field::FamilyId);
    out.str(h.family_id.as_str());
    out.field(Field::CapabilityId);
    out.str(h.capability_id.as_str());
    out.field(Field::GrantIndex);
    out.u32(h.grant_index);
    match &command.op {
        Operation::AuthorizeHold {
            hold_id,
            requested_exposure_units,
            limits,
            ancestors,
            hold_timeout_ms: _,
        } => {
            out.field(Field::HoldId);
            out.str(hold_id.as_str());
            out.field(Field::RequestedExposureUnits);
            out.u64(*requested_exposure_units);
            out.grant_limits(limits);
            out.field(Field::Ancestors);
            out.uint(ancestors.len() as u64);
            // Sorted by account like `Identity::of` (stably: position breaks ties), by picking
            // the next smallest each time: a handful of ancestors, no allocation.
            let mut previous: Option<(&AccountKey, usize)> = None;
            for _ in 0..ancestors.len() {
                let next = ancestors
                    .iter()
                    .enumerate()
                    .map(|(position, ancestor)| (&ancestor.account, position))
                    .filter(|candidate| previous.is_none_or(|p| *candidate > p))
                    .min()
                    .expect("one ancestor is left to visit");
                let ancestor = &ancestors[next.1];
                out.str(ancestor.account.capability_id.as_str());
                out.u32(ancestor.account.grant_index);
                out.limits(&ancestor.limits);
                previous = Some(next);
            }
        }
        Operation::CaptureInvocation {
            hold_id,
            attempt_id: _,
        }
        | Operation::CancelCapturedBeforeDispatch { hold_id } => {
            out.field(Field::HoldId);
            out.str(hold_id.as_str());
        }
        Operation::ReverseHold {
            hold_id,
            exposure_units,
        } => {
            out.field(Field::HoldId);
            out.str(hold_id.as_str());
            out.field(Field::ExposureUnits);
            out.u64(*exposure_units);
        }
        Operation::ReleaseHold {
            hold_id,
            released_exposure_units,
        } => {
            out.field(Field::HoldId);
            out.str(hold_id.as_str());
            out.field(Field::ReleasedExposureUnits);
            out.u64(*released_exposure_units);
        }
        Operation::ReconcileHold {
            hold_id,
            exposed_cost_units,
            realized_spend_units,
        } => {
            out.field(Field::HoldId);
            out.str(hold_id.as_str());
            out.field(Field::ExposedCostUnits);
            out.u64(*exposed_cost_units);
            out.field(Field::RealizedSpendUnits);
            out.u64(*realized_spend_units);
        }
        Operation::TryIncrement { limits } => out.grant_limits(limits),
        Operation::TryChargeCost { cost_units, limits } => {
            out.field(Field::CostUnits);
            out.u64(*cost_units);
            out.grant_limits(limits);
        }
        Operation::ReverseChargeCost { cost_units }
        | Operation::ReduceChargeCost { cost_units } => {
            out.field(Field::CostUnits);
            out.u64(*cost_units);
        }
        Operation::SettleChargeCost {
            exposed_cost_units,
            realized_spend_units,
        } => {
            out.field(Field::ExposedCostUnits);
            out.u64(*exposed_cost_units);
            out.field(Field::RealizedSpendUnits);
            out.u64(*realized_spend_units);
        }
        Operation::ConsumeNonce {
            nonce_id,
            expires_at_ms: _,
        } => {
            out.field(Field::NonceId);
            out.str(nonce_id.as_str());
        }
    }
    out.finish()
}

/// The operation's code in the identity encoding. Fixed for ever: never renumber.
fn operation_code(op: &Operation) -> u8 {
    match op {
        Operation::AuthorizeHold { .. } => 1,
        Operation::CaptureInvocation { .. } => 2,
        Operation::CancelCapturedBeforeDispatch { .. } => 3,
        Operation::ReverseHold { .. } => 4,
        Operation::ReleaseHold { .. } => 5,
        Operation::ReconcileHold { .. } => 6,
        Operation::TryIncrement { .. } => 7,
        Operation::TryChargeCost { .. } => 8,
        Operation::ReverseChargeCost { .. } => 9,
        Operation::ReduceChargeCost { .. } => 10,
        Operation::SettleChargeCost { .. } => 11,
        Operation::ConsumeNonce { .. } => 12,
    }
}

/// Bytes of encoding kept on the stack; a longer identity (long ids, many ancestors) moves to
/// the heap. Typical commands encode to about 100 bytes.
const INLINE_ENCODING_BYTES: usize = 256;

/// Builds the encoding in one contiguous buffer, noting where each field's bytes lie, then
/// hashes it once: SHA-256 over the whole, and each field's slice on its own (see
/// `identity_fields.rs`). One pass of plain stores, with no hashing between small writes.
struct HashWriter {
    inline: [u8; INLINE_ENCODING_BYTES],
    len: usize,
    /// The whole encoding, once it outgrew `inline`.
    spilled: Option<Vec<u8>>,
    fields: FieldHasher,
}

impl HashWriter {
    fn new(operation_code: u8, with_fields: bool) -> Self {
        Self {
            inline: [0; INLINE_ENCODING_BYTES],
            len: 0,
            spilled: None,
            fields: FieldHasher::new(operation_code, with_fields),
        }
    }

    /// What is written from now on belongs to `field`, and the field before it is complete
    /// (for the per-field hashes only: the digest's encoding has no field markers).
    #[inline]
    fn field(&mut self, field: Field) {
        let encoding = match &self.spilled {
            Some(spilled) => spilled.as_slice(),
            None => &self.inline[..self.len],
        };
        self.fields.begin(field, encoding);
    }

    #[inline(always)]
    fn bytes(&mut self, bytes: &[u8]) {
        if let Some(spilled) = &mut self.spilled {
            spilled.extend_from_slice(bytes);
        } else if let Some(room) = self.inline.get_mut(self.len..self.len + bytes.len()) {
            room.copy_from_slice(bytes);
            self.len += bytes.len();
        } else {
            let mut spilled = Vec::with_capacity(2 * (self.len + bytes.len()));
            spilled.extend_from_slice(&self.inline[..self.len]);
            spilled.extend_from_slice(bytes);
            self.spilled = Some(spilled);
        }
    }

    #[inline]
    fn u8(&mut self, value: u8) {
        self.bytes(&[value]);
    }

    /// Unsigned LEB128, minimal: seven bits a byte, low first, high bit set on all but the last.
    #[inline(always)]
    fn uint(&mut self, mut value: u64) {
        if value < 0x80 {
            return self.u8(value as u8);
        }
        let mut encoded = [0u8; 10];
        let mut len = 0;
        loop {
            let low = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                encoded[len] = low;
                len += 1;
                break;
            }
            encoded[len] = low | 0x80;
            len += 1;
        }
        self.bytes(&encoded[..len]);
    }

    #[inline]
    fn u32(&mut self, value: u32) {
        self.uint(u64::from(value));
    }

    #[inline]
    fn u64(&mut self, value: u64) {
        self.uint(value);
    }

    #[inline]
    fn str(&mut self, text: &str) {
        self.uint(text.len() as u64);
        self.bytes(text.as_bytes());
    }

    #[inline(always)]
    fn option<T>(&mut self, value: Option<T>, write: impl FnOnce(&mut Self, T)) {
        match value {
            None => self.u8(0),
            Some(value) => {
                self.u8(1);
                write(self, value);
            }
        }
    }

    fn limits(&mut self, limits: &GrantLimits) {
        self.option(limits.max_invocations, Self::u32);
        self.option(limits.max_cost_per_invocation_units, Self::u64);
        self.option(limits.max_total_cost_units, Self::u64);
        self.option(limits.currency.as_deref(), Self::str);
    }

    /// A command's own limits: the same bytes as `limits`, the amounts as the `limits` field
    /// and the currency as the `currency` field.
    fn grant_limits(&mut self, limits: &GrantLimits) {
        self.field(Field::Limits);
        self.option(limits.max_invocations, Self::u32);
        self.option(limits.max_cost_per_invocation_units, Self::u64);
        self.option(limits.max_total_cost_units, Self::u64);
        self.field(Field::Currency);
        self.option(limits.currency.as_deref(), Self::str);
    }

    fn finish(self) -> ([u8; 32], FieldHashes) {
        let Self {
            inline,
            len,
            spilled,
            fields,
        } = self;
        let encoding = match &spilled {
            Some(spilled) => spilled.as_slice(),
            None => &inline[..len],
        };
        (Sha256::digest(encoding).into(), fields.finish(encoding))
    }
}

fn limits_text(limits: &crate::account::GrantLimits) -> String {
    format!(
        "max_invocations={:?} max_cost_per_invocation_units={:?} max_total_cost_units={:?}",
        limits.max_invocations, limits.max_cost_per_invocation_units, limits.max_total_cost_units
    )
}

/// Fixed-size digests as msgpack binary, not as an array of 32 integers.
pub(crate) mod serde_bytes_array {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::AccountKey;
    use crate::command::{AncestorAccount, CommandHeader};

    fn authorize(family: &str, capability: &str, ancestors: Vec<AncestorAccount>) -> ClientCommand {
        ClientCommand {
            header: CommandHeader {
                family_id: family.into(),
                capability_id: capability.into(),
                grant_index: 0,
                event_id: "e".into(),
                not_after_ms: 10,
            },
            op: Operation::AuthorizeHold {
                hold_id: "h".into(),
                requested_exposure_units: 100,
                limits: GrantLimits::monetary(None, Some(100), None, "USD"),
                ancestors,
                hold_timeout_ms: Some(5),
            },
        }
    }

    fn ancestor(capability: &str, max: u32) -> AncestorAccount {
        AncestorAccount {
            account: AccountKey::new(capability, 1),
            limits: GrantLimits::invocations(max),
        }
    }

    #[test]
    fn the_digest_covers_the_identity_and_nothing_else() {
        let cmd = authorize("fam", "cap", vec![ancestor("a", 1), ancestor("b", 2)]);
        let digest = digest_of(&cmd);
        assert_eq!(Identity::of(&cmd).digest(), digest);

        let mut outside = cmd.clone();
        outside.header.not_after_ms = 99;
        outside.header.event_id = "other".into();
        if let Operation::AuthorizeHold {
            hold_timeout_ms,
            ancestors,
            ..
        } = &mut outside.op
        {
            *hold_timeout_ms = None;
            ancestors.reverse();
        }
        assert_eq!(digest_of(&outside), digest, "outside the identity");

        let mut limits = cmd.clone();
        if let Operation::AuthorizeHold { limits, .. } = &mut limits.op {
            limits.max_invocations = Some(0);
        }
        let mut amount = cmd.clone();
        if let Operation::AuthorizeHold {
            requested_exposure_units,
            ..
        } = &mut amount.op
        {
            *requested_exposure_units = 101;
        }
        for changed in [
            limits,
            amount,
            authorize("fam", "cap", vec![ancestor("a", 1)]),
            authorize("fam", "cap", vec![ancestor("a", 1), ancestor("b", 3)]),
            // Field boundaries are unambiguous.
            authorize("fa", "mcap", vec![ancestor("a", 1), ancestor("b", 2)]),
        ] {
            assert_ne!(digest_of(&changed), digest, "{changed:?}");
        }
    }

    #[test]
    fn the_encoding_is_fixed() {
        // Stored digests depend on it: changing it needs a new IDENTITY_ENCODING_VERSION.
        // (Checked independently: SHA-256 of the 32 bytes the doc comment of `digest_of` gives.)
        let digest = digest_of(&authorize("fam", "cap", vec![ancestor("a", 1)]));
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "990e5d3fbb063e447ab635f807b50d58bf766de80c5bc25c93ebcb36c502f635"
        );
    }

    #[test]
    fn field_hashes_are_fixed() {
        // Retained commands keep these hashes in snapshots: a faster encoder or hash must give
        // the same values (pinned as the SHA-256 of their encoding, one case per shape).
        let hold = "budget-hold:7f3c1f0e-2a51-4d0c-9c7b-2f1e6c3b9a10:cap:0";
        let mut capture = authorize("fam", "cap", vec![]);
        capture.op = Operation::CaptureInvocation {
            hold_id: hold.into(),
            attempt_id: "attempt".into(),
        };
        let mut reconcile = capture.clone();
        reconcile.op = Operation::ReconcileHold {
            hold_id: hold.into(),
            exposed_cost_units: 100,
            realized_spend_units: 60,
        };
        let cases = [
            authorize("fam", "cap", vec![ancestor("a", 1), ancestor("b", 2)]),
            capture,
            reconcile,
            long_authorize(1),
        ];
        let hashes: Vec<FieldHashes> = cases.iter().map(|c| identity_hashes(c).1).collect();
        let encoded = rmp_serde::to_vec(&hashes).expect("encodes");
        let hex: String = Sha256::digest(&encoded)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "80e7de13d82b9ebc833d8b10f463dbf62c08e6ed0bf275101af7a285cb199651"
        );
    }

    /// A 1,419-byte identity: past the inline buffer, so it is encoded on the heap.
    fn long_authorize(last_ancestor_max: u32) -> ClientCommand {
        let ancestors = (0..7u8)
            .rev()
            .map(|n| {
                let capability = char::from(b'a' + n).to_string().repeat(100);
                ancestor(
                    &capability,
                    if n == 0 {
                        last_ancestor_max
                    } else {
                        u32::from(n) + 1
                    },
                )
            })
            .collect();
        let mut cmd = authorize(&"f".repeat(300), &"c".repeat(200), ancestors);
        if let Operation::AuthorizeHold { hold_id, .. } = &mut cmd.op {
            *hold_id = "h".repeat(150).into();
        }
        cmd
    }

    #[test]
    fn a_long_identity_spills_to_the_heap_and_encodes_the_same() {
        // (Checked independently: a Python transcription of `digest_of`'s doc comment, which
        // also gives `the_encoding_is_fixed`'s digest.)
        let digest = digest_of(&long_authorize(1));
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "b2e19374642c4f4bd88197afb6d40010439ad8c053ceea8e8530bbe2d4ed1a3a"
        );
        // Field spans stay right past the spill: only the changed field is named.
        let named = identity_hashes(&long_authorize(1))
            .1
            .differing(&identity_hashes(&long_authorize(9)).1);
        assert_eq!(named, ["ancestors"]);
    }

    #[test]
    fn field_hashes_name_the_fields_the_full_identity_names() {
        let base = authorize("fam", "cap", vec![ancestor("a", 1)]);
        let mut variants = vec![
            authorize("other", "cap", vec![ancestor("a", 1)]),
            authorize("fam", "other", vec![ancestor("a", 1)]),
            authorize("fam", "cap", vec![ancestor("a", 2)]),
            authorize("fam", "cap", vec![]),
        ];
        let mut edit = |change: &dyn Fn(&mut ClientCommand)| {
            let mut cmd = base.clone();
            change(&mut cmd);
            variants.push(cmd);
        };
        edit(&|c| c.header.grant_index = 3);
        edit(&|c| c.header.not_after_ms = 99);
        edit(&|c| {
            if let Operation::AuthorizeHold {
                hold_id,
                requested_exposure_units,
                limits,
                ..
            } = &mut c.op
            {
                *hold_id = "h2".into();
                *requested_exposure_units = 7;
                limits.currency = Some("EUR".into());
            }
        });
        edit(&|c| {
            if let Operation::AuthorizeHold { limits, .. } = &mut c.op {
                limits.max_total_cost_units = Some(5);
            }
        });
        edit(&|c| {
            c.op = Operation::ReconcileHold {
                hold_id: "h".into(),
                exposed_cost_units: 1,
                realized_spend_units: 1,
            }
        });
        let charge = |cost_units, currency: &str| ClientCommand {
            op: Operation::TryChargeCost {
                cost_units,
                limits: GrantLimits::monetary(None, None, Some(10), currency),
            },
            ..base.clone()
        };
        let reconcile = |exposed, realized| ClientCommand {
            op: Operation::ReconcileHold {
                hold_id: "h".into(),
                exposed_cost_units: exposed,
                realized_spend_units: realized,
            },
            ..base.clone()
        };
        let pairs = [
            (charge(1, "USD"), charge(2, "EUR")),
            (charge(1, "USD"), charge(1, "USD")),
            (reconcile(1, 2), reconcile(1, 3)),
            (reconcile(1, 2), reconcile(4, 2)),
        ];
        let mut checked = 0;
        for (a, b) in variants
            .iter()
            .map(|v| (base.clone(), v.clone()))
            .chain(pairs)
        {
            let expected = Identity::of(&a).differing_fields(&Identity::of(&b));
            let named = identity_hashes(&a).1.differing(&identity_hashes(&b).1);
            assert_eq!(named, expected, "{a:?} vs {b:?}");
            checked += usize::from(!expected.is_empty());
        }
        assert!(checked >= 9, "most pairs differ: {checked}");
    }
}
