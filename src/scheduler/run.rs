//! The run seam: what the scheduler asks of whatever executes a run
//! ([`Runner`]), what a runner gets ([`Run`]) and how it reports back
//! ([`RunReporter`]). The built-in runners (`crate::runner`) and a worker
//! process implement it; the scheduler owns everything else: the
//! deadline, cancellation, slots and events.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

pub use super::durable::ProcessGroup;
use super::{
    conversation::History,
    error::Error,
    inbox::SteerInbox,
    trace::TraceContext,
    types::{AgentError, AgentId, AgentView, ApprovalOutcome, TurnVerdict, Usage, Workspace},
};
use crate::config::AgentTypeConfig;

/// Error code of a run whose runner panicked.
pub const CODE_RUNNER_CRASHED: &str = "RUNNER_CRASHED";

/// What a run resolves to: the final result, or why it failed.
pub type RunOutcome = Result<String, AgentError>;

/// Everything a runner gets for one run.
#[derive(Debug)]
pub struct Run {
    /// The agent as it was when the run started.
    pub agent: AgentView,
    /// The prompt.
    pub prompt: Arc<str>,
    /// Steer messages in arrival order (buffered ones first).
    pub steer: SteerInbox,
    /// Cancelled when the scheduler ends the run (cancel, deadline, parent
    /// ended). The run future is also dropped then.
    pub cancel: CancellationToken,
    /// Reports progress back to the scheduler.
    pub reporter: RunReporter,
    /// The agent type's config as of the run's start.
    pub agent_type: Arc<AgentTypeConfig>,
    /// The run's trace context (its span, or the context it inherited
    /// when spans are not recorded): set on the server; on a worker, what
    /// its assignment carried. See [`Run::traceparent`].
    pub trace: Option<TraceContext>,
    /// The run's own credential (`SUBAGENTD_TOKEN` for a program), valid
    /// while the run lives; None when calls need none.
    pub credential: Option<Arc<str>>,
    /// A continuation's history: the earlier turns of its conversation
    /// (None for a conversation's first turn).
    pub history: Option<Arc<History>>,
    /// Spawn's `workspace_base`: where the run's worktree starts instead
    /// of its type's `base`.
    pub workspace_base: Option<Arc<str>>,
    /// A continuation or fork of an agent whose workspace was saved: that
    /// workspace, where this run's worktree starts (None otherwise).
    pub continues_workspace: Option<Arc<Workspace>>,
}

impl Run {
    /// The run's W3C `traceparent`, for a runner that passes it on (a
    /// program's environment, an HTTP header). Made when asked: most runs
    /// of the simulated runner never do.
    pub fn traceparent(&self) -> Option<String> {
        self.trace.as_ref().map(TraceContext::traceparent)
    }
}

/// Executes runs of one kind of agent.
pub trait Runner: Send + Sync + 'static {
    /// Runs one agent to completion.
    fn run(&self, run: Run) -> BoxFuture<'static, RunOutcome>;

    /// Called once at server shutdown, after every run was cancelled, for
    /// what must not be cut short by the process exiting (the command
    /// runner waits out its programs' kill grace).
    fn shutdown(&self) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// The failure of a run whose runner panicked with `panic`.
pub fn crashed(panic: &(dyn std::any::Any + Send)) -> AgentError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    AgentError::new(CODE_RUNNER_CRASHED, format!("runner crashed: {what}"))
}

/// A run's channel back to the scheduler. Reports after the agent ended
/// are ignored.
///
/// In the server the reports go straight to the core; in a worker process
/// (`subagentd worker`) the same runners report through a [`RemoteReports`]
/// that sends them over the worker's session.
#[derive(Clone)]
pub struct RunReporter {
    id: AgentId,
    sink: ReportSink,
}

#[derive(Clone)]
enum ReportSink {
    Core(Arc<dyn CoreReports>),
    Remote(Arc<dyn RemoteReports>),
}

/// The core's side of a run's reports, implemented by the scheduler's
/// handle (`handle::reports`). A trait, so that the run seam does not name
/// the handle that holds the runners.
pub(crate) trait CoreReports: Send + Sync + 'static {
    fn append_output(&self, id: AgentId, chunk: &str);
    fn record_process_group(
        &self,
        id: AgentId,
        group: ProcessGroup,
    ) -> BoxFuture<'_, Result<(), Error>>;
    fn touch_progress(&self, id: AgentId);
    fn record_tool_call(&self, id: AgentId, name: &str, input_digest: &str);
    fn turn_started(&self, id: AgentId) -> TurnVerdict;
    fn mark_retryable(&self, id: AgentId);
    fn set_session(&self, id: AgentId, session: &str);
    fn add_usage(&self, id: AgentId, usage: Usage);
    fn set_workspace(&self, id: AgentId, workspace: Workspace) -> BoxFuture<'_, ()>;
    fn request_approval<'a>(
        &'a self,
        id: AgentId,
        tool_name: &'a str,
        detail: &'a str,
    ) -> BoxFuture<'a, ApprovalOutcome>;
}

/// Where a run's reports go when the run executes away from the core (in
/// a worker process). Every method returns at once except
/// `request_approval`, which resolves to the decision.
pub trait RemoteReports: Send + Sync + 'static {
    /// A chunk of output; an empty one says the run is still working.
    fn output(&self, chunk: &str);
    /// A tool call.
    fn tool_call(&self, name: &str, input_digest: &str);
    /// Tokens used.
    fn usage(&self, usage: Usage);
    /// The run's own session, sent with its terminal report.
    fn session(&self, session: &str);
    /// The run's workspace was saved: before the terminal report for a run
    /// that ends by itself, after it for a stopped one.
    fn workspace(&self, workspace: &Workspace);
    /// The run starts a turn.
    fn turn_started(&self);
    /// The failure the run is about to return is a retryable provider
    /// error (sent as `RunFailed.retryable`).
    fn retryable_failure(&self);
    /// Asks for a decision and resolves to it; never resolves if the run
    /// is stopped first (the run future is dropped then).
    fn request_approval(
        &self,
        tool_name: &str,
        detail: &str,
    ) -> futures_util::future::BoxFuture<'static, ApprovalOutcome>;
}

