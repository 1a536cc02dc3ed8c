//! Budget family ids. A family is named by its root token, and token ids are chosen by their
//! issuers, so two issuers could pick the same id; the family id is therefore namespaced by the
//! root issuer's public key: `{namespace}:{root token id}`, where the namespace is the
//! lower-case hex of the issuer's 32-byte ed25519 key (64 characters). Token ids never contain
//! `:` (see `structure::check_id`), so the first `:` always ends the namespace, and the cluster
//! can check a kernel's certificate against that prefix alone.

use tally_ledger::{CapabilityId, FamilyId};

use crate::keys::{PublicKey, PUBLIC_KEY_BYTES};

/// Characters in a family namespace: two hex digits per key byte.
pub const FAMILY_NAMESPACE_CHARS: usize = 2 * PUBLIC_KEY_BYTES;

/// The namespace every family rooted in a token by `issuer` lives under.
pub fn family_namespace(issuer: &PublicKey) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(FAMILY_NAMESPACE_CHARS);
    for byte in issuer.as_bytes() {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// The family of a chain whose root token is `root_id`, issued by `issuer`.
pub fn family_id(issuer: &PublicKey, root_id: &CapabilityId) -> FamilyId {
    FamilyId::new(format!("{}:{root_id}", family_namespace(issuer)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyPair;

    #[test]
    fn the_family_id_format_is_fixed() {
        let issuer = PublicKey([0xab; PUBLIC_KEY_BYTES]);
        let id = family_id(&issuer, &CapabilityId::new("cap-7"));
        assert_eq!(id.as_str(), format!("{}:cap-7", "ab".repeat(32)));
        let key = KeyPair::from_seed(&[1; 32]).public_key();
        let namespace = family_namespace(&key);
        assert_eq!(namespace.len(), FAMILY_NAMESPACE_CHARS);
        assert!(namespace
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(
            family_id(&key, &CapabilityId::new("x"))
                .as_str()
                .split_once(':'),
            Some((namespace.as_str(), "x"))
        );
    }
}
