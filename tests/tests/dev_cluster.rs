//! The README's main command as a newcomer types it: `tally-node dev` brings up a 3-node
//! cluster that a second terminal (`tally`) can call; stopped with SIGTERM and started again on
//! the same data dir, it is the same cluster with the same state.

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tally_tests::{stdout_lines, workspace_binary};

struct Dev {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Dev {
    fn start(data_dir: &std::path::Path, base_port: u16) -> Dev {
        std::fs::create_dir_all(data_dir).expect("data dir");
        let stderr = std::fs::File::create(data_dir.with_extension("stderr")).expect("stderr file");
        let binary = workspace_binary("tally-node");
        assert!(
            binary.exists(),
            "{} is built by `cargo nextest run --workspace`",
            binary.display()
        );
        let mut child = Command::new(binary)
            .args(["dev", "--data-dir"])
            .arg(data_dir)
            .args(["--base-port", &base_port.to_string()])
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("tally-node dev starts");
        let lines = stdout_lines(&mut child);
        Dev { child, lines }
    }

    /// Waits (bounded) for a stdout line containing `needle`; returns every line seen, or
    /// why not (the process exited, or 60 s passed).
    fn wait_for(&self, needle: &str) -> Result<Vec<String>, String> {
        let mut seen = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    let found = line.contains(needle);
                    seen.push(line);
                    if found {
                        return Ok(seen);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "dev exited before printing {needle:?}; saw {seen:#?}"
                    ))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("no line containing {needle:?} within 60 s; saw {seen:#?}")
                }
            }
        }
    }

    /// SIGTERM, as the README says, then wait for a clean exit.
    fn stop(mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(sent, 0, "SIGTERM delivered");
        let status = self.child.wait().expect("dev exits");
        assert!(status.success(), "dev exits cleanly on SIGTERM: {status}");
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tally` against the dev cluster, with the certificates `tally-node dev` made.
fn tally(base_port: u16, data_dir: &std::path::Path, args: &[&str]) -> (i32, String) {
    let endpoints = (1..=3)
        .map(|i| format!("127.0.0.1:{}", base_port + i))
        .collect::<Vec<_>>()
        .join(",");
    let output = Command::new(workspace_binary("tally"))
        .arg("--endpoints")
        .arg(endpoints)
        .arg("--tls-dir")
        .arg(data_dir.join("tls"))
        .args(args)
        .output()
        .expect("tally runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

const AUTHORIZE: &[&str] = &[
    "hold",
    "authorize",
    "--family",
    "acme",
    "--capability",
    "cap-7",
    "--hold",
    "h1",
    "--units",
    "100",
    "--max-cost-per-invocation",
    "100",
    "--max-total-cost",
    "1000",
    "--currency",
    "USD",
];

#[test]
fn the_dev_cluster_serves_stops_on_sigterm_and_restarts_with_its_state() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Other tests may hold ports: try a few bases, each with its own data dir, until one
    // serves (a dev cluster that cannot bind exits at once and says why on stderr).
    let mut failures = Vec::new();
    let (dev, base_port, data_dir, banner) = (0..8u16)
        .find_map(|attempt| {
            let base_port = 31_000 + ((std::process::id() as u16 % 400) + attempt * 53) % 400 * 10;
            let data_dir = dir.path().join(format!("attempt-{attempt}"));
            let dev = Dev::start(&data_dir, base_port);
            match dev.wait_for("Ctrl-C or SIGTERM stops the cluster") {
                Ok(banner) => Some((dev, base_port, data_dir, banner)),
                Err(why) => {
                    let stderr = std::fs::read_to_string(data_dir.with_extension("stderr"))
                        .unwrap_or_default();
                    failures.push(format!("{why}\n{stderr}"));
                    None
                }
            }
        })
        .unwrap_or_else(|| panic!("no dev cluster started: {failures:#?}"));
    assert!(
        banner
            .iter()
            .any(|l| l.contains("initialized a new 3-node cluster")),
        "{banner:#?}"
    );
    assert!(
        banner.iter().any(|l| l.contains("grpcurl")),
        "an example call is printed"
    );

    let (code, out) = tally(base_port, &data_dir, AUTHORIZE);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Authorized"), "{out}");
    let (code, out) = tally(base_port, &data_dir, &["status", "--json"]);
    assert_eq!(code, 0, "{out}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("JSON status");
    let leaders = status
        .as_array()
        .expect("one row per node")
        .iter()
        .filter(|n| n["role"] == "leader")
        .count();
    assert_eq!(leaders, 1, "{out}");

    // Cluster parameters: the defaults, then a change through the log that a restart keeps.
    let (code, out) = tally(base_port, &data_dir, &["params", "--json"]);
    assert_eq!(code, 0, "{out}");
    let params: serde_json::Value = serde_json::from_str(&out).expect("JSON params");
    assert_eq!(params["retention_ms"], 24 * 3_600_000, "{out}");
    assert_eq!(params["max_clock_step_ms"], 10_000, "{out}");
    let (code, out) = tally(
        base_port,
        &data_dir,
        &["params", "--retention-ms", "3600000", "--json"],
    );
    assert_eq!(code, 0, "{out}");
    let params: serde_json::Value = serde_json::from_str(&out).expect("JSON params");
    assert_eq!(params["retention_ms"], 3_600_000, "{out}");
    assert_eq!(
        params["max_clock_step_ms"], 10_000,
        "unset keeps its value: {out}"
    );
    assert!(params["committed_at_log_index"].as_u64().is_some(), "{out}");
    let (code, out) = tally(
        base_port,
        &data_dir,
        &["params", "--max-clock-step-ms", "0"],
    );
    assert_eq!(code, 2, "a zero clock step is bad usage: {out}");
    dev.stop();

    let dev = Dev::start(&data_dir, base_port);
    let banner = dev
        .wait_for("Ctrl-C or SIGTERM stops the cluster")
        .expect("the restart serves");
    assert!(
        banner.iter().any(|l| l.contains("restarting the cluster")),
        "{banner:#?}"
    );
    let (code, out) = tally(
        base_port,
        &data_dir,
        &["usage", "--family", "acme", "--json"],
    );
    assert_eq!(code, 0, "{out}");
    let usage: serde_json::Value = serde_json::from_str(&out).expect("JSON usage");
    assert_eq!(
        usage[0]["account"]["invocation_count"], 1,
        "the restarted cluster kept its state: {out}"
    );
    let (code, out) = tally(base_port, &data_dir, &["params", "--json"]);
    assert_eq!(code, 0, "{out}");
    let params: serde_json::Value = serde_json::from_str(&out).expect("JSON params");
    assert_eq!(
        params["retention_ms"], 3_600_000,
        "the restarted cluster kept its parameters: {out}"
    );
    // The same command again is a replay, answered from the stored outcome.
    let (code, out) = tally(base_port, &data_dir, AUTHORIZE);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("(replayed)"), "{out}");
    dev.stop();
}
