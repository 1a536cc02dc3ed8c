//! End-to-end tests live in `tests/`; this library only locates the workspace's binaries.

use std::path::PathBuf;

/// A binary of this workspace, built next to the test executable (`target/<profile>/`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    profile_dir.join(name)
}
