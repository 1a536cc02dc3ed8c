//! Compiles `proto/tally/v1/*.proto` with protox (pure Rust, no system `protoc`) and
//! generates the prost messages and tonic clients/servers from its descriptor set. The
//! encoded descriptor set is written too, for tonic-reflection.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "proto/tally/v1/common.proto",
    "proto/tally/v1/budget.proto",
    "proto/tally/v1/admin.proto",
    "proto/tally/v1/raft.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(PROTOS)?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("tally_v1_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        // Deterministic iteration for anything that maps (membership lists, digests).
        .btree_map(".")
        // Raft payloads and snapshot chunks are large: share buffers instead of copying.
        .bytes(".tally.v1.RaftBytes")
        .bytes(".tally.v1.SnapshotChunk")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
