//! Agents, their status, attempts, errors and usage, both ways.

use std::{sync::Arc, time::SystemTime};

use prost_types::Timestamp;
use uuid::Uuid;

use super::check::truncate;
use crate::pb;
use crate::scheduler::{
    AgentError, AgentStatus, AgentView, Attempt, Attempts, Continuation, SteerDelivery, Usage,
    Workspace,
};

pub(super) fn status_from_pb(s: pb::AgentStatus) -> AgentStatus {
    match s {
        pb::AgentStatus::Queued | pb::AgentStatus::Unspecified => AgentStatus::Queued,
        pb::AgentStatus::Running => AgentStatus::Running,
        pb::AgentStatus::AwaitingApproval => AgentStatus::AwaitingApproval,
        pb::AgentStatus::Done => AgentStatus::Done,
        pb::AgentStatus::Failed => AgentStatus::Failed,
        pb::AgentStatus::Cancelled => AgentStatus::Cancelled,
    }
}

/// Domain status → protobuf enum.
pub fn status_to_pb(s: AgentStatus) -> pb::AgentStatus {
    match s {
        AgentStatus::Queued => pb::AgentStatus::Queued,
        AgentStatus::Running => pb::AgentStatus::Running,
        AgentStatus::AwaitingApproval => pb::AgentStatus::AwaitingApproval,
        AgentStatus::Done => pb::AgentStatus::Done,
        AgentStatus::Failed => pb::AgentStatus::Failed,
        AgentStatus::Cancelled => pb::AgentStatus::Cancelled,
    }
}

pub(super) fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::from(t)
}

/// A saved workspace on the wire.
pub fn workspace_to_pb(w: &Workspace) -> pb::Workspace {
    pb::Workspace {
        branch: w.branch.clone(),
        kept: w.kept,
        base_commit: w.base_commit.clone(),
        head_commit: w.head_commit.clone(),
        files_changed: w.files_changed,
        insertions: w.insertions,
        deletions: w.deletions,
    }
}

/// A saved workspace from the wire.
pub fn workspace_from_pb(w: &pb::Workspace) -> Workspace {
    Workspace {
        branch: w.branch.clone(),
        kept: w.kept,
        base_commit: w.base_commit.clone(),
        head_commit: w.head_commit.clone(),
        files_changed: w.files_changed,
        insertions: w.insertions,
        deletions: w.deletions,
    }
}

/// An agent as the API shows it; `now` fixes `elapsed_ms` for running agents.
pub fn agent_to_pb(a: &AgentView, now: SystemTime) -> pb::Agent {
    pb::Agent {
        id: uuid_text(&a.id),
        tenant: a.tenant.as_ref().to_owned(),
        agent: a.agent.as_ref().to_owned(),
        model: a.model.as_ref().to_owned(),
        description: a.description.as_ref().to_owned(),
        parent_id: a.parent_id.as_ref().map(uuid_text).unwrap_or_default(),
        root_id: uuid_text(&a.root_id),
        lead_id: a.lead_id.as_deref().unwrap_or_default().to_owned(),
        depth: a.depth,
        status: status_to_pb(a.status) as i32,
        created_at: Some(timestamp(a.created_at)),
        started_at: a.started_at.map(timestamp),
        finished_at: a.finished_at.map(timestamp),
        collected_time: a.collected_at.map(timestamp),
        workspace: a.workspace.as_deref().map(workspace_to_pb),
        elapsed_ms: u64::try_from(a.elapsed(now).as_millis()).unwrap_or(u64::MAX),
        result: a.result.as_ref().to_owned(),
        error: a.error.as_ref().map(error_to_pb),
        approval: a.approval.as_ref().map(|ap| pb::Approval {
            id: uuid_text(&ap.id),
            tool_name: ap.tool_name.as_ref().to_owned(),
            detail: ap.detail.as_ref().to_owned(),
        }),
        usage: Some(usage_to_pb(&a.usage)),
        labels: a
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        background: a.background,
        detached: a.detached,
        queue_reason: a.queue_reason.as_deref().unwrap_or_default().to_owned(),
        worker_id: a.worker_id.map(|w| w.to_string()).unwrap_or_default(),
        trace_id: a.trace_id.to_hex(),
        total_usage: Some(usage_to_pb(&a.total_usage)),
        attempt: a.attempt,
        bucket: a.bucket.as_ref().to_owned(),
        conversation_id: uuid_text(&a.conversation_id()),
        continues_id: a
            .continuation
            .as_ref()
            .map(|c| uuid_text(&c.continues_id))
            .unwrap_or_default(),
        turn: a.turn(),
        attempts: attempts_to_pb(a),
    }
}

/// Every attempt of `a`: the ended ones, then the current one once it
/// started or while it waits to start as a retry.
pub(super) fn attempts_to_pb(a: &AgentView) -> Vec<pb::AgentAttempt> {
    let ended = a.attempts.as_deref().map_or(&[][..], |x| &x.ended[..]);
    let mut out: Vec<pb::AgentAttempt> = ended
        .iter()
        .zip(1..)
        .map(|(x, n)| pb::AgentAttempt {
            attempt: n,
            model: x.model.as_ref().to_owned(),
            error: Some(error_to_pb(&x.error)),
            started_at: x.started_at.map(timestamp),
            ended_at: Some(timestamp(x.ended_at)),
        })
        .collect();
    if a.has_current_attempt() {
        let ended_now = a.status.is_terminal();
        out.push(pb::AgentAttempt {
            attempt: a.attempt,
            model: a.model.as_ref().to_owned(),
            error: a.error.as_ref().filter(|_| ended_now).map(error_to_pb),
            started_at: a.attempt_started_at().map(timestamp),
            ended_at: a.finished_at.filter(|_| ended_now).map(timestamp),
        });
    }
    out
}

