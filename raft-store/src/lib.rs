//! The durable Raft log of a Tally node: openraft's [`RaftLogStorage`] on one redb file.
//!
//! The file holds the log entries (keyed by index), the vote, the last committed log id, the
//! last purged log id, and a format marker. Values are rmp-serde bytes, so the store works for
//! any [`RaftTypeConfig`] whose entry, vote and log id are serde types (openraft's `serde`
//! feature).
//!
//! The decoded tail of the log stays in memory (bounded by [`CacheLimits`]), so replication
//! and apply read what was just appended without decoding it again; see `entry_cache.rs` for
//! why that never returns anything the file does not hold.
//!
//! # Crash contract
//!
//! Every write is one redb write transaction, run by one writer thread in the order openraft
//! issued the calls and committed with [`redb::Durability::Immediate`]
//! (but the committed-id hint, below): the commit returns only after redb's fsync, and redb's
//! commit is atomic, so a crash at any point leaves the file at the last completed commit,
//! never part of one.
//!
//! | call | durable when |
//! |------|--------------|
//! | [`RaftLogStorage::append`] | when the `IOFlushed` callback is called with `Ok`: `append` returns as soon as the entries are readable, the log's writer thread commits them (with any appends queued behind them: one transaction, one fsync) and then calls the callback |
//! | [`RaftLogStorage::save_vote`] | when it returns `Ok` |
//! | [`RaftLogStorage::save_committed`] | with the next durable write (queued, not waited for, no fsync of its own: it is only a restart hint, and every entry it names is already durable; losing it makes a restarted node replay less and learn the rest from the leader) |
//! | [`RaftLogStorage::truncate_after`] | when it returns `Ok` |
//! | [`RaftLogStorage::purge`] | when it returns `Ok` (entries removed and the purged id recorded in the same transaction) |
//!
//! After a crash the log is whatever the last returned call left: an `append` whose callback
//! never fired is either wholly present or wholly absent. A crash can never leave a hole, a
//! half-written entry, or a purge without its purged id.
//!
//! Opening checks the checksums of the whole file (redb's integrity check) and then this
//! crate's own invariants (format marker, no hole in the log). A file that is truncated,
//! overwritten, not a redb database, or of an unknown format is a typed [`StoreError`] at open;
//! the store never silently starts empty or with fewer entries than were committed. redb may
//! repair its allocator state after an unclean shutdown; that repair only restores the last
//! commit.
//!
//! [`RaftLogStorage`]: openraft::storage::RaftLogStorage
//! [`RaftLogStorage::append`]: openraft::storage::RaftLogStorage::append
//! [`RaftLogStorage::save_vote`]: openraft::storage::RaftLogStorage::save_vote
//! [`RaftLogStorage::save_committed`]: openraft::storage::RaftLogStorage::save_committed
//! [`RaftLogStorage::truncate_after`]: openraft::storage::RaftLogStorage::truncate_after
//! [`RaftLogStorage::purge`]: openraft::storage::RaftLogStorage::purge
//! [`RaftTypeConfig`]: openraft::RaftTypeConfig

mod codec;
mod entry_cache;
mod error;
#[cfg(feature = "failpoints")]
pub mod failpoint;
mod metrics;
mod open;
mod reader;
mod schema;
mod store;
mod txn;
mod writer;

pub use entry_cache::CacheLimits;
pub use error::StoreError;
pub use metrics::{MetricsSnapshot, StoreMetrics};
pub use reader::RedbLogReader;
pub use schema::FORMAT_VERSION;
pub use store::{RedbLogStore, StoreConfig, DEFAULT_MAX_ENTRY_BYTES};
