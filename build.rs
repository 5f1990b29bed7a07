//! Compiles the protobuf API with protox (pure Rust, so no system `protoc` is
//! needed) and writes the file descriptor set that server reflection serves.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &[
    "proto/subagents/v1/subagents.proto",
    "proto/subagents/v1/workers.proto",
];
/// Served by reflection only, so grpcurl can decode error details.
const REFLECTION_ONLY: &[&str] = &["proto-vendor/google/rpc/error_details.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=proto-vendor");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let mut reflected = protox::compile(
        PROTOS.iter().chain(REFLECTION_ONLY),
        ["proto", "proto-vendor"],
    )?;
    reflected.file.sort_by(|a, b| a.name.cmp(&b.name));
    reflected.file.dedup_by(|a, b| a.name == b.name);
    let out = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out.join("subagents_descriptor.bin"),
        prost::Message::encode_to_vec(&reflected),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        // No generated `Client::connect(addr)` constructor: it would clash with
        // the WorkerService `Connect` RPC. Clients are built on a `Channel`.
        .build_transport(false)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
