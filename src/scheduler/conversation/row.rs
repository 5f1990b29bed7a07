//! A conversation's encoded form: the store's `conversations` row, and how
//! the scheduler keeps an ended conversation in memory.
//!
//! Most conversations end and are only kept in case someone continues one
//! or reads its transcript, for a day by default. Kept as Rust values an
//! ended one-turn conversation takes four allocations (~450 bytes beyond
//! its text); kept as its row it takes one of ~60 bytes plus the text, and
//! the store writes those same bytes without encoding them again.
//!
//! Rows are protobuf messages (prost derives, no .proto file). [`encode`]
//! writes the bytes the derived [`ConversationRow`] would, field by field
//! from the domain types, without first copying every string into an owned
//! row (a test holds the two to the same bytes); [`decode`] goes through
//! the derived types. The smaller rows the store's agent and event rows
//! share ([`ErrorRow`], [`WorkspaceRow`], times and status codes) live here
//! too, so each is written once.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use prost::{
    encoding::{encode_key, encode_varint, WireType},
    Message,
};
use uuid::Uuid;

use super::{Conversation, Elided, Entry, EntryKind, Inherited, Turn};
use crate::scheduler::types::{AgentError, AgentStatus, Workspace};

/// A row that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Corrupt(pub String);

/// A [`Corrupt`] saying what did not decode and why.
pub(crate) fn corrupt(what: &str, why: impl std::fmt::Display) -> Corrupt {
    Corrupt(format!("{what}: {why}"))
}

/// One row of the `conversations` table (keyed by its id). Since schema 4.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ConversationRow {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) id: Vec<u8>,
    #[prost(string, tag = "2")]
    pub(crate) tenant: String,
    #[prost(message, repeated, tag = "3")]
    pub(crate) turns: Vec<TurnRow>,
    #[prost(uint64, tag = "4")]
    pub(crate) elided_entries: u64,
    #[prost(uint64, tag = "5")]
    pub(crate) elided_bytes: u64,
    #[prost(int64, optional, tag = "6")]
    pub(crate) elided_at: Option<i64>,
}

/// One turn of a conversation.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TurnRow {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) agent_id: Vec<u8>,
    #[prost(bool, tag = "2")]
    pub(crate) copied: bool,
    #[prost(string, tag = "3")]
    pub(crate) agent: String,
    #[prost(string, tag = "4")]
    pub(crate) model: String,
    #[prost(bytes = "vec", optional, tag = "5")]
    pub(crate) parent_id: Option<Vec<u8>>,
    #[prost(string, optional, tag = "6")]
    pub(crate) lead_id: Option<String>,
    #[prost(btree_map = "string, string", tag = "7")]
    pub(crate) labels: BTreeMap<String, String>,
    #[prost(string, optional, tag = "8")]
    pub(crate) session: Option<String>,
    /// Set once the turn ended, with `ended_status` (a [`status_code`]).
    #[prost(int64, optional, tag = "9")]
    pub(crate) ended_at: Option<i64>,
    #[prost(uint32, tag = "10")]
    pub(crate) ended_status: u32,
    #[prost(message, repeated, tag = "11")]
    pub(crate) entries: Vec<EntryRow>,
}

/// One transcript entry.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct EntryRow {
    /// An [`entry_code`].
    #[prost(uint32, tag = "1")]
    pub(crate) kind: u32,
    #[prost(int64, tag = "2")]
    pub(crate) at: i64,
    #[prost(string, tag = "3")]
    pub(crate) text: String,
    /// A result's [`status_code`]; 0 for other kinds.
    #[prost(uint32, tag = "4")]
    pub(crate) status: u32,
    /// A result's error.
    #[prost(message, optional, tag = "5")]
    pub(crate) error: Option<ErrorRow>,
    /// A result's workspace (absent in older rows).
    #[prost(message, optional, tag = "6")]
    pub(crate) workspace: Option<WorkspaceRow>,
}

/// What a run left in its workspace (`Workspace`).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct WorkspaceRow {
    #[prost(string, tag = "1")]
    pub(crate) branch: String,
    #[prost(bool, tag = "2")]
    pub(crate) kept: bool,
    #[prost(string, tag = "3")]
    pub(crate) base_commit: String,
    #[prost(string, tag = "4")]
    pub(crate) head_commit: String,
    #[prost(uint32, tag = "5")]
    pub(crate) files_changed: u32,
    #[prost(uint32, tag = "6")]
    pub(crate) insertions: u32,
    #[prost(uint32, tag = "7")]
    pub(crate) deletions: u32,
}

