//! Requests parsed into domain values: each `parse_*` returns the value or
//! every field violation it found, so a bad request changes nothing.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use uuid::Uuid;

use super::{
    agent::status_from_pb,
    check::{
        truncate, Violations, DEFAULT_AWAIT_TIMEOUT, MAX_AWAIT_TIMEOUT, MAX_KEY_BYTES,
        MAX_NOTE_BYTES, MAX_RUN_TIMEOUT,
    },
};
use crate::pb;
use crate::scheduler::conversation::TranscriptOf;
use crate::scheduler::trace::{SpawnTrace, TraceContext};
use crate::scheduler::{
    AgentFilter, AgentId, ApprovalOutcome, AwaitMode, Error, InboxOf, ModelRef, SpawnSpec,
    WatchQuery,
};

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
    // An empty model is the agent type's `default_model` (or the continued
    // agent's): the scheduler fills it in or refuses it.
    if !req.model.is_empty()
        && req.model.len() <= MAX_KEY_BYTES
        && ModelRef::parse(&req.model).is_none()
    {
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
    let workspace_base = v.workspace_base(&req.workspace_base, continuing);
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
        workspace_base,
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
            || req.uncollected
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
            uncollected: req.uncollected,
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

/// A parsed AwaitRequest.
#[derive(Debug)]
pub struct AwaitQuery {
    /// What it waits on.
    pub target: AwaitTarget,
    /// How long to wait.
    pub timeout: Duration,
    /// ALL or ANY.
    pub mode: AwaitMode,
    /// Collect the terminal agents returned.
    pub collect: bool,
}

/// What an Await waits on.
#[derive(Debug)]
pub enum AwaitTarget {
    /// These agents, in request order.
    Ids(Vec<AgentId>),
    /// An inbox.
    Inbox(InboxOf),
}

/// Parses an AwaitRequest.
pub fn parse_await(req: pb::AwaitRequest) -> Result<AwaitQuery, Error> {
    const ONE_OF: &str = "set exactly one of ids, lead_id and parent_id";
    let mut v = Violations::default();
    let given = [
        !req.ids.is_empty(),
        !req.lead_id.is_empty(),
        !req.parent_id.is_empty(),
    ];
    let target = match given {
        [false, false, false] => {
            v.add("ids", ONE_OF);
            None
        }
        [true, false, false] => Some(AwaitTarget::Ids(v.ids("ids", &req.ids, true))),
        [false, true, false] => v
            .key("lead_id", &req.lead_id)
            .map(|lead| AwaitTarget::Inbox(InboxOf::Lead(lead))),
        [false, false, true] => v
            .optional_id("parent_id", &req.parent_id)
            .map(|parent| AwaitTarget::Inbox(InboxOf::Parent(parent))),
        _ => {
            for (field, set) in ["ids", "lead_id", "parent_id"].into_iter().zip(given) {
                if set {
                    v.add(field, format!("{ONE_OF}, not several"));
                }
            }
            None
        }
    };
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
    v.finish(target.map(|target| AwaitQuery {
        target,
        timeout,
        mode,
        collect: req.collect,
    }))
    .map(|q| q.expect("a target when nothing is invalid"))
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
    const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
    TraceContext::from_traceparent(metadata.as_ref().get(TRACEPARENT)?.to_str().ok()?)
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
            uncollected: false,
        },
        after_sequence: req.after_sequence,
        include_snapshot: req.include_snapshot,
        include_progress: req.include_progress,
    })
}
