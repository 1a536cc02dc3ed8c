//! Run profiles: `ci` (about two minutes, every nemesis incl. leader kills mid-capture) and
//! `soak` (as long as asked).

use clap::ValueEnum;
use serde::Serialize;

use crate::workload::WorkloadConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileName {
    Ci,
    Soak,
}

impl ProfileName {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ci => "ci",
            Self::Soak => "soak",
        }
    }
}

/// The longest run accepted (a soak of a day).
pub const MAX_DURATION_S: u64 = 24 * 3_600;

#[derive(Clone, Debug)]
pub struct Profile {
    pub name: ProfileName,
    /// Workload-and-faults phase; healing, resolving and checking come after.
    pub duration_s: u64,
    pub workload: WorkloadConfig,
    pub nodes: u64,
    pub snapshot_every_entries: u64,
    /// Each node's `max_live_families`: below the workload's families, so families are
    /// passivated to the family store and read back all the time, under the faults, and the
    /// checker's final reads and digests cover families on disk.
    pub max_live_families: usize,
    /// The cluster's `retention_ms`, set through the log before the load (`None`: the
    /// default, 24 h). Short in `ci`, with a short `not_after` window, so events are compacted
    /// under the faults and the checker must find them in the followed journal
    /// (`journal.rs`) or through `GetEvent`'s compact record.
    pub retention_ms: Option<u64>,
}

/// `ci`'s window and retention: an event is compacted ~25 s after its command was built, so
/// most of a 90 s run's events are compacted before the final read; a maintenance event
/// (expiry) ~5 s after it applied, time enough for the journal follower to read it.
const CI_NOT_AFTER_WINDOW_MS: u64 = 20_000;
const CI_RETENTION_MS: u64 = 5_000;
/// `soak`'s: nothing is compacted within a run of up to ~24 h.
const SOAK_NOT_AFTER_WINDOW_MS: u64 = 10 * 60 * 1_000;

impl Profile {
    pub fn new(name: ProfileName, duration_s: Option<u64>) -> Self {
        let default_s = match name {
            ProfileName::Ci => 90,
            ProfileName::Soak => 1_800,
        };
        Self {
            name,
            duration_s: duration_s.unwrap_or(default_s).clamp(5, MAX_DURATION_S),
            workload: WorkloadConfig {
                families: 8,
                hot_share: 0.5,
                children: 2,
                workers: 6,
                twin_pairs: 2,
                think_ms: 20,
                not_after_window_ms: match name {
                    ProfileName::Ci => CI_NOT_AFTER_WINDOW_MS,
                    ProfileName::Soak => SOAK_NOT_AFTER_WINDOW_MS,
                },
            },
            nodes: 3,
            snapshot_every_entries: 200,
            max_live_families: 5,
            retention_ms: match name {
                ProfileName::Ci => Some(CI_RETENTION_MS),
                ProfileName::Soak => None,
            },
        }
    }

    /// Faults to plan: one per ~5 s of the run is more than can happen, the deadline stops it.
    pub fn planned_faults(&self) -> usize {
        (self.duration_s / 3).clamp(4, 1_000) as usize
    }
}
