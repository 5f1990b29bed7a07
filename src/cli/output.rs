//! Rendering of responses and errors for the client subcommands: protobuf-style
//! JSON for `--json`, compact text otherwise.
//!
//! Everything here renders to values or strings so it can be tested without a
//! terminal; writing them out is the caller's job.

use std::fmt::Write as _;

use serde_json::{json, Map, Value};
use tonic_types::StatusExt as _;

use crate::pb;

/// Width of the longest status / event kind name ("awaiting-approval"), so
/// the columns after it line up.
const STATE_WIDTH: usize = 17;

/// Converts an agent to the protobuf JSON mapping: lowerCamelCase field
/// names, enums as their names, timestamps in RFC 3339.
///
/// Two deliberate differences from the canonical mapping, both still accepted
/// by protobuf JSON parsers: 64-bit integers are JSON numbers rather than
/// strings (they never approach 2^53 here, and numbers compare correctly in
/// `jq`), and scalar fields are always present, so every line has the same
/// keys. Unset message fields (`startedAt`, `error`, …) are omitted.
pub(crate) fn agent_json(agent: &pb::Agent) -> Value {
    let mut obj = Map::new();
    obj.insert("id".into(), json!(agent.id));
    obj.insert("agent".into(), json!(agent.agent));
    obj.insert("model".into(), json!(agent.model));
    obj.insert("description".into(), json!(agent.description));
    obj.insert("parentId".into(), json!(agent.parent_id));
    obj.insert("rootId".into(), json!(agent.root_id));
    obj.insert("leadId".into(), json!(agent.lead_id));
    obj.insert("depth".into(), json!(agent.depth));
    obj.insert(
        "status".into(),
        enum_json(agent.status, |v| {
            pb::AgentStatus::try_from(v).ok().map(|s| s.as_str_name())
        }),
    );
    let timestamps = [
        ("createdAt", &agent.created_at),
        ("startedAt", &agent.started_at),
        ("finishedAt", &agent.finished_at),
    ];
    for (key, ts) in timestamps {
        if let Some(ts) = ts {
            obj.insert(key.into(), json!(ts.to_string()));
        }
    }
    obj.insert("elapsedMs".into(), json!(agent.elapsed_ms));
    obj.insert("result".into(), json!(agent.result));
    if let Some(error) = &agent.error {
        obj.insert(
            "error".into(),
            json!({ "code": error.code, "message": error.message }),
        );
    }
    if let Some(approval) = &agent.approval {
        obj.insert(
            "approval".into(),
            json!({ "id": approval.id, "toolName": approval.tool_name, "detail": approval.detail }),
        );
    }
    for (key, usage) in [("usage", &agent.usage), ("totalUsage", &agent.total_usage)] {
        if let Some(usage) = usage {
            obj.insert(
                key.into(),
                json!({
                    "inputTokens": usage.input_tokens,
                    "outputTokens": usage.output_tokens,
                    "toolCalls": usage.tool_calls,
                }),
            );
        }
    }
    // serde_json's map is ordered by key, so labels print deterministically.
    obj.insert("labels".into(), json!(agent.labels));
    obj.insert("background".into(), json!(agent.background));
    obj.insert("detached".into(), json!(agent.detached));
    obj.insert("queueReason".into(), json!(agent.queue_reason));
    obj.insert("bucket".into(), json!(agent.bucket));
    obj.insert("workerId".into(), json!(agent.worker_id));
    obj.insert("attempt".into(), json!(agent.attempt));
    obj.insert("traceId".into(), json!(agent.trace_id));
    obj.insert("tenant".into(), json!(agent.tenant));
    obj.insert("conversationId".into(), json!(agent.conversation_id));
    obj.insert("continuesId".into(), json!(agent.continues_id));
    obj.insert("turn".into(), json!(agent.turn));
    if let Some(w) = &agent.workspace {
        obj.insert(
            "workspace".into(),
            json!({
                "branch": w.branch,
                "kept": w.kept,
                "baseCommit": w.base_commit,
                "headCommit": w.head_commit,
                "filesChanged": w.files_changed,
                "insertions": w.insertions,
                "deletions": w.deletions,
            }),
        );
    }
    let attempts: Vec<Value> = agent
        .attempts
        .iter()
        .map(|a| {
            let mut x = Map::new();
            x.insert("attempt".into(), json!(a.attempt));
            x.insert("model".into(), json!(a.model));
            if let Some(e) = &a.error {
                x.insert(
                    "error".into(),
                    json!({ "code": e.code, "message": e.message }),
                );
            }
            for (key, ts) in [("startedAt", &a.started_at), ("endedAt", &a.ended_at)] {
                if let Some(ts) = ts {
                    x.insert(key.into(), json!(ts.to_string()));
                }
            }
            Value::Object(x)
        })
        .collect();
    obj.insert("attempts".into(), Value::Array(attempts));
    Value::Object(obj)
}

