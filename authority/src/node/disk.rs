//! The disk watcher (docs/spec.md §5.6): every `disk_check_interval_ms` it measures what the
//! data dir uses (Raft log, snapshots, incoming snapshots) and what the filesystem has free,
//! and when either crosses its limit it has the `NoSpace` alarm raised *through the log*, so
//! every replica refuses new exposure from the same entry on. A write that fails for lack of
//! space is fatal to a Raft log, so the alarm comes early: at `100 - QUOTA_HEADROOM_PERCENT`
//! percent of the quota, or when free space falls below the reserve, and what is still applied
//! while it is raised (holds closed, charges settled) is small.
//!
//! The leader proposes the raise itself; a follower asks the leader on the peer port
//! (`Raft.RaiseAlarm`, which the leader accepts only from the node the raise names). The
//! watcher never clears: an operator does (`tally alarm clear`), and if space is still short
//! the next check raises it again.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::metrics::NodeMetrics;
use super::proposer::Proposer;
use crate::families::{AlarmChange, AlarmKind};
use crate::raft::state_machine::SharedRouter;
use crate::raft::types::NodeId;

/// The share of the quota kept as headroom: the alarm is raised once the data dir uses 90% of
/// `disk_quota_bytes`, so entries in flight and the next snapshot still fit.
pub const QUOTA_HEADROOM_PERCENT: u64 = 10;
/// Directory entries visited per measurement at most: a data dir holds a log file and a few
/// snapshots, so the bound only stops a runaway walk (say, a mount loop) from blocking a
/// thread for ever.
const MAX_ENTRIES_WALKED: usize = 100_000;

/// A node's disk limits, from its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskLimits {
    /// Bytes the data dir may use; 0 = no quota.
    pub quota_bytes: u64,
    /// Free filesystem space to keep; 0 = not checked.
    pub reserve_bytes: u64,
    pub check_interval: Duration,
}

impl DiskLimits {
    /// The usage at which the quota check raises the alarm.
    pub fn quota_alarm_bytes(&self) -> u64 {
        self.quota_bytes - self.quota_bytes / 100 * QUOTA_HEADROOM_PERCENT
    }

    /// Why space is short, if it is: the alarm's reason.
    pub fn shortage(&self, usage: DiskUsage) -> Option<String> {
        if self.quota_bytes > 0 && usage.used_bytes >= self.quota_alarm_bytes() {
            return Some(format!(
                "data dir uses {} bytes, {}% of its quota of {} bytes \
                 (the alarm is raised at {}%)",
                usage.used_bytes,
                usage.used_bytes.saturating_mul(100) / self.quota_bytes,
                self.quota_bytes,
                100 - QUOTA_HEADROOM_PERCENT
            ));
        }
        if self.reserve_bytes > 0 && usage.free_bytes < self.reserve_bytes {
            return Some(format!(
                "the filesystem has {} bytes free, below the reserve of {} bytes",
                usage.free_bytes, self.reserve_bytes
            ));
        }
        None
    }
}

/// One measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes of every file under the data dir (their length: a sparse file counts in full,
    /// which errs on the safe side), each file once however many names it has.
    pub used_bytes: u64,
    /// Bytes an unprivileged writer may still use on the data dir's filesystem.
    pub free_bytes: u64,
}

/// Measures `data_dir` (blocking: run it off the async workers).
pub fn measure(data_dir: &Path) -> io::Result<DiskUsage> {
    Ok(DiskUsage {
        used_bytes: dir_bytes(data_dir)?,
        free_bytes: free_bytes(data_dir)?,
    })
}

/// A node's snapshots name the family store's run files by hard link (one run is then named
/// by the store and by each of the two snapshots kept), so a file is counted once by its
/// inode: counting names counted the history up to four times, and raised `NoSpace` at a
/// third of the real use.
fn dir_bytes(root: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    // Only files with more than one name: their count is bounded by the walk's.
    let mut linked = std::collections::HashSet::new();
    let mut pending: Vec<PathBuf> = vec![root.to_path_buf()];
    let mut walked = 0usize;
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            walked += 1;
            if walked > MAX_ENTRIES_WALKED {
                return Err(io::Error::other(format!(
                    "more than {MAX_ENTRIES_WALKED} entries under {}",
                    root.display()
                )));
            }
            let entry = entry?;
            // A file removed between listing and stat (a pruned snapshot) counts as gone.
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if metadata.nlink() < 2 || linked.insert((metadata.dev(), metadata.ino())) {
                total = total.saturating_add(metadata.len());
            }
        }
    }
    Ok(total)
}

fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("data dir path contains a NUL byte"))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call, and `stats` points
    // to writable memory of the right type; statvfs writes it entirely on success.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let stats = unsafe { stats.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// The watcher task: measures every `limits.check_interval` and has the alarm raised when
/// space is short and this node's alarm is not already raised.
pub async fn run(
    node_id: NodeId,
    data_dir: PathBuf,
    limits: DiskLimits,
    router: SharedRouter,
    proposer: Arc<Proposer>,
    metrics: Arc<NodeMetrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(limits.check_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let dir = data_dir.clone();
        let usage = match tokio::task::spawn_blocking(move || measure(&dir)).await {
            Ok(Ok(usage)) => usage,
            Ok(Err(error)) => {
                tracing::warn!(%error, dir = %data_dir.display(), "disk usage not measured");
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, "disk measurement task failed");
                continue;
            }
        };
        metrics
            .data_dir_bytes
            .store(usage.used_bytes, Ordering::Relaxed);
        metrics
            .disk_free_bytes
            .store(usage.free_bytes, Ordering::Relaxed);
        let Some(reason) = limits.shortage(usage) else {
            continue;
        };
        let already = router
            .lock()
            .await
            .alarms()
            .iter()
            .any(|(kind, node, _)| kind == AlarmKind::NoSpace && node == node_id);
        if already {
            continue;
        }
        tracing::warn!(node_id, %reason, "disk short: raising the NoSpace alarm");
        let change = AlarmChange::raise(AlarmKind::NoSpace, node_id, &reason);
        match proposer.raise_alarm(change).await {
            Ok(reply) => tracing::warn!(
                node_id,
                log_index = reply.log_id.index,
                "NoSpace alarm raised through the log: new exposure is refused until an \
                 operator clears it (`tally alarm clear`)"
            ),
            Err(error) => {
                tracing::warn!(%error, "NoSpace alarm not raised yet; retrying next check")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(quota_bytes: u64, reserve_bytes: u64) -> DiskLimits {
        DiskLimits {
            quota_bytes,
            reserve_bytes,
            check_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_alarm_comes_before_the_quota_and_below_the_reserve() {
        let usage = |used_bytes, free_bytes| DiskUsage {
            used_bytes,
            free_bytes,
        };
        let quota = limits(1_000, 0);
        assert_eq!(quota.quota_alarm_bytes(), 900);
        assert!(quota.shortage(usage(899, 0)).is_none(), "no reserve check");
        let reason = quota.shortage(usage(900, 0)).expect("at 90%");
        assert!(reason.contains("quota of 1000 bytes"), "{reason}");
        assert!(limits(0, 0).shortage(usage(u64::MAX, 0)).is_none());
        let reserve = limits(0, 500);
        assert!(reserve.shortage(usage(u64::MAX, 500)).is_none());
        let reason = reserve.shortage(usage(0, 499)).expect("below the reserve");
        assert!(reason.contains("reserve of 500 bytes"), "{reason}");
    }

    #[test]
    fn a_measurement_counts_every_file_under_the_data_dir_once() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("a"), [0u8; 100])?;
        std::fs::create_dir(dir.path().join("snapshots"))?;
        std::fs::write(dir.path().join("snapshots").join("b"), [0u8; 28])?;
        // A snapshot's second name for a run of the store takes no more disk.
        std::fs::hard_link(
            dir.path().join("a"),
            dir.path().join("snapshots").join("a-linked"),
        )?;
        let usage = measure(dir.path())?;
        assert_eq!(usage.used_bytes, 128);
        assert!(usage.free_bytes > 0);
        Ok(())
    }
}
