//! Run tasks: one per run, racing the runner, the cancel token and one
//! timer for the deadline and the stale watch; worker capacity held after
//! a cancel until its grace passes.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures_util::FutureExt;

use super::Scheduler;
use crate::config::RunnerKind;
use crate::scheduler::{
    core::{RunProgress, RunStart},
    run::{crashed, Run, RunReporter},
    types::{AgentError, AgentId, CODE_DEADLINE_EXCEEDED},
    workers::WorkerId,
};

impl Scheduler {
    /// The server's side of a run's end, on one timer: resolves `true` when
    /// the deadline passes (the caller reports DEADLINE_EXCEEDED), or `false`
    /// once the core ended the run as stale (nothing left to report). Wakes
    /// early only when the run could be stale, and then lets the core decide.
    async fn watch(
        &self,
        id: AgentId,
        timeout: Duration,
        progress: &RunProgress,
        stale_timeout: Duration,
    ) -> bool {
        let Some(deadline) = tokio::time::Instant::now().checked_add(timeout) else {
            return std::future::pending().await;
        };
        let mut stale_due = (!stale_timeout.is_zero()).then(|| progress.last() + stale_timeout);
        loop {
            let wake = stale_due.map_or(deadline, |due| due.min(deadline));
            tokio::time::sleep_until(wake).await;
            if tokio::time::Instant::now() >= deadline {
                return true;
            }
            match self.with_core(|c| c.check_stale(id)) {
                Some(next) => stale_due = Some(next),
                None => return false,
            }
        }
    }
    /// Frees a stopped worker run's capacity once its cancel grace passed
    /// (a no-op if the worker confirmed first).
    pub(super) async fn release_after(self, worker: WorkerId, agent: AgentId, grace: Duration) {
        tokio::time::sleep(grace).await;
        self.with_core(|c| c.release_worker_slot(worker, agent));
    }
    /// Executes one run: the runner future races the cancel token and the
    /// deadline; whatever wins is reported to the core exactly once (the
    /// core ignores reports for agents that already ended).
    pub(super) async fn drive(self, start: RunStart) {
        let id = start.agent.id;
        let cancel = start.cancel.clone();
        if start.runner == RunnerKind::Worker {
            // A worker's reports reach the core directly (`worker_report`):
            // this task only keeps the run's deadline and stale watch.
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                expired = self.watch(id, start.timeout, &start.progress, start.stale_timeout) => {
                    if expired {
                        let error = deadline_error(start.timeout);
                        self.with_core(|c| c.finish(id, Err(error)));
                    }
                }
            }
            return;
        }
        let (Some(runner), Some(agent_type)) = (
            self.shared.runners.get(&start.runner).cloned(),
            start.agent_type.clone(),
        ) else {
            let error = AgentError::new(
                "RUNNER_UNAVAILABLE",
                format!(
                    "no runner of kind {:?} is available for agent type \"{}\"",
                    start.runner, start.agent.agent
                ),
            );
            self.with_core(|c| c.finish(id, Err(error)));
            return;
        };
        let timeout = start.timeout;
        let (progress, stale_timeout) = (start.progress.clone(), start.stale_timeout);
        // Lives as long as this task, which outlives the run: the token is
        // revoked on every way the run ends.
        let credential = self
            .shared
            .run_credentials
            .get()
            .and_then(|issuer| issuer.issue(&start.agent.tenant, id));
        let run = Run {
            agent: start.agent,
            prompt: start.prompt,
            steer: start.steer,
            cancel: cancel.clone(),
            reporter: RunReporter::core(id, Arc::new(self.clone())),
            agent_type,
            trace: Some(start.trace),
            credential: credential.as_ref().map(|c| c.token().clone()),
            history: start.history,
            workspace_base: start.workspace_base,
            continues_workspace: start.continues_workspace,
        };
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            expired = self.watch(id, timeout, &progress, stale_timeout) => {
                if !expired {
                    // The core already failed the run as STALE.
                    return;
                }
                Err(deadline_error(timeout))
            }
            out = AssertUnwindSafe(runner.run(run)).catch_unwind() => out.unwrap_or_else(|panic| Err(crashed(&*panic))),
        };
        self.with_core(|c| c.finish(id, outcome));
    }
    /// Lets every runner finish stopping its runs (see
    /// [`Runner::shutdown`]); call after [`Scheduler::shut_down`].
    pub async fn shutdown_runners(&self) {
        let runners: Vec<_> = self.shared.runners.values().cloned().collect();
        futures_util::future::join_all(runners.iter().map(|r| r.shutdown())).await;
    }
}

fn deadline_error(timeout: Duration) -> AgentError {
    AgentError::new(
        CODE_DEADLINE_EXCEEDED,
        format!(
            "run exceeded its deadline of {}",
            humantime::format_duration(timeout)
        ),
    )
}
