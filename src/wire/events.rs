//! Watch events, as messages and as their encoded bytes.

use super::agent::agent_to_pb;
use crate::pb;
use crate::scheduler::{Event, EventKind, Progress};

/// An event as WatchAgents sends it.
pub fn event_to_pb(e: &Event) -> pb::WatchAgentsResponse {
    let kind = match e.kind {
        EventKind::Snapshot => pb::AgentEventKind::Snapshot,
        EventKind::Queued => pb::AgentEventKind::Queued,
        EventKind::Started => pb::AgentEventKind::Started,
        EventKind::Steered => pb::AgentEventKind::Steered,
        EventKind::AwaitingApproval => pb::AgentEventKind::AwaitingApproval,
        EventKind::Done => pb::AgentEventKind::Done,
        EventKind::Failed => pb::AgentEventKind::Failed,
        EventKind::Cancelled => pb::AgentEventKind::Cancelled,
        EventKind::Retrying => pb::AgentEventKind::Retrying,
        EventKind::Output => pb::AgentEventKind::Output,
        EventKind::ToolCall => pb::AgentEventKind::ToolCall,
        EventKind::WorkspaceSaved => pb::AgentEventKind::WorkspaceSaved,
    };
    let (output, tool_call) = match &e.progress {
        None => (String::new(), None),
        Some(Progress::Output(chunk)) => (chunk.to_string(), None),
        Some(Progress::ToolCall { name, input_digest }) => (
            String::new(),
            Some(pb::ToolCall {
                name: name.to_string(),
                input_digest: input_digest.to_string(),
            }),
        ),
    };
    pb::WatchAgentsResponse {
        sequence: e.sequence,
        kind: kind as i32,
        agent: Some(agent_to_pb(&e.agent, e.at)),
        output,
        tool_call,
    }
}

/// An event's WatchAgentsResponse encoding, made once per event and shared
/// by every subscriber that sends it.
pub fn event_wire(e: &Event) -> bytes::Bytes {
    e.wire
        .get_or_init(|| prost::Message::encode_to_vec(&event_to_pb(e)).into())
        .clone()
}
