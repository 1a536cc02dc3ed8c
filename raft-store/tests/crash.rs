//! What survives a restart, what a crash leaves (at most the write in flight, cut off at
//! open), and what damage does at open: a typed error, never an empty or shorter log.

mod support;

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::type_config::alias::VoteOf;
use support::{append_durable, entry, log_id, Entry, C};
use tally_raft_store::{LogStore, StoreConfig, StoreError, WalConfig};
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
    let mut store = LogStore::<C>::open(path)?;
    for start in (0..ENTRIES).step_by(20) {
        append_durable(&mut store, entries(start..start + 20)).await?;
    }
    let vote = VoteOf::<C>::new_committed(1, 0);
    store.save_vote(&vote).await?;
    store.save_committed(Some(log_id(1, ENTRIES - 1))).await?;
    Ok(vote)
}

/// Segments of five entries, so a few appends roll the log.
fn small_segments() -> StoreConfig {
    StoreConfig {
        wal: WalConfig {
            segment_bytes: 5 * PAYLOAD as u64,
        },
        ..StoreConfig::default()
    }
}

fn log_dir(dir: &TempDir) -> PathBuf {
    dir.path().join("raft-log")
}

/// The segment files, oldest first.
fn segments(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs::read_dir(path)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    out.retain(|p| p.extension().is_some_and(|e| e == "wal"));
    out.sort();
    Ok(out)
}

fn newest_segment(path: &Path) -> anyhow::Result<PathBuf> {
    segments(path)?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no segment in {}", path.display()))
}

async fn all_entries(store: &mut LogStore<C>) -> anyhow::Result<Vec<Entry>> {
    Ok(store
        .get_log_reader()
        .await
        .try_get_log_entries(0..)
        .await?)
}

#[tokio::test]
async fn reopen_after_drop_keeps_entries_vote_committed_and_purge() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    let vote = write_log(&path).await?;
    {
        let mut store = LogStore::<C>::open(&path)?;
        store.purge(log_id(1, 9)).await?;
    }

    let mut store = LogStore::<C>::open(&path)?;
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

/// The crash contract: a crash loses at most the write whose `fdatasync` had not returned,
/// and its blocks may reach the disk in any order or not at all. Every way the last frame can
/// be left (cut at any length, its first block or its last lost) must reopen to exactly the
/// entries whose durability was reported, and the log must go on from there.
#[tokio::test]
async fn an_unsynced_last_write_in_any_state_is_cut_off_and_nothing_else() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    write_log(&path).await?;
    let segment = newest_segment(&path)?;
    let synced = fs::read(&segment)?;
    // The bytes the next append would write: made by a scratch log, taken from its end.
    let in_flight = {
        let scratch = tempfile::tempdir()?;
        let scratch_path = log_dir(&scratch);
        let mut store = LogStore::<C>::open(&scratch_path)?;
        append_durable(&mut store, entries(ENTRIES..ENTRIES + 3)).await?;
        drop(store);
        let bytes = fs::read(newest_segment(&scratch_path)?)?;
        let before = {
            let empty = tempfile::tempdir()?;
            drop(LogStore::<C>::open(log_dir(&empty))?);
            fs::read(newest_segment(&log_dir(&empty))?)?.len()
        };
        bytes[before..].to_vec()
    };
    assert!(in_flight.len() > 3 * PAYLOAD, "three entries in one frame");

    let mut partial: Vec<(String, Vec<u8>)> =
        [1, 7, 16, 100, in_flight.len() / 2, in_flight.len() - 1]
            .into_iter()
            .map(|cut| (format!("cut at {cut}"), in_flight[..cut].to_vec()))
            .collect();
    let mut first_block_lost = in_flight.clone();
    first_block_lost[..4096].fill(0);
    partial.push(("first block lost".into(), first_block_lost));
    let mut last_block_lost = in_flight.clone();
    let len = last_block_lost.len();
    last_block_lost[len - 4096..].fill(0);
    partial.push(("last block lost".into(), last_block_lost));
    partial.push(("zeroes only".into(), vec![0; 8192]));

    for (case, tail) in partial {
        let mut bytes = synced.clone();
        bytes.extend(&tail);
        fs::write(&segment, &bytes)?;
        let mut store = LogStore::<C>::open(&path)?;
        assert_eq!(
            all_entries(&mut store).await?,
            entries(0..ENTRIES),
            "{case}: exactly the durable entries"
        );
        assert_eq!(
            fs::metadata(&segment)?.len(),
            synced.len() as u64,
            "{case}: the torn tail is cut off"
        );
        append_durable(&mut store, entries(ENTRIES..ENTRIES + 1)).await?;
        drop(store);
        let mut store = LogStore::<C>::open(&path)?;
        assert_eq!(
            all_entries(&mut store).await?,
            entries(0..ENTRIES + 1),
            "{case}: the log goes on after the cut"
        );
        drop(store);
        fs::write(&segment, &synced)?;
    }
    Ok(())
}

