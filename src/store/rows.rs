//! The stored form of durable state, and the conversion between it and the
//! domain types of [`crate::scheduler::durable`]. Conversation rows are the
//! exception: the scheduler keeps ended conversations in their row form, so
//! their encoding lives with it ([`crate::scheduler::conversation::row`]),
//! with the row pieces both share.
//!
//! Rows are protobuf messages (prost derives, no .proto file: they are
//! private to the store). Protobuf gives what a row format needs across
//! versions: a field added later reads as its default from an older row,
//! and an older server skips fields it does not know. Both engines store
//! the same encoded bytes, so the conversion is written once.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use prost::Message;

use crate::{
    config::RunnerKind,
    scheduler::{
        conversation::{
            row::{
                self, error_of, put_bytes, put_error, put_fixed64, put_labels, put_len,
                put_message, put_nanos, put_str, put_time, put_u64, put_varint, put_workspace,
                status_code, status_of, time_of, uuid_of, workspace_of, ErrorRow, WorkspaceRow,
            },
            Conversation,
        },
        durable::{AgentState, ProcessGroup},
        events::{Event, EventKind},
        trace::TraceId,
        AgentView, Approval, ApprovalOutcome, Attempt, Attempts, Continuation, Usage,
    },
};

use super::StoreError;
#[cfg(test)]
use crate::scheduler::conversation::row::{error_row, nanos, workspace_row};

#[derive(Clone, PartialEq, Message)]
pub(super) struct ViewRow {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
    #[prost(string, tag = "2")]
    agent: String,
    #[prost(string, tag = "3")]
    model: String,
    #[prost(string, tag = "4")]
    description: String,
    #[prost(bytes = "vec", optional, tag = "5")]
    parent_id: Option<Vec<u8>>,
    #[prost(bytes = "vec", tag = "6")]
    root_id: Vec<u8>,
    #[prost(string, optional, tag = "7")]
    lead_id: Option<String>,
    #[prost(uint32, tag = "8")]
    depth: u32,
    #[prost(uint32, tag = "9")]
    status: u32,
    #[prost(int64, tag = "10")]
    created_at: i64,
    #[prost(int64, optional, tag = "11")]
    started_at: Option<i64>,
    #[prost(int64, optional, tag = "12")]
    finished_at: Option<i64>,
    #[prost(string, tag = "13")]
    result: String,
    #[prost(message, optional, tag = "14")]
    error: Option<ErrorRow>,
    #[prost(message, optional, tag = "15")]
    approval: Option<ApprovalRow>,
    #[prost(message, optional, tag = "16")]
    usage: Option<UsageRow>,
    #[prost(message, optional, tag = "17")]
    total_usage: Option<UsageRow>,
    #[prost(btree_map = "string, string", tag = "18")]
    labels: BTreeMap<String, String>,
    #[prost(bool, tag = "19")]
    background: bool,
    #[prost(bool, tag = "20")]
    detached: bool,
    #[prost(string, tag = "21")]
    bucket: String,
    #[prost(bytes = "vec", optional, tag = "22")]
    worker_id: Option<Vec<u8>>,
    #[prost(bytes = "vec", tag = "23")]
    trace_id: Vec<u8>,
    #[prost(uint32, tag = "24")]
    attempt: u32,
    /// Empty in rows written before tenants existed: those agents belong
    /// to the tenant of a server without authentication.
    #[prost(string, tag = "25")]
    tenant: String,
    /// Since schema 4, with the two below: set on a continuation or fork
    /// (`AgentView::continuation`), absent on every other agent.
    #[prost(bytes = "vec", optional, tag = "26")]
    conversation_id: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "27")]
    continues_id: Option<Vec<u8>>,
    #[prost(uint32, tag = "28")]
    turn: u32,
    /// Since schema 4: `AgentView::attempts` (set once an attempt ended
    /// and the agent ran again).
    #[prost(message, repeated, tag = "29")]
    attempts: Vec<AttemptRow>,
    #[prost(int64, optional, tag = "30")]
    attempt_started_at: Option<i64>,
    /// Whether `attempts` is set (an empty list is not the same as none).
    #[prost(bool, tag = "31")]
    has_attempts: bool,
    #[prost(int64, optional, tag = "32")]
    collected_at: Option<i64>,
    /// Since schema 7 (no migration: absent before): `AgentView::workspace`.
    #[prost(message, optional, tag = "33")]
    workspace: Option<WorkspaceRow>,
}