/// Converts a transcript entry to the mapping of [`agent_json`]: every
/// scalar present (`status` is `AGENT_STATUS_UNSPECIFIED` but on RESULT
/// entries), `time` and `error` omitted when unset.
pub(crate) fn transcript_entry_json(entry: &pb::TranscriptEntry) -> Value {
    let mut obj = Map::new();
    obj.insert(
        "kind".into(),
        enum_json(entry.kind, |v| {
            pb::TranscriptEntryKind::try_from(v)
                .ok()
                .map(|k| k.as_str_name())
        }),
    );
    obj.insert("agentId".into(), json!(entry.agent_id));
    obj.insert("turn".into(), json!(entry.turn));
    if let Some(time) = &entry.time {
        obj.insert("time".into(), json!(time.to_string()));
    }
    obj.insert("text".into(), json!(entry.text));
    obj.insert(
        "status".into(),
        enum_json(entry.status, |v| {
            pb::AgentStatus::try_from(v).ok().map(|s| s.as_str_name())
        }),
    );
    if let Some(error) = &entry.error {
        obj.insert(
            "error".into(),
            json!({ "code": error.code, "message": error.message }),
        );
    }
    Value::Object(obj)
}

/// Converts a watch event to `{"sequence", "kind", "agent"}` in the same
/// mapping as [`agent_json`].
pub(crate) fn event_json(event: &pb::WatchAgentsResponse) -> Value {
    let mut obj = Map::new();
    obj.insert("sequence".into(), json!(event.sequence));
    obj.insert(
        "kind".into(),
        enum_json(event.kind, |v| {
            pb::AgentEventKind::try_from(v)
                .ok()
                .map(|k| k.as_str_name())
        }),
    );
    if let Some(agent) = &event.agent {
        obj.insert("agent".into(), agent_json(agent));
    }
    if event.kind == pb::AgentEventKind::Output as i32 {
        obj.insert("output".into(), json!(event.output));
    }
    if let Some(call) = &event.tool_call {
        obj.insert(
            "tool_call".into(),
            json!({"name": call.name, "input_digest": call.input_digest}),
        );
    }
    Value::Object(obj)
}

/// Converts a steer result to `{"delivery", "agent"}`.
pub(crate) fn steer_json(response: &pb::SteerResponse) -> Value {
    let mut obj = Map::new();
    obj.insert(
        "delivery".into(),
        enum_json(response.delivery, |v| {
            pb::SteerDelivery::try_from(v).ok().map(|d| d.as_str_name())
        }),
    );
    if let Some(agent) = &response.agent {
        obj.insert("agent".into(), agent_json(agent));
    }
    Value::Object(obj)
}

/// An enum as its name, or as its number when this client does not know the
/// value (a newer server), as the protobuf JSON mapping prescribes.
fn enum_json(value: i32, name: impl FnOnce(i32) -> Option<&'static str>) -> Value {
    name(value).map_or_else(|| json!(value), |n| json!(n))
}

/// Renders an agent as one summary line (id, status, elapsed, agent, model)
/// followed by indented detail lines. The result is included only when
/// `with_result` is set, because it can be long and repeats across events.
pub(crate) fn agent_human(agent: &pb::Agent, with_result: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}  {:<STATE_WIDTH$}  {:>7}  {}  {}",
        agent.id,
        status_word(agent.status),
        elapsed(agent),
        agent.agent,
        agent.model
    );
    push_details(&mut out, agent, with_result);
    out
}

