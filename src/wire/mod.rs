//! The one place that converts between protobuf and domain types.
//!
//! Requests are parsed, not just validated: each `parse_*` returns a domain
//! value or every field violation it found, so a bad request changes nothing.

use std::{collections::BTreeSet, sync::Arc, time::Duration, time::SystemTime};

use prost_types::Timestamp;
use uuid::Uuid;

use crate::pb;
use crate::scheduler::conversation::{
    Elided, Entry, EntryKind, History, TranscriptItem, TranscriptOf, TranscriptPage,
};
use crate::scheduler::trace::{SpawnTrace, TraceContext};
use crate::scheduler::{
    AgentError, AgentFilter, AgentId, AgentStatus, AgentView, ApprovalOutcome, Attempt, Attempts,
    AwaitMode, Continuation, Error, Event, EventKind, FieldViolation, HeldRun, ModelRef, Progress,
    SpawnSpec, SteerDelivery, Usage, WatchQuery, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo,
    CODE_RUN_FAILED,
};

/// Most ids one Status, Await or WatchAgents request may name.
pub const MAX_IDS: usize = 100;
/// Longest `lead_id` / `idempotency_key`, in bytes.
pub const MAX_KEY_BYTES: usize = crate::scheduler::core::MAX_KEY_BYTES;
/// Await timeout when none is given.
pub const DEFAULT_AWAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest Await timeout.
pub const MAX_AWAIT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Longest Spawn run timeout (7 days).
pub const MAX_RUN_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Status page size when none is given.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest Status page size.
pub const MAX_PAGE_SIZE: usize = 1000;
/// Longest approval note accepted.
pub const MAX_NOTE_BYTES: usize = 64 * 1024;

/// Collects field violations while parsing one request.
#[derive(Default)]
struct Violations(Vec<FieldViolation>);

