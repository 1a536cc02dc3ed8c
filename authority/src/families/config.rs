//! The router's node-local limits: how much work is in flight and how many actors stay live.

use tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;

use super::error::RouterError;

/// Hard ceiling on `max_commands_per_batch`: one round's commands and replies sit in memory.
pub const MAX_COMMANDS_PER_BATCH_CEILING: usize = 1 << 20;

/// Node-local knobs. None of them is replicated state: two replicas with different values
/// still reach the same state and digest, they only use memory differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterConfig {
    /// Commands fanned out to family actors in one round. `apply` splits larger inputs into
    /// rounds (never splitting an entry), so in-flight work is bounded by one round.
    pub max_commands_per_batch: usize,
    /// Live actors kept after a round; beyond it the least recently used are passivated.
    /// During a round up to `max_live_actors + max_commands_per_batch` actors may be live.
    pub max_live_actors: usize,
    /// The hot families' share of the node's memory budget: after a round the least recently
    /// used live families are passivated to the family store while the live families'
    /// estimated footprint (`Family::footprint_bytes`) is above it.
    pub max_live_bytes: usize,
    /// A family used in the last this many log entries is not passivated for bytes (the
    /// count limit still applies). A family is spilled whole, so spilling one in use only
    /// brings it back, re-encoded and decoded, a few rounds later: with families in use
    /// larger than the budget that costs more than the memory it saves (measured: leader
    /// changes with 20 hot families of ~30 MB each). 0 spills any family not in the round.
    pub min_idle_entries_to_spill: u64,
    /// What the filters over rows out of memory may keep in memory, part of `max_live_bytes`:
    /// beyond it the pages of the largest go to the page file (`filter_memory.rs`). `None`:
    /// a quarter of `max_live_bytes`.
    pub max_filter_bytes: Option<usize>,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            max_commands_per_batch: 16_384,
            max_live_actors: 10_000,
            max_live_bytes: 1 << 30,
            min_idle_entries_to_spill: 1_000,
            max_filter_bytes: None,
        }
    }
}

impl RouterConfig {
    pub fn validate(&self) -> Result<(), RouterError> {
        if self.max_commands_per_batch < MAX_COMMANDS_PER_ENTRY {
            return Err(RouterError::Config(format!(
                "max_commands_per_batch {} is below {MAX_COMMANDS_PER_ENTRY}: one entry must fit \
                 in one round",
                self.max_commands_per_batch
            )));
        }
        if self.max_commands_per_batch > MAX_COMMANDS_PER_BATCH_CEILING {
            return Err(RouterError::Config(format!(
                "max_commands_per_batch {} exceeds {MAX_COMMANDS_PER_BATCH_CEILING}",
                self.max_commands_per_batch
            )));
        }
        if self.max_live_actors == 0 {
            return Err(RouterError::Config(
                "max_live_actors must be at least 1".into(),
            ));
        }
        if self.max_live_bytes == 0 {
            return Err(RouterError::Config(
                "max_live_bytes must be at least 1".into(),
            ));
        }
        Ok(())
    }
}
