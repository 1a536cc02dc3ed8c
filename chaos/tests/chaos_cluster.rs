//! A short chaos run end to end (real chaos-node processes, proxies, every phase): it must
//! inject faults, abort a leader at a failpoint, settle every unknown and find no violation.
//! The full `ci` profile is the `tally-chaos run --profile ci` command.

use std::time::Duration;

use tally_chaos::profile::{Profile, ProfileName};
use tally_chaos::run::{run, RunOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_cluster_smoke_run_passes_the_checker() {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = RunOptions {
        profile: Profile::new(ProfileName::Ci, Some(15)),
        seed: 20_261_130,
        out: dir.path().to_owned(),
        node_binary: env!("CARGO_BIN_EXE_chaos-node").into(),
        kernel_binary: Some(env!("CARGO_BIN_EXE_chaos-kernel").into()),
    };
    let report = tokio::time::timeout(Duration::from_secs(240), run(&options))
        .await
        .expect("the run is bounded")
        .expect("the run completes");
    let summary = tally_chaos::report::summary(&report);
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
        assert!(dir.path().join(file).exists(), "{file} written");
    }
}