impl Violations {
    fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }

    fn finish<T>(self, value: T) -> Result<T, Error> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(Error::Invalid(self.0))
        }
    }

    fn id(&mut self, field: &str, raw: &str) -> Option<AgentId> {
        self.uuid(field, raw, "an agent id")
    }

    fn uuid(&mut self, field: &str, raw: &str, what: &str) -> Option<Uuid> {
        match Uuid::parse_str(raw) {
            Ok(id) => Some(id),
            Err(_) => {
                self.add(
                    field,
                    format!("\"{}\" is not {what} (a UUID)", truncate(raw)),
                );
                None
            }
        }
    }

    fn optional_id(&mut self, field: &str, raw: &str) -> Option<AgentId> {
        if raw.is_empty() {
            None
        } else {
            self.id(field, raw)
        }
    }

    /// `page_size`: the default for 0, at most [`MAX_PAGE_SIZE`].
    fn page_size(&mut self, raw: u32) -> usize {
        match raw as usize {
            0 => DEFAULT_PAGE_SIZE,
            n if n > MAX_PAGE_SIZE => {
                self.add("page_size", format!("at most {MAX_PAGE_SIZE}"));
                0
            }
            n => n,
        }
    }

    /// `page_token`: empty for the first page, else a position `rpc`
    /// returned.
    fn page_token<T: std::str::FromStr + Default>(&mut self, raw: &str, rpc: &str) -> T {
        if raw.is_empty() {
            return T::default();
        }
        raw.parse().unwrap_or_else(|_| {
            self.add("page_token", format!("is not a token returned by {rpc}"));
            T::default()
        })
    }

    fn key(&mut self, field: &str, raw: &str) -> Option<String> {
        if raw.len() > MAX_KEY_BYTES {
            self.add(
                field,
                format!(
                    "is {} bytes; at most {MAX_KEY_BYTES} bytes allowed",
                    raw.len()
                ),
            );
            None
        } else if raw.is_empty() {
            None
        } else {
            Some(raw.to_owned())
        }
    }

    fn ids(&mut self, field: &str, raw: &[String], required: bool) -> Vec<AgentId> {
        if required && raw.is_empty() {
            self.add(field, "at least one id is required");
        }
        if raw.len() > MAX_IDS {
            self.add(
                field,
                format!("{} ids given; at most {MAX_IDS} allowed", raw.len()),
            );
            return Vec::new();
        }
        raw.iter()
            .enumerate()
            .filter_map(|(i, s)| self.id(&format!("{field}[{i}]"), s))
            .collect()
    }

    /// A non-negative duration no longer than `max`.
    fn duration(
        &mut self,
        field: &str,
        d: &prost_types::Duration,
        max: Duration,
    ) -> Option<Duration> {
        if d.seconds < 0 || d.nanos < 0 {
            self.add(field, "must not be negative");
            return None;
        }
        if d.nanos >= 1_000_000_000 {
            self.add(field, "nanos must be below 1 000 000 000");
            return None;
        }
        let value = Duration::new(d.seconds as u64, d.nanos as u32);
        if value > max {
            self.add(
                field,
                format!(
                    "{} is too long; at most {}",
                    humantime::format_duration(value),
                    humantime::format_duration(max)
                ),
            );
            return None;
        }
        Some(value)
    }
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Parses a SpawnRequest.
pub fn parse_spawn(req: pb::SpawnRequest) -> Result<SpawnSpec, Error> {
    let mut v = Violations::default();
    let continue_from = v.optional_id("continue_from", &req.continue_from);
    // A continuation inherits its agent type and model unless it names them.
    let continuing = !req.continue_from.is_empty();
    if req.agent.is_empty() && !continuing {
        v.add("agent", "is required: name a configured agent type");
    }
    // Names are echoed in refusals (UNKNOWN_AGENT_TYPE, a model's bucket):
    // bounded like every other name, so no answer outgrows a header.
    for (field, name) in [("agent", &req.agent), ("model", &req.model)] {
        if name.len() > MAX_KEY_BYTES {
            v.add(
                field,
                format!(
                    "is {} bytes; at most {MAX_KEY_BYTES} bytes allowed",
                    name.len()
                ),
            );
        }
    }
    if req.fork && !continuing {
        v.add("fork", "needs continue_from: the agent to fork from");
    }
    if req.model.is_empty() {
        if !continuing {
            v.add("model", "is required, as \"provider/model\"");
        }
    } else if req.model.len() <= MAX_KEY_BYTES && ModelRef::parse(&req.model).is_none() {
        v.add(
            "model",
            format!(
                "\"{}\" is not of the form \"provider/model\"",
                truncate(&req.model)
            ),
        );
    }
    if req.prompt.is_empty() {
        v.add("prompt", "must not be empty");
    }
    let parent_id = v.optional_id("parent_id", &req.parent_id);
    let lead_id = v.key("lead_id", &req.lead_id);
    let idempotency_key = v.key("idempotency_key", &req.idempotency_key);
    let timeout = match &req.timeout {
        Some(d) => match v.duration("timeout", d, MAX_RUN_TIMEOUT) {
            Some(t) if t.is_zero() => {
                v.add("timeout", "must be positive when set");
                None
            }
            t => t,
        },
        None => None,
    };
    v.finish(SpawnSpec {
        // The caller's, from its credential: set by the handler.
        tenant: Arc::from(""),
        agent: req.agent,
        model: req.model,
        prompt: req.prompt,
        description: req.description,
        parent_id,
        lead_id,
        background: req.background,
        labels: req.labels.into_iter().collect(),
        timeout,
        idempotency_key,
        detached: req.detached,
        // From the call's metadata and server span, not its message.
        trace: SpawnTrace::default(),
        continue_from,
        fork: req.fork,
    })
}

/// What a StatusRequest asks for.
#[derive(Debug)]
pub enum StatusQuery {
    /// These agents, in this order.
    Ids(Vec<AgentId>),
    /// A page of a filtered listing.
    List {
        /// The filter.
        filter: AgentFilter,
        /// Admission sequence to continue after.
        after: u64,
        /// Page size.
        limit: usize,
    },
}

