//! A node's vote never starts below the term of its last log id.
//!
//! Raft's terms only grow along the log: a leader's entries carry its term, which is at least
//! that of every entry before them. openraft keeps the vote in the log store, beside the log.
//! A node restored from a backup (`tally-node restore`), or whose log dir was lost while its
//! snapshots were kept, starts with the snapshot's last log id (say term 24) and no vote
//! (term 0). Elected at term 2, it appended entries behind term 24's, and openraft's
//! replication panicked ("no data to send"): seen when a 3-node cluster was restored from a
//! backup taken at term 24, where the election ran before every node was up. So before
//! openraft starts, a vote below that term is raised to it, voted for this node and not
//! committed. That only narrows what the node will grant: nobody can be leader at that term
//! any more (its leader's entries are behind the snapshot), and the next election runs at
//! the term after.

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::type_config::alias::VoteOf;

use super::types::{LogId, NodeId, TypeConfig};
use tally_raft_store::LogStore;

/// Raises the stored vote to the term of the newest log id the node holds (its log's last,
/// or `snapshot_last`, the newest snapshot's) if it is lower; returns that term when it did.
pub async fn raise_to_last_log_term(
    log_store: &mut LogStore<TypeConfig>,
    snapshot_last: Option<LogId>,
    node_id: NodeId,
) -> Result<Option<u64>, std::io::Error> {
    let log_last = log_store.get_log_state().await?.last_log_id;
    let Some(last_term) = [log_last, snapshot_last]
        .into_iter()
        .flatten()
        .map(|id| id.leader_id.term)
        .max()
    else {
        return Ok(None);
    };
    let vote = log_store.get_log_reader().await.read_vote().await?;
    if vote.is_some_and(|vote| vote.leader_id.term >= last_term) {
        return Ok(None);
    }
    log_store
        .save_vote(&VoteOf::<TypeConfig>::new(last_term, node_id))
        .await?;
    Ok(Some(last_term))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(term, 2, index)
    }

    async fn stored_vote(store: &mut LogStore<TypeConfig>) -> Option<VoteOf<TypeConfig>> {
        store
            .get_log_reader()
            .await
            .read_vote()
            .await
            .expect("reads")
    }

    /// Node 1 raising its vote against `snapshot_last`; the term it raised to.
    async fn raise(store: &mut LogStore<TypeConfig>, snapshot_last: Option<LogId>) -> Option<u64> {
        raise_to_last_log_term(store, snapshot_last, 1)
            .await
            .expect("raises")
    }

    #[tokio::test]
    async fn a_vote_below_the_snapshot_s_term_is_raised_once_and_a_higher_one_is_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = LogStore::<TypeConfig>::open(dir.path()).expect("opens");
        assert_eq!(
            raise(&mut store, None).await,
            None,
            "a new node has no term to keep up with"
        );
        assert_eq!(stored_vote(&mut store).await, None);

        let restored = Some(log_id(24, 167_790));
        assert_eq!(raise(&mut store, restored).await, Some(24));
        let vote = stored_vote(&mut store).await.expect("a vote");
        assert_eq!((vote.leader_id.term, vote.leader_id.node_id), (24, 1));
        assert!(
            !vote.is_committed(),
            "the node was nobody's leader at that term"
        );
        assert_eq!(raise(&mut store, restored).await, None, "raised once");

        store
            .save_vote(&VoteOf::<TypeConfig>::new(30, 3))
            .await
            .expect("saves");
        assert_eq!(raise(&mut store, restored).await, None);
        assert_eq!(
            stored_vote(&mut store).await.map(|v| v.leader_id.term),
            Some(30)
        );
    }
}
