//! The one place that converts between protobuf and domain types, by
//! message family, next to the generated code (`crate::pb`).
//!
//! Requests are parsed, not just validated: each `parse_*` returns a domain
//! value or every field violation it found, so a bad request changes nothing.
//! This root only declares modules and re-exports.

pub mod agent;
pub mod check;
pub mod events;
pub mod requests;
pub mod server_info;
pub mod transcript;
pub mod workers;

pub use self::agent::{
    agent_from_pb, agent_to_pb, agents_to_pb, delivery_to_pb, status_to_pb, workspace_from_pb,
    workspace_to_pb,
};
pub use self::check::{
    DEFAULT_AWAIT_TIMEOUT, DEFAULT_PAGE_SIZE, MAX_AWAIT_TIMEOUT, MAX_IDS, MAX_KEY_BYTES,
    MAX_NOTE_BYTES, MAX_PAGE_SIZE, MAX_RUN_TIMEOUT,
};
pub use self::events::{event_to_pb, event_wire};
pub use self::requests::{
    parse_approve, parse_await, parse_cancel, parse_get_transcript, parse_spawn, parse_status,
    parse_steer, parse_watch, trace_context_from, AwaitQuery, AwaitTarget, CancelTarget,
    StatusQuery, TranscriptQuery,
};
pub use self::server_info::{runner_name, server_info_to_pb};
pub use self::transcript::{history_from_assignment, history_to_pb, transcript_to_pb};
pub use self::workers::{
    parse_hello, welcome_to_pb, worker_command_to_pb, worker_event_from_pb, MAX_WORKER_CAPACITY,
};

#[cfg(test)]
mod tests;
