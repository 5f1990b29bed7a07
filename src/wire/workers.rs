//! The worker protocol: the hello, run events in, commands out.

use std::{sync::Arc, time::SystemTime};

use uuid::Uuid;

use super::{
    agent::{agent_to_pb, timestamp, workspace_from_pb, workspace_to_pb},
    check::{non_empty, truncate, Violations, MAX_KEY_BYTES},
    transcript::history_to_pb,
};
use crate::pb;
use crate::scheduler::{
    AgentError, AgentId, Error, HeldRun, Usage, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo,
    Workspace, CODE_RUN_FAILED,
};

/// Most runs one worker may declare it can hold.
pub const MAX_WORKER_CAPACITY: u32 = 100_000;

/// Parses a worker's first message: it must be a hello naming at least one
/// agent type, each configured with `runner = "worker"` (`worker_types`).
pub fn parse_hello(
    req: pb::ConnectRequest,
    worker_types: &[String],
) -> Result<(WorkerInfo, Vec<HeldRun>), Error> {
    let Some(pb::connect_request::Message::Hello(hello)) = req.message else {
        return Err(Error::invalid(
            "hello",
            "the first message of a worker session must be `hello`",
        ));
    };
    let mut v = Violations::default();
    if hello.agents.is_empty() {
        v.add(
            "hello.agents",
            format!(
                "must name at least one agent type; worker agent types: {}",
                known_list(worker_types)
            ),
        );
    }
    let mut agents: Vec<Arc<str>> = Vec::new();
    for (i, name) in hello.agents.iter().enumerate() {
        if !worker_types.iter().any(|t| t == name) {
            v.add(
                format!("hello.agents[{i}]"),
                format!(
                    "\"{}\" is not an agent type with runner = \"worker\"; worker agent types: {}",
                    truncate(name),
                    known_list(worker_types)
                ),
            );
        } else if !agents.iter().any(|a| **a == **name) {
            agents.push(name.as_str().into());
        }
    }
    if hello.capacity < 1 || hello.capacity > MAX_WORKER_CAPACITY {
        v.add(
            "hello.capacity",
            format!("must be 1..={MAX_WORKER_CAPACITY} (got {})", hello.capacity),
        );
    }
    if hello.name.len() > MAX_KEY_BYTES {
        v.add(
            "hello.name",
            format!(
                "is {} bytes; at most {MAX_KEY_BYTES} bytes allowed",
                hello.name.len()
            ),
        );
    }
    let mut held = Vec::with_capacity(hello.held_runs.len());
    for (i, run) in hello.held_runs.iter().enumerate() {
        match Uuid::parse_str(&run.agent_id) {
            Ok(agent_id) if run.attempt >= 1 => held.push(HeldRun {
                agent_id,
                attempt: run.attempt,
            }),
            Ok(_) => v.add(
                format!("hello.held_runs[{i}].attempt"),
                "must be ≥ 1 (the attempt of the run's assignment)",
            ),
            Err(_) => v.add(
                format!("hello.held_runs[{i}].agent_id"),
                format!("\"{}\" is not an agent id", truncate(&run.agent_id)),
            ),
        }
    }
    v.finish(())?;
    let name = if hello.name.is_empty() {
        "(unnamed)".into()
    } else {
        hello.name.into()
    };
    let info = WorkerInfo {
        // The credential's, not the hello's: set by the handler.
        tenant: Arc::from(""),
        name,
        agents,
        capacity: hello.capacity,
        labels: hello.labels.into_iter().collect(),
    };
    Ok((info, held))
}

pub(super) fn known_list(names: &[String]) -> String {
    if names.is_empty() {
        "none configured".to_owned()
    } else {
        names.join(", ")
    }
}

/// A worker's report, or why it cannot be applied (a protocol slip that
/// is logged and skipped, not a reason to drop the worker's other runs).
pub fn worker_event_from_pb(event: pb::RunEvent) -> Result<(AgentId, WorkerEvent), String> {
    let agent = Uuid::parse_str(&event.agent_id).map_err(|_| {
        format!(
            "agent_id \"{}\" is not an agent id",
            truncate(&event.agent_id)
        )
    })?;
    use pb::run_event::Event as E;
    let event = match event.event.ok_or("the event is empty")? {
        E::Output(chunk) => WorkerEvent::Output(chunk),
        E::ToolCall(call) => WorkerEvent::ToolCall {
            name: call.name,
            input_digest: call.input_digest,
        },
        E::Usage(u) => WorkerEvent::Usage(Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            tool_calls: 0,
        }),
        E::ApprovalRequest(a) => WorkerEvent::ApprovalRequest {
            tool_name: a.tool_name,
            detail: a.detail,
        },
        E::TurnStarted(_) => WorkerEvent::TurnStarted,
        E::Workspace(w) => WorkerEvent::Workspace(workspace_from_pb(&w)),
        E::Done(d) => WorkerEvent::Done {
            result: d.result,
            session: non_empty(d.session),
        },
        E::Failed(f) => {
            let code = if f.code.is_empty() {
                CODE_RUN_FAILED
            } else {
                f.code.as_str()
            };
            WorkerEvent::Failed {
                error: AgentError::new(code, f.message),
                session: non_empty(f.session),
                retryable: f.retryable,
            }
        }
    };
    Ok((agent, event))
}

