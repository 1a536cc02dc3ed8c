//! Cluster time (docs/spec.md §6): the leader's stamp, clamped so it never goes back and one bad
//! clock cannot leap it forward.

use serde::{Deserialize, Serialize};

/// Replicated parameters: changed only through the log, so every replica compacts alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterParams {
    /// How long after `not_after_ms` a full event (and a terminal hold) stays in memory.
    pub retention_ms: u64,
    /// The most cluster time may advance in one log entry.
    pub max_clock_step_ms: u64,
}

impl Default for ClusterParams {
    fn default() -> Self {
        Self {
            retention_ms: 24 * 3_600_000,
            max_clock_step_ms: 10_000,
        }
    }
}

/// `max(previous, min(stamped, previous + max_step))`; the first stamp (previous = 0)
/// bootstraps the clock.
pub fn advance(previous_ms: u64, stamped_ms: u64, max_step_ms: u64) -> u64 {
    if previous_ms == 0 {
        return stamped_ms;
    }
    previous_ms.max(stamped_ms.min(previous_ms.saturating_add(max_step_ms)))
}

#[cfg(test)]
mod tests {
    use super::advance;

    #[test]
    fn never_goes_back_and_never_leaps() {
        assert_eq!(advance(0, 1_000_000, 10_000), 1_000_000);
        assert_eq!(advance(1_000_000, 999_000, 10_000), 1_000_000);
        assert_eq!(advance(1_000_000, 1_005_000, 10_000), 1_005_000);
        assert_eq!(advance(1_000_000, 9_000_000, 10_000), 1_010_000);
        assert_eq!(advance(u64::MAX - 1, u64::MAX, 10_000), u64::MAX);
    }
}
