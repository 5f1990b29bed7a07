//! Errors of the domain. Mapped to gRPC statuses in one place:
//! [`crate::api::status`].

use std::sync::Arc;

use super::types::{AgentId, AgentStatus};

/// One bad field of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Field path, e.g. `prompt` or `ids[2]`.
    pub field: String,
    /// What is wrong and what is expected.
    pub description: String,
}

impl FieldViolation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is malformed; nothing changed.
    #[error("invalid request: {}", .0.iter().map(|v| format!("{}: {}", v.field, v.description)).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<FieldViolation>),
    /// The agent type is not configured.
    #[error("unknown agent type \"{name}\"; known agent types: {}", known.join(", "))]
    UnknownAgentType {
        /// Requested type.
        name: String,
        /// Configured types.
        known: Vec<String>,
    },
    /// No such agent (never existed, or forgotten after retention).
    #[error("agent {id} not found (field `{field}`); finished agents are forgotten after [runs] finished_retention")]
    NotFound {
        /// Request field that named it.
        field: &'static str,
        /// The id as given.
        id: String,
    },
    /// The agent already ended.
    #[error("agent {id} has already finished ({status:?})")]
    AgentFinished {
        /// Request field that named it.
        field: &'static str,
        /// The agent.
        id: String,
        /// Its terminal status.
        status: AgentStatus,
    },
    /// `continue_from` names a live agent: it cannot be continued yet.
    #[error("agent {id} is still live ({status:?}): only a finished agent can be continued; send it a message with Steer, decide its approval with Approve, or wait for it with Await and continue it then")]
    AgentBusy {
        /// The agent.
        id: AgentId,
        /// Its live status.
        status: AgentStatus,
    },
    /// `continue_from` names an agent a later agent already continued.
    #[error("agent {id} is not the latest agent of conversation {conversation_id}: continue its latest agent {latest}, or set fork to branch from {id}")]
    NotLatest {
        /// The agent named.
        id: AgentId,
        /// Its conversation.
        conversation_id: AgentId,
        /// The conversation's latest agent.
        latest: AgentId,
    },
    /// The transcript of the agent `continue_from` or GetTranscript names
    /// is no longer retained.
    #[error("the conversation of {id} is not retained (field `{field}`): transcripts are kept for [conversations] retention after their latest agent ends")]
    ConversationExpired {
        /// Request field that named it.
        field: &'static str,
        /// The id as given.
        id: AgentId,
    },
    /// The agent type of the agent to continue, or of the continuation,
    /// takes no history.
    #[error("agent type \"{agent_type}\" sets continuable = false: agent {id} cannot be continued or forked")]
    NotResumable {
        /// The agent named.
        id: AgentId,
        /// The type that takes no history.
        agent_type: String,
    },
    /// `max_background_agents` reached.
    #[error("global limit reached: {live} of {limit} background agents are live (queued, running or awaiting approval); wait for one to finish, cancel one, or raise [limits] max_background_agents")]
    GlobalLimit {
        /// The configured limit.
        limit: u32,
        /// Live background agents now.
        live: u32,
    },
    /// The tenant's `[tenants.NAME] max_background_agents` reached.
    #[error("tenant limit reached: tenant \"{tenant}\" has {live} live background agents and its [tenants.{tenant}] max_background_agents is {limit}; wait for some to finish (Await or WatchAgents) and retry")]
    TenantLimit {
        /// The tenant.
        tenant: Arc<str>,
        /// Its limit.
        limit: u32,
        /// Its live background agents now.
        live: u32,
    },
    /// The tenant's `[tenants.NAME] spawn_rate` passed.
    #[error("rate limited: tenant \"{tenant}\" may spawn {rate}/s with bursts of {burst} ([tenants.{tenant}] spawn_rate, spawn_burst); retry after {} ms", retry_after.as_millis())]
    RateLimited {
        /// The tenant.
        tenant: Arc<str>,
        /// Its spawn rate per second, as configured.
        rate: String,
        /// Its burst.
        burst: u32,
        /// When the next Spawn would be admitted.
        retry_after: std::time::Duration,
    },
    /// The tenant's open WatchAgents streams reached
    /// `[limits] max_watchers_per_tenant`.
    #[error("watch limit reached: tenant \"{tenant}\" has {open} open WatchAgents streams and [limits] max_watchers_per_tenant is {limit}; close one (or filter one watch instead of opening several)")]
    WatchLimit {
        /// The tenant.
        tenant: Arc<str>,
        /// The limit.
        limit: u32,
        /// Its open streams now.
        open: u32,
    },
    /// `max_depth` reached.
    #[error("depth limit reached: the new agent would be at depth {depth} but [limits] max_depth is {limit}; spawn from a shallower agent or raise the limit")]
    DepthLimit {
        /// The configured limit.
        limit: u32,
        /// Depth the agent would have had.
        depth: u32,
    },
    /// `max_live_descendants_per_root` reached.
    #[error("descendant limit reached: tree {root_id} already has {live} live agents and [limits] max_live_descendants_per_root is {limit}; wait for some to finish or raise the limit")]
    DescendantLimit {
        /// The configured limit.
        limit: u32,
        /// Live agents in the tree now.
        live: u32,
        /// The tree.
        root_id: AgentId,
    },
    /// The server is shutting down.
    #[error("the server is shutting down and accepts no new agents; retry against another instance or after restart")]
    ShuttingDown,
    /// The store failed to write a change: it may not have been kept.
    #[error("the server could not make the change durable (its store failed); the server is stopping and recovers what was written when it restarts, so retry against it (with the same idempotency key) once it is back")]
    StoreFailed,
    /// The server is reading its store at start.
    #[error("the server is recovering its state from the store after a restart; retry shortly")]
    Recovering,
    /// A standby that knows no reachable leader (an election in progress,
    /// or the database out of reach).
    #[error("no leader to serve this call ({why}); retry shortly")]
    NoLeader {
        /// What the standby knows.
        why: String,
    },
    /// Approve for a worker run whose worker has not re-attached since a
    /// restart: nothing could receive the decision yet.
    #[error(
        "agent {id}'s run waits for its worker to re-attach after a server restart; retry the \
         approval once it has (within [runs] worker_reattach_grace, or the run follows the \
         worker-lost rules)"
    )]
    AwaitingReattach { id: AgentId },
    /// Steer to an agent whose type takes no steer messages.
    #[error("agent {id} is of type \"{agent_type}\", which does not accept steering (set steer = \"stdin\" in [agents.{agent_type}] to send steer messages to its standard input)")]
    SteerNotAccepted { id: AgentId, agent_type: String },
    /// Approve for an agent that has no pending approval.
    #[error("agent {id} is not awaiting approval (it is {status:?})")]
    NotAwaitingApproval { id: AgentId, status: AgentStatus },
    /// Approve naming an approval other than the pending one.
    #[error("approval {given} is not agent {id}'s pending approval (that is {pending}); it may have been decided already")]
    ApprovalMismatch {
        id: AgentId,
        given: uuid::Uuid,
        pending: uuid::Uuid,
    },
}

impl Error {
    /// A single-field [`Error::Invalid`].
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::Invalid(vec![FieldViolation::new(field, description)])
    }
}