/// An agent's error.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ErrorRow {
    #[prost(string, tag = "1")]
    pub(crate) code: String,
    #[prost(string, tag = "2")]
    pub(crate) message: String,
}

/// Encodes `c` as its `conversations` row, appending to `buf`: the bytes
/// `ConversationRow::from(c).encode_to_vec()` would give.
pub fn encode(c: &Conversation, buf: &mut Vec<u8>) {
    put_bytes(buf, 1, c.id.as_bytes());
    put_str(buf, 2, &c.tenant);
    for t in &c.turns {
        put_message(buf, 3, |buf| encode_turn(t, buf));
    }
    put_u64(buf, 4, c.elided.entries);
    put_u64(buf, 5, c.elided.bytes);
    put_time(buf, 6, c.elided.at);
}

fn encode_turn(t: &Turn, buf: &mut Vec<u8>) {
    put_bytes(buf, 1, t.agent_id.as_bytes());
    if t.copied {
        put_varint(buf, 2, 1);
    }
    put_str(buf, 3, &t.inherited.agent);
    put_str(buf, 4, &t.inherited.model);
    if let Some(parent) = t.inherited.parent_id {
        put_len(buf, 5, parent.as_bytes());
    }
    if let Some(lead) = &t.inherited.lead_id {
        put_len(buf, 6, lead.as_bytes());
    }
    put_labels(buf, 7, &t.inherited.labels);
    if let Some(session) = &t.session {
        put_len(buf, 8, session.as_bytes());
    }
    if let Some((at, status)) = t.ended {
        put_time(buf, 9, Some(at));
        put_u64(buf, 10, u64::from(status_code(status)));
    }
    for e in &t.entries {
        put_message(buf, 11, |buf| encode_entry(e, buf));
    }
}

fn encode_entry(e: &Entry, buf: &mut Vec<u8>) {
    put_u64(buf, 1, u64::from(entry_code(&e.kind)));
    put_nanos(buf, 2, e.at);
    put_str(buf, 3, &e.text);
    if let EntryKind::Result {
        status,
        error,
        workspace,
    } = &e.kind
    {
        put_u64(buf, 4, u64::from(status_code(*status)));
        if let Some(error) = error {
            put_error(buf, 5, error);
        }
        if let Some(w) = workspace {
            put_workspace(buf, 6, w);
        }
    }
}

// Proto3 as prost writes it: a plain scalar, string or bytes field is left
// out at its default; an `optional` one and every message are written when
// present. The store's agent and event rows are written with these too.

/// An `int64` time in nanoseconds (left out at the epoch).
pub(crate) fn put_nanos(buf: &mut Vec<u8>, tag: u32, t: SystemTime) {
    put_u64(buf, tag, nanos(t) as u64);
}

/// An `optional int64` time in nanoseconds (written when present).
pub(crate) fn put_time(buf: &mut Vec<u8>, tag: u32, t: Option<SystemTime>) {
    if let Some(t) = t {
        put_varint(buf, tag, nanos(t) as u64);
    }
}

/// An [`ErrorRow`] field.
pub(crate) fn put_error(buf: &mut Vec<u8>, tag: u32, e: &AgentError) {
    put_message(buf, tag, |buf| {
        put_str(buf, 1, &e.code);
        put_str(buf, 2, &e.message);
    });
}

/// A [`WorkspaceRow`] field.
pub(crate) fn put_workspace(buf: &mut Vec<u8>, tag: u32, w: &Workspace) {
    put_message(buf, tag, |buf| {
        put_str(buf, 1, &w.branch);
        if w.kept {
            put_varint(buf, 2, 1);
        }
        put_str(buf, 3, &w.base_commit);
        put_str(buf, 4, &w.head_commit);
        put_u64(buf, 5, u64::from(w.files_changed));
        put_u64(buf, 6, u64::from(w.insertions));
        put_u64(buf, 7, u64::from(w.deletions));
    });
}

/// A `map<string, string>` field: one entry message per pair.
pub(crate) fn put_labels(buf: &mut Vec<u8>, tag: u32, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        put_message(buf, tag, |buf| {
            put_str(buf, 1, k);
            put_str(buf, 2, v);
        });
    }
}