impl std::fmt::Debug for RunReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunReporter").field("id", &self.id).finish()
    }
}

impl RunReporter {
    /// A reporter of `id`'s run that reports to the core.
    pub(crate) fn core(id: AgentId, core: Arc<dyn CoreReports>) -> Self {
        Self {
            id,
            sink: ReportSink::Core(core),
        }
    }

    /// A reporter of `id`'s run that sends to `remote` (a worker process).
    pub fn remote(id: AgentId, remote: Arc<dyn RemoteReports>) -> Self {
        Self {
            id,
            sink: ReportSink::Remote(remote),
        }
    }

    /// The agent this run belongs to.
    pub fn agent_id(&self) -> AgentId {
        self.id
    }

    /// Appends a chunk of output to the agent's result (and streams it to
    /// progress watchers).
    pub fn output(&self, chunk: &str) {
        match &self.sink {
            ReportSink::Core(s) => s.append_output(self.id, chunk),
            ReportSink::Remote(r) if !chunk.is_empty() => r.output(chunk),
            ReportSink::Remote(_) => {}
        }
    }

    /// A command run's program is about to run as process group `group`:
    /// recorded with the run, and resolves once that is durable, so a
    /// restart after a crash can stop it. Err when the store failed. A
    /// worker process records nothing: its programs are its own, and it
    /// stops them itself.
    pub async fn process_group(&self, group: ProcessGroup) -> Result<(), Error> {
        let ReportSink::Core(core) = &self.sink else {
            return Ok(());
        };
        core.record_process_group(self.id, group).await
    }

    /// The run's workspace was saved (committed, its worktree removed):
    /// shown as the agent's `workspace`, durably. A run that ends by itself
    /// reports it before it returns, so its terminal event carries it; a
    /// stopped run's reporter (kept by whoever saves the worktree) reports
    /// it after the agent ended, which announces it with a WORKSPACE_SAVED
    /// event. Resolves once durable (in a worker process: once sent).
    pub async fn workspace(&self, workspace: Workspace) {
        match &self.sink {
            ReportSink::Core(core) => core.set_workspace(self.id, workspace).await,
            ReportSink::Remote(r) => r.workspace(&workspace),
        }
    }

    /// Says the run is still working although it reports nothing (output
    /// past its cap, say), so it does not count as stale.
    pub fn still_working(&self) {
        match &self.sink {
            ReportSink::Core(s) => s.touch_progress(self.id),
            ReportSink::Remote(r) => r.output(""),
        }
    }

    /// Reports a tool call: counted in `usage.tool_calls` and streamed to
    /// progress watchers.
    pub fn tool_call(&self, name: &str, input_digest: &str) {
        match &self.sink {
            // May trip a circuit breaker, which ends the run and frees slots.
            ReportSink::Core(s) => s.record_tool_call(self.id, name, input_digest),
            ReportSink::Remote(r) => r.tool_call(name, input_digest),
        }
    }

    /// The run starts a turn (one model call of its loop); see
    /// [`Core::turn_started`]. In a worker process the server decides, and
    /// sends a wrap-up as a steer and a stop as a cancel: this says Go.
    pub fn turn_started(&self) -> TurnVerdict {
        match &self.sink {
            ReportSink::Core(s) => s.turn_started(self.id),
            ReportSink::Remote(r) => {
                r.turn_started();
                TurnVerdict::Go
            }
        }
    }

    /// The failure this run is about to return is a provider's that
    /// another model may not have: rate limit or quota exhausted, 5xx,
    /// overloaded, unknown model, missing credentials. With the type's
    /// `fallback_models` the agent then moves to the next model instead of
    /// failing (see [`Core::finish`]).
    pub fn retryable_failure(&self) {
        match &self.sink {
            ReportSink::Core(s) => s.mark_retryable(self.id),
            ReportSink::Remote(r) => r.retryable_failure(),
        }
    }

    /// The run's own session (an agent CLI's session id, say), handed to
    /// the run that continues this agent; the latest report wins. Empty:
    /// none.
    pub fn session(&self, session: &str) {
        match &self.sink {
            ReportSink::Core(s) => s.set_session(self.id, session),
            ReportSink::Remote(r) => r.session(session),
        }
    }

    /// Adds token usage or tool calls.
    pub fn usage(&self, usage: Usage) {
        match &self.sink {
            ReportSink::Core(s) => s.add_usage(self.id, usage),
            ReportSink::Remote(r) => r.usage(usage),
        }
    }

    /// Pauses the run in AWAITING_APPROVAL for `tool_name` and resolves
    /// to the decision once the agent runs again (after Approve, and after
    /// waiting for a slot if its limits are full).
    ///
    /// If the agent ends instead (cancel, deadline) the scheduler drops the
    /// run future, so this never resolves then.
    pub async fn request_approval(&self, tool_name: &str, detail: &str) -> ApprovalOutcome {
        match &self.sink {
            ReportSink::Core(s) => s.request_approval(self.id, tool_name, detail).await,
            ReportSink::Remote(r) => r.request_approval(tool_name, detail).await,
        }
    }
}
