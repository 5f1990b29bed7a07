//! How agents read in a tool's answer: lower-case statuses, results cut at
//! `max_result_chars` with a pointer to `agent_result`, structured content
//! as `key: value` lines, and the prose of `agent_await` and
//! `agent_result`.

use std::{fmt::Write as _, time::Duration};

use serde_json::{json, Value};

use crate::pb;

/// Characters of a result `agent_status` previews.
pub const PREVIEW_CHARS: usize = 200;

/// The lower-case word of an `AgentStatus` named as the API names it
/// (`AGENT_STATUS_DONE`, as ErrorInfo metadata carries it).
pub fn status_word_of_name(name: &str) -> &'static str {
    pb::AgentStatus::from_str_name(name).map_or("unknown", |s| status_word(s as i32))
}

/// The lower-case word of an `AgentStatus`.
pub fn status_word(status: i32) -> &'static str {
    match pb::AgentStatus::try_from(status) {
        Ok(pb::AgentStatus::Queued) => "queued",
        Ok(pb::AgentStatus::Running) => "running",
        Ok(pb::AgentStatus::AwaitingApproval) => "awaiting_approval",
        Ok(pb::AgentStatus::Done) => "done",
        Ok(pb::AgentStatus::Failed) => "failed",
        Ok(pb::AgentStatus::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

/// Terminal or awaiting approval.
pub fn is_settled(agent: &pb::Agent) -> bool {
    !matches!(
        pb::AgentStatus::try_from(agent.status),
        Ok(pb::AgentStatus::Queued | pb::AgentStatus::Running) | Err(_)
    )
}

/// An agent error as one line: `CODE: message`.
pub fn error_line(error: &pb::AgentError) -> String {
    format!("{}: {}", error.code, error.message)
}

/// At most `max` characters of `text` from character `offset`, and the
/// offset to continue from when more follows.
pub fn cut(text: &str, offset: usize, max: usize) -> (String, Option<usize>) {
    let shown: String = text.chars().skip(offset).take(max).collect();
    let end = offset + shown.chars().count();
    let more = text.chars().nth(end).is_some();
    (shown, more.then_some(end))
}

/// A JSON object as `key: value` lines (nested objects in arrays as
/// blocks): the text of a structured answer, with every field in it.
pub fn fields(value: &Value) -> String {
    let mut out = String::new();
    write_fields(&mut out, value, "");
    out.trim_end().to_owned()
}

fn write_fields(out: &mut String, value: &Value, indent: &str) {
    let Value::Object(map) = value else {
        let _ = writeln!(out, "{indent}{}", scalar(value));
        return;
    };
    for (key, v) in map {
        match v {
            Value::Array(items) if items.iter().any(Value::is_object) => {
                let _ = writeln!(out, "{indent}{key}: {} item(s)", items.len());
                for item in items {
                    let _ = writeln!(out, "{indent}-");
                    write_fields(out, item, &format!("{indent}  "));
                }
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(scalar).collect();
                let _ = writeln!(out, "{indent}{key}: [{}]", items.join(", "));
            }
            Value::Object(_) => {
                let _ = writeln!(out, "{indent}{key}:");
                write_fields(out, v, &format!("{indent}  "));
            }
            _ => {
                let _ = writeln!(out, "{indent}{key}: {}", scalar(v));
            }
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "null".to_owned(),
        other => other.to_string(),
    }
}

/// The default `agent_status` listing: live agents first (oldest first),
/// then settled and uncollected ones (oldest settled first), then the
/// rest, newest first; at most `limit`.
pub fn listing_order(agents: Vec<pb::Agent>, limit: usize) -> Vec<pb::Agent> {
    let (settled, mut live): (Vec<_>, Vec<_>) = agents.into_iter().partition(is_settled);
    let (mut seen, mut uncollected): (Vec<_>, Vec<_>) = settled
        .into_iter()
        .partition(|a| a.collected_time.is_some());
    uncollected.sort_by_key(ended);
    seen.sort_by_key(|a| std::cmp::Reverse(ended(a)));
    live.extend(uncollected);
    live.extend(seen);
    live.truncate(limit);
    live
}

fn ended(agent: &pb::Agent) -> (i64, i32) {
    agent
        .finished_at
        .as_ref()
        .map_or((i64::MAX, 0), |t| (t.seconds, t.nanos))
}

/// One `agent_status` row.
pub fn status_row(agent: &pb::Agent) -> Value {
    let elapsed = agent.elapsed_ms as f64 / 1000.0;
    let approval = agent.approval.as_ref();
    let preview = (!agent.result.is_empty()).then(|| {
        let (shown, more) = cut(&agent.result, 0, PREVIEW_CHARS);
        if more.is_some() {
            format!("{shown}…")
        } else {
            shown
        }
    });
    json!({
        "id": agent.id,
        "description": agent.description,
        "agent": agent.agent,
        "status": status_word(agent.status),
        "elapsed_seconds": elapsed,
        "queue_reason": (!agent.queue_reason.is_empty()).then_some(&agent.queue_reason),
        "approval_id": approval.map(|a| &a.id),
        "approval_tool": approval.map(|a| &a.tool_name),
        "approval_detail": approval.map(|a| &a.detail),
        "result_preview": preview,
        "error": agent.error.as_ref().map(error_line),
        "collected": agent.collected_time.is_some(),
    })
}

/// What `agent_await` shows.
pub struct AwaitView<'a> {
    /// The settled agents it returns.
    pub settled: &'a [pb::Agent],
    /// The owner's agents still live (inbox waits only).
    pub live: &'a [pb::Agent],
    /// Whether the wait timed out.
    pub timed_out: bool,
    /// How long it waited.
    pub waited: Duration,
    /// Characters of a result shown.
    pub max_result_chars: usize,
    /// Whether the lead decides approvals (`agent_approve`).
    pub lead_approves: bool,
    /// Waited on given ids (their live ones are among `settled`'s peers).
    pub by_ids: bool,
}

/// The prose answer of `agent_await`.
pub fn await_text(view: &AwaitView<'_>, notes: &[String]) -> String {
    let mut out = String::new();
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    let (settled, live_by_id): (Vec<&pb::Agent>, Vec<&pb::Agent>) =
        view.settled.iter().partition(|a| is_settled(a));
    if settled.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            if view.timed_out {
                format!(
                    "Nothing new finished within {:.1}s (timed out: a normal answer). Call \
                     agent_await again to keep waiting.",
                    view.waited.as_secs_f64()
                )
            } else {
                "Nothing to wait for: no agent of yours is running, and every result was \
                 already returned."
                    .to_owned()
            }
        );
    }
    for agent in &settled {
        let _ = writeln!(out, "\n## {}", headline(agent));
        if let Some(approval) = &agent.approval {
            let _ = writeln!(
                out,
                "Waiting for approval of a call of {} (approval_id {}): {}",
                approval.tool_name, approval.id, approval.detail
            );
            if view.lead_approves {
                let _ = writeln!(
                    out,
                    "Decide it with agent_approve. Until then agent_await returns at once; to \
                     wait for the others, pass their ids."
                );
            } else {
                let _ = writeln!(
                    out,
                    "A person must decide it: `subagentd approve {} {}` (add --deny to refuse). \
                     Until then agent_await returns at once; to wait for the others, pass their \
                     ids.",
                    agent.id, approval.id
                );
            }
            continue;
        }
        if let Some(error) = &agent.error {
            let _ = writeln!(out, "Error: {}", error_line(error));
        }
        if agent.result.is_empty() {
            let _ = writeln!(out, "(no result text)");
            continue;
        }
        let (shown, more) = cut(&agent.result, 0, view.max_result_chars);
        let _ = writeln!(out, "{shown}");
        if let Some(offset) = more {
            let _ = writeln!(
                out,
                "[result cut at {offset} characters: read on with agent_result id \"{}\" offset \
                 {offset}]",
                agent.id
            );
        }
    }
    let still: Vec<&pb::Agent> = if view.by_ids {
        live_by_id
    } else {
        // An agent awaiting approval is shown above, not twice.
        view.live
            .iter()
            .filter(|a| !settled.iter().any(|s| s.id == a.id))
            .collect()
    };
    if !still.is_empty() {
        let _ = writeln!(out, "\nStill running ({}):", still.len());
        for agent in still {
            let mut line = format!("- {}", headline(agent));
            if !agent.queue_reason.is_empty() {
                let _ = write!(line, "; waits for: {}", agent.queue_reason);
            }
            let _ = writeln!(out, "{line}");
        }
        if view.timed_out && !settled.is_empty() {
            let _ = writeln!(out, "Call agent_await again for the rest.");
        }
    }
    out.trim().to_owned()
}

