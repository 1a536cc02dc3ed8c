//! Where a row out of memory sits in the store's key order: its family's prefix, then its
//! key within the family. One family's rows are one range of keys, families in id order, so
//! a snapshot reads each family's rows as one range and each block of a run once.

use tally_ledger::FamilyId;

/// A row's key in the store: the family id's bytes with each zero byte written as `00 ff`,
/// then `00 01`, then the row's key within the family (`ColdKey::to_bytes`). One family's
/// keys are one range no other family's key falls in, and families come in id order (the
/// order snapshots read them in, so a scan reads each block of a run once).
pub fn cold_row_key(family_id: &FamilyId, key: &[u8]) -> Vec<u8> {
    let mut bytes = cold_family_prefix(family_id);
    bytes.extend_from_slice(key);
    bytes
}

/// The family's part of its rows' keys (`cold_row_key`).
pub(super) fn cold_family_prefix(family_id: &FamilyId) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(family_id.as_str().len() + 2 + 64);
    push_family_prefix(&mut bytes, family_id);
    bytes
}

pub(super) fn push_family_prefix(bytes: &mut Vec<u8>, family_id: &FamilyId) {
    for &byte in family_id.as_str().as_bytes() {
        bytes.push(byte);
        if byte == 0 {
            bytes.push(0xff);
        }
    }
    bytes.extend_from_slice(&[0, 1]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One family's rows are one range of keys no other family's key falls in, even where
    /// one id is a prefix of another or holds zero bytes, and families sort by id.
    #[test]
    fn row_keys_keep_families_apart_and_in_id_order() {
        let ids = ["fa", "fa\0", "fa\0\0", "fa\0x", "fa\u{1}", "fam", "fb"];
        let prefixes: Vec<Vec<u8>> = (ids.iter())
            .map(|id| cold_family_prefix(&FamilyId::from(*id)))
            .collect();
        for (i, prefix) in prefixes.iter().enumerate() {
            let mut end = prefix.clone();
            end.push(0xff);
            for (j, id) in ids.iter().enumerate() {
                let key = cold_row_key(&FamilyId::from(*id), &[0, 7]);
                let inside = prefix.as_slice() <= key.as_slice() && key < end;
                assert_eq!(inside, i == j, "{:?} in the range of {:?}", id, ids[i]);
            }
        }
        assert!(
            prefixes.windows(2).all(|pair| pair[0] < pair[1]),
            "id order"
        );
    }
}
