//! Domain types of the scheduler: ids, statuses, the public view of an agent
//! and the validated spawn specification. None of them know about protobuf.

use std::{collections::BTreeMap, sync::Arc, time::Duration, time::SystemTime};

use uuid::Uuid;

/// Server-assigned agent id.
pub type AgentId = Uuid;

/// Lifecycle state of an agent. See [`crate::scheduler::state`] for the moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AgentStatus {
    /// Admitted, waiting for a bucket or per-parent slot.
    Queued,
    /// Executing.
    Running,
    /// Paused until a tool call is approved.
    AwaitingApproval,
    /// Finished with a result.
    Done,
    /// Failed; the agent's error says why.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl AgentStatus {
    /// DONE, FAILED and CANCELLED.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::Cancelled)
    }

    /// Upper-case name, as in logs, metrics labels and span attributes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::AwaitingApproval => "AWAITING_APPROVAL",
            Self::Done => "DONE",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// Terminal or awaiting approval: what Await and foreground Spawn wait for.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || self == Self::AwaitingApproval
    }
}

pub use crate::config::ModelRef;

/// Who counts as an agent's parent for the per-parent limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParentKey {
    /// A root agent without a lead: no per-parent limit applies.
    None,
    /// A root agent of a lead (the frontend's own run): the tenant, then
    /// the lead id, since two tenants' equal lead ids are unrelated.
    Lead(Arc<str>, Arc<str>),
    /// A child of an agent.
    Agent(AgentId),
}

/// What a run left in its workspace (a git worktree): its branch and the
/// changes from the commit it started at to the branch's head.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workspace {
    pub branch: String,
    /// Whether the branch still exists.
    pub kept: bool,
    pub base_commit: String,
    pub head_commit: String,
    pub files_changed: u32,
    pub insertions: u32,
    pub deletions: u32,
}

/// Why a run failed or was cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentError {
    /// Machine-readable code, e.g. `DEADLINE_EXCEEDED`.
    pub code: Arc<str>,
    /// Human-readable message.
    pub message: Arc<str>,
}

impl AgentError {
    /// Builds an error from a code and a message.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into().into(),
        }
    }
}

/// Error code of a run that outlived its deadline.
pub const CODE_DEADLINE_EXCEEDED: &str = "DEADLINE_EXCEEDED";
/// Error code of a cancelled agent.
pub const CODE_CANCELLED: &str = "CANCELLED";
/// Error code of a run that reported failure.
pub const CODE_RUN_FAILED: &str = "RUN_FAILED";
/// Error code of a run stopped by a circuit breaker (`[runs]
/// max_tool_calls`, `max_identical_tool_calls`).
pub const CODE_CIRCUIT_BREAKER: &str = "CIRCUIT_BREAKER";
/// Error code of a run stopped after `[agents.NAME] max_turns` +
/// `grace_turns` turns.
pub const CODE_TURN_LIMIT: &str = "TURN_LIMIT";
/// Error code of a run that reported nothing for `[runs] stale_timeout`.
pub const CODE_STALE: &str = "STALE";
/// Error code of a run whose worker was lost.
pub const CODE_WORKER_LOST: &str = "WORKER_LOST";
/// Error code of an in-process run that a server restart interrupted.
pub const CODE_SERVER_RESTARTED: &str = "SERVER_RESTARTED";

/// What a run that starts a turn is told (`[agents.NAME] max_turns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnVerdict {
    /// Go on.
    Go,
    /// Go on, with this wrap-up message as (part of) the turn's input: the
    /// first turn past `max_turns`.
    WrapUp(Arc<str>),
    /// Past `max_turns + grace_turns`: the run has been ended (FAILED
    /// `TURN_LIMIT`) and is about to be dropped.
    Stop,
}

/// A pending approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// Server-generated id.
    pub id: Uuid,
    /// Tool the run wants to call.
    pub tool_name: Arc<str>,
    /// What the run says about the call, for the person deciding.
    pub detail: Arc<str>,
}

