//! The budget commit index of docs/spec.md §6: unique, strictly increasing in apply order, equal on
//! every replica, and known before a family applies the command.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_COMMANDS_PER_ENTRY, MAX_EVENTS_PER_COMMAND, MAX_LOG_INDEX};

/// `(log_index << 20) | (command_position << 8) | event_position`.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BudgetCommitIndex(pub u64);

impl BudgetCommitIndex {
    pub fn new(log_index: u64, command_position: usize, event_position: usize) -> Self {
        assert!(
            log_index <= MAX_LOG_INDEX,
            "log index {log_index} exceeds 44 bits"
        );
        assert!(
            command_position < MAX_COMMANDS_PER_ENTRY,
            "command position {command_position} exceeds the per-entry limit"
        );
        assert!(
            event_position < MAX_EVENTS_PER_COMMAND,
            "event position {event_position} exceeds the per-command limit"
        );
        Self((log_index << 20) | ((command_position as u64) << 8) | event_position as u64)
    }

    pub fn log_index(self) -> u64 {
        self.0 >> 20
    }

    pub fn command_position(self) -> usize {
        ((self.0 >> 8) & 0xfff) as usize
    }

    pub fn event_position(self) -> usize {
        (self.0 & 0xff) as usize
    }

    /// The index of the `n`th event of the same command.
    pub fn with_event_position(self, event_position: usize) -> Self {
        Self::new(self.log_index(), self.command_position(), event_position)
    }
}

impl fmt::Debug for BudgetCommitIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}({}.{}.{})",
            self.0,
            self.log_index(),
            self.command_position(),
            self.event_position()
        )
    }
}

impl fmt::Display for BudgetCommitIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The Raft log id an event was committed at.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct LogPosition {
    pub term: u64,
    pub index: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_orders_by_log_then_command_then_event() {
        let a = BudgetCommitIndex::new(7, 4_095, 255);
        assert_eq!(
            (a.log_index(), a.command_position(), a.event_position()),
            (7, 4_095, 255)
        );
        assert!(a < BudgetCommitIndex::new(8, 0, 0));
        assert!(BudgetCommitIndex::new(8, 0, 1) < BudgetCommitIndex::new(8, 1, 0));
        assert_eq!(
            BudgetCommitIndex::new(8, 1, 0)
                .with_event_position(3)
                .event_position(),
            3
        );
    }

    #[test]
    #[should_panic(expected = "command position")]
    fn too_many_commands_per_entry_is_a_bug() {
        BudgetCommitIndex::new(1, MAX_COMMANDS_PER_ENTRY, 0);
    }
}
