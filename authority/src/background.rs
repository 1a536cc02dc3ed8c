//! Long work a node does beside apply (writing a snapshot, expanding one to send, writing the
//! store's rows), on threads of lower CPU priority.
//!
//! Every replica starts a snapshot at the same log index, and the first command after the cut
//! copies what it touches of the families the snapshot shares. With the encoders at the same
//! priority as apply and the Raft tasks, the cores went to them: on a 3-node dev cluster at
//! ~19,000 commands/s (2 cores), each snapshot of ~1 GB of hot state stalled every node for
//! 5–11 s, heartbeats were missed and the leader changed (docs/benchmarks.md, "Snapshots
//! without a stall"). A thread niced by [`NICE`] still gets its share when apply waits, so
//! the work ends; it only waits while apply, replication and heartbeats want the cores.
//!
//! A thread's niceness cannot be raised back without privileges, so each job gets a fresh
//! thread instead of a pooled one (snapshots come every `snapshot_every_entries`: a thread
//! per job costs nothing beside the job).
//!
//! An install from the leader that arrives while a niced encoder writes the node's own
//! snapshot does not wait for it: a save takes `SnapshotDir`'s write lock only to take its
//! finished file in and prune (raft/snapshot_file.rs).

use std::io;

/// The niceness of background threads: CFS weighs a nice-10 thread at about a ninth of a
/// nice-0 one, so it runs when apply and the Raft tasks leave a core free, and still gets
/// some CPU under full load.
pub const NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`NICE`]. Failure only costs priority, so it
/// is logged, never returned.
pub fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid` has no preconditions; `setpriority` only reads its arguments.
        let outcome = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE)
        };
        if outcome != 0 {
            tracing::debug!(
                error = %io::Error::last_os_error(),
                "could not lower a background thread's priority"
            );
        }
    }
}

/// Runs `work` on a new thread named `name`, at [`NICE`], and waits for it without holding an
/// async worker. If no thread can be started (a process or memory limit), `work` runs on
/// tokio's blocking pool at the usual priority instead of failing. A panic in `work` comes
/// back as an error.
pub async fn run<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let panicked = || io::Error::other(format!("the background thread {name} panicked"));
    // Shared so that a thread that could not start gives the work back.
    let job = std::sync::Arc::new(std::sync::Mutex::new(Some(work)));
    let (done, outcome) = tokio::sync::oneshot::channel();
    let for_thread = std::sync::Arc::clone(&job);
    let started = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            lower_this_thread();
            let work = for_thread.lock().ok().and_then(|mut job| job.take());
            if let Some(work) = work {
                let _ = done.send(work());
            }
        });
    if let Err(error) = started {
        tracing::warn!(%error, name, "no background thread; running on the blocking pool");
        let work = job.lock().ok().and_then(|mut job| job.take());
        let work = work.ok_or_else(|| io::Error::other("the background work was lost"))?;
        return tokio::task::spawn_blocking(work)
            .await
            .map_err(|_| panicked());
    }
    outcome.await.map_err(|_| panicked())
}

/// This thread's niceness (tests).
#[cfg(all(test, target_os = "linux"))]
fn this_thread_nice() -> i32 {
    // SAFETY: as above; `getpriority` may return -1 legitimately, which errno tells apart, and
    // the tests only compare with values a thread here can have.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn background_work_runs_niced_on_its_own_thread_and_the_caller_is_untouched() {
        let before = this_thread_nice();
        let (nice, name) = run("tally-test-bg", || {
            (
                this_thread_nice(),
                std::thread::current().name().map(str::to_owned),
            )
        })
        .await
        .expect("ran");
        assert_eq!(
            nice,
            NICE.max(before),
            "the work ran at the background niceness"
        );
        assert_eq!(name.as_deref(), Some("tally-test-bg"));
        assert_eq!(
            this_thread_nice(),
            before,
            "the caller's thread keeps its priority"
        );
        let error = run::<()>("tally-test-bg", || panic!("boom"))
            .await
            .expect_err("a panic is an error");
        assert!(error.to_string().contains("panicked"), "{error}");
    }
}
