//! Generated protobuf and gRPC code for `subagents.v1`.
//!
//! Kept in one module so the lint allowances for generated code stay here.
#![allow(clippy::all, missing_docs, clippy::pedantic)]

tonic::include_proto!("subagents.v1");

/// Encoded `FileDescriptorSet` of the API, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("subagents_descriptor");