/// An ended attempt (`Attempt`).
#[derive(Clone, PartialEq, Message)]
struct AttemptRow {
    #[prost(string, tag = "1")]
    model: String,
    #[prost(message, optional, tag = "2")]
    error: Option<ErrorRow>,
    #[prost(int64, optional, tag = "3")]
    started_at: Option<i64>,
    #[prost(int64, tag = "4")]
    ended_at: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ApprovalRow {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
    #[prost(string, tag = "2")]
    tool_name: String,
    #[prost(string, tag = "3")]
    detail: String,
}

#[derive(Clone, PartialEq, Message)]
struct UsageRow {
    #[prost(uint64, tag = "1")]
    input_tokens: u64,
    #[prost(uint64, tag = "2")]
    output_tokens: u64,
    #[prost(uint64, tag = "3")]
    tool_calls: u64,
}

/// One row of the `agents` table.
#[derive(Clone, PartialEq, Message)]
pub(super) struct AgentRow {
    #[prost(message, optional, tag = "1")]
    view: Option<ViewRow>,
    #[prost(uint64, tag = "2")]
    seq: u64,
    #[prost(uint32, tag = "3")]
    runner: u32,
    #[prost(string, optional, tag = "4")]
    prompt: Option<String>,
    #[prost(uint64, tag = "5")]
    timeout_ms: u64,
    #[prost(string, repeated, tag = "6")]
    steer_buffer: Vec<String>,
    #[prost(string, optional, tag = "7")]
    idempotency_key: Option<String>,
    #[prost(fixed64, tag = "8")]
    span_id: u64,
    #[prost(bool, tag = "9")]
    sampled: bool,
    #[prost(int32, optional, tag = "10")]
    process_group: Option<i32>,
    #[prost(uint64, tag = "11")]
    process_start_ticks: u64,
    /// Since schema 2.
    #[prost(message, optional, tag = "12")]
    decision: Option<DecisionRow>,
    /// Since schema 2.
    #[prost(uint64, tag = "13")]
    report_seq: u64,
    /// The Spawn's `workspace_base` (an older row has none: read as unset).
    #[prost(string, optional, tag = "14")]
    workspace_base: Option<String>,
}

/// A decided approval its paused run has not received yet.
#[derive(Clone, PartialEq, Message)]
struct DecisionRow {
    #[prost(bytes = "vec", tag = "1")]
    approval_id: Vec<u8>,
    #[prost(bool, tag = "2")]
    approved: bool,
    #[prost(string, tag = "3")]
    note: String,
}

/// One row of the `events` table (keyed by its sequence).
#[derive(Clone, PartialEq, Message)]
pub(super) struct EventRow {
    #[prost(uint32, tag = "1")]
    kind: u32,
    #[prost(int64, tag = "2")]
    at: i64,
    #[prost(message, optional, tag = "3")]
    view: Option<ViewRow>,
}

/// Decodes a `conversations` row.
pub(super) fn decode_conversation(bytes: &[u8]) -> Result<Conversation, StoreError> {
    Ok(row::decode(bytes)?)
}

/// Encodes an agent's state as its `agents` row: the bytes the derived
/// [`AgentRow`] would give, written straight from the state (no owned copy
/// of every string first; a test holds the two to the same bytes).
pub(super) fn encode_agent(state: &AgentState) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256 + state.view.result.len());
    put_message(&mut buf, 1, |buf| encode_view(&state.view, buf));
    put_u64(&mut buf, 2, state.seq);
    put_u64(&mut buf, 3, u64::from(runner_code(state.runner)));
    if let Some(prompt) = &state.prompt {
        put_len(&mut buf, 4, prompt.as_bytes());
    }
    put_u64(
        &mut buf,
        5,
        u64::try_from(state.timeout.as_millis()).unwrap_or(u64::MAX),
    );
    for steer in &state.steer_buffer {
        put_len(&mut buf, 6, steer.as_bytes());
    }
    if let Some(key) = &state.idempotency_key {
        put_len(&mut buf, 7, key.as_bytes());
    }
    put_fixed64(&mut buf, 8, state.span_id);
    if state.sampled {
        put_varint(&mut buf, 9, 1);
    }
    if let Some(g) = state.process_group {
        // int32: a negative value is sign-extended to ten bytes.
        put_varint(&mut buf, 10, i64::from(g.pgid) as u64);
    }
    put_u64(
        &mut buf,
        11,
        state.process_group.map_or(0, |g| g.start_ticks),
    );
    if let Some((id, outcome)) = &state.decision {
        put_message(&mut buf, 12, |buf| {
            put_bytes(buf, 1, id.as_bytes());
            if outcome.approved {
                put_varint(buf, 2, 1);
            }
            put_str(buf, 3, &outcome.note);
        });
    }
    put_u64(&mut buf, 13, state.report_seq);
    if let Some(base) = &state.workspace_base {
        put_len(&mut buf, 14, base.as_bytes());
    }
    buf
}

