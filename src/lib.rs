//! subagentd: a gRPC service that schedules, runs and supervises sub-agents.
//!
//! See ARCHITECTURE.md for the layout and the path of one Spawn.

pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod fuzzing;
pub mod ha;
pub mod mcp;
pub mod pb;
pub mod runner;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod wire;
pub mod worker;
