//! Compiles the subset of etcd's v3 API in `proto/etcd/` (for `tally-bench compare etcd`) with
//! protox (pure Rust, no system `protoc`) into prost messages and a tonic client, as
//! `api/build.rs` does for Tally's own protos.

const PROTOS: &[&str] = &[
    "proto/etcd/mvccpb/kv.proto",
    "proto/etcd/etcdserverpb/rpc.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut compiler = protox::Compiler::new(["proto/etcd"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(PROTOS.iter().map(|p| p.trim_start_matches("proto/etcd/")))?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
