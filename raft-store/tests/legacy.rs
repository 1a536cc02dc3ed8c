//! A node upgraded in place: the single redb file of earlier builds is imported into the
//! segment files, entry for entry, with its vote, committed hint and purged id.

mod support;

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::type_config::alias::{LogIdOf, VoteOf};
use redb::TableDefinition;
use support::{entry, log_id, Entry, C};
use tally_raft_store::{import_redb_log, LogStore};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");

fn bytes<T: serde::Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("encode")
}

#[tokio::test]
async fn an_earlier_builds_file_is_imported_once_with_everything_in_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let old = dir.path().join("raft-log.redb");
    let new = dir.path().join("raft-log");
    let entries: Vec<Entry> = (6..40).map(|i| entry(2, i, vec![i as u8; 100])).collect();
    let vote = VoteOf::<C>::new_committed(2, 1);
    {
        let db = redb::Database::create(&old)?;
        let txn = db.begin_write()?;
        {
            let mut log = txn.open_table(LOG)?;
            for e in &entries {
                log.insert(e.log_id.index, bytes(e).as_slice())?;
            }
            let mut state = txn.open_table(STATE)?;
            state.insert("vote", bytes(&vote).as_slice())?;
            state.insert("last_purged", bytes(&log_id(1, 5)).as_slice())?;
            state.insert("committed", bytes(&Some(log_id(2, 30))).as_slice())?;
        }
        txn.commit()?;
    }

    let imported = import_redb_log::<C>(&old, &new)?.expect("something to import");
    assert_eq!(imported.entries, 34);
    assert!(imported.old_file_renamed && !old.exists());
    assert!(
        import_redb_log::<C>(&old, &new)?.is_none(),
        "a second start imports nothing"
    );

    let mut store = LogStore::<C>::open(&new)?;
    let state = store.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
    assert_eq!(state.last_log_id, Some(log_id(2, 39)));
    let committed: Option<LogIdOf<C>> = store.read_committed().await?;
    assert_eq!(committed, Some(log_id(2, 30)));
    let mut reader = store.get_log_reader().await;
    assert_eq!(reader.read_vote().await?, Some(vote));
    assert_eq!(reader.try_get_log_entries(0..).await?, entries);
    Ok(())
}
