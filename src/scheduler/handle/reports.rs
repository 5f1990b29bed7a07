//! Run reports into the core (the core side of [`RunReporter`]): each one
//! call under the lock; a change that can end the run (a tool call that
//! trips a breaker, a turn past the limit) goes through `with_core` so
//! freed slots start what waits.
//!
//! [`RunReporter`]: crate::scheduler::run::RunReporter

use futures_util::future::BoxFuture;

use super::Scheduler;
use crate::scheduler::{
    durable::ProcessGroup,
    error::Error,
    run::CoreReports,
    types::{AgentId, ApprovalOutcome, TurnVerdict, Usage, Workspace},
};

impl CoreReports for Scheduler {
    fn append_output(&self, id: AgentId, chunk: &str) {
        self.inspect_mut(|c| c.append_output(id, chunk));
    }

    fn record_process_group(
        &self,
        id: AgentId,
        group: ProcessGroup,
    ) -> BoxFuture<'_, Result<(), Error>> {
        let ticket = self.inspect_mut(|c| {
            c.record_process_group(id, group);
            c.ticket()
        });
        Box::pin(self.durable(ticket))
    }

    fn touch_progress(&self, id: AgentId) {
        self.inspect_mut(|c| c.touch_progress(id));
    }

    fn record_tool_call(&self, id: AgentId, name: &str, input_digest: &str) {
        // May trip a circuit breaker, which ends the run and frees slots.
        self.with_core(|c| c.record_tool_call(id, name, input_digest));
    }

    fn turn_started(&self, id: AgentId) -> TurnVerdict {
        self.with_core(|c| c.turn_started(id))
    }

    fn mark_retryable(&self, id: AgentId) {
        self.inspect_mut(|c| c.mark_retryable(id));
    }

    fn set_session(&self, id: AgentId, session: &str) {
        self.inspect_mut(|c| c.set_session(id, Some(session.into())));
    }

    fn add_usage(&self, id: AgentId, usage: Usage) {
        self.inspect_mut(|c| c.add_usage(id, usage));
    }

    fn set_workspace(&self, id: AgentId, workspace: Workspace) -> BoxFuture<'_, ()> {
        let ticket = self.inspect_mut(|c| {
            c.set_workspace(id, workspace);
            c.ticket()
        });
        // A store failure is the store's to report (the server exits);
        // the workspace itself is saved in git either way.
        Box::pin(async move {
            let _ = self.durable(ticket).await;
        })
    }

    fn request_approval<'a>(
        &'a self,
        id: AgentId,
        tool_name: &'a str,
        detail: &'a str,
    ) -> BoxFuture<'a, ApprovalOutcome> {
        let pending = self.with_core(|c| c.request_approval(id, tool_name, detail));
        Box::pin(async move {
            match pending {
                Some((_, decision)) => match decision.await {
                    Ok(outcome) => outcome,
                    Err(_) => std::future::pending().await,
                },
                // Not running: the run is ending and about to be dropped.
                None => std::future::pending().await,
            }
        })
    }
}
