//! A short chaos run end to end (real chaos-node processes, proxies, every phase): it must
//! inject faults, abort a leader at a failpoint, settle every unknown and find no violation.
//! The full `ci` profile is the `tally-chaos run --profile ci` command.

use std::time::Duration;

use tally_chaos::profile::{Profile, ProfileName};
use tally_chaos::run::{run, RunOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_cluster_smoke_run_passes_the_checker() {
    // Kept when the test fails, for the node logs and the report; removed when it passes.
    let dir = tempfile::Builder::new()
        .prefix("chaos-smoke-")
        .tempdir()
        .expect("temp dir")
        .keep();
    let options = RunOptions {
        profile: Profile::new(ProfileName::Ci, Some(15)),
        seed: 20_261_130,
        out: dir.clone(),
        node_binary: env!("CARGO_BIN_EXE_chaos-node").into(),
        kernel_binary: Some(env!("CARGO_BIN_EXE_chaos-kernel").into()),
    };
    // Below nextest's 300 s limit: every phase of a run has its own budget, so even a cluster
    // that stops answering ends in a report well before this.
    let report = tokio::time::timeout(Duration::from_secs(280), run(&options))
        .await
        .unwrap_or_else(|_| panic!("the run is bounded (out dir {})", dir.display()))
        .unwrap_or_else(|error| panic!("the run completes: {error:#} (out dir {})", dir.display()));
    let summary = format!(
        "{}\nout dir (kept): {}",
        tally_chaos::report::summary(&report),
        dir.display()
    );
    assert!(report.passed(), "{summary}");
    assert!(report.ops.total > 100, "{summary}");
    assert!(report.faults.len() >= 2, "{summary}");
    assert!(report.failpoints_fired >= 1, "{summary}");
    assert_eq!(report.unknowns.unresolved, 0, "{summary}");
    assert_eq!(report.check.replicas_compared, 3, "{summary}");
    let kernel = report.kernel.as_ref().expect("the kernel layer ran");
    assert!(kernel.evaluations > 20 && kernel.allows > 0, "{summary}");
    let checked = report.check.kernel.as_ref().expect("the kernel checks ran");
    assert!(checked.receipts_checked > 0, "{summary}");
    for file in ["report.json", "summary.txt", "history.json", "timeline.png"] {
        assert!(dir.join(file).exists(), "{file} written");
    }
    std::fs::remove_dir_all(&dir).expect("remove the out dir of a passing run");
}