/// The derived row [`encode_agent`] writes the bytes of.
#[cfg(test)]
fn agent_row(state: &AgentState) -> AgentRow {
    AgentRow {
        view: Some(view_row(&state.view)),
        seq: state.seq,
        runner: runner_code(state.runner),
        prompt: state.prompt.as_deref().map(str::to_owned),
        timeout_ms: u64::try_from(state.timeout.as_millis()).unwrap_or(u64::MAX),
        steer_buffer: state.steer_buffer.clone(),
        idempotency_key: state.idempotency_key.as_deref().map(str::to_owned),
        workspace_base: state.workspace_base.as_deref().map(str::to_owned),
        span_id: state.span_id,
        sampled: state.sampled,
        process_group: state.process_group.map(|g| g.pgid),
        process_start_ticks: state.process_group.map_or(0, |g| g.start_ticks),
        decision: state.decision.as_ref().map(|(id, outcome)| DecisionRow {
            approval_id: id.as_bytes().to_vec(),
            approved: outcome.approved,
            note: outcome.note.clone(),
        }),
        report_seq: state.report_seq,
    }
}

/// Decodes an `agents` row.
pub(super) fn decode_agent(bytes: &[u8]) -> Result<AgentState, StoreError> {
    let row = AgentRow::decode(bytes).map_err(|e| corrupt("agent row", e))?;
    Ok(AgentState {
        view: view_of(row.view.ok_or_else(|| corrupt("agent row", "no view"))?)?,
        seq: row.seq,
        runner: runner_of(row.runner)?,
        prompt: row.prompt.map(Arc::from),
        timeout: Duration::from_millis(row.timeout_ms),
        steer_buffer: row.steer_buffer,
        idempotency_key: row.idempotency_key.map(Arc::from),
        workspace_base: row.workspace_base.map(Arc::from),
        span_id: row.span_id,
        sampled: row.sampled,
        process_group: row.process_group.map(|pgid| ProcessGroup {
            pgid,
            start_ticks: row.process_start_ticks,
        }),
        decision: row
            .decision
            .map(|d| -> Result<_, StoreError> {
                let outcome = ApprovalOutcome {
                    approved: d.approved,
                    note: d.note,
                };
                Ok((uuid_of(&d.approval_id)?, outcome))
            })
            .transpose()?,
        report_seq: row.report_seq,
    })
}

/// Just the admission sequence of an `agents` row (protobuf skips the
/// other fields without decoding them), for engines that keep it in a
/// column of its own.
#[derive(Clone, PartialEq, Message)]
struct AgentSeqRow {
    #[prost(uint64, tag = "2")]
    seq: u64,
}

/// The admission sequence stored in an encoded `agents` row.
pub(super) fn agent_seq(bytes: &[u8]) -> Result<u64, StoreError> {
    AgentSeqRow::decode(bytes)
        .map(|row| row.seq)
        .map_err(|e| corrupt("agent row", e))
}

/// Encodes a lifecycle event as its `events` row (as [`encode_agent`]:
/// the derived [`EventRow`]'s bytes, written straight from the event).
pub(super) fn encode_event(event: &Event) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256 + event.agent.result.len());
    put_u64(&mut buf, 1, u64::from(event_code(event.kind)));
    put_nanos(&mut buf, 2, event.at);
    put_message(&mut buf, 3, |buf| encode_view(&event.agent, buf));
    buf
}