/// The decision on an approval, as the run receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalOutcome {
    /// Approved or denied.
    pub approved: bool,
    /// The decider's note; may be empty.
    pub note: String,
}

/// Resources a run has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Tool calls.
    pub tool_calls: u64,
}

/// Caller labels, shared between the record and every event that shows it.
pub type Labels = Arc<BTreeMap<String, String>>;

/// The public state of an agent, as Status, Await and events show it.
///
/// Cheap to clone: strings are shared, so an event carries a full copy.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentView {
    /// Server-assigned id.
    pub id: AgentId,
    /// The tenant it belongs to: the tenant of whoever spawned it.
    pub tenant: Arc<str>,
    /// Agent type.
    pub agent: Arc<str>,
    /// "provider/model".
    pub model: Arc<str>,
    /// Free text.
    pub description: Arc<str>,
    /// Parent agent, if any.
    pub parent_id: Option<AgentId>,
    /// Root of the tree.
    pub root_id: AgentId,
    /// The frontend run the tree belongs to.
    pub lead_id: Option<Arc<str>>,
    /// 1 for a root.
    pub depth: u32,
    /// Current state.
    pub status: AgentStatus,
    /// When the Spawn was accepted.
    pub created_at: SystemTime,
    /// When the run first started.
    pub started_at: Option<SystemTime>,
    /// When the agent ended.
    pub finished_at: Option<SystemTime>,
    /// When an inbox Await (`collect`) returned it, settled, to its lead
    /// or parent: the next such Await skips it.
    pub collected_at: Option<SystemTime>,
    /// Output so far / final result.
    pub result: Arc<str>,
    /// Why it failed or was cancelled.
    pub error: Option<AgentError>,
    /// Set while awaiting approval (boxed: rare, and it keeps retained
    /// records in their allocation size class).
    pub approval: Option<Arc<Approval>>,
    /// What the run left in its workspace, once saved (types with a
    /// workspace only; shared, like `approval`, to keep records small).
    pub workspace: Option<Arc<Workspace>>,
    /// Resources used.
    pub usage: Usage,
    /// Resources used by the agent and all its descendants.
    pub total_usage: Usage,
    /// Caller labels.
    pub labels: Labels,
    /// Spawned in the background.
    pub background: bool,
    /// Survives its parent.
    pub detached: bool,
    /// Which limit holds it; only while queued.
    pub queue_reason: Option<Arc<str>>,
    /// Bucket key it is counted in.
    pub bucket: Arc<str>,
    /// The worker session holding its run (worker agent types, while the
    /// run is on a worker).
    pub worker_id: Option<Uuid>,
    /// The trace the agent's run belongs to: inherited from its parent or
    /// the Spawn caller, else a new one; always set.
    pub trace_id: super::trace_id::TraceId,
    /// Which attempt this is: 1 from the first start, + 1 each time the
    /// agent is queued again for another (a lost worker, a restart, a
    /// fallback model), before that one starts; 0 before the first start.
    pub attempt: u32,
    /// Set on a continuation or fork: its place in its conversation. None:
    /// the first turn of the conversation its own id names (most agents;
    /// shared and boxed so they pay one word).
    pub continuation: Option<Arc<Continuation>>,
    /// Set once an attempt ended and the agent was run again (a retry, a
    /// fallback model): the ended attempts. None: at most one attempt so
    /// far (most agents), which the view itself describes.
    pub attempts: Option<Arc<Attempts>>,
}

/// An agent's ended attempts, and when its current one started.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attempts {
    /// Ended attempts, oldest first.
    pub ended: Vec<Attempt>,
    /// When the current attempt started; None before it has.
    pub current_started_at: Option<SystemTime>,
}

/// One ended attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The model it ran on.
    pub model: Arc<str>,
    /// Why it ended.
    pub error: AgentError,
    /// When it started.
    pub started_at: Option<SystemTime>,
    /// When it ended.
    pub ended_at: SystemTime,
}

