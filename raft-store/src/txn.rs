//! The write transactions, synchronous: each function is exactly one redb transaction committed
//! with `Durability::Immediate`, so each returns only once its effect is on disk, and a crash
//! part-way leaves none of it.
//!
//! They run on a blocking thread (see `store.rs`); none of them is async.

use redb::{Durability, ReadableTable, WriteTransaction};

use crate::error::StoreError;
use crate::reader::Shared;
use crate::schema::{KEY_PURGED, LOG, STATE};

/// An entry ready to write: its index and its encoded bytes.
pub(crate) type Encoded = (u64, Vec<u8>);

fn begin(shared: &Shared) -> Result<WriteTransaction, StoreError> {
    begin_with(shared, Durability::Immediate)
}

fn begin_with(shared: &Shared, durability: Durability) -> Result<WriteTransaction, StoreError> {
    let mut txn = shared.db.begin_write()?;
    // Immediate is the default, stated so that no one weakens it by accident: the crash
    // contract rests on it. Only the committed-id hint is written lazily (`put_hint`).
    txn.set_durability(durability)?;
    Ok(txn)
}

/// Appends a batch, which must continue the stored log.
///
/// The batch is contiguous (the caller asserts it); here it is checked against the stored tail
/// so that no append can open a hole or silently overwrite entries. An empty table accepts any
/// first index: after a purge past the last entry, or a snapshot install, the log restarts
/// there.
pub(crate) fn append(shared: &Shared, batch: &[Encoded]) -> Result<(), StoreError> {
    let Some((first, _)) = batch.first() else {
        return Ok(());
    };
    let txn = begin(shared)?;
    {
        let mut log = txn.open_table(LOG)?;
        let tail = log.last()?.map(|(k, _)| k.value());
        if let Some(last) = tail {
            if *first != last + 1 {
                return Err(StoreError::NotContiguous {
                    expected: last + 1,
                    got: *first,
                });
            }
        }
        for (index, bytes) in batch {
            log.insert(*index, bytes.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

/// Writes one record of the state table durably (the vote).
pub(crate) fn put_record(shared: &Shared, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
    put_with(shared, key, bytes, Durability::Immediate)
}

/// Writes a hint record without an fsync of its own (the committed id): redb makes it durable
/// with the next durable commit, and a crash before that only loses the hint, never a log
/// entry or a vote.
pub(crate) fn put_hint(shared: &Shared, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
    put_with(shared, key, bytes, Durability::None)
}

fn put_with(
    shared: &Shared,
    key: &str,
    bytes: &[u8],
    durability: Durability,
) -> Result<(), StoreError> {
    let txn = begin_with(shared, durability)?;
    {
        let mut state = txn.open_table(STATE)?;
        state.insert(key, bytes)?;
    }
    txn.commit()?;
    Ok(())
}

/// Deletes every entry with index `>= from`.
pub(crate) fn truncate_from(shared: &Shared, from: u64) -> Result<(), StoreError> {
    let txn = begin(shared)?;
    {
        let mut log = txn.open_table(LOG)?;
        log.retain_in(from.., |_, _| false)?;
    }
    txn.commit()?;
    Ok(())
}

/// Deletes every entry with index `<= upto` and records `purged` (the encoded log id at
/// `upto`) as the last purged id, in the same transaction: a reader or a restart sees either
/// the old log and old purged id, or the new ones.
pub(crate) fn purge(shared: &Shared, upto: u64, purged: &[u8]) -> Result<(), StoreError> {
    let txn = begin(shared)?;
    {
        let mut log = txn.open_table(LOG)?;
        log.retain_in(..=upto, |_, _| false)?;
        let mut state = txn.open_table(STATE)?;
        state.insert(KEY_PURGED, purged)?;
    }
    txn.commit()?;
    Ok(())
}
