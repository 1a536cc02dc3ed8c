//! The group-commit metric and the append limits, on the real store.

mod support;

use std::io;

use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::type_config::alias::VoteOf;
use openraft::type_config::TypeConfigExt;
use support::{append_durable, entry, log_id, Entry, C};
use tally_raft_store::{LogStore, StoreConfig, StoreError};

#[tokio::test]
async fn three_appends_of_ten_are_three_fsyncs_of_thirty_entries() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut store = LogStore::<C>::open(dir.path().join("raft-log"))?;
    for batch in 0..3u64 {
        let entries = (batch * 10..batch * 10 + 10)
            .map(|i| entry(1, i, vec![i as u8; 16]))
            .collect();
        append_durable(&mut store, entries).await?;
    }
    let m = store.metrics();
    assert_eq!(m.appends, 3);
    assert_eq!(m.entries, 30);
    assert_eq!(m.entries_per_fsync(), 10.0);
    assert_eq!(m.other_commits, 0);

    store.save_vote(&VoteOf::<C>::new_committed(1, 0)).await?;
    let m = store.metrics_handle().snapshot();
    assert_eq!((m.appends, m.other_commits, m.fsyncs()), (3, 1, 4));
    Ok(())
}

fn store_error(e: &io::Error) -> Option<&StoreError> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<StoreError>())
}

#[tokio::test]
async fn an_entry_over_the_limit_is_rejected_and_nothing_is_written() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = StoreConfig {
        max_entry_bytes: 1024,
        ..StoreConfig::default()
    };
    let mut store = LogStore::<C>::open_with(dir.path().join("raft-log"), config)?;

    let batch = vec![entry(1, 0, vec![0; 10]), entry(1, 1, vec![0; 4096])];
    let (tx, rx) = C::oneshot();
    let err = store
        .append(batch, IOFlushed::signal(tx))
        .await
        .expect_err("over the limit");
    assert!(
        matches!(
            store_error(&err),
            Some(StoreError::EntryTooLarge {
                index: 1,
                max: 1024,
                ..
            })
        ),
        "expected EntryTooLarge, got {err:?}"
    );
    assert!(
        rx.await?.is_err(),
        "the callback must report the failure too"
    );
    assert!(store
        .get_log_reader()
        .await
        .try_get_log_entries(..)
        .await?
        .is_empty());
    assert_eq!(store.metrics().appends, 0);
    Ok(())
}

#[tokio::test]
async fn an_append_that_would_leave_a_hole_is_rejected() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut store = LogStore::<C>::open(dir.path().join("raft-log"))?;
    append_durable(&mut store, vec![entry(1, 0, vec![]), entry(1, 1, vec![])]).await?;

    let err = append_durable(&mut store, vec![entry(1, 5, vec![])])
        .await
        .expect_err("a hole");
    assert!(
        matches!(
            store_error(&err),
            Some(StoreError::NotContiguous {
                expected: 2,
                got: 5
            })
        ),
        "expected NotContiguous, got {err:?}"
    );
    assert_eq!(
        store
            .get_log_reader()
            .await
            .try_get_log_entries(..)
            .await?
            .len(),
        2
    );
    Ok(())
}

/// Entries just appended are read back from memory, entries from before an open from the
/// file, and a truncation is never answered from memory.
#[tokio::test]
async fn the_tail_is_read_from_memory_and_truncation_reaches_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("raft-log");
    {
        let mut store = LogStore::<C>::open(&path)?;
        append_durable(
            &mut store,
            (0..5).map(|i| entry(1, i, vec![i as u8])).collect(),
        )
        .await?;
    }
    let mut store = LogStore::<C>::open(&path)?;
    append_durable(
        &mut store,
        (5..8).map(|i| entry(1, i, vec![i as u8])).collect(),
    )
    .await?;
    let mut reader = store.get_log_reader().await;
    let index =
        |entries: &[Entry]| -> Vec<u64> { entries.iter().map(|e| e.log_id.index).collect() };
    assert_eq!(index(&reader.try_get_log_entries(5..).await?), [5, 6, 7]);
    assert_eq!(
        (store.metrics().cache_reads, store.metrics().file_reads),
        (1, 0)
    );
    assert_eq!(
        index(&reader.try_get_log_entries(3..7).await?),
        [3, 4, 5, 6]
    );
    assert_eq!(
        store.metrics().file_reads,
        1,
        "written before the open: the file"
    );

    store.truncate_after(Some(log_id(1, 5))).await?;
    assert_eq!(index(&reader.try_get_log_entries(5..).await?), [5]);
    append_durable(&mut store, vec![entry(2, 6, vec![66])]).await?;
    let tail = reader.try_get_log_entries(6..).await?;
    assert_eq!(index(&tail), [6]);
    assert_eq!(
        tail[0].log_id.leader_id.term, 2,
        "the new entry, not the truncated one"
    );
    store.purge(log_id(1, 5)).await?;
    assert_eq!(index(&reader.try_get_log_entries(0..).await?), [6]);
    Ok(())
}