/// The derived row [`encode_event`] writes the bytes of.
#[cfg(test)]
fn event_row(event: &Event) -> EventRow {
    EventRow {
        kind: event_code(event.kind),
        at: nanos(event.at),
        view: Some(view_row(&event.agent)),
    }
}

/// Writes a view's [`ViewRow`] fields.
fn encode_view(v: &AgentView, buf: &mut Vec<u8>) {
    let usage = |buf: &mut Vec<u8>, tag, u: Usage| {
        put_message(buf, tag, |buf| {
            put_u64(buf, 1, u.input_tokens);
            put_u64(buf, 2, u.output_tokens);
            put_u64(buf, 3, u.tool_calls);
        });
    };
    put_bytes(buf, 1, v.id.as_bytes());
    put_str(buf, 2, &v.agent);
    put_str(buf, 3, &v.model);
    put_str(buf, 4, &v.description);
    if let Some(parent) = v.parent_id {
        put_len(buf, 5, parent.as_bytes());
    }
    put_bytes(buf, 6, v.root_id.as_bytes());
    if let Some(lead) = &v.lead_id {
        put_len(buf, 7, lead.as_bytes());
    }
    put_u64(buf, 8, u64::from(v.depth));
    put_u64(buf, 9, u64::from(status_code(v.status)));
    put_nanos(buf, 10, v.created_at);
    put_time(buf, 11, v.started_at);
    put_time(buf, 12, v.finished_at);
    put_str(buf, 13, &v.result);
    if let Some(e) = &v.error {
        put_error(buf, 14, e);
    }
    if let Some(a) = &v.approval {
        put_message(buf, 15, |buf| {
            put_bytes(buf, 1, a.id.as_bytes());
            put_str(buf, 2, &a.tool_name);
            put_str(buf, 3, &a.detail);
        });
    }
    usage(buf, 16, v.usage);
    usage(buf, 17, v.total_usage);
    put_labels(buf, 18, &v.labels);
    if v.background {
        put_varint(buf, 19, 1);
    }
    if v.detached {
        put_varint(buf, 20, 1);
    }
    put_str(buf, 21, &v.bucket);
    if let Some(w) = v.worker_id {
        put_len(buf, 22, w.as_bytes());
    }
    put_bytes(buf, 23, &v.trace_id.get().to_be_bytes());
    put_u64(buf, 24, u64::from(v.attempt));
    put_str(buf, 25, &v.tenant);
    if let Some(c) = &v.continuation {
        put_len(buf, 26, c.conversation_id.as_bytes());
        put_len(buf, 27, c.continues_id.as_bytes());
        put_u64(buf, 28, u64::from(c.turn));
    }
    for a in v.attempts.iter().flat_map(|a| &a.ended) {
        put_message(buf, 29, |buf| {
            put_str(buf, 1, &a.model);
            put_error(buf, 2, &a.error);
            put_time(buf, 3, a.started_at);
            put_nanos(buf, 4, a.ended_at);
        });
    }
    put_time(
        buf,
        30,
        v.attempts.as_ref().and_then(|a| a.current_started_at),
    );
    if v.attempts.is_some() {
        put_varint(buf, 31, 1);
    }
    put_time(buf, 32, v.collected_at);
    if let Some(w) = &v.workspace {
        put_workspace(buf, 33, w);
    }
}

/// Decodes the `events` row of `sequence`.
pub(super) fn decode_event(sequence: u64, bytes: &[u8]) -> Result<Event, StoreError> {
    let row = EventRow::decode(bytes).map_err(|e| corrupt("event row", e))?;
    let agent = view_of(row.view.ok_or_else(|| corrupt("event row", "no view"))?)?;
    Ok(Event::recovered(
        sequence,
        event_kind_of(row.kind)?,
        agent,
        time_of(row.at),
    ))
}