pub(super) fn error_to_pb(e: &AgentError) -> pb::AgentError {
    pb::AgentError {
        code: e.code.as_ref().to_owned(),
        message: e.message.as_ref().to_owned(),
    }
}

/// An id as the API writes it (hyphenated, lower case), without the
/// `fmt` machinery `to_string` goes through: every answer carries several.
pub(super) fn uuid_text(id: &Uuid) -> String {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    id.hyphenated().encode_lower(&mut buf).to_owned()
}

/// The agent of a worker's assignment, as a worker process hands it to
/// its runner. Fields the runners do not read (approval) are left empty;
/// an id that does not parse is an error (the server sent it).
pub fn agent_from_pb(a: &pb::Agent) -> Result<AgentView, String> {
    let id = |field: &str, value: &str| {
        Uuid::parse_str(value)
            .map_err(|_| format!("{field} \"{}\" is not an agent id", truncate(value)))
    };
    let time = |t: &Option<Timestamp>| t.as_ref().and_then(|t| SystemTime::try_from(*t).ok());
    let usage = |u: &Option<pb::Usage>| {
        u.as_ref().map_or_else(Usage::default, |u| Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            tool_calls: u.tool_calls,
        })
    };
    let optional = |s: &str| (!s.is_empty()).then(|| Arc::<str>::from(s));
    let status = pb::AgentStatus::try_from(a.status).unwrap_or(pb::AgentStatus::Unspecified);
    Ok(AgentView {
        id: id("agent.id", &a.id)?,
        tenant: a.tenant.as_str().into(),
        agent: a.agent.as_str().into(),
        model: a.model.as_str().into(),
        description: a.description.as_str().into(),
        parent_id: match a.parent_id.as_str() {
            "" => None,
            p => Some(id("agent.parent_id", p)?),
        },
        root_id: id("agent.root_id", &a.root_id)?,
        lead_id: optional(&a.lead_id),
        depth: a.depth,
        status: status_from_pb(status),
        created_at: time(&a.created_at).unwrap_or_else(SystemTime::now),
        started_at: time(&a.started_at),
        finished_at: time(&a.finished_at),
        collected_at: time(&a.collected_time),
        workspace: a.workspace.as_ref().map(|w| Arc::new(workspace_from_pb(w))),
        result: a.result.as_str().into(),
        error: a
            .error
            .as_ref()
            .map(|e| AgentError::new(&e.code, e.message.clone())),
        approval: None,
        usage: usage(&a.usage),
        total_usage: usage(&a.total_usage),
        labels: Arc::new(
            a.labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        background: a.background,
        detached: a.detached,
        queue_reason: optional(&a.queue_reason),
        bucket: a.bucket.as_str().into(),
        worker_id: match a.worker_id.as_str() {
            "" => None,
            w => Some(id("agent.worker_id", w)?),
        },
        trace_id: u128::from_str_radix(&a.trace_id, 16)
            .ok()
            .and_then(crate::scheduler::trace::TraceId::new)
            .ok_or_else(|| {
                format!(
                    "agent.trace_id \"{}\" is not a trace id",
                    truncate(&a.trace_id)
                )
            })?,
        attempt: a.attempt,
        continuation: match a.continues_id.as_str() {
            "" => None,
            from => Some(Arc::new(Continuation {
                conversation_id: id("agent.conversation_id", &a.conversation_id)?,
                continues_id: id("agent.continues_id", from)?,
                turn: a.turn,
            })),
        },
        attempts: match a.attempts.split_last() {
            Some((current, ended)) if !ended.is_empty() => Some(Arc::new(Attempts {
                ended: ended
                    .iter()
                    .map(|x| Attempt {
                        model: x.model.as_str().into(),
                        error: x.error.as_ref().map_or_else(
                            || AgentError::new("", ""),
                            |e| AgentError::new(&e.code, e.message.clone()),
                        ),
                        started_at: time(&x.started_at),
                        ended_at: time(&x.ended_at).unwrap_or(SystemTime::UNIX_EPOCH),
                    })
                    .collect(),
                current_started_at: time(&current.started_at),
            })),
            _ => None,
        },
    })
}

pub(super) fn usage_to_pb(u: &Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        tool_calls: u.tool_calls,
    }
}

/// Agents as the API shows them, all with the same `now`.
pub fn agents_to_pb(agents: &[AgentView]) -> Vec<pb::Agent> {
    let now = SystemTime::now();
    agents.iter().map(|a| agent_to_pb(a, now)).collect()
}

/// Steer delivery → protobuf enum.
pub fn delivery_to_pb(d: SteerDelivery) -> pb::SteerDelivery {
    match d {
        SteerDelivery::Delivered => pb::SteerDelivery::Delivered,
        SteerDelivery::Buffered => pb::SteerDelivery::Buffered,
    }
}