/// A `fixed64` field (left out at 0).
pub(crate) fn put_fixed64(buf: &mut Vec<u8>, tag: u32, value: u64) {
    if value != 0 {
        encode_key(tag, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

pub(crate) fn put_varint(buf: &mut Vec<u8>, tag: u32, value: u64) {
    encode_key(tag, WireType::Varint, buf);
    encode_varint(value, buf);
}

pub(crate) fn put_u64(buf: &mut Vec<u8>, tag: u32, value: u64) {
    if value != 0 {
        put_varint(buf, tag, value);
    }
}

pub(crate) fn put_len(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

pub(crate) fn put_bytes(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    if !bytes.is_empty() {
        put_len(buf, tag, bytes);
    }
}

pub(crate) fn put_str(buf: &mut Vec<u8>, tag: u32, s: &str) {
    put_bytes(buf, tag, s.as_bytes());
}

/// A nested message: its body is written first, then its length is put
/// in front of it (one small move instead of a pass to size it).
pub(crate) fn put_message(buf: &mut Vec<u8>, tag: u32, body: impl FnOnce(&mut Vec<u8>)) {
    encode_key(tag, WireType::LengthDelimited, buf);
    let start = buf.len();
    body(buf);
    let len = (buf.len() - start) as u64;
    let mut prefix = [0u8; 10];
    let n = {
        let mut rest = &mut prefix[..];
        encode_varint(len, &mut rest);
        10 - rest.len()
    };
    buf.splice(start..start, prefix[..n].iter().copied());
}

/// Decodes a `conversations` row.
pub fn decode(bytes: &[u8]) -> Result<Conversation, Corrupt> {
    let row = ConversationRow::decode(bytes).map_err(|e| corrupt("conversation row", e))?;
    if row.turns.is_empty() {
        // Every conversation has a turn (`Conversation::latest` relies on it).
        return Err(corrupt("conversation row", "no turns"));
    }
    Ok(Conversation {
        id: uuid_of(&row.id)?,
        tenant: row.tenant.into(),
        turns: row
            .turns
            .into_iter()
            .map(turn_of)
            .collect::<Result<_, _>>()?,
        elided: Elided {
            entries: row.elided_entries,
            bytes: row.elided_bytes,
            at: row.elided_at.map(time_of),
        },
    })
}

fn turn_of(r: TurnRow) -> Result<Turn, Corrupt> {
    Ok(Turn {
        agent_id: uuid_of(&r.agent_id)?,
        copied: r.copied,
        inherited: Inherited {
            agent: r.agent.into(),
            model: r.model.into(),
            parent_id: r.parent_id.as_deref().map(uuid_of).transpose()?,
            lead_id: r.lead_id.map(Arc::from),
            labels: Arc::new(r.labels),
        },
        session: r.session.map(Arc::from),
        ended: r
            .ended_at
            .map(|at| Ok::<_, Corrupt>((time_of(at), status_of(r.ended_status)?)))
            .transpose()?,
        entries: r
            .entries
            .into_iter()
            .map(entry_of)
            .collect::<Result<_, _>>()?,
    })
}

fn entry_of(r: EntryRow) -> Result<Entry, Corrupt> {
    let kind = match r.kind {
        1 => EntryKind::Prompt,
        2 => EntryKind::Steer,
        3 => EntryKind::ToolCall,
        4 => EntryKind::Result {
            status: status_of(r.status)?,
            error: r.error.map(error_of),
            workspace: r.workspace.map(workspace_of),
        },
        other => return Err(corrupt("entry kind", format!("unknown code {other}"))),
    };
    Ok(Entry {
        kind,
        at: time_of(r.at),
        text: r.text.into(),
    })
}

/// The row of a workspace.
#[cfg(test)]
pub(crate) fn workspace_row(w: &Workspace) -> WorkspaceRow {
    WorkspaceRow {
        branch: w.branch.clone(),
        kept: w.kept,
        base_commit: w.base_commit.clone(),
        head_commit: w.head_commit.clone(),
        files_changed: w.files_changed,
        insertions: w.insertions,
        deletions: w.deletions,
    }
}

/// A workspace from its row.
pub(crate) fn workspace_of(w: WorkspaceRow) -> Arc<Workspace> {
    Arc::new(Workspace {
        branch: w.branch,
        kept: w.kept,
        base_commit: w.base_commit,
        head_commit: w.head_commit,
        files_changed: w.files_changed,
        insertions: w.insertions,
        deletions: w.deletions,
    })
}

/// The row of an error.
#[cfg(test)]
pub(crate) fn error_row(e: &AgentError) -> ErrorRow {
    ErrorRow {
        code: e.code.to_string(),
        message: e.message.to_string(),
    }
}

/// An error from its row.
pub(crate) fn error_of(e: ErrorRow) -> AgentError {
    AgentError {
        code: e.code.into(),
        message: e.message.into(),
    }
}

/// An id from its 16 bytes.
pub(crate) fn uuid_of(bytes: &[u8]) -> Result<Uuid, Corrupt> {
    Uuid::from_slice(bytes).map_err(|e| corrupt("id", e))
}

/// Nanoseconds since the Unix epoch (negative before it, saturating).
pub(crate) fn nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// The time `nanos` after the Unix epoch.
pub(crate) fn time_of(nanos: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(nanos.unsigned_abs());
    if nanos >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

// Stored codes are explicit, not enum discriminants, so reordering a Rust
// enum can never change what a stored row means.

/// A status's stored code.
pub(crate) fn status_code(s: AgentStatus) -> u32 {
    match s {
        AgentStatus::Queued => 1,
        AgentStatus::Running => 2,
        AgentStatus::AwaitingApproval => 3,
        AgentStatus::Done => 4,
        AgentStatus::Failed => 5,
        AgentStatus::Cancelled => 6,
    }
}

/// A status from its stored code.
pub(crate) fn status_of(code: u32) -> Result<AgentStatus, Corrupt> {
    Ok(match code {
        1 => AgentStatus::Queued,
        2 => AgentStatus::Running,
        3 => AgentStatus::AwaitingApproval,
        4 => AgentStatus::Done,
        5 => AgentStatus::Failed,
        6 => AgentStatus::Cancelled,
        other => return Err(corrupt("status", format!("unknown code {other}"))),
    })
}

fn entry_code(k: &EntryKind) -> u32 {
    match k {
        EntryKind::Prompt => 1,
        EntryKind::Steer => 2,
        EntryKind::ToolCall => 3,
        EntryKind::Result { .. } => 4,
    }
}

#[cfg(test)]
impl From<&Conversation> for ConversationRow {
    /// The derived row, to hold [`encode`] to the bytes prost writes.
    fn from(c: &Conversation) -> Self {
        let entry_row = |e: &Entry| {
            let (status, error, workspace) = match &e.kind {
                EntryKind::Result {
                    status,
                    error,
                    workspace,
                } => (
                    status_code(*status),
                    error.as_ref().map(error_row),
                    workspace.as_deref().map(workspace_row),
                ),
                _ => (0, None, None),
            };
            EntryRow {
                kind: entry_code(&e.kind),
                at: nanos(e.at),
                text: e.text.to_string(),
                status,
                error,
                workspace,
            }
        };
        let turn_row = |t: &Turn| TurnRow {
            agent_id: t.agent_id.as_bytes().to_vec(),
            copied: t.copied,
            agent: t.inherited.agent.to_string(),
            model: t.inherited.model.to_string(),
            parent_id: t.inherited.parent_id.map(|p| p.as_bytes().to_vec()),
            lead_id: t.inherited.lead_id.as_deref().map(str::to_owned),
            labels: (*t.inherited.labels).clone(),
            session: t.session.as_deref().map(str::to_owned),
            ended_at: t.ended.map(|(at, _)| nanos(at)),
            ended_status: t.ended.map_or(0, |(_, status)| status_code(status)),
            entries: t.entries.iter().map(entry_row).collect(),
        };
        ConversationRow {
            id: c.id.as_bytes().to_vec(),
            tenant: c.tenant.to_string(),
            turns: c.turns.iter().map(turn_row).collect(),
            elided_entries: c.elided.entries,
            elided_bytes: c.elided.bytes,
            elided_at: c.elided.at.map(nanos),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A conversation `id` (ended at `t`) with every entry kind, a copied
    /// turn, an elision, a session and labels.
    pub(crate) fn full_conversation(id: Uuid, t: SystemTime) -> Conversation {
        let inherited = |parent| Inherited {
            agent: "coder".into(),
            model: "p/m".into(),
            parent_id: parent,
            lead_id: Some("lead-1".into()),
            labels: Arc::new(BTreeMap::from([
                ("k".to_owned(), "v".to_owned()),
                ("team".to_owned(), "a".to_owned()),
                ("".to_owned(), "empty key".to_owned()),
                ("empty value".to_owned(), "".to_owned()),
            ])),
        };
        let entry = |kind, s: u64, text: &str| Entry {
            kind,
            at: t - Duration::from_secs(100 - s),
            text: text.into(),
        };
        Conversation {
            id,
            tenant: "team-a".into(),
            turns: vec![
                Turn {
                    agent_id: Uuid::now_v7(),
                    copied: true,
                    inherited: Inherited {
                        lead_id: None,
                        labels: Arc::default(),
                        ..inherited(None)
                    },
                    session: None,
                    ended: Some((t - Duration::from_secs(50), AgentStatus::Failed)),
                    entries: vec![
                        entry(EntryKind::Steer, 2, "steer"),
                        entry(EntryKind::ToolCall, 3, "shell"),
                        entry(
                            EntryKind::Result {
                                status: AgentStatus::Failed,
                                error: Some(AgentError::new("RUN_FAILED", "boom")),
                                workspace: Some(Arc::new(Workspace {
                                    branch: "subagentd/y".into(),
                                    kept: true,
                                    base_commit: "c".repeat(40),
                                    head_commit: "d".repeat(40),
                                    files_changed: 1,
                                    insertions: 2,
                                    deletions: 3,
                                })),
                            },
                            4,
                            "partial",
                        ),
                    ],
                },
                Turn {
                    agent_id: id,
                    copied: false,
                    inherited: inherited(Some(Uuid::now_v7())),
                    session: Some("session-7".into()),
                    ended: Some((t, AgentStatus::Done)),
                    entries: vec![
                        entry(EntryKind::Prompt, 60, "again"),
                        entry(
                            EntryKind::Result {
                                status: AgentStatus::Done,
                                error: None,
                                workspace: None,
                            },
                            70,
                            // Long enough that its entry's length takes two
                            // bytes.
                            &"done ".repeat(40),
                        ),
                    ],
                },
            ],
            elided: Elided {
                entries: 3,
                bytes: 4100,
                at: Some(t - Duration::new(60, 5)),
            },
        }
    }

    fn encoded(c: &Conversation) -> Vec<u8> {
        let mut buf = Vec::new();
        encode(c, &mut buf);
        buf
    }

    #[test]
    fn the_encoder_writes_the_bytes_prost_writes_for_the_row() {
        let t = UNIX_EPOCH + Duration::new(1_790_000_000, 123_456_789);
        let c = full_conversation(Uuid::now_v7(), t);
        assert_eq!(encoded(&c), ConversationRow::from(&c).encode_to_vec());
        // Defaults left out: a live turn, an empty tenant, nothing elided,
        // an entry at the epoch, a long one (a length of several bytes).
        let mut sparse = c.clone();
        sparse.tenant = "".into();
        sparse.turns[1].ended = None;
        sparse.turns[1].session = None;
        sparse.turns[1].entries.truncate(1);
        sparse.turns[1].entries[0].at = UNIX_EPOCH;
        sparse.turns[0].entries[0].text = "x".repeat(70_000).into();
        sparse.elided = Elided::default();
        assert_eq!(
            encoded(&sparse),
            ConversationRow::from(&sparse).encode_to_vec()
        );
        // Before the epoch: a negative int64, ten bytes.
        let mut early = c;
        early.turns[0].ended = Some((UNIX_EPOCH - Duration::from_secs(5), AgentStatus::Done));
        assert_eq!(
            encoded(&early),
            ConversationRow::from(&early).encode_to_vec()
        );
    }

    #[test]
    fn a_conversation_row_round_trips_every_field() {
        let t = UNIX_EPOCH + Duration::new(1_790_000_000, 123_456_789);
        let c = full_conversation(Uuid::now_v7(), t);
        assert_eq!(decode(&encoded(&c)).unwrap(), c);
        let mut live = c.clone();
        live.tenant = "".into();
        live.turns[1].ended = None;
        live.turns[1].session = None;
        live.turns[1].entries.truncate(1);
        live.elided = Elided::default();
        assert_eq!(decode(&encoded(&live)).unwrap(), live);
    }

    #[test]
    fn a_conversation_row_without_turns_or_with_an_unknown_entry_is_corrupt() {
        let c = full_conversation(Uuid::now_v7(), UNIX_EPOCH);
        let mut row = ConversationRow::decode(encoded(&c).as_slice()).unwrap();
        row.turns[0].entries[0].kind = 99;
        let err = decode(&row.encode_to_vec()).unwrap_err();
        assert!(err.to_string().contains("unknown code 99"), "{err}");
        row.turns.clear();
        let err = decode(&row.encode_to_vec()).unwrap_err();
        assert!(err.to_string().contains("no turns"), "{err}");
        assert!(decode(b"\xff\xff").is_err());
    }
}
