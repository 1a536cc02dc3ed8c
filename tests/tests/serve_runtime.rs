//! `tally-node serve` sizes its async runtime from its configuration (`worker_threads`)
//! before the runtime exists: the size a node asks for is the size it prints, and a value out
//! of range stops it at once, naming the setting, with nothing written.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tally_tests::{stdout_lines, workspace_binary};

fn serve(data_dir: &Path, worker_threads: &str) -> Command {
    let binary = workspace_binary("tally-node");
    assert!(
        binary.exists(),
        "{} is built by `cargo nextest run --workspace`",
        binary.display()
    );
    let mut command = Command::new(binary);
    command
        .args(["serve", "--insecure"])
        .env("TALLY_WORKER_THREADS", worker_threads)
        .env("TALLY_LISTEN_ADDR", "127.0.0.1:0")
        .env("TALLY_PEER_LISTEN_ADDR", "127.0.0.1:0")
        .env("TALLY_DATA_DIR", data_dir)
        .env("RUST_LOG", "error");
    command
}

#[test]
fn serve_runs_the_worker_threads_its_configuration_asks_for() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("data");

    let refused = serve(&data_dir, "5000").output().expect("tally-node runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "refused: {stderr}");
    assert!(
        stderr.contains("worker_threads must be 0..=1024, got 5000"),
        "the error names the setting and its range: {stderr}"
    );
    assert!(!data_dir.exists(), "a refused configuration writes nothing");

    let mut child = serve(&data_dir, "3")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tally-node serve starts");
    let lines = stdout_lines(&mut child);
    let mut seen = Vec::new();
    let runtime_line = loop {
        match lines.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.starts_with("async runtime worker threads:") => break line,
            Ok(line) => seen.push(line),
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no runtime line ({error}); saw {seen:#?}");
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().any(|line| line == "worker_threads = 3"),
        "the printed configuration holds the setting: {seen:#?}"
    );
    assert!(
        runtime_line.starts_with("async runtime worker threads: 3 "),
        "{runtime_line}"
    );
}
