//! Tally's budget rules (SPEC.md §1–8) as pure, deterministic code: no I/O, no async, no
//! clocks, no randomness in any answer or state byte. Every replica applies the same commands
//! in log order through [`Family::apply`] and reaches byte-identical state. (The id tables hash
//! with a per-table random seed, which only decides where a row sits in memory; see
//! `id_table.rs`.)

pub mod account;
mod apply;
mod chunked_deque;
pub mod cluster_time;
pub mod command;
pub mod commit_index;
mod compaction;
mod compaction_queue;
pub mod decision;
mod dedupe;
mod dedupe_table;
pub mod error;
pub mod event;
pub mod family;
pub mod hold;
pub mod id_map;
pub mod id_table;
pub mod identity;
mod identity_fields;
pub mod ids;
mod invariants;
mod journal;
pub mod limits;
pub mod list_position;
pub mod reads;
mod short_copy;
pub mod snapshot;
mod spare_capacity;

pub use account::{Account, AccountKey, GrantLimits, LegacyUnheld, UsageRecord};
pub use cluster_time::ClusterParams;
pub use command::{AncestorAccount, ClientCommand, Command, CommandHeader, Operation};
pub use commit_index::{BudgetCommitIndex, LogPosition};
pub use decision::{Decision, DenyReason, DenyRule, Outcome, Resolution};
pub use error::{ConflictReason, LedgerError, PreconditionCode};
pub use event::{AccountImage, AfterImages, EventKind, EventLookup, EventRecord};
pub use family::{ApplyCtx, Family};
pub use hold::{
    ArchivedHold, Hold, HoldAccounts, HoldStates, HoldView, InvocationState, MonetaryState,
};
pub use id_map::{IdKey, IdMap};
pub use id_table::IdTable;
pub use ids::{AttemptId, CapabilityId, EventId, FamilyId, HoldId, NonceId};
pub use list_position::{HoldPosition, UsagePosition};
pub use reads::HoldFilter;
pub use snapshot::SnapshotError;