/// Parses a StatusRequest of a caller who may list `tenant`'s agents (None:
/// every tenant's), see [`crate::api::auth::listed_tenant`].
pub fn parse_status(
    req: pb::StatusRequest,
    tenant: Option<Arc<str>>,
) -> Result<StatusQuery, Error> {
    let mut v = Violations::default();
    let ids = v.ids("ids", &req.ids, false);
    let parent_id = v.optional_id("parent_id", &req.parent_id);
    let root_id = v.optional_id("root_id", &req.root_id);
    let lead_id = v.key("lead_id", &req.lead_id);
    let conversation_id = v.optional_id("conversation_id", &req.conversation_id);
    let statuses = req
        .statuses
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match pb::AgentStatus::try_from(*s) {
            Ok(s) if s != pb::AgentStatus::Unspecified => Some(status_from_pb(s)),
            _ => {
                v.add(
                    format!("statuses[{i}]"),
                    format!("{s} is not a valid AgentStatus"),
                );
                None
            }
        })
        .collect::<Vec<_>>();
    let limit = v.page_size(req.page_size);
    let after = v.page_token::<u64>(&req.page_token, "Status");
    if !req.ids.is_empty() {
        let filtered = parent_id.is_some()
            || root_id.is_some()
            || lead_id.is_some()
            || !statuses.is_empty()
            || conversation_id.is_some()
            || !req.tenant.is_empty()
            || !req.page_token.is_empty();
        if filtered {
            v.add("ids", "cannot be combined with filters or a page token");
        }
        return v.finish(StatusQuery::Ids(ids));
    }
    v.finish(StatusQuery::List {
        filter: AgentFilter {
            tenant,
            ids: Vec::new(),
            parent_id,
            root_id,
            lead_id,
            statuses,
            conversation_id,
        },
        after,
        limit,
    })
}

/// A parsed GetTranscriptRequest.
#[derive(Debug)]
pub struct TranscriptQuery {
    /// Whose transcript.
    pub target: TranscriptOf,
    /// Position to start at.
    pub after: usize,
    /// Page size.
    pub limit: usize,
}

/// Parses a GetTranscriptRequest.
pub fn parse_get_transcript(req: pb::GetTranscriptRequest) -> Result<TranscriptQuery, Error> {
    let mut v = Violations::default();
    let agent = v.optional_id("agent_id", &req.agent_id);
    let conversation = v.optional_id("conversation_id", &req.conversation_id);
    let target = match (agent, conversation) {
        (Some(a), None) => Some(TranscriptOf::Agent(a)),
        (None, Some(c)) => Some(TranscriptOf::Conversation(c)),
        (Some(_), Some(_)) => {
            v.add("agent_id", "set agent_id or conversation_id, not both");
            None
        }
        (None, None) if req.agent_id.is_empty() && req.conversation_id.is_empty() => {
            v.add("agent_id", "set agent_id or conversation_id");
            None
        }
        (None, None) => None,
    };
    let limit = v.page_size(req.page_size);
    let after = v.page_token::<usize>(&req.page_token, "GetTranscript");
    let query = target.map(|target| TranscriptQuery {
        target,
        after,
        limit,
    });
    v.finish(query)
        .map(|q| q.expect("a target when nothing is invalid"))
}

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

fn elided_to_pb(elided: &Elided) -> pb::TranscriptEntry {
    pb::TranscriptEntry {
        kind: pb::TranscriptEntryKind::Elided as i32,
        time: elided.at.map(timestamp),
        text: elided.notice(),
        elided_entries: elided.entries,
        elided_bytes: elided.bytes,
        ..pb::TranscriptEntry::default()
    }
}