fn headline(agent: &pb::Agent) -> String {
    let mut line = format!("{} [{}]", agent.id, status_word(agent.status));
    if !agent.description.is_empty() {
        let _ = write!(line, " {}", agent.description);
    }
    let _ = write!(line, " ({}", agent.agent);
    if agent.started_at.is_some() {
        let _ = write!(line, ", {:.1}s", agent.elapsed_ms as f64 / 1000.0);
    }
    line.push(')');
    line
}

/// A page of an agent's result for `agent_result`.
pub fn result_page(agent: &pb::Agent, offset: usize, max: usize) -> String {
    let total = agent.result.chars().count();
    let (shown, more) = cut(&agent.result, offset, max);
    let mut out = format!(
        "{} [{}], result characters {}–{} of {}:\n{shown}",
        agent.id,
        status_word(agent.status),
        offset.min(total),
        offset.min(total) + shown.chars().count(),
        total
    );
    match more {
        Some(next) => {
            let _ = write!(
                out,
                "\n[more: agent_result id \"{}\" offset {next}]",
                agent.id
            );
        }
        None => out.push_str("\n[end of result]"),
    }
    out
}

/// A page of a transcript for `agent_result` with `transcript: true`.
pub fn transcript_text(
    id: &str,
    offset: usize,
    page: &pb::GetTranscriptResponse,
    max: usize,
) -> String {
    let mut out = format!(
        "Conversation {} (of agent {id}), entries from {offset}:\n",
        page.conversation_id
    );
    let mut shown = 0;
    let mut next = page.next_page_token.parse::<usize>().ok();
    for (i, entry) in page.entries.iter().enumerate() {
        let kind = match pb::TranscriptEntryKind::try_from(entry.kind) {
            Ok(pb::TranscriptEntryKind::Prompt) => "prompt",
            Ok(pb::TranscriptEntryKind::Steer) => "steer",
            Ok(pb::TranscriptEntryKind::ToolCall) => "tool call",
            Ok(pb::TranscriptEntryKind::Result) => "result",
            _ => "elided",
        };
        let line = format!(
            "[{}] turn {} {kind} ({}): {}\n",
            offset + i,
            entry.turn,
            entry.agent_id,
            entry.text
        );
        let len = line.chars().count();
        if shown > 0 && shown + len > max {
            next = Some(offset + i);
            break;
        }
        if len > max {
            // One entry larger than a page: its start, and the next entry
            // after it (read the whole entry's text with agent_result).
            let (start, _) = cut(&line, 0, max);
            let _ = writeln!(out, "{start}… [entry cut at {max} of {len} characters]");
            shown = max;
            continue;
        }
        shown += len;
        out.push_str(&line);
    }
    match next {
        Some(n) => {
            let _ = write!(
                out,
                "[more: agent_result id \"{id}\" transcript true offset {n}]"
            );
        }
        None => out.push_str("[end of conversation]"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_counts_characters_and_says_where_to_go_on() {
        assert_eq!(cut("héllo", 0, 3), ("hél".to_owned(), Some(3)));
        assert_eq!(cut("héllo", 3, 10), ("lo".to_owned(), None));
        assert_eq!(cut("abc", 0, 3), ("abc".to_owned(), None));
        assert_eq!(cut("abc", 9, 3), (String::new(), None));
    }

    #[test]
    fn structured_content_reads_as_every_field() {
        let text = fields(&json!({
            "cancelled": ["a", "b"],
            "agents": [{"id": "x", "queue_reason": null}],
        }));
        assert!(text.contains("cancelled: [a, b]"));
        assert!(text.contains("agents: 1 item(s)"));
        assert!(text.contains("  id: x"));
        assert!(text.contains("  queue_reason: null"));
    }

    #[test]
    fn the_listing_puts_live_then_uncollected_then_the_rest() {
        let agent = |id: &str, status: pb::AgentStatus, ended: i64, collected: bool| pb::Agent {
            id: id.into(),
            status: status as i32,
            finished_at: (ended > 0).then_some(prost_types::Timestamp {
                seconds: ended,
                nanos: 0,
            }),
            collected_time: collected.then_some(prost_types::Timestamp::default()),
            ..Default::default()
        };
        let ordered = listing_order(
            vec![
                agent("old-seen", pb::AgentStatus::Done, 1, true),
                agent("new-seen", pb::AgentStatus::Done, 5, true),
                agent("late", pb::AgentStatus::Done, 4, false),
                agent("early", pb::AgentStatus::Failed, 2, false),
                agent("live", pb::AgentStatus::Running, 0, false),
            ],
            4,
        );
        let ids: Vec<_> = ordered.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["live", "early", "late", "new-seen"]);
    }
}
