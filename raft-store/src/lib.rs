//! The durable Raft log of a Tally node: openraft's [`RaftLogStorage`] on a directory of
//! append-only segment files (`wal.rs`, framing in `frame.rs`).
//!
//! The segments hold the log entries, the vote, the committed-id hint, the last purged id and
//! truncations, as checksummed frames; values are rmp-serde bytes, so the store works for any
//! [`RaftTypeConfig`] whose entry, vote and log id are serde types (openraft's `serde`
//! feature). An in-memory index says where each live entry's bytes are.
//!
//! Why not a B-tree file: an append here is one sequential write and one `fdatasync`, which
//! measured about the disk's bare `fdatasync` cost, where the redb file of earlier builds
//! wrote and synced several scattered pages per commit (2-3x the `fdatasync`, on the critical
//! path of every command, on the leader and on each follower). A log needs no B-tree: it is
//! appended at the end, cut at the end (truncate) and dropped at the front (purge).
//! `import_redb_log` moves a node written by an earlier build.
//!
//! The decoded tail of the log stays in memory (bounded by [`CacheLimits`]), so replication
//! and apply read what was just appended without decoding it again; see `entry_cache.rs` for
//! why that never returns anything the files do not hold.
//!
//! # Crash contract
//!
//! Every write is one frame appended to the newest segment by one writer thread, in the order
//! openraft issued the calls, and synced with `fdatasync` before the next frame is written.
//! A frame carries one checksum over all of it. So a crash leaves every frame before the last
//! intact and the last one whole, missing, or torn; a torn last frame (its `fdatasync` never
//! returned, so nothing in it was reported durable) is cut off at open.
//!
//! | call | durable when |
//! |------|--------------|
//! | [`RaftLogStorage::append`] | when the `IOFlushed` callback is called with `Ok`: `append` returns as soon as the entries are readable, the log's writer thread writes them (with any appends queued behind them: one frame, one `fdatasync`) and then calls the callback |
//! | [`RaftLogStorage::save_vote`] | when it returns `Ok` |
//! | [`RaftLogStorage::save_committed`] | with the first frame after which the log holds the entry it names (not queued, not waited for, no write of its own: it is only a restart hint; losing it makes a restarted node replay less and learn the rest from the leader) |
//! | [`RaftLogStorage::truncate_after`] | when it returns `Ok` (a truncation record; nothing is rewritten) |
//! | [`RaftLogStorage::purge`] | when it returns `Ok` (a purge record; segments no live entry is in are then deleted) |
//!
//! After a crash the log is whatever the last returned call left: an `append` whose callback
//! never fired is either wholly present or wholly absent. A crash can never leave a hole, a
//! half-written entry, or a purge without its purged id.
//!
//! Opening replays every segment and checks every frame's checksum and this crate's own
//! invariants (segment header and format version, consecutive segments, no hole in the log).
//! Damage with a valid frame after it, a missing segment, a foreign file or an unknown format
//! is a typed [`StoreError`] at open; the store never silently starts empty. What open cannot
//! tell from a torn write is a segment cut short *inside its last frame* by something other
//! than a crash: those entries are dropped with a warning, as a torn write's would be.
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
mod frame;
mod legacy;
mod metrics;
mod preallocate;
mod reader;
mod store;
mod wal;
mod writer;

pub use entry_cache::CacheLimits;
pub use error::StoreError;
pub use legacy::{import_redb_log, Imported};
pub use metrics::{MetricsSnapshot, StoreMetrics};
pub use reader::LogReader;
pub use store::{LogRelease, LogStore, StoreConfig, DEFAULT_MAX_ENTRY_BYTES};
pub use wal::{WalConfig, FORMAT_VERSION};
