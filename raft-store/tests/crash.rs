//! What survives a restart, and what a damaged file does at open: a typed error, never an
//! empty or shorter log.

mod support;

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::type_config::alias::VoteOf;
use support::{append_durable, entry, log_id, Entry, C};
use tally_raft_store::{RedbLogStore, StoreError};
use tempfile::TempDir;

const ENTRIES: u64 = 200;
const PAYLOAD: usize = 4096;

/// A payload that names its entry, so the test can find that entry's bytes in the file.
fn marked_payload(index: u64) -> Vec<u8> {
    let mark = format!("TALLY-ENTRY-{index:06}|");
    mark.as_bytes()
        .iter()
        .copied()
        .cycle()
        .take(PAYLOAD)
        .collect()
}

fn entries(range: std::ops::Range<u64>) -> Vec<Entry> {
    range.map(|i| entry(1, i, marked_payload(i))).collect()
}

/// Writes `ENTRIES` entries in batches of 20, a vote and a committed id; closes the store.
async fn write_log(path: &Path) -> anyhow::Result<VoteOf<C>> {
    let mut store = RedbLogStore::<C>::open(path)?;
    for start in (0..ENTRIES).step_by(20) {
        append_durable(&mut store, entries(start..start + 20)).await?;
    }
    let vote = VoteOf::<C>::new_committed(1, 0);
    store.save_vote(&vote).await?;
    store.save_committed(Some(log_id(1, ENTRIES - 1))).await?;
    Ok(vote)
}

fn db_path(dir: &TempDir) -> PathBuf {
    dir.path().join("raft.redb")
}

#[tokio::test]
async fn reopen_after_drop_keeps_entries_vote_committed_and_purge() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    let vote = write_log(&path).await?;
    {
        let mut store = RedbLogStore::<C>::open(&path)?;
        store.purge(log_id(1, 9)).await?;
    }

    let mut store = RedbLogStore::<C>::open(&path)?;
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 9)));
    assert_eq!(state.last_log_id, Some(log_id(1, ENTRIES - 1)));
    assert_eq!(store.read_committed().await?, Some(log_id(1, ENTRIES - 1)));

    let mut reader = store.get_log_reader().await;
    assert_eq!(reader.read_vote().await?, Some(vote));
    let got = reader.try_get_log_entries(0..ENTRIES).await?;
    assert_eq!(got, entries(10..ENTRIES));
    Ok(())
}

#[tokio::test]
async fn file_cut_to_half_is_an_error_at_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    write_log(&path).await?;

    let len = fs::metadata(&path)?.len();
    OpenOptions::new()
        .write(true)
        .open(&path)?
        .set_len(len / 2)?;

    let err = RedbLogStore::<C>::open(&path).expect_err("a truncated log must not open");
    assert!(
        matches!(err, StoreError::Corrupt { .. }),
        "expected Corrupt, got {err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn garbage_over_a_live_entry_is_an_error_at_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    write_log(&path).await?;

    // Overwrite every copy of entry 100's payload (the live page and any stale copy), so the
    // live tree is certainly damaged.
    let bytes = fs::read(&path)?;
    let mark = b"TALLY-ENTRY-000100|";
    let hits: Vec<usize> = bytes
        .windows(mark.len())
        .enumerate()
        .filter(|(_, w)| w == mark)
        .map(|(i, _)| i)
        .collect();
    assert!(!hits.is_empty(), "entry 100 not found in the file");
    let mut f = OpenOptions::new().write(true).open(&path)?;
    for at in hits {
        f.seek(SeekFrom::Start(at as u64))?;
        f.write_all(&[0xA5; 19])?;
    }
    f.sync_all()?;
    drop(f);

    let err = RedbLogStore::<C>::open(&path).expect_err("a damaged log must not open");
    assert!(
        matches!(err, StoreError::Corrupt { .. }),
        "expected Corrupt, got {err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn garbage_block_in_the_middle_is_an_error_at_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    write_log(&path).await?;

    let len = fs::metadata(&path)?.len();
    let mut f = OpenOptions::new().write(true).open(&path)?;
    f.seek(SeekFrom::Start(len / 2))?;
    f.write_all(&vec![0x5A; 8192])?;
    f.sync_all()?;
    drop(f);

    // With 200 entries of 4 KiB the middle of the file is live B-tree pages, so the block
    // damages committed data and redb's checksums catch it at open. (Had it landed on free
    // space, open would succeed with every entry intact; what must never happen is an open
    // that succeeds with fewer or different entries.)
    let err = RedbLogStore::<C>::open(&path).expect_err("a damaged log must not open");
    assert!(
        matches!(err, StoreError::Corrupt { .. }),
        "expected Corrupt, got {err:?}"
    );
    Ok(())
}

#[test]
fn a_file_that_is_not_redb_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    fs::write(
        &path,
        b"this is a text file, not a redb database\n".repeat(2000),
    )?;
    let err = RedbLogStore::<C>::open(&path).expect_err("a text file must not open");
    assert!(
        matches!(err, StoreError::NotADatabase { .. }),
        "expected NotADatabase, got {err:?}"
    );
    Ok(())
}

#[test]
fn an_empty_file_is_an_error_not_a_new_log() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    fs::write(&path, b"")?;
    let err = RedbLogStore::<C>::open(&path).expect_err("an empty file must not open as a new log");
    assert!(
        matches!(err, StoreError::NotADatabase { .. }),
        "expected NotADatabase, got {err:?}"
    );
    Ok(())
}

#[test]
fn another_redb_database_is_not_a_raft_log() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    {
        let db = redb::Database::create(&path)?;
        let txn = db.begin_write()?;
        txn.open_table(redb::TableDefinition::<u64, u64>::new("something_else"))?
            .insert(1, 2)?;
        txn.commit()?;
    }
    let err = RedbLogStore::<C>::open(&path).expect_err("a foreign redb file must not open");
    assert!(
        matches!(err, StoreError::NotARaftLog { .. }),
        "expected NotARaftLog, got {err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_unknown_format_version_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = db_path(&dir);
    drop(RedbLogStore::<C>::open(&path)?);
    {
        let db = redb::Database::create(&path)?;
        let txn = db.begin_write()?;
        txn.open_table(redb::TableDefinition::<&str, &[u8]>::new("tally_meta"))?
            .insert("format_version", 99u32.to_be_bytes().as_slice())?;
        txn.commit()?;
    }
    let err = RedbLogStore::<C>::open(&path).expect_err("an unknown version must not open");
    assert!(
        matches!(
            err,
            StoreError::UnsupportedVersion {
                found: 99,
                supported: 1,
                ..
            }
        ),
        "expected UnsupportedVersion, got {err:?}"
    );
    Ok(())
}
