//! Transcripts and a continuation's history, both ways.

use std::{sync::Arc, time::SystemTime};

use uuid::Uuid;

use super::{
    agent::{status_from_pb, status_to_pb, timestamp, workspace_from_pb, workspace_to_pb},
    check::{non_empty, truncate},
};
use crate::pb;
use crate::scheduler::conversation::{
    Elided, Entry, EntryKind, History, TranscriptItem, TranscriptPage,
};
use crate::scheduler::{AgentError, AgentId};

/// A transcript page as the API shows it.
pub fn transcript_to_pb(page: &TranscriptPage) -> pb::GetTranscriptResponse {
    let entries = page
        .items
        .iter()
        .map(|item| match item {
            TranscriptItem::Elided(elided) => elided_to_pb(elided),
            TranscriptItem::Entry {
                agent_id,
                turn,
                entry,
            } => entry_to_pb(*agent_id, *turn, entry),
        })
        .collect();
    pb::GetTranscriptResponse {
        conversation_id: page.conversation_id.to_string(),
        entries,
        next_page_token: page.next_after.map(|n| n.to_string()).unwrap_or_default(),
    }
}

/// A continuation's history as a worker's assignment carries it: the
/// entries GetTranscript shows for the agent it continues.
pub fn history_to_pb(history: &History) -> Vec<pb::TranscriptEntry> {
    let elided = history.elided.any().then(|| elided_to_pb(&history.elided));
    elided
        .into_iter()
        .chain(
            history
                .entries
                .iter()
                .map(|(agent_id, turn, entry)| entry_to_pb(*agent_id, *turn, entry)),
        )
        .collect()
}

/// The history an assignment carries (see [`history_to_pb`]); None for
/// the first turn of a conversation (no entries, no session).
pub fn history_from_assignment(
    conversation_id: AgentId,
    transcript: &[pb::TranscriptEntry],
    session: String,
) -> Result<Option<History>, String> {
    if transcript.is_empty() && session.is_empty() {
        return Ok(None);
    }
    let mut elided = Elided::default();
    let mut entries = Vec::with_capacity(transcript.len());
    for e in transcript {
        let at = e
            .time
            .and_then(|t| SystemTime::try_from(t).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let kind = match e.kind() {
            pb::TranscriptEntryKind::Elided => {
                elided = Elided {
                    entries: e.elided_entries,
                    bytes: e.elided_bytes,
                    at: Some(at),
                };
                continue;
            }
            pb::TranscriptEntryKind::Prompt => EntryKind::Prompt,
            pb::TranscriptEntryKind::Steer => EntryKind::Steer,
            pb::TranscriptEntryKind::ToolCall => EntryKind::ToolCall,
            pb::TranscriptEntryKind::Result => EntryKind::Result {
                status: status_from_pb(e.status()),
                error: e
                    .error
                    .as_ref()
                    .map(|err| AgentError::new(&err.code, err.message.clone())),
                workspace: e.workspace.as_ref().map(|w| Arc::new(workspace_from_pb(w))),
            },
            pb::TranscriptEntryKind::Unspecified => {
                return Err(format!("transcript entry of unknown kind {}", e.kind));
            }
        };
        let agent = Uuid::parse_str(&e.agent_id).map_err(|_| {
            format!(
                "transcript entry agent_id \"{}\" is not an agent id",
                truncate(&e.agent_id)
            )
        })?;
        let text = e.text.as_str().into();
        entries.push((agent, e.turn, Entry { kind, at, text }));
    }
    Ok(Some(History {
        conversation_id,
        entries,
        elided,
        session: non_empty(session).map(Into::into),
    }))
}

pub(super) fn elided_to_pb(elided: &Elided) -> pb::TranscriptEntry {
    pb::TranscriptEntry {
        kind: pb::TranscriptEntryKind::Elided as i32,
        time: elided.at.map(timestamp),
        text: elided.notice(),
        elided_entries: elided.entries,
        elided_bytes: elided.bytes,
        ..pb::TranscriptEntry::default()
    }
}

pub(super) fn entry_to_pb(agent_id: AgentId, turn: u32, entry: &Entry) -> pb::TranscriptEntry {
    let (kind, status, error, workspace) = match &entry.kind {
        EntryKind::Prompt => (pb::TranscriptEntryKind::Prompt, None, None, None),
        EntryKind::Steer => (pb::TranscriptEntryKind::Steer, None, None, None),
        EntryKind::ToolCall => (pb::TranscriptEntryKind::ToolCall, None, None, None),
        EntryKind::Result {
            status,
            error,
            workspace,
        } => (
            pb::TranscriptEntryKind::Result,
            Some(*status),
            error.as_ref(),
            workspace.as_deref(),
        ),
    };
    pb::TranscriptEntry {
        kind: kind as i32,
        agent_id: agent_id.to_string(),
        turn,
        time: Some(timestamp(entry.at)),
        text: entry.text.to_string(),
        status: status.map_or(0, |s| status_to_pb(s) as i32),
        error: error.map(|e| pb::AgentError {
            code: e.code.to_string(),
            message: e.message.to_string(),
        }),
        workspace: workspace.map(workspace_to_pb),
        ..pb::TranscriptEntry::default()
    }
}