/// A continuation's or fork's place in its conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// The conversation: its first agent's id (a fork's own id).
    pub conversation_id: AgentId,
    /// The agent it continues or forked from.
    pub continues_id: AgentId,
    /// Its turn: the continued agent's + 1.
    pub turn: u32,
}

impl AgentView {
    /// The conversation the agent is a turn of.
    pub fn conversation_id(&self) -> AgentId {
        self.continuation
            .as_ref()
            .map_or(self.id, |c| c.conversation_id)
    }

    /// Its turn in that conversation (1 for the first).
    pub fn turn(&self) -> u32 {
        self.continuation.as_ref().map_or(1, |c| c.turn)
    }

    /// Whether attempt number `attempt` is not among the ended ones: it
    /// runs, or waits to start as a retry.
    pub fn has_current_attempt(&self) -> bool {
        let ended = self.attempts.as_ref().map_or(0, |a| a.ended.len());
        self.attempt as usize > ended
    }

    /// When the current attempt started (None before it has).
    pub fn attempt_started_at(&self) -> Option<SystemTime> {
        match &self.attempts {
            Some(a) => a.current_started_at,
            None => self.started_at,
        }
    }

    /// Settled and not collected: what an inbox Await returns. An agent
    /// awaiting approval is never collected (its approval must be seen
    /// until it is decided).
    pub fn is_uncollected(&self) -> bool {
        self.status.is_settled() && self.collected_at.is_none()
    }

    /// Running time so far, or in total once finished; zero if never started.
    pub fn elapsed(&self, now: SystemTime) -> Duration {
        match self.started_at {
            Some(start) => self
                .finished_at
                .unwrap_or(now)
                .duration_since(start)
                .unwrap_or_default(),
            None => Duration::ZERO,
        }
    }
}

/// A validated Spawn request.
#[derive(Debug, Clone, Default)]
pub struct SpawnSpec {
    /// The caller's tenant: where the agent lands, and the only tenant its
    /// parent, lead and idempotency key are looked up in. Empty: the
    /// [`DEFAULT_TENANT`].
    pub tenant: Arc<str>,
    /// Agent type.
    pub agent: String,
    /// "provider/model", already checked to parse.
    pub model: String,
    /// Instructions; non-empty.
    pub prompt: String,
    /// Free text.
    pub description: String,
    /// Parent agent.
    pub parent_id: Option<AgentId>,
    /// Lead for a root agent (ignored for children, which inherit).
    pub lead_id: Option<String>,
    /// Queue and return at once.
    pub background: bool,
    /// Caller labels.
    pub labels: BTreeMap<String, String>,
    /// Run deadline; None = the configured default.
    pub timeout: Option<Duration>,
    /// Deduplication key.
    pub idempotency_key: Option<String>,
    /// Survives its parent.
    pub detached: bool,
    /// The trace context the Spawn call carried and its RPC span.
    pub trace: super::trace_id::SpawnTrace,
    /// Continue this finished agent's conversation (`agent` and `model`
    /// may then be empty: inherited).
    pub continue_from: Option<AgentId>,
    /// With `continue_from`: a new conversation from a copy of the history.
    pub fork: bool,
    /// Where the run's worktree starts instead of its type's `base` (types
    /// with a workspace only). Whether the repository has it is checked
    /// before the Spawn reaches the scheduler (or, on a worker, at the
    /// run's start).
    pub workspace_base: Option<String>,
}

/// Filters of Status and WatchAgents; unset fields match everything.
#[derive(Debug, Clone, Default)]
pub struct AgentFilter {
    /// Only this tenant's agents (None = every tenant's: only an admin's
    /// unfiltered call).
    pub tenant: Option<Arc<str>>,
    /// Only these agents (empty = any).
    pub ids: Vec<AgentId>,
    /// Direct children of this agent.
    pub parent_id: Option<AgentId>,
    /// Agents of this tree.
    pub root_id: Option<AgentId>,
    /// Agents under this lead.
    pub lead_id: Option<String>,
    /// Agents in one of these states (empty = any).
    pub statuses: Vec<AgentStatus>,
    /// Turns of this conversation.
    pub conversation_id: Option<AgentId>,
    /// Only settled agents not yet collected (see
    /// [`AgentView::is_uncollected`]).
    pub uncollected: bool,
}

