//! Replays committed inputs without libFuzzer: `cargo test` in fuzz/ runs every file under
//! `fuzz/regressions/<target>/` (minimized crashes, which must stay fixed) and
//! `fuzz/corpus/<target>/` (the seed corpus) through the target's `run`, and the freshly
//! generated seeds too.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// `fuzz/`, the root of the fuzz workspace.
pub fn fuzz_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("common/ sits in fuzz/")
        .to_path_buf()
}

/// Runs every committed input of `target` and every seed `seeds` generates through `run`;
/// panics listing every input that panicked.
pub fn replay(target: &str, run: fn(&[u8]), seeds: fn() -> Vec<(String, Vec<u8>)>) {
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    for kind in ["regressions", "corpus"] {
        let dir = fuzz_root().join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries
            .map(|entry| entry.expect("directory entry").path())
            .filter(|path| path.is_file())
            .collect();
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path).expect("read an input");
            inputs.push((path.display().to_string(), bytes));
        }
    }
    for (name, bytes) in seeds() {
        inputs.push((format!("generated seed {name}"), bytes));
    }
    let mut failures = Vec::new();
    for (name, bytes) in &inputs {
        if catch_unwind(AssertUnwindSafe(|| run(bytes))).is_err() {
            failures.push(name.clone());
        }
    }
    assert!(
        failures.is_empty(),
        "{target}: {} of {} inputs panicked:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}