#[cfg(test)]
fn view_row(v: &AgentView) -> ViewRow {
    ViewRow {
        id: v.id.as_bytes().to_vec(),
        agent: v.agent.to_string(),
        model: v.model.to_string(),
        description: v.description.to_string(),
        parent_id: v.parent_id.map(|p| p.as_bytes().to_vec()),
        root_id: v.root_id.as_bytes().to_vec(),
        lead_id: v.lead_id.as_deref().map(str::to_owned),
        depth: v.depth,
        status: status_code(v.status),
        created_at: nanos(v.created_at),
        started_at: v.started_at.map(nanos),
        finished_at: v.finished_at.map(nanos),
        collected_at: v.collected_at.map(nanos),
        workspace: v.workspace.as_deref().map(workspace_row),
        result: v.result.to_string(),
        error: v.error.as_ref().map(error_row),
        approval: v.approval.as_ref().map(|a| ApprovalRow {
            id: a.id.as_bytes().to_vec(),
            tool_name: a.tool_name.to_string(),
            detail: a.detail.to_string(),
        }),
        usage: Some(usage_row(v.usage)),
        total_usage: Some(usage_row(v.total_usage)),
        labels: (*v.labels).clone(),
        background: v.background,
        detached: v.detached,
        bucket: v.bucket.to_string(),
        worker_id: v.worker_id.map(|w| w.as_bytes().to_vec()),
        trace_id: v.trace_id.get().to_be_bytes().to_vec(),
        attempt: v.attempt,
        tenant: v.tenant.to_string(),
        conversation_id: v
            .continuation
            .as_ref()
            .map(|c| c.conversation_id.as_bytes().to_vec()),
        continues_id: v
            .continuation
            .as_ref()
            .map(|c| c.continues_id.as_bytes().to_vec()),
        turn: v.continuation.as_ref().map_or(0, |c| c.turn),
        attempts: v
            .attempts
            .iter()
            .flat_map(|a| &a.ended)
            .map(|a| AttemptRow {
                model: a.model.to_string(),
                error: Some(error_row(&a.error)),
                started_at: a.started_at.map(nanos),
                ended_at: nanos(a.ended_at),
            })
            .collect(),
        attempt_started_at: v
            .attempts
            .as_ref()
            .and_then(|a| a.current_started_at)
            .map(nanos),
        has_attempts: v.attempts.is_some(),
    }
}

fn view_of(r: ViewRow) -> Result<AgentView, StoreError> {
    let trace = <[u8; 16]>::try_from(r.trace_id.as_slice())
        .ok()
        .and_then(|b| TraceId::new(u128::from_be_bytes(b)))
        .ok_or_else(|| corrupt("agent view", "invalid trace id"))?;
    let continuation = match (r.conversation_id.as_deref(), r.continues_id.as_deref()) {
        (None, None) => None,
        (Some(conversation), Some(continues)) => Some(Arc::new(Continuation {
            conversation_id: uuid_of(conversation)?,
            continues_id: uuid_of(continues)?,
            turn: r.turn,
        })),
        _ => return Err(corrupt("agent view", "half a continuation")),
    };
    let attempts = r.has_attempts.then(|| {
        Arc::new(Attempts {
            ended: r
                .attempts
                .into_iter()
                .map(|a| Attempt {
                    model: a.model.into(),
                    error: error_of(a.error.unwrap_or_default()),
                    started_at: a.started_at.map(time_of),
                    ended_at: time_of(a.ended_at),
                })
                .collect(),
            current_started_at: r.attempt_started_at.map(time_of),
        })
    });
    Ok(AgentView {
        tenant: if r.tenant.is_empty() {
            crate::scheduler::DEFAULT_TENANT.into()
        } else {
            r.tenant.as_str().into()
        },
        id: uuid_of(&r.id)?,
        agent: r.agent.into(),
        model: r.model.into(),
        description: r.description.into(),
        parent_id: r.parent_id.as_deref().map(uuid_of).transpose()?,
        root_id: uuid_of(&r.root_id)?,
        lead_id: r.lead_id.map(Arc::from),
        depth: r.depth,
        status: status_of(r.status)?,
        created_at: time_of(r.created_at),
        started_at: r.started_at.map(time_of),
        finished_at: r.finished_at.map(time_of),
        collected_at: r.collected_at.map(time_of),
        workspace: r.workspace.map(workspace_of),
        result: r.result.into(),
        error: r.error.map(error_of),
        approval: r
            .approval
            .map(|a| -> Result<_, StoreError> {
                Ok(Arc::new(Approval {
                    id: uuid_of(&a.id)?,
                    tool_name: a.tool_name.into(),
                    detail: a.detail.into(),
                }))
            })
            .transpose()?,
        usage: usage_of(r.usage),
        total_usage: usage_of(r.total_usage),
        labels: Arc::new(r.labels),
        background: r.background,
        detached: r.detached,
        // Which limit holds a queued agent depends on the limits of the
        // server that reads it; the core works it out again.
        queue_reason: None,
        bucket: r.bucket.into(),
        worker_id: r.worker_id.as_deref().map(uuid_of).transpose()?,
        trace_id: trace,
        attempt: r.attempt,
        continuation,
        attempts,
    })
}

