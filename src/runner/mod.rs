//! The runner seam: what executes one agent run.
//!
//! A runner gets the prompt, a cancellation token, a stream of steer
//! messages and a [`RunReporter`] to report output, tool calls, usage and
//! approval requests; it resolves to the result or a failure. The scheduler
//! owns everything else: the deadline, cancellation, slots and events. A
//! runner that is cancelled is simply dropped, so runners need no cleanup
//! path of their own beyond `Drop`.

pub mod command;
pub mod openai;
pub mod simulated;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::config::AgentTypeConfig;
pub use crate::scheduler::{inbox::SteerInbox, RemoteReports, RunReporter};
use crate::scheduler::{AgentError, AgentView};

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
    /// W3C trace context of the run (its span, or the context it
    /// inherited when spans are not recorded); always set.
    pub traceparent: Arc<str>,
    /// The run's own credential (`SUBAGENTD_TOKEN` for a program), valid
    /// while the run lives; None when calls need none.
    pub credential: Option<Arc<str>>,
    /// A continuation's history: the earlier turns of its conversation
    /// (None for a conversation's first turn).
    pub history: Option<Arc<crate::scheduler::conversation::History>>,
}

/// The built-in runners, by kind (the server's in-process ones, and what
/// `subagentd worker` runs). Command runs reach the API at `api_url`
/// (`SUBAGENTD_ADDR`) when given.
pub fn builtin(
    api_url: Option<String>,
) -> std::collections::HashMap<crate::config::RunnerKind, Arc<dyn Runner>> {
    use crate::config::RunnerKind;
    std::collections::HashMap::from([
        (
            RunnerKind::Simulated,
            Arc::new(simulated::SimulatedRunner) as Arc<dyn Runner>,
        ),
        (
            RunnerKind::Command,
            Arc::new(command::CommandRunner::new(api_url)) as Arc<dyn Runner>,
        ),
        (
            RunnerKind::Openai,
            Arc::new(openai::OpenAiRunner::new()) as Arc<dyn Runner>,
        ),
    ])
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
