//! Compiles the protobuf API with protox (pure Rust, so no system `protoc` is
//! needed) and writes the file descriptor set that server reflection serves.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &["proto/subagents/v1/subagents.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out.join("subagents_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