fn entry_to_pb(agent_id: AgentId, turn: u32, entry: &Entry) -> pb::TranscriptEntry {
    let (kind, status, error) = match &entry.kind {
        EntryKind::Prompt => (pb::TranscriptEntryKind::Prompt, None, None),
        EntryKind::Steer => (pb::TranscriptEntryKind::Steer, None, None),
        EntryKind::ToolCall => (pb::TranscriptEntryKind::ToolCall, None, None),
        EntryKind::Result { status, error } => (
            pb::TranscriptEntryKind::Result,
            Some(*status),
            error.as_ref(),
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
        ..pb::TranscriptEntry::default()
    }
}

/// A parsed AwaitRequest.
#[derive(Debug)]
pub struct AwaitQuery {
    /// Agents to wait for, in request order.
    pub ids: Vec<AgentId>,
    /// How long to wait.
    pub timeout: Duration,
    /// ALL or ANY.
    pub mode: AwaitMode,
}

/// Parses an AwaitRequest.
pub fn parse_await(req: pb::AwaitRequest) -> Result<AwaitQuery, Error> {
    let mut v = Violations::default();
    let ids = v.ids("ids", &req.ids, true);
    let timeout = match &req.timeout {
        Some(d) => v
            .duration("timeout", d, MAX_AWAIT_TIMEOUT)
            .unwrap_or_default(),
        None => DEFAULT_AWAIT_TIMEOUT,
    };
    let mode = match pb::AwaitMode::try_from(req.mode) {
        Ok(pb::AwaitMode::Unspecified | pb::AwaitMode::All) => AwaitMode::All,
        Ok(pb::AwaitMode::Any) => AwaitMode::Any,
        Err(_) => {
            v.add("mode", format!("{} is not a valid AwaitMode", req.mode));
            AwaitMode::All
        }
    };
    v.finish(AwaitQuery { ids, timeout, mode })
}

/// What a CancelRequest targets.
#[derive(Debug)]
pub enum CancelTarget {
    /// One agent and its descendants.
    Agent(AgentId),
    /// Every live agent under a lead.
    Lead(String),
}

/// Parses a CancelRequest into its target and reason.
pub fn parse_cancel(req: pb::CancelRequest) -> Result<(CancelTarget, String), Error> {
    let mut v = Violations::default();
    let target = match (req.id.is_empty(), req.lead_id.is_empty()) {
        (false, false) => {
            v.add("id", "set exactly one of id and lead_id, not both");
            v.add("lead_id", "set exactly one of id and lead_id, not both");
            None
        }
        (true, true) => {
            v.add("id", "set exactly one of id and lead_id");
            None
        }
        (false, true) => v.id("id", &req.id).map(CancelTarget::Agent),
        (true, false) => v.key("lead_id", &req.lead_id).map(CancelTarget::Lead),
    };
    v.finish(())?;
    Ok((target.expect("target set when no violation"), req.reason))
}

/// Parses a SteerRequest.
pub fn parse_steer(req: pb::SteerRequest) -> Result<(AgentId, String), Error> {
    let mut v = Violations::default();
    let id = v.id("id", &req.id);
    if req.message.is_empty() {
        v.add("message", "must not be empty");
    }
    v.finish(())?;
    Ok((id.expect("id set when no violation"), req.message))
}

/// The caller's trace context from a call's `traceparent` metadata, if it
/// carries a valid one (an invalid one is ignored, as the W3C spec asks,
/// rather than refused).
pub fn trace_context_from(metadata: &tonic::metadata::MetadataMap) -> Option<TraceContext> {
    TraceContext::from_traceparent(metadata.get("traceparent")?.to_str().ok()?)
}

/// Parses an ApproveRequest.
pub fn parse_approve(req: pb::ApproveRequest) -> Result<(AgentId, Uuid, ApprovalOutcome), Error> {
    let mut v = Violations::default();
    let id = v.id("id", &req.id);
    let approval_id = v.uuid("approval_id", &req.approval_id, "an approval id");
    let approved = match pb::ApprovalDecision::try_from(req.decision) {
        Ok(pb::ApprovalDecision::Approve) => Some(true),
        Ok(pb::ApprovalDecision::Deny) => Some(false),
        Ok(pb::ApprovalDecision::Unspecified) => {
            v.add(
                "decision",
                "must be APPROVAL_DECISION_APPROVE or APPROVAL_DECISION_DENY",
            );
            None
        }
        Err(_) => {
            v.add("decision", format!("unknown value {}", req.decision));
            None
        }
    };
    if req.note.len() > MAX_NOTE_BYTES {
        v.add(
            "note",
            format!(
                "is {} bytes; at most {MAX_NOTE_BYTES} bytes allowed",
                req.note.len()
            ),
        );
    }
    v.finish(())?;
    Ok((
        id.expect("id set when no violation"),
        approval_id.expect("approval_id set when no violation"),
        ApprovalOutcome {
            approved: approved.expect("decision set when no violation"),
            note: req.note,
        },
    ))
}

/// Parses a WatchAgentsRequest of a caller who may watch `tenant`'s agents
/// (None: every tenant's).
pub fn parse_watch(
    req: pb::WatchAgentsRequest,
    tenant: Option<Arc<str>>,
) -> Result<WatchQuery, Error> {
    let mut v = Violations::default();
    let ids = v.ids("ids", &req.ids, false);
    let parent_id = v.optional_id("parent_id", &req.parent_id);
    let root_id = v.optional_id("root_id", &req.root_id);
    let lead_id = v.key("lead_id", &req.lead_id);
    let conversation_id = v.optional_id("conversation_id", &req.conversation_id);
    v.finish(WatchQuery {
        filter: AgentFilter {
            tenant,
            ids: ids
                .into_iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            parent_id,
            root_id,
            lead_id,
            statuses: Vec::new(),
            conversation_id,
        },
        after_sequence: req.after_sequence,
        include_snapshot: req.include_snapshot,
        include_progress: req.include_progress,
    })
}

fn status_from_pb(s: pb::AgentStatus) -> AgentStatus {
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

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::from(t)
}

/// An agent as the API shows it; `now` fixes `elapsed_ms` for running agents.
pub fn agent_to_pb(a: &AgentView, now: SystemTime) -> pb::Agent {
    pb::Agent {
        id: a.id.to_string(),
        tenant: a.tenant.to_string(),
        agent: a.agent.to_string(),
        model: a.model.to_string(),
        description: a.description.to_string(),
        parent_id: a.parent_id.map(|p| p.to_string()).unwrap_or_default(),
        root_id: a.root_id.to_string(),
        lead_id: a.lead_id.as_deref().unwrap_or_default().to_owned(),
        depth: a.depth,
        status: status_to_pb(a.status) as i32,
        created_at: Some(timestamp(a.created_at)),
        started_at: a.started_at.map(timestamp),
        finished_at: a.finished_at.map(timestamp),
        elapsed_ms: u64::try_from(a.elapsed(now).as_millis()).unwrap_or(u64::MAX),
        result: a.result.to_string(),
        error: a.error.as_ref().map(error_to_pb),
        approval: a.approval.as_ref().map(|ap| pb::Approval {
            id: ap.id.to_string(),
            tool_name: ap.tool_name.to_string(),
            detail: ap.detail.to_string(),
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
        trace_id: a.trace_id.to_string(),
        total_usage: Some(usage_to_pb(&a.total_usage)),
        attempt: a.attempt,
        bucket: a.bucket.to_string(),
        conversation_id: a.conversation_id().to_string(),
        continues_id: a
            .continuation
            .as_ref()
            .map(|c| c.continues_id.to_string())
            .unwrap_or_default(),
        turn: a.turn(),
        attempts: attempts_to_pb(a),
    }
}

/// Every attempt of `a`: the ended ones, then the current one once it
/// started or while it waits to start as a retry.
fn attempts_to_pb(a: &AgentView) -> Vec<pb::AgentAttempt> {
    let ended = a.attempts.as_deref().map_or(&[][..], |x| &x.ended[..]);
    let mut out: Vec<pb::AgentAttempt> = ended
        .iter()
        .zip(1..)
        .map(|(x, n)| pb::AgentAttempt {
            attempt: n,
            model: x.model.to_string(),
            error: Some(error_to_pb(&x.error)),
            started_at: x.started_at.map(timestamp),
            ended_at: Some(timestamp(x.ended_at)),
        })
        .collect();
    if a.has_current_attempt() {
        let ended_now = a.status.is_terminal();
        out.push(pb::AgentAttempt {
            attempt: a.attempt,
            model: a.model.to_string(),
            error: a.error.as_ref().filter(|_| ended_now).map(error_to_pb),
            started_at: a.attempt_started_at().map(timestamp),
            ended_at: a.finished_at.filter(|_| ended_now).map(timestamp),
        });
    }
    out
}

fn error_to_pb(e: &AgentError) -> pb::AgentError {
    pb::AgentError {
        code: e.code.to_string(),
        message: e.message.to_string(),
    }
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

fn usage_to_pb(u: &Usage) -> pb::Usage {
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

fn known_list(names: &[String]) -> String {
    if names.is_empty() {
        "none configured".to_owned()
    } else {
        names.join(", ")
    }
}

/// None for the empty string (proto3's "not set").
fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
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

/// Steer delivery → protobuf enum.
pub fn delivery_to_pb(d: SteerDelivery) -> pb::SteerDelivery {
    match d {
        SteerDelivery::Delivered => pb::SteerDelivery::Delivered,
        SteerDelivery::Buffered => pb::SteerDelivery::Buffered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(err: Error) -> Vec<String> {
        match err {
            Error::Invalid(v) => v.into_iter().map(|v| v.field).collect(),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn an_agent_survives_the_round_trip_a_worker_assignment_takes() {
        let (id, parent, worker) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let created = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let usage = Usage {
            input_tokens: 3,
            output_tokens: 5,
            tool_calls: 1,
        };
        let agent = AgentView {
            tenant: "t".into(),
            id,
            agent: "coder".into(),
            model: "openai/gpt".into(),
            description: "fix it".into(),
            parent_id: Some(parent),
            root_id: parent,
            lead_id: Some("lead-7".into()),
            depth: 2,
            status: AgentStatus::Running,
            created_at: created,
            started_at: Some(created + Duration::from_millis(5)),
            finished_at: None,
            result: "partial".into(),
            error: Some(AgentError::new("STALE", "no progress")),
            approval: None,
            usage,
            total_usage: Usage {
                input_tokens: 30,
                ..usage
            },
            labels: Arc::new([("team".to_string(), "a".to_string())].into()),
            background: true,
            detached: true,
            queue_reason: None,
            bucket: "openai/gpt".into(),
            worker_id: Some(worker),
            trace_id: crate::scheduler::trace::TraceId::random(),
            attempt: 2,
            continuation: Some(Arc::new(Continuation {
                conversation_id: parent,
                continues_id: parent,
                turn: 3,
            })),
            attempts: Some(Arc::new(Attempts {
                ended: vec![Attempt {
                    model: "openai/first".into(),
                    error: AgentError::new("PROVIDER_429", "slow down"),
                    started_at: Some(created + Duration::from_millis(5)),
                    ended_at: created + Duration::from_millis(7),
                }],
                current_started_at: Some(created + Duration::from_millis(9)),
            })),
        };
        let back = agent_from_pb(&agent_to_pb(&agent, created)).unwrap();
        assert_eq!(back, agent);

        let mut bad = agent_to_pb(&agent, created);
        bad.parent_id = "nope".into();
        let err = agent_from_pb(&bad).unwrap_err();
        assert!(err.contains("agent.parent_id"), "{err}");
        bad = agent_to_pb(&agent, created);
        bad.trace_id.clear();
        assert!(agent_from_pb(&bad).unwrap_err().contains("agent.trace_id"));
    }

    #[test]
    fn a_call_s_traceparent_is_read_and_a_malformed_one_ignored() {
        let with = |v: &str| {
            let mut m = tonic::metadata::MetadataMap::new();
            m.insert("traceparent", v.parse().unwrap());
            trace_context_from(&m)
        };
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(with(valid).map(|c| c.traceparent()).as_deref(), Some(valid));
        assert_eq!(with("garbage"), None);
        assert_eq!(
            trace_context_from(&tonic::metadata::MetadataMap::new()),
            None
        );
    }

    #[test]
    fn spawn_collects_every_violation() {
        let err = parse_spawn(pb::SpawnRequest {
            model: "no-slash".into(),
            parent_id: "nope".into(),
            lead_id: "x".repeat(257),
            timeout: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            fields(err),
            vec![
                "agent",
                "model",
                "prompt",
                "parent_id",
                "lead_id",
                "timeout"
            ]
        );
    }

    #[test]
    fn await_defaults_and_bounds() {
        let q = parse_await(pb::AwaitRequest {
            ids: vec![Uuid::new_v4().to_string()],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(q.timeout, DEFAULT_AWAIT_TIMEOUT);
        assert_eq!(q.mode, AwaitMode::All);
        let err = parse_await(pb::AwaitRequest {
            ids: vec![],
            timeout: Some(prost_types::Duration {
                seconds: 3601,
                nanos: 0,
            }),
            mode: 0,
        })
        .unwrap_err();
        assert_eq!(fields(err), vec!["ids", "timeout"]);
        let many: Vec<String> = (0..101).map(|_| Uuid::new_v4().to_string()).collect();
        let err = parse_await(pb::AwaitRequest {
            ids: many,
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(fields(err), vec!["ids"]);
    }

    #[test]
    fn cancel_wants_exactly_one_target() {
        assert_eq!(
            fields(parse_cancel(pb::CancelRequest::default()).unwrap_err()),
            vec!["id"]
        );
        let both = pb::CancelRequest {
            id: Uuid::new_v4().to_string(),
            lead_id: "lead".into(),
            reason: String::new(),
        };
        assert_eq!(
            fields(parse_cancel(both).unwrap_err()),
            vec!["id", "lead_id"]
        );
    }
}