/// Renders a watch event as `#<sequence>  <kind>  <agent summary>` plus the
/// agent's detail lines; the result is shown once the agent is terminal.
pub(crate) fn event_human(event: &pb::WatchAgentsResponse) -> String {
    let kind = pb::AgentEventKind::try_from(event.kind)
        .map(|k| match k {
            pb::AgentEventKind::Unspecified => "unspecified".to_owned(),
            pb::AgentEventKind::Snapshot => "snapshot".to_owned(),
            pb::AgentEventKind::Queued => "queued".to_owned(),
            pb::AgentEventKind::Started => "started".to_owned(),
            pb::AgentEventKind::Steered => "steered".to_owned(),
            pb::AgentEventKind::AwaitingApproval => "awaiting-approval".to_owned(),
            pb::AgentEventKind::Done => "done".to_owned(),
            pb::AgentEventKind::Failed => "failed".to_owned(),
            pb::AgentEventKind::Cancelled => "cancelled".to_owned(),
            pb::AgentEventKind::Retrying => "retrying".to_owned(),
            pb::AgentEventKind::Output => "output".to_owned(),
            pb::AgentEventKind::WorkspaceSaved => "workspace-saved".to_owned(),
            pb::AgentEventKind::ToolCall => "tool-call".to_owned(),
        })
        .unwrap_or_else(|_| format!("kind-{}", event.kind));
    let mut out = format!("#{}  {kind:<STATE_WIDTH$}  ", event.sequence);
    // Progress: one line naming the agent and what it reported.
    let id = event.agent.as_ref().map_or("", |a| a.id.as_str());
    if event.kind == pb::AgentEventKind::Output as i32 {
        let _ = writeln!(out, "{id}  {:?}", event.output);
        return out;
    }
    if let (Some(call), true) = (
        &event.tool_call,
        event.kind == pb::AgentEventKind::ToolCall as i32,
    ) {
        let _ = writeln!(out, "{id}  {} {}", call.name, call.input_digest);
        return out;
    }
    match &event.agent {
        Some(agent) => out.push_str(&agent_human(agent, is_terminal(agent.status))),
        None => out.push_str("(no agent)\n"),
    }
    out
}

/// Width of the longest transcript entry kind ("tool-call", "cancelled").
const ENTRY_KIND_WIDTH: usize = 9;

/// Renders a transcript entry as `turn <n>  <kind>  <agent id>  <text>`:
/// the text's further lines follow indented by four spaces, and a failed or
/// cancelled turn's error as `    error: <code>: <message>`. A RESULT's kind
/// is how the turn ended: `result` (done), `failed` or `cancelled`, as the
/// `simulated` runner's `history` names them. ELIDED has no turn or agent,
/// shown as `-`.
pub(crate) fn transcript_entry_human(entry: &pb::TranscriptEntry) -> String {
    let kind = match pb::TranscriptEntryKind::try_from(entry.kind) {
        Ok(pb::TranscriptEntryKind::Unspecified) => "unspecified".to_owned(),
        Ok(pb::TranscriptEntryKind::Prompt) => "prompt".to_owned(),
        Ok(pb::TranscriptEntryKind::Steer) => "steer".to_owned(),
        Ok(pb::TranscriptEntryKind::ToolCall) => "tool-call".to_owned(),
        Ok(pb::TranscriptEntryKind::Result) => match pb::AgentStatus::try_from(entry.status) {
            Ok(pb::AgentStatus::Done) => "result".to_owned(),
            _ => status_word(entry.status),
        },
        Ok(pb::TranscriptEntryKind::Elided) => "elided".to_owned(),
        Err(_) => format!("kind-{}", entry.kind),
    };
    let turn = match entry.turn {
        0 => "-".to_owned(),
        n => n.to_string(),
    };
    let agent = if entry.agent_id.is_empty() {
        "-"
    } else {
        entry.agent_id.as_str()
    };
    let mut lines = entry.text.lines();
    let first = lines.next().unwrap_or_default();
    let head = format!("turn {turn}  {kind:<ENTRY_KIND_WIDTH$}  {agent}  {first}");
    let mut out = format!("{}\n", head.trim_end());
    for line in lines {
        let _ = writeln!(out, "    {line}");
    }
    if let Some(error) = &entry.error {
        let _ = writeln!(out, "    error: {}: {}", error.code, error.message);
    }
    out
}

/// Lower-case status name, matching the `--status` values of `status`.
pub(crate) fn status_word(status: i32) -> String {
    match pb::AgentStatus::try_from(status) {
        Ok(pb::AgentStatus::Unspecified) => "unspecified".into(),
        Ok(pb::AgentStatus::Queued) => "queued".into(),
        Ok(pb::AgentStatus::Running) => "running".into(),
        Ok(pb::AgentStatus::AwaitingApproval) => "awaiting-approval".into(),
        Ok(pb::AgentStatus::Done) => "done".into(),
        Ok(pb::AgentStatus::Failed) => "failed".into(),
        Ok(pb::AgentStatus::Cancelled) => "cancelled".into(),
        Err(_) => format!("status-{status}"),
    }
}

