//! What the router consumes (committed log entries) and what it answers per entry.

use tally_ledger::{Command, Decision, LedgerError, LogPosition, ParamsChange};

use super::alarms::AlarmChange;

/// One committed log entry, as the Raft layer hands it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInput {
    pub log_id: LogPosition,
    /// The leader's clock when it proposed the entry; clamped into cluster time (docs/spec.md §6).
    pub stamped_ms: u64,
    pub payload: EntryPayload,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryPayload {
    /// A leader's no-op (or a membership change): advances the clock and `last_applied` only.
    Blank,
    /// At most `tally_ledger::limits::MAX_COMMANDS_PER_ENTRY` commands, applied in order.
    Commands(Vec<Command>),
    /// Parameters change only through the log, so every replica compacts alike: the named
    /// fields, applied on top of the parameters in force (a whole struct names every field).
    SetParams(ParamsChange),
    /// An alarm raised or cleared (docs/spec.md §5.6): through the log, so every replica
    /// refuses alike from this entry on.
    Alarm(AlarmChange),
    /// The rules that decide what leaves memory raised to this version (never lowered): from
    /// this entry on every replica applies them. A node that does not know the version stops.
    RaiseRules(u32),
}

/// The answers to one entry's commands, in the entry's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryOutput {
    pub log_id: LogPosition,
    /// The cluster time every command of the entry was applied at.
    pub cluster_time_ms: u64,
    pub results: Vec<Result<Decision, LedgerError>>,
}
