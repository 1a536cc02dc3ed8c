//! Compiles the payment rail's `proto/tally/rail/v1/rail.proto` with protox (pure Rust, no
//! system `protoc`) into prost messages and a tonic client/server, so several kernel nodes
//! can share one rail process.

const PROTOS: &[&str] = &[
    "proto/tally/rail/v1/rail.proto",
    "proto/tally/kernel/v1/kernel.proto",
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
    tonic_prost_build::configure().compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