/// True for DONE, FAILED and CANCELLED.
pub(crate) fn is_terminal(status: i32) -> bool {
    matches!(
        pb::AgentStatus::try_from(status),
        Ok(pb::AgentStatus::Done | pb::AgentStatus::Failed | pb::AgentStatus::Cancelled)
    )
}

/// True when Await would consider the agent settled: terminal or awaiting
/// approval.
pub(crate) fn is_settled(status: i32) -> bool {
    is_terminal(status) || status == pb::AgentStatus::AwaitingApproval as i32
}

fn push_details(out: &mut String, agent: &pb::Agent, with_result: bool) {
    if !agent.description.is_empty() {
        let _ = writeln!(out, "  description: {}", agent.description);
    }
    if !agent.queue_reason.is_empty() {
        let _ = writeln!(out, "  queued: {}", agent.queue_reason);
    }
    if !agent.worker_id.is_empty() {
        let _ = writeln!(
            out,
            "  worker: {} (attempt {})",
            agent.worker_id, agent.attempt
        );
    }
    if !agent.trace_id.is_empty() {
        let _ = writeln!(out, "  trace: {}", agent.trace_id);
    }
    // A conversation's first turn is the agent itself: nothing to say.
    if agent.turn > 1 {
        let _ = write!(
            out,
            "  conversation: {} (turn {}",
            agent.conversation_id, agent.turn
        );
        if !agent.continues_id.is_empty() {
            let _ = write!(out, ", continues {}", agent.continues_id);
        }
        out.push_str(")\n");
    }
    if !agent.tenant.is_empty() && agent.tenant != crate::scheduler::DEFAULT_TENANT {
        let _ = writeln!(out, "  tenant: {}", agent.tenant);
    }
    if let Some(w) = &agent.workspace {
        let _ = writeln!(
            out,
            "  workspace: {} ({}), {} files changed, +{} -{}",
            w.branch,
            if w.kept { "kept" } else { "deleted" },
            w.files_changed,
            w.insertions,
            w.deletions
        );
    }
    if let Some(approval) = &agent.approval {
        let _ = writeln!(
            out,
            "  approval: {} (approval id {})",
            approval.tool_name, approval.id
        );
        if !approval.detail.is_empty() {
            let _ = writeln!(out, "  approval detail: {}", approval.detail);
        }
    }
    if let Some(error) = &agent.error {
        let _ = writeln!(out, "  error: {}: {}", error.code, error.message);
    }
    if with_result && !agent.result.is_empty() {
        out.push_str("  result:\n");
        for line in agent.result.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
}

/// Compact running time: "-" if the run never started, then "450ms", "12.3s",
/// "2m03s" or "1h02m" depending on magnitude.
fn elapsed(agent: &pb::Agent) -> String {
    let ms = agent.elapsed_ms;
    if ms == 0 && agent.started_at.is_none() {
        return "-".into();
    }
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", ms / 1_000, ms % 1_000 / 100),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1_000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// Renders a non-OK status as `<CODE>: <message>` followed by the rich error
/// details the server attached, one per indented line:
/// ErrorInfo as `reason: <REASON> (k=v, …)`, BadRequest as
/// `<field>: <description>`, QuotaFailure as `quota: <subject>: <description>`
/// and RetryInfo as `retry after: <delay>`.
pub(crate) fn status_error(status: &tonic::Status) -> String {
    let mut out = format!("{}: {}", code_name(status.code()), status.message());
    let details = status.get_error_details();
    if let Some(info) = details.error_info() {
        let _ = write!(out, "\n  reason: {}", info.reason);
        if !info.metadata.is_empty() {
            let mut pairs: Vec<_> = info.metadata.iter().collect();
            pairs.sort();
            let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(out, " ({})", pairs.join(", "));
        }
    }
    if let Some(bad_request) = details.bad_request() {
        for violation in &bad_request.field_violations {
            let _ = write!(out, "\n  {}: {}", violation.field, violation.description);
        }
    }
    if let Some(quota) = details.quota_failure() {
        for violation in &quota.violations {
            let _ = write!(
                out,
                "\n  quota: {}: {}",
                violation.subject, violation.description
            );
        }
    }
    if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
        let _ = write!(
            out,
            "\n  retry after: {}",
            humantime::format_duration(delay)
        );
    }
    out
}

/// The canonical upper-case gRPC code name, as used in the gRPC spec and by
/// other clients (tonic's `Debug` would print `NotFound`).
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use prost_types::Timestamp;
    use tonic_types::{ErrorDetails, FieldViolation, QuotaViolation};

    use super::*;

    fn sample_agent() -> pb::Agent {
        pb::Agent {
            collected_time: None,
            workspace: None,
            id: "0b6f2c1e-7d1a-4c8e-9a53-2f3e4d5c6b7a".into(),
            agent: "coder".into(),
            model: "anthropic/claude-sonnet-4".into(),
            description: "fix the build".into(),
            parent_id: String::new(),
            root_id: "0b6f2c1e-7d1a-4c8e-9a53-2f3e4d5c6b7a".into(),
            lead_id: "lead-1".into(),
            depth: 1,
            status: pb::AgentStatus::Failed as i32,
            created_at: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            started_at: Some(Timestamp {
                seconds: 1_700_000_001,
                nanos: 500_000_000,
            }),
            finished_at: None,
            elapsed_ms: 61_500,
            result: "line one\nline two".into(),
            error: Some(pb::AgentError {
                code: "DEADLINE_EXCEEDED".into(),
                message: "run exceeded 1m".into(),
            }),
            approval: None,
            usage: Some(pb::Usage {
                input_tokens: 10,
                output_tokens: 20,
                tool_calls: 3,
            }),
            labels: HashMap::from([("team".into(), "infra".into())]),
            background: true,
            detached: false,
            queue_reason: String::new(),
            bucket: "anthropic".into(),
            worker_id: String::new(),
            attempt: 1,
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            tenant: "team-a".into(),
            total_usage: Some(pb::Usage {
                input_tokens: 15,
                output_tokens: 25,
                tool_calls: 4,
            }),
            conversation_id: "0b6f2c1e-7d1a-4c8e-9a53-2f3e4d5c6b7a".into(),
            continues_id: String::new(),
            turn: 1,
            attempts: vec![pb::AgentAttempt {
                attempt: 1,
                model: "anthropic/claude-sonnet-4".into(),
                error: Some(pb::AgentError {
                    code: "DEADLINE_EXCEEDED".into(),
                    message: "run exceeded 1m".into(),
                }),
                started_at: Some(Timestamp {
                    seconds: 1_700_000_001,
                    nanos: 500_000_000,
                }),
                ended_at: None,
            }],
        }
    }

    #[test]
    fn agent_json_uses_protobuf_names_enum_names_and_rfc3339() {
        let value = agent_json(&sample_agent());
        assert_eq!(
            value,
            json!({
                "id": "0b6f2c1e-7d1a-4c8e-9a53-2f3e4d5c6b7a",
                "agent": "coder",
                "model": "anthropic/claude-sonnet-4",
                "description": "fix the build",
                "parentId": "",
                "rootId": "0b6f2c1e-7d1a-4c8e-9a53-2f3e4d5c6b7a",
                "leadId": "lead-1",
                "depth": 1,
                "status": "AGENT_STATUS_FAILED",
                "createdAt": "2023-11-14T22:13:20Z",
                "startedAt": "2023-11-14T22:13:21.500Z",
                "elapsedMs": 61500,
                "result": "line one\nline two",
                "error": {"code": "DEADLINE_EXCEEDED", "message": "run exceeded 1m"},
                "usage": {"inputTokens": 10, "outputTokens": 20, "toolCalls": 3},
                "labels": {"team": "infra"},
                "background": true,
                "detached": false,
                "queueReason": "",
                "bucket": "anthropic",
                "workerId": "",
                "attempt": 1,
                "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
                "tenant": "team-a",
                "totalUsage": {"inputTokens": 15, "outputTokens": 25, "toolCalls": 4},
                "conversationId": "0b6f2c1e-7d1a-4c8e-9a53-2f3e4d5c6b7a",
                "continuesId": "",
                "turn": 1,
                "attempts": [{
                    "attempt": 1,
                    "model": "anthropic/claude-sonnet-4",
                    "error": {"code": "DEADLINE_EXCEEDED", "message": "run exceeded 1m"},
                    "startedAt": "2023-11-14T22:13:21.500Z",
                }],
            })
        );
    }

    #[test]
    fn agent_json_keeps_unknown_enum_values_as_numbers() {
        let agent = pb::Agent {
            status: 42,
            ..Default::default()
        };
        assert_eq!(agent_json(&agent)["status"], json!(42));
    }

    #[test]
    fn agent_json_is_one_line() {
        let line = serde_json::to_string(&agent_json(&sample_agent())).unwrap();
        assert!(!line.contains('\n'));
    }

    #[test]
    fn event_json_wraps_the_agent() {
        let event = pb::WatchAgentsResponse {
            sequence: 7,
            kind: pb::AgentEventKind::Started as i32,
            agent: Some(sample_agent()),
            ..Default::default()
        };
        let value = event_json(&event);
        assert_eq!(value["sequence"], json!(7));
        assert_eq!(value["kind"], json!("AGENT_EVENT_KIND_STARTED"));
        assert_eq!(value["agent"]["id"], json!(sample_agent().id));
    }

    #[test]
    fn steer_json_names_the_delivery() {
        let response = pb::SteerResponse {
            agent: Some(sample_agent()),
            delivery: pb::SteerDelivery::Buffered as i32,
        };
        assert_eq!(
            steer_json(&response)["delivery"],
            json!("STEER_DELIVERY_BUFFERED")
        );
    }

    #[test]
    fn agent_human_shows_summary_error_and_indented_result() {
        let text = agent_human(&sample_agent(), true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "0b6f2c1e-7d1a-4c8e-9a53-2f3e4d5c6b7a  failed               1m01s  coder  anthropic/claude-sonnet-4",
                "  description: fix the build",
                "  trace: 4bf92f3577b34da6a3ce929d0e0e4736",
                "  tenant: team-a",
                "  error: DEADLINE_EXCEEDED: run exceeded 1m",
                "  result:",
                "    line one",
                "    line two",
            ]
        );
        assert!(!agent_human(&sample_agent(), false).contains("result"));
    }

    #[test]
    fn a_saved_workspace_shows_in_both_outputs() {
        let mut agent = sample_agent();
        agent.workspace = Some(pb::Workspace {
            branch: "subagentd/x".into(),
            kept: true,
            base_commit: "b".into(),
            head_commit: "h".into(),
            files_changed: 2,
            insertions: 5,
            deletions: 1,
        });
        assert!(agent_human(&agent, false)
            .contains("  workspace: subagentd/x (kept), 2 files changed, +5 -1\n"));
        let json = agent_json(&agent);
        assert_eq!(json["workspace"]["headCommit"], "h");
        assert_eq!(json["workspace"]["filesChanged"], 2);
        assert!(agent_json(&sample_agent()).get("workspace").is_none());
    }

    #[test]
    fn elapsed_is_a_dash_before_the_run_starts() {
        let mut agent = pb::Agent::default();
        assert_eq!(elapsed(&agent), "-");
        agent.started_at = Some(Timestamp::default());
        assert_eq!(elapsed(&agent), "0ms");
        agent.elapsed_ms = 12_345;
        assert_eq!(elapsed(&agent), "12.3s");
        agent.elapsed_ms = 3_723_000;
        assert_eq!(elapsed(&agent), "1h02m");
    }

    #[test]
    fn event_human_shows_the_result_only_once_terminal() {
        let mut event = pb::WatchAgentsResponse {
            sequence: 3,
            kind: pb::AgentEventKind::Done as i32,
            agent: Some(pb::Agent {
                status: pb::AgentStatus::Done as i32,
                result: "ok".into(),
                ..sample_agent()
            }),
            ..Default::default()
        };
        let text = event_human(&event);
        assert!(text.starts_with("#3  done "), "{text}");
        assert!(text.contains("    ok"), "{text}");

        event.kind = pb::AgentEventKind::Started as i32;
        event.agent.as_mut().unwrap().status = pb::AgentStatus::Running as i32;
        assert!(!event_human(&event).contains("    ok"));
    }

    #[test]
    fn status_error_lists_rich_details() {
        let mut details = ErrorDetails::new();
        details
            .set_error_info(
                "QUEUE_FULL",
                "subagentd",
                HashMap::from([
                    ("limit".into(), "100".into()),
                    ("bucket".into(), "x".into()),
                ]),
            )
            .set_bad_request(vec![FieldViolation::new("model", "must be provider/model")])
            .set_quota_failure(vec![QuotaViolation::new("bucket x", "3/3 running")]);
        let status = tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            "queue is full",
            details,
        );
        assert_eq!(
            status_error(&status),
            "RESOURCE_EXHAUSTED: queue is full\n  \
             reason: QUEUE_FULL (bucket=x, limit=100)\n  \
             model: must be provider/model\n  \
             quota: bucket x: 3/3 running"
        );
    }

    #[test]
    fn status_error_without_details_is_one_line() {
        let status = tonic::Status::not_found("no agent abc");
        assert_eq!(status_error(&status), "NOT_FOUND: no agent abc");
    }
}
