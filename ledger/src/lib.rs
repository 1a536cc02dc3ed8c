//! Tally's budget rules (docs/spec.md §1–8) as pure, deterministic code: no I/O, no async, no
//! clocks, no randomness in any answer or state byte. Every replica applies the same commands
//! in log order through [`Family::apply`] and reaches byte-identical state. (The id tables hash
//! with a per-table random seed, which only decides where a row sits in memory; see
//! `tables/id_table.rs`.)

pub mod account;
mod apply;
pub mod cluster_time;
pub mod cold;
pub mod command;
pub mod commit_index;
mod compaction;
pub mod decision;
mod dedupe;
pub mod error;
pub mod event;
pub mod family;
mod footprint;
pub mod hold;
mod id_sharing;
pub mod identity;
pub mod ids;
mod invariants;
mod journal;
pub mod limits;
pub mod list_position;
pub mod reads;
pub mod region;
pub mod snapshot;
pub mod tables;

pub use account::{Account, AccountKey, GrantLimits, LegacyUnheld, UsageRecord};
pub use cluster_time::{ClusterParams, ParamsChange, CURRENT_RULES, LEGACY_RULES};
pub use cold::{
    ColdFetch, ColdHold, ColdKey, ColdKeyHash, ColdKeyRef, ColdMeta, ColdRowsInMemory, MovedRow,
};
pub use command::{AncestorAccount, ClientCommand, Command, CommandHeader, Operation};
pub use commit_index::{BudgetCommitIndex, LogPosition};
pub use decision::{Decision, DenyReason, DenyRule, Outcome, Resolution};
pub use error::{ConflictReason, LedgerError, PreconditionCode};
pub use event::{AccountImage, AfterImages, EventKind, EventLookup, EventRecord};
pub use family::{ApplyCtx, Family};
pub use hold::{
    ArchivedHold, Hold, HoldAccounts, HoldStates, HoldView, InvocationState, MonetaryState,
};
pub use ids::{AttemptId, CapabilityId, EventId, FamilyId, HoldId, NonceId};
pub use list_position::{HoldPosition, UsagePosition};
pub use reads::HoldFilter;
pub use snapshot::SnapshotError;
pub use tables::id_map::{IdKey, IdMap};
pub use tables::id_table::IdTable;