/// Damage with valid frames after it is not a torn write: it must stop the open.
#[tokio::test]
async fn garbage_over_a_live_entry_is_an_error_at_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    write_log(&path).await?;

    let segment = newest_segment(&path)?;
    let bytes = fs::read(&segment)?;
    let mark = b"TALLY-ENTRY-000100|";
    let at = bytes
        .windows(mark.len())
        .position(|w| w == mark)
        .ok_or_else(|| anyhow::anyhow!("entry 100 not found in the file"))?;
    overwrite(&segment, at as u64, &[0xA5; 19])?;
    assert_corrupt_at_open(&path);
    Ok(())
}

fn overwrite(file: &Path, at: u64, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = OpenOptions::new().write(true).open(file)?;
    f.seek(SeekFrom::Start(at))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn assert_corrupt_at_open(path: &Path) {
    let err = LogStore::<C>::open(path).expect_err("a damaged log must not open");
    assert!(
        matches!(err, StoreError::Corrupt { .. }),
        "expected Corrupt, got {err:?}"
    );
}

#[tokio::test]
async fn garbage_block_in_the_middle_is_an_error_at_open() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    write_log(&path).await?;

    let segment = newest_segment(&path)?;
    let len = fs::metadata(&segment)?.len();
    overwrite(&segment, len / 2, &[0x5A; 8192])?;
    assert_corrupt_at_open(&path);
    Ok(())
}

/// Small segments: the log rolls, a purge deletes the segments no live entry is in, a reopen
/// reads across segments, and a segment missing from the middle is an error.
#[tokio::test]
async fn segments_roll_are_deleted_once_purged_and_a_gap_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    let config = small_segments();
    {
        let mut store = LogStore::<C>::open_with(&path, config.clone())?;
        for start in (0..60).step_by(4) {
            append_durable(&mut store, entries(start..start + 4)).await?;
        }
        assert!(
            store.segment_count() >= 7,
            "{} segments",
            store.segment_count()
        );
        store.save_vote(&VoteOf::<C>::new_committed(3, 1)).await?;
        store.purge(log_id(1, 39)).await?;
        assert!(
            store.segment_count() <= 4,
            "segments holding only purged entries are gone: {}",
            store.segment_count()
        );
        assert_eq!(store.segment_count(), segments(&path)?.len());
    }
    let mut store = LogStore::<C>::open_with(&path, config.clone())?;
    assert_eq!(all_entries(&mut store).await?, entries(40..60));
    assert_eq!(
        store.get_log_reader().await.read_vote().await?,
        Some(VoteOf::<C>::new_committed(3, 1)),
        "the vote survives the deletion of the segment it was written in"
    );
    drop(store);

    let files = segments(&path)?;
    fs::remove_file(&files[files.len() / 2])?;
    assert_corrupt_at_open(&path);
    Ok(())
}

#[test]
fn a_segment_that_is_not_ours_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    drop(LogStore::<C>::open(&path)?);
    fs::write(
        newest_segment(&path)?,
        b"this is not a raft log, just some text\n",
    )?;
    let err = LogStore::<C>::open(&path).expect_err("a text file must not open");
    assert!(
        matches!(err, StoreError::NotARaftLog { .. }),
        "expected NotARaftLog, got {err:?}"
    );
    Ok(())
}

#[test]
fn an_empty_segment_is_an_error_not_a_new_log() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    drop(LogStore::<C>::open(&path)?);
    fs::write(newest_segment(&path)?, b"")?;
    let err = LogStore::<C>::open(&path).expect_err("an empty segment must not open");
    assert!(
        matches!(err, StoreError::NotARaftLog { .. }),
        "expected NotARaftLog, got {err:?}"
    );
    Ok(())
}

/// The single file of earlier builds (or any file) where the log's directory should be.
#[test]
fn a_file_where_the_directory_should_be_is_an_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    fs::write(&path, b"redb bytes")?;
    let err = LogStore::<C>::open(&path).expect_err("a file must not open as a log");
    assert!(
        matches!(err, StoreError::NotARaftLog { .. }),
        "expected NotARaftLog, got {err:?}"
    );
    Ok(())
}