#[cfg(test)]
fn usage_row(u: Usage) -> UsageRow {
    UsageRow {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        tool_calls: u.tool_calls,
    }
}

fn usage_of(u: Option<UsageRow>) -> Usage {
    let u = u.unwrap_or_default();
    Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        tool_calls: u.tool_calls,
    }
}

fn corrupt(what: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {why}"))
}

fn runner_code(r: RunnerKind) -> u32 {
    match r {
        RunnerKind::Simulated => 1,
        RunnerKind::Worker => 2,
        RunnerKind::Command => 3,
        RunnerKind::Openai => 4,
    }
}

fn runner_of(code: u32) -> Result<RunnerKind, StoreError> {
    Ok(match code {
        1 => RunnerKind::Simulated,
        2 => RunnerKind::Worker,
        3 => RunnerKind::Command,
        4 => RunnerKind::Openai,
        other => return Err(corrupt("runner", format!("unknown code {other}"))),
    })
}

fn event_code(k: EventKind) -> u32 {
    match k {
        EventKind::Snapshot => 1,
        EventKind::Queued => 2,
        EventKind::Started => 3,
        EventKind::Steered => 4,
        EventKind::AwaitingApproval => 5,
        EventKind::Done => 6,
        EventKind::Failed => 7,
        EventKind::Cancelled => 8,
        EventKind::Retrying => 9,
        EventKind::Output => 10,
        EventKind::ToolCall => 11,
        EventKind::WorkspaceSaved => 12,
    }
}

