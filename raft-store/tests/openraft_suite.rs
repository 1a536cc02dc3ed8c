//! openraft's own storage test suite against the real store, one fresh redb file per case.

mod support;

use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::StorageError;
use support::{MemStateMachine, C};
use tally_raft_store::LogStore;
use tempfile::TempDir;

/// Builds a store on a new file in its own temp dir; the dir is the guard, removed on drop.
struct WalBuilder;

impl StoreBuilder<C, LogStore<C>, MemStateMachine, TempDir> for WalBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore<C>, MemStateMachine), StorageError<C>> {
        let dir = tempfile::tempdir().map_err(|e| StorageError::write(C::err_from_error(&e)))?;
        let store = LogStore::<C>::open(dir.path().join("raft-log"))
            .map_err(|e| StorageError::write(C::err_from_error(&e)))?;
        Ok((dir, store, MemStateMachine::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_log_suite_passes_on_redb() -> anyhow::Result<()> {
    Suite::test_all(WalBuilder).await?;
    Ok(())
}
