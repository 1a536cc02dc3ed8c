//! The budget families behind the replicated state machine: committed log entries in, ledger
//! decisions out. A [`FamilyRouter`] owns one ractor actor per budget family (the pure ledger
//! inside each) and is the only sender to them, so every family sees its commands in log order.
//! `raft/state_machine.rs` is openraft's side of the same thing: it hands each applied batch of
//! entries to the router and builds and installs snapshots from the router's cut.

mod actor_table;
mod alarms;
mod batch;
mod cold_buffer;
mod cold_filter;
mod cold_index;
mod cold_keys;
mod cold_rows;
mod cold_runs;
mod cold_view;
mod config;
mod entry;
mod error;
mod expiry_index;
mod family_actor;
mod family_store;
mod filter_memory;
mod filter_spill;
mod hold_index;
mod messages;
mod reads;
mod router;
mod router_state;
mod snapshot;
pub mod snapshot_stream;

pub use alarms::{AlarmChange, AlarmKind, Alarms, RaisedAlarm, MAX_ALARMS, MAX_ALARM_REASON_BYTES};
pub use cold_keys::cold_row_key;
pub use config::RouterConfig;
pub use entry::{EntryInput, EntryOutput, EntryPayload};
pub use error::RouterError;
pub use family_store::{FamilyStore, FamilyStoreDir, StoreView, MIN_STORE_CACHE_BYTES};
pub use hold_index::rebuild_hold_index;
pub use reads::{every_family, read};
pub use router::{FamilyRouter, FilterPages, MemoryUse};
pub use router_state::RouterState;
pub use snapshot::{
    RouterCut, RouterSnapshot, OLDEST_SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION,
};
