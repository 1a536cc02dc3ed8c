//! Snapshot files (`*.tsnap`, authority/src/raft/snapshot_file.rs): magic, format version,
//! meta, state digest, data and a SHA-256 trailer, read on start by `SnapshotDir::load_latest`. The file
//! reader (`read`) is private, so this target writes each input as a file and loads it through
//! the public `SnapshotDir`, in `$TMPDIR` (scripts/fuzz points it at tmpfs, where fsync is
//! free).
//!
//! Input: a mode byte, then the file. With an even mode byte the target appends the correct
//! checksum itself, so the fuzzer gets past it to the header, meta and data parsing; with an
//! odd one the file is taken as is (truncation, checksum mismatch).
//!
//! Asserts: loading never panics, and an invalid file is skipped (`Ok(None)`), never
//! returned; a loaded snapshot saved again (`SnapshotDir::save_copy`) loads back equal, and
//! saving that writes the same bytes (the file format round-trips); and its data passes the
//! `router_snapshot` checks.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use tally_authority::raft::snapshot_file::{SnapshotDir, SnapshotFile, SnapshotFileError};
use tally_authority::raft::types::{SnapshotMeta, TypeConfig};
use tally_fuzz_common::seeds::selected;

/// The name `SnapshotDir::save_with` gives a snapshot without a last log id.
const FILE: &str = "snapshot-00000000000000000000-00000000000000000000.tsnap";

fn scratch() -> &'static (PathBuf, PathBuf) {
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIRS.get_or_init(|| {
        let root =
            std::env::temp_dir().join(format!("tally-fuzz-snapshot-file-{}", std::process::id()));
        let (input, output) = (root.join("in"), root.join("out"));
        for dir in [&input, &output] {
            std::fs::create_dir_all(dir).expect("scratch directory");
        }
        (input, output)
    })
}

fn clear(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read scratch") {
        let _ = std::fs::remove_file(entry.expect("entry").path());
    }
}

pub fn run(data: &[u8]) {
    let Some((mode, body)) = tally_fuzz_common::split_selector(data) else {
        return;
    };
    let mut file = body.to_vec();
    if mode % 2 == 0 {
        let checksum = Sha256::digest(&file);
        file.extend_from_slice(&checksum);
    }
    let (input, output) = scratch();
    clear(input);
    std::fs::write(input.join(FILE), &file).expect("write the input file");
    let dir = SnapshotDir::open(input).expect("open");
    let (meta, loaded) = match dir.load_latest() {
        Ok(Some(snapshot)) => snapshot,
        Ok(None) | Err(SnapshotFileError::Incompatible { .. }) => return,
        Err(other) => panic!("loading a snapshot file failed with {other}"),
    };
    clear(output);
    let out = SnapshotDir::open(output).expect("open");
    let saved = out
        .save_copy(&meta, &loaded)
        .unwrap_or_else(|e| panic!("a loaded snapshot does not save: {e}"));
    let first = read_dir_file(output);
    let (again_meta, again) = out
        .load_latest()
        .unwrap_or_else(|e| panic!("a saved snapshot does not load: {e}"))
        .expect("the saved snapshot is valid");
    assert_eq!(again_meta, meta, "snapshot meta changed through a file");
    assert_eq!(
        (data_of(&again), again.digest()),
        (data_of(&loaded), loaded.digest()),
        "snapshot data changed through a file"
    );
    clear(output);
    drop(saved);
    // From the input's file: `again` is this directory's own file, which a save keeps in
    // place instead of copying (and `clear` has just removed it).
    out.save_copy(&meta, &loaded).expect("saves");
    assert_eq!(
        read_dir_file(output),
        first,
        "saving the same snapshot twice wrote different files"
    );
    crate::router_snapshot::check(&data_of(&loaded));
}

fn data_of(file: &SnapshotFile) -> Vec<u8> {
    let mut data = Vec::new();
    file.reader()
        .read_to_end(&mut data)
        .expect("a loaded snapshot reads");
    data
}

/// The one snapshot file in `dir`.
fn read_dir_file(dir: &Path) -> Vec<u8> {
    let entry = std::fs::read_dir(dir)
        .expect("read scratch")
        .next()
        .expect("one file")
        .expect("entry");
    std::fs::read(entry.path()).expect("read back")
}

/// Files as `SnapshotDir::save_with` writes them (without the checksum, which the target
/// adds).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let (_, output) = scratch();
    let mut seeds = Vec::new();
    let membership = openraft::Membership::new(
        vec![[1].into()],
        [(1, tally_authority::raft::types::TallyNode::default())]
            .into_iter()
            .collect::<std::collections::BTreeMap<_, _>>(),
    )
    .expect("a valid membership");
    for (name, router) in crate::router_snapshot::seed_snapshots() {
        for (meta_name, meta) in [
            ("no-meta", SnapshotMeta::default()),
            (
                "meta",
                SnapshotMeta {
                    last_log_id: Some(openraft::testing::log_id::<TypeConfig>(1, 1, 16)),
                    last_membership: openraft::StoredMembership::new(
                        Some(openraft::testing::log_id::<TypeConfig>(1, 1, 1)),
                        membership.clone(),
                    ),
                },
            ),
        ] {
            clear(output);
            let dir = SnapshotDir::open(output).expect("open");
            let digest = router.digest();
            let bytes = router.to_bytes().expect("encodes");
            dir.save_with(&meta, |out| {
                std::io::Write::write_all(out, &bytes)?;
                Ok(digest)
            })
            .expect("saves");
            let mut file = read_dir_file(output);
            file.truncate(file.len() - 32);
            seeds.push((format!("{name}-{meta_name}"), selected(0, &file)));
        }
    }
    seeds
}
