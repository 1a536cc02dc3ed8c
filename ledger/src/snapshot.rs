//! Canonical encoding of a family: the snapshot bytes and the state digest replicas compare.
//! All replicated state is in ordered containers, so equal states encode to equal bytes.

use sha2::{Digest, Sha256};

use crate::family::Family;

/// A snapshot that could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("family snapshot is not decodable: {0}")]
pub struct SnapshotError(#[from] rmp_serde::decode::Error);

impl Family {
    /// The canonical msgpack encoding of the whole family.
    pub fn to_snapshot_bytes(&self) -> Vec<u8> {
        rmp_serde::to_vec(self)
            .expect("a family always encodes: it holds no maps with non-string keys")
    }

    /// Decodes a family with its equal ids sharing one string, as `apply` built them, so a
    /// family read back takes what its footprint estimate says (`id_sharing.rs`).
    pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        crate::id_sharing::decoding_with_shared_ids(|| Ok(rmp_serde::from_slice(bytes)?))
    }

    /// SHA-256 of the canonical encoding: same state, same digest, on every replica.
    pub fn digest(&self) -> [u8; 32] {
        digest_bytes(&self.to_snapshot_bytes())
    }
}

/// The digest of an already encoded family (a passivated one, for instance).
pub fn digest_bytes(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}
