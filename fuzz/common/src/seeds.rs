//! Seed corpora: small, real encodings produced by the code under test. Each fuzz binary
//! writes its seeds and exits when `TALLY_FUZZ_WRITE_SEEDS=<dir>` is set (scripts/fuzz
//! --seeds), so the committed corpus is regenerated from the current encoders with the
//! binaries already built.

use std::path::Path;

/// The environment variable naming the corpus root to write into.
pub const WRITE_SEEDS_ENV: &str = "TALLY_FUZZ_WRITE_SEEDS";

/// If asked to, writes `seeds` under `<root>/<target>/` (replacing the target's `seed-*`
/// files) and exits the process.
pub fn write_if_asked(target: &str, seeds: impl FnOnce() -> Vec<(String, Vec<u8>)>) {
    let Some(root) = std::env::var_os(WRITE_SEEDS_ENV) else {
        return;
    };
    let dir = Path::new(&root).join(target);
    std::fs::create_dir_all(&dir).expect("create the corpus directory");
    for entry in std::fs::read_dir(&dir).expect("read the corpus directory") {
        let path = entry.expect("entry").path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("seed-"))
        {
            std::fs::remove_file(&path).expect("remove an old seed");
        }
    }
    let seeds = seeds();
    for (name, bytes) in &seeds {
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write a seed");
    }
    eprintln!("{target}: wrote {} seeds to {}", seeds.len(), dir.display());
    std::process::exit(0);
}

/// `selector` followed by `payload`, for targets that pick their decoder by the first byte.
pub fn selected(selector: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 1);
    out.push(selector);
    out.extend_from_slice(payload);
    out
}
