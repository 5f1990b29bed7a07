//! The built-in runners: what executes one agent run in process (and in
//! a worker process). The seam they implement is the scheduler's
//! ([`crate::scheduler::run`]), re-exported here.
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
pub mod workspace;

use std::sync::Arc;

pub use crate::scheduler::{
    inbox::SteerInbox,
    run::{RemoteReports, Run, RunOutcome, RunReporter, Runner},
};

/// The built-in runners, by kind (the server's in-process ones, and what
/// `subagentd worker` runs). Command runs reach the API at `api_url`
/// (`SUBAGENTD_ADDR`) when given; their worktrees go to `worktree_root`
/// when their type sets no `root`.
pub fn builtin(
    api_url: Option<String>,
    worktree_root: Option<std::path::PathBuf>,
) -> std::collections::HashMap<crate::config::RunnerKind, Arc<dyn Runner>> {
    use crate::config::RunnerKind;
    std::collections::HashMap::from([
        (
            RunnerKind::Simulated,
            Arc::new(simulated::SimulatedRunner) as Arc<dyn Runner>,
        ),
        (
            RunnerKind::Command,
            Arc::new(command::CommandRunner::new(api_url).with_worktree_root(worktree_root))
                as Arc<dyn Runner>,
        ),
        (
            RunnerKind::Openai,
            Arc::new(openai::OpenAiRunner::new()) as Arc<dyn Runner>,
        ),
    ])
}