/// What the server sends a worker.
pub fn worker_command_to_pb(command: WorkerCommand) -> pb::ConnectResponse {
    use pb::connect_response::Message as M;
    let message = match command {
        WorkerCommand::Assign(a) => M::Assign(pb::RunAssignment {
            agent: Some(agent_to_pb(&a.agent, SystemTime::now())),
            prompt: a.prompt.to_string(),
            steer_messages: a.steer_messages,
            traceparent: a.trace.traceparent(),
            deadline: Some(timestamp(a.deadline)),
            transcript: a.history.as_deref().map(history_to_pb).unwrap_or_default(),
            session: a
                .history
                .as_ref()
                .and_then(|h| h.session.as_deref())
                .unwrap_or_default()
                .to_owned(),
            workspace_base: a.workspace_base.as_deref().unwrap_or_default().to_owned(),
            continues_workspace: a.continues_workspace.as_deref().map(workspace_to_pb),
        }),
        WorkerCommand::Steer { agent_id, message } => M::Steer(pb::SteerRun {
            agent_id: agent_id.to_string(),
            message,
        }),
        WorkerCommand::Cancel { agent_id, reason } => M::Cancel(pb::CancelRun {
            agent_id: agent_id.to_string(),
            reason,
        }),
        WorkerCommand::Approval {
            agent_id,
            approval_id,
            outcome,
        } => M::Approval(pb::ApprovalOutcome {
            agent_id: agent_id.to_string(),
            approval_id: approval_id.to_string(),
            approved: outcome.approved,
            note: outcome.note,
        }),
        WorkerCommand::Released { agent_id, attempt } => M::Released(pb::RunReleased {
            agent_id: agent_id.to_string(),
            attempt,
            workspace: false,
        }),
        WorkerCommand::WorkspaceAnswered { agent_id, attempt } => M::Released(pb::RunReleased {
            agent_id: agent_id.to_string(),
            attempt,
            workspace: true,
        }),
    };
    pb::ConnectResponse {
        message: Some(message),
    }
}

/// The answer to a worker's hello.
pub fn welcome_to_pb(worker_id: WorkerId) -> pb::ConnectResponse {
    pb::ConnectResponse {
        message: Some(pb::connect_response::Message::Welcome(pb::Welcome {
            worker_id: worker_id.to_string(),
        })),
    }
}

// The worker process's side of the protocol (`subagentd worker`): what it
// sends up its session.

/// One message up a worker's session.
pub fn up(message: pb::connect_request::Message) -> pb::ConnectRequest {
    pb::ConnectRequest {
        message: Some(message),
    }
}

/// A worker's hello: its name, the types it runs, its capacity and labels,
/// and the runs it still holds (agent id, attempt) for a re-attach.
pub fn hello<'a>(
    name: &str,
    agents: impl IntoIterator<Item = &'a String>,
    capacity: u32,
    labels: &std::collections::HashMap<String, String>,
    held: impl IntoIterator<Item = (&'a String, u32)>,
) -> pb::ConnectRequest {
    up(pb::connect_request::Message::Hello(pb::WorkerHello {
        name: name.to_owned(),
        agents: agents.into_iter().cloned().collect(),
        capacity,
        labels: labels.clone(),
        held_runs: held
            .into_iter()
            .map(|(agent_id, attempt)| pb::HeldRun {
                agent_id: agent_id.clone(),
                attempt,
            })
            .collect(),
    }))
}

/// A worker's notice that it is stopping: assign it nothing more.
pub fn drain(reason: &str) -> pb::ConnectRequest {
    up(pb::connect_request::Message::Drain(pb::WorkerDrain {
        reason: reason.to_owned(),
    }))
}

/// Report number `seq` of a run's attempt.
pub fn run_event(
    agent_id: &str,
    seq: u64,
    attempt: u32,
    event: pb::run_event::Event,
) -> pb::RunEvent {
    pb::RunEvent {
        agent_id: agent_id.to_owned(),
        seq,
        attempt,
        event: Some(event),
    }
}

/// A run's output chunk (empty: still working).
pub fn output(chunk: &str) -> pb::run_event::Event {
    pb::run_event::Event::Output(chunk.to_owned())
}

/// A run's tool call.
pub fn tool_call(name: &str, input_digest: &str) -> pb::run_event::Event {
    pb::run_event::Event::ToolCall(pb::ToolCall {
        name: name.to_owned(),
        input_digest: input_digest.to_owned(),
    })
}

/// A run's saved workspace.
pub fn workspace(workspace: &Workspace) -> pb::run_event::Event {
    pb::run_event::Event::Workspace(workspace_to_pb(workspace))
}

/// A run starts a turn.
pub fn turn_started() -> pb::run_event::Event {
    pb::run_event::Event::TurnStarted(pb::TurnStarted {})
}

/// Tokens a run used; None for none.
pub fn usage(usage: Usage) -> Option<pb::run_event::Event> {
    (usage.input_tokens > 0 || usage.output_tokens > 0).then_some(pb::run_event::Event::Usage(
        pb::TokenUsage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        },
    ))
}

/// A run asks for a decision on a tool call.
pub fn approval_request(tool_name: &str, detail: &str) -> pb::run_event::Event {
    pb::run_event::Event::ApprovalRequest(pb::ApprovalRequest {
        tool_name: tool_name.to_owned(),
        detail: detail.to_owned(),
    })
}

/// A run ended with its result, and the session it reported.
pub fn done(result: String, session: String) -> pb::run_event::Event {
    pb::run_event::Event::Done(pb::RunDone { result, session })
}

/// A run failed.
pub fn failed(
    code: &str,
    message: String,
    session: String,
    retryable: bool,
) -> pb::run_event::Event {
    pb::run_event::Event::Failed(pb::RunFailed {
        code: code.to_owned(),
        message,
        session,
        retryable,
    })
}
