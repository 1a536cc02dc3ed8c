//! End-to-end tests live in `tests/`; this library only locates the workspace's binaries.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc;

/// A binary of this workspace, built next to the test executable (`target/<profile>/`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    profile_dir.join(name)
}

/// The lines `child` prints on its piped stdout, read on a thread of their own so a test can
/// wait for one with a timeout; the receiver ends when the child closes its stdout.
pub fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    lines
}