impl AgentFilter {
    /// Whether the agent passes every set filter.
    pub fn matches(&self, a: &AgentView) -> bool {
        self.tenant.as_deref().is_none_or(|t| *a.tenant == *t)
            && (self.ids.is_empty() || self.ids.contains(&a.id))
            && self.parent_id.is_none_or(|p| a.parent_id == Some(p))
            && self.root_id.is_none_or(|r| a.root_id == r)
            && self
                .lead_id
                .as_deref()
                .is_none_or(|l| a.lead_id.as_deref() == Some(l))
            && (self.statuses.is_empty() || self.statuses.contains(&a.status))
            && self
                .conversation_id
                .is_none_or(|c| a.conversation_id() == c)
            && (!self.uncollected || a.is_uncollected())
    }
}

/// Whose inbox an inbox Await reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxOf {
    /// A lead's root agents (no parent; continuations included) in the
    /// caller's tenant.
    Lead(String),
    /// An agent's direct children.
    Parent(AgentId),
}

/// An inbox as it is now.
#[derive(Debug, Default)]
pub struct InboxRead {
    /// The settled, uncollected agents: those awaiting approval first, then
    /// the others oldest settled first; at most [`MAX_INBOX_AGENTS`].
    pub settled: Vec<AgentView>,
    /// How many of the inbox's agents are live (not settled).
    pub live: usize,
}

/// The most agents one inbox Await returns.
pub const MAX_INBOX_AGENTS: usize = 100;

/// The tenant of every agent when authentication is off, and of a
/// [`SpawnSpec`] that names none.
pub const DEFAULT_TENANT: &str = "default";

/// Whose agents a call may find by id and act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One tenant's: every caller but an admin.
    Tenant(Arc<str>),
    /// Every tenant's: an admin, and the server itself.
    All,
}

impl Scope {
    /// Whether an agent of `tenant` is visible in this scope. Callers
    /// treat an invisible agent exactly as one that never existed.
    pub fn admits(&self, tenant: &str) -> bool {
        match self {
            Scope::Tenant(own) => **own == *tenant,
            Scope::All => true,
        }
    }
}

/// What a WatchAgents subscriber asks for.
#[derive(Debug, Clone, Default)]
pub struct WatchQuery {
    /// Which agents.
    pub filter: AgentFilter,
    /// Replay retained events after this sequence (0 = none).
    pub after_sequence: u64,
    /// Start with one SNAPSHOT per matching agent.
    pub include_snapshot: bool,
    /// Also receive progress events (output, tool calls).
    pub include_progress: bool,
}

/// Issues each in-process run a credential of its own, for what the run
/// starts to call the API back with (see `crate::auth::run_tokens`).
pub trait RunCredentials: Send + Sync + std::fmt::Debug {
    /// A credential acting in `tenant` for the run of `agent`, valid
    /// until it is dropped; None when none can be made.
    fn issue(&self, tenant: &Arc<str>, agent: AgentId) -> Option<RunCredential>;
}

/// A run's credential: its token, valid while this value lives.
pub struct RunCredential {
    token: Arc<str>,
    /// Revokes the token when dropped.
    _revoke: Box<dyn Send + Sync>,
}

impl RunCredential {
    /// `token`, revoked when `revoke` is dropped.
    pub fn new(token: Arc<str>, revoke: Box<dyn Send + Sync>) -> Self {
        Self {
            token,
            _revoke: revoke,
        }
    }

    /// The token (a secret: never log it).
    pub fn token(&self) -> &Arc<str> {
        &self.token
    }
}

impl std::fmt::Debug for RunCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunCredential(..)")
    }
}
