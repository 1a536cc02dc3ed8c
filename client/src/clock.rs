//! The caller's wall clock, in milliseconds since the epoch: what clients put in
//! `not_after_ms` (the cluster judges deadlines on its own clock, docs/spec.md §6).

pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