fn event_kind_of(code: u32) -> Result<EventKind, StoreError> {
    Ok(match code {
        1 => EventKind::Snapshot,
        2 => EventKind::Queued,
        3 => EventKind::Started,
        4 => EventKind::Steered,
        5 => EventKind::AwaitingApproval,
        6 => EventKind::Done,
        7 => EventKind::Failed,
        8 => EventKind::Cancelled,
        9 => EventKind::Retrying,
        10 => EventKind::Output,
        11 => EventKind::ToolCall,
        12 => EventKind::WorkspaceSaved,
        other => return Err(corrupt("event kind", format!("unknown code {other}"))),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::UNIX_EPOCH;

    use uuid::Uuid;

    use super::*;
    use crate::scheduler::{AgentError, AgentStatus, Workspace};

    /// An agent with every optional field set, so a round trip that drops
    /// one shows.
    pub(crate) fn full_state(seq: u64) -> AgentState {
        let id = Uuid::now_v7();
        let t = UNIX_EPOCH + Duration::new(1_790_000_000, 123_456_789);
        AgentState {
            view: AgentView {
                tenant: "team-a".into(),
                id,
                agent: "coder".into(),
                model: "p/m".into(),
                description: "d".into(),
                parent_id: Some(Uuid::now_v7()),
                root_id: Uuid::now_v7(),
                lead_id: Some("lead-1".into()),
                depth: 2,
                status: AgentStatus::AwaitingApproval,
                created_at: t,
                started_at: Some(t + Duration::from_millis(5)),
                finished_at: Some(t + Duration::from_secs(9)),
                collected_at: Some(t + Duration::from_secs(10)),
                workspace: Some(Arc::new(Workspace {
                    branch: "subagentd/x".into(),
                    kept: true,
                    base_commit: "a".repeat(40),
                    head_commit: "b".repeat(40),
                    files_changed: 3,
                    insertions: 10,
                    deletions: 2,
                })),
                result: "partial".into(),
                error: Some(AgentError::new("RUN_FAILED", "boom")),
                approval: Some(Arc::new(Approval {
                    id: Uuid::now_v7(),
                    tool_name: "shell".into(),
                    detail: "rm -rf /tmp/x".into(),
                })),
                usage: Usage {
                    input_tokens: 1,
                    output_tokens: 2,
                    tool_calls: 3,
                },
                total_usage: Usage {
                    input_tokens: 10,
                    output_tokens: 20,
                    tool_calls: 30,
                },
                labels: Arc::new(BTreeMap::from([("k".to_owned(), "v".to_owned())])),
                background: true,
                detached: true,
                queue_reason: None,
                bucket: "p/m".into(),
                worker_id: Some(Uuid::now_v7()),
                trace_id: TraceId::random(),
                attempt: 3,
                continuation: Some(Arc::new(Continuation {
                    conversation_id: Uuid::now_v7(),
                    continues_id: Uuid::now_v7(),
                    turn: 4,
                })),
                attempts: Some(Arc::new(Attempts {
                    ended: vec![
                        Attempt {
                            model: "p/first".into(),
                            error: AgentError::new("PROVIDER_429", "slow down"),
                            started_at: Some(t + Duration::from_millis(5)),
                            ended_at: t + Duration::from_millis(6),
                        },
                        Attempt {
                            model: "p/second".into(),
                            error: AgentError::new("WORKER_LOST", "gone"),
                            started_at: None,
                            ended_at: t + Duration::from_millis(8),
                        },
                    ],
                    current_started_at: Some(t + Duration::from_millis(9)),
                })),
            },
            seq,
            runner: RunnerKind::Worker,
            prompt: Some("do it".into()),
            timeout: Duration::from_millis(90_000),
            steer_buffer: vec!["one".into(), "two".into()],
            idempotency_key: Some("key-1".into()),
            workspace_base: Some("release/2.0".into()),
            span_id: 0xdead_beef_0000_0001,
            sampled: true,
            process_group: Some(ProcessGroup {
                pgid: 4242,
                start_ticks: 987_654,
            }),
            decision: Some((
                Uuid::now_v7(),
                ApprovalOutcome {
                    approved: true,
                    note: "go ahead".into(),
                },
            )),
            report_seq: 17,
        }
    }

    #[test]
    fn a_view_round_trips_with_and_without_a_continuation() {
        let mut view = full_state(1).view;
        assert!(view.continuation.is_some());
        assert_eq!(view_of(view_row(&view)).unwrap(), view);
        view.continuation = None;
        let row = view_row(&view);
        assert_eq!(
            (&row.conversation_id, &row.continues_id, row.turn),
            (&None, &None, 0)
        );
        assert_eq!(view_of(row).unwrap(), view);
    }

    #[test]
    fn a_view_row_from_before_continuations_reads_as_no_continuation() {
        // Tags 26-28 left out: the bytes a schema 3 server wrote.
        let mut row =
            ViewRow::decode(view_row(&full_state(1).view).encode_to_vec().as_slice()).unwrap();
        (row.conversation_id, row.continues_id, row.turn) = (None, None, 0);
        let old = row.encode_to_vec();
        let view = view_of(ViewRow::decode(old.as_slice()).unwrap()).unwrap();
        assert_eq!(view.continuation, None);
        // Half of one is damage, not an absent continuation.
        row.conversation_id = Some(Uuid::now_v7().as_bytes().to_vec());
        let err = view_of(row).unwrap_err();
        assert!(err.to_string().contains("half a continuation"), "{err}");
    }

    #[test]
    fn an_agent_row_round_trips_every_field() {
        let state = full_state(42);
        assert_eq!(decode_agent(&encode_agent(&state)).unwrap(), state);
        let mut bare = full_state(1);
        bare.view.parent_id = None;
        bare.view.lead_id = None;
        bare.view.started_at = None;
        bare.view.finished_at = None;
        bare.view.error = None;
        bare.view.approval = None;
        bare.view.worker_id = None;
        bare.view.continuation = None;
        bare.prompt = None;
        bare.idempotency_key = None;
        bare.workspace_base = None;
        bare.process_group = None;
        bare.decision = None;
        bare.report_seq = 0;
        assert_eq!(decode_agent(&encode_agent(&bare)).unwrap(), bare);
    }

    #[test]
    fn the_encoders_write_the_bytes_prost_writes_for_the_rows() {
        let same = |state: &AgentState| {
            assert_eq!(
                encode_agent(state),
                agent_row(state).encode_to_vec(),
                "agent row of {state:?}"
            );
            let event = Event::recovered(
                5,
                EventKind::Started,
                state.view.clone(),
                state.view.created_at,
            );
            assert_eq!(encode_event(&event), event_row(&event).encode_to_vec());
        };
        same(&full_state(42));
        // Every default a plain field leaves out, every empty value an
        // optional or repeated one keeps, negative numbers, long lengths.
        let mut sparse = full_state(0);
        let v = &mut sparse.view;
        v.tenant = "".into();
        v.description = "".into();
        v.result = "r".repeat(20_000).into();
        v.parent_id = None;
        v.lead_id = Some("".into());
        v.depth = 0;
        v.created_at = UNIX_EPOCH;
        v.started_at = Some(UNIX_EPOCH - Duration::from_secs(3));
        v.finished_at = None;
        v.collected_at = None;
        v.error = Some(AgentError::new("", ""));
        v.approval = None;
        v.usage = Usage::default();
        v.labels = Arc::new(BTreeMap::from([
            ("".to_owned(), "v".to_owned()),
            ("k".to_owned(), "".to_owned()),
        ]));
        v.background = false;
        v.detached = false;
        v.worker_id = None;
        v.attempt = 0;
        v.continuation = None;
        v.attempts = Some(Arc::new(Attempts {
            ended: vec![],
            current_started_at: None,
        }));
        v.workspace = None;
        sparse.prompt = Some("".into());
        sparse.timeout = Duration::ZERO;
        sparse.steer_buffer = vec!["".into(), "x".into()];
        sparse.idempotency_key = None;
        sparse.span_id = 0;
        sparse.sampled = false;
        sparse.process_group = Some(ProcessGroup {
            pgid: -7,
            start_ticks: 0,
        });
        sparse.decision = Some((
            Uuid::nil(),
            ApprovalOutcome {
                approved: false,
                note: "".into(),
            },
        ));
        same(&sparse);
        sparse.view.attempts = None;
        sparse.process_group = None;
        same(&sparse);
    }

    #[test]
    fn a_row_from_before_tenants_reads_as_the_default_tenant() {
        // An empty tenant is not encoded at all: the bytes of an older row.
        let mut old = full_state(3);
        old.view.tenant = "".into();
        let read = decode_agent(&encode_agent(&old)).unwrap();
        assert_eq!(&*read.view.tenant, crate::scheduler::DEFAULT_TENANT);
    }

    #[test]
    fn the_admission_sequence_reads_from_an_encoded_agent_row() {
        assert_eq!(agent_seq(&encode_agent(&full_state(42))).unwrap(), 42);
        assert!(matches!(agent_seq(b"\xff"), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn an_event_row_round_trips() {
        let state = full_state(7);
        let event = Event::recovered(
            99,
            EventKind::Done,
            state.view.clone(),
            state.view.created_at,
        );
        let back = decode_event(99, &encode_event(&event)).unwrap();
        assert_eq!(
            (back.sequence, back.kind, &back.agent, back.at),
            (99, EventKind::Done, &event.agent, event.at)
        );
    }

    #[test]
    fn a_row_with_an_unknown_status_is_corrupt_not_a_panic() {
        let mut row = AgentRow::decode(encode_agent(&full_state(1)).as_slice()).unwrap();
        row.view.as_mut().unwrap().status = 77;
        let err = decode_agent(&row.encode_to_vec()).unwrap_err();
        assert!(err.to_string().contains("unknown code 77"), "{err}");
        assert!(matches!(
            decode_agent(b"\xff\xff\xff"),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn times_before_the_epoch_survive() {
        let t = UNIX_EPOCH - Duration::from_nanos(1_500);
        assert_eq!(time_of(nanos(t)), t);
    }
}