#[test]
fn a_log_open_elsewhere_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    let first = LogStore::<C>::open(&path)?;
    let err = LogStore::<C>::open(&path).expect_err("one writer per log");
    assert!(
        matches!(err, StoreError::AlreadyOpen { .. }),
        "expected AlreadyOpen, got {err:?}"
    );
    drop(first);
    drop(LogStore::<C>::open(&path)?);
    Ok(())
}

/// A reader keeps the log (and its lock) open after the store is gone, and the release watch
/// says so: what a node's stop waits on before the node can start again in one process.
#[test]
fn the_release_watch_turns_with_the_last_handle() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    let store = LogStore::<C>::open(&path)?;
    let watch = store.release_watch();
    let reader = store.reader();
    drop(store);
    assert!(!watch.is_released(), "a reader still holds the log");
    assert!(
        matches!(
            LogStore::<C>::open(&path),
            Err(StoreError::AlreadyOpen { .. })
        ),
        "the lock goes with the last handle, not with the store"
    );
    drop(reader);
    assert!(watch.is_released(), "the last handle is gone");
    drop(LogStore::<C>::open(&path)?);
    Ok(())
}

/// The watch turns only once the lock is closed, not when the last handle starts to drop:
/// the log's drop gives reserved room back (file I/O) before its fields go, and a start that
/// trusted an earlier signal met "already open elsewhere" (CI, 2026-12-07). The last handle
/// drops on another thread while this one polls the watch and opens at once, many times.
#[test]
fn a_released_log_opens_at_once_whichever_thread_dropped_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    for round in 0..200 {
        let store = LogStore::<C>::open(&path)?;
        let watch = store.release_watch();
        let dropper = std::thread::spawn(move || drop(store));
        while !watch.is_released() {
            std::hint::spin_loop();
        }
        let reopened = LogStore::<C>::open(&path);
        assert!(
            reopened.is_ok(),
            "round {round}: released, yet {:?}",
            reopened.err()
        );
        drop(reopened);
        dropper.join().expect("the drop ends");
    }
    Ok(())
}

/// The room reserved ahead of the writes (`preallocate.rs`): a crash leaves it as zeros after
/// the last frame, which the next open cuts off with every durable entry kept; a clean close
/// gives it back; and only the newest segment ever has it, so zeros at the end of an older
/// segment are still damage.
#[tokio::test]
async fn reserved_room_is_cut_at_open_and_close_and_only_the_newest_segment_has_it(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = log_dir(&dir);
    let config = small_segments();
    let mut store = LogStore::<C>::open_with(&path, config.clone())?;
    for start in (0..40).step_by(4) {
        append_durable(&mut store, entries(start..start + 4)).await?;
    }
    let files = segments(&path)?;
    assert!(files.len() >= 3, "the log rolled: {} segments", files.len());
    // What a crash now would leave on disk: the newest segment with its room, as it is.
    let newest = newest_segment(&path)?;
    let crashed = fs::read(&newest)?;
    for older in &files[..files.len() - 1] {
        let bytes = fs::read(older)?;
        assert_ne!(
            bytes.last(),
            Some(&0),
            "{}: a full segment is cut to its frames before the next starts",
            older.display()
        );
    }
    drop(store);
    let closed = fs::read(&newest)?;
    assert!(
        crashed.len() >= closed.len() && crashed[..closed.len()] == closed[..],
        "the open file is the closed one plus its room"
    );
    assert!(
        crashed[closed.len()..].iter().all(|&b| b == 0),
        "the room reads as zeros"
    );
    let reserved = crashed.len() > closed.len();

    // Reopen from the crash's state: the zeros go, the entries stay, the log goes on.
    fs::write(&newest, &crashed)?;
    let mut store = LogStore::<C>::open_with(&path, config.clone())?;
    assert_eq!(all_entries(&mut store).await?, entries(0..40));
    assert_eq!(
        fs::metadata(&newest)?.len(),
        closed.len() as u64,
        "the open cut the room off (reserved here: {reserved})"
    );
    append_durable(&mut store, entries(40..41)).await?;
    drop(store);
    let mut store = LogStore::<C>::open_with(&path, config.clone())?;
    assert_eq!(all_entries(&mut store).await?, entries(0..41));
    drop(store);

    // Zeros at the end of a segment that is not the newest were never room: damage.
    let files = segments(&path)?;
    let older = &files[files.len() - 2];
    let mut bytes = fs::read(older)?;
    bytes.extend(std::iter::repeat_n(0u8, 4096));
    fs::write(older, &bytes)?;
    assert_corrupt_at_open(&path);
    Ok(())
}
