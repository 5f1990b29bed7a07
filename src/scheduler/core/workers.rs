//! Workers as the core sees them: registering one, losing one (its runs
//! fail or retry), its reports about runs, and the cancel-grace timers
//! that free a stopped run's capacity.

use std::time::{Duration, SystemTime};

use super::{Core, RunControl, RunStart};
use crate::config::RunnerKind;
use crate::scheduler::{
    queue::Dirty,
    types::*,
    workers::{HeldRun, ReportNumber, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo},
};

impl Core {
    /// Cancel-grace timers to arm since the last call: after the duration,
    /// [`Core::release_worker_slot`] the (worker, agent) pair.
    pub fn take_grace_timers(&mut self) -> Vec<(WorkerId, AgentId, Duration)> {
        std::mem::take(&mut self.grace_timers)
    }

    /// Registers a connected worker; queued agents of its types may start
    /// at once.
    ///
    /// `held` are the runs it says it still holds (it reconnected, or the
    /// server restarted): each that is live here on one of its agent types
    /// with the same attempt and no connected worker re-attaches to it, and
    /// takes its capacity before anything new is assigned; the worker is
    /// told to stop each other one.
    pub fn register_worker(
        &mut self,
        info: WorkerInfo,
        commands: tokio::sync::mpsc::UnboundedSender<WorkerCommand>,
        held: &[HeldRun],
    ) -> WorkerId {
        let mut dirty = Dirty::default();
        for agent_type in &info.agents {
            dirty.worker_type(&(info.tenant.clone(), agent_type.clone()));
        }
        let id = self.workers.register(info, commands);
        for run in held {
            if !self.reattach(id, *run) {
                self.workers.send(
                    id,
                    WorkerCommand::Cancel {
                        agent_id: run.agent_id,
                        reason: format!(
                            "the server has no live run of agent {} at attempt {} for this \
                             worker (it ended, was retried, or is unknown)",
                            run.agent_id, run.attempt
                        ),
                    },
                );
            }
        }
        self.drain(dirty);
        id
    }

    /// Re-attaches `run` to `worker` if it matches a live worker run that
    /// no connected worker holds. The run gets fresh controls (commands
    /// reach it again) and a deadline watch for what is left of its
    /// timeout; no new assignment is sent.
    fn reattach(&mut self, worker: WorkerId, run: HeldRun) -> bool {
        let Some(rec) = self.agents.get(&run.agent_id) else {
            return false;
        };
        // Only a run of the worker's own tenant: a worker of another tenant
        // naming this run learns nothing (it is told to stop it).
        let serves = self
            .workers
            .serves(worker, &rec.view.tenant, &rec.view.agent);
        let orphaned = rec
            .view
            .worker_id
            .is_none_or(|w| !self.workers.is_connected(w));
        let live = matches!(
            rec.view.status,
            AgentStatus::Running | AgentStatus::AwaitingApproval
        );
        if !(rec.runner == RunnerKind::Worker
            && serves
            && orphaned
            && live
            && rec.view.attempt == run.attempt)
        {
            return false;
        }
        let id = run.agent_id;
        self.workers.hold(worker, id);
        let rec = self.agents.get_mut(&id).expect("checked above");
        rec.view.worker_id = Some(worker);
        // Steer messages that waited for the re-attach, in order.
        for message in rec.take_steer_buffer() {
            self.workers.send(
                worker,
                WorkerCommand::Steer {
                    agent_id: id,
                    message,
                },
            );
        }
        let (mut control, inbox) = RunControl::fresh();
        control.report_seq = self.held_report_seqs.remove(&id).unwrap_or(0);
        let (progress, cancel) = (control.progress.clone(), control.cancel.clone());
        rec.run = Some(control);
        let ran = rec
            .view
            .started_at
            .and_then(|s| SystemTime::now().duration_since(s).ok())
            .unwrap_or_default();
        let start = RunStart {
            agent: rec.view.clone(),
            runner: rec.runner,
            prompt: rec.prompt.clone().unwrap_or_else(|| "".into()),
            steer: inbox,
            cancel,
            timeout: rec.timeout().saturating_sub(ran),
            agent_type: self.agent_types.get(&*rec.view.agent).cloned(),
            trace: rec.trace_context(),
            progress,
            stale_timeout: self.runs.stale_timeout,
            // The worker has the run, and had the history with it.
            history: None,
            workspace_base: None,
            continues_workspace: None,
        };
        self.starts.push(start);
        self.changed(id);
        true
    }

    /// The agent types served by workers, for validating a hello: every
    /// configured type with `runner = "worker"`.
    pub fn worker_agent_types(&self) -> Vec<String> {
        self.agent_types
            .iter()
            .filter(|(_, t)| t.runner == RunnerKind::Worker)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// A worker's session ended (stream closed, keepalive failed). Each
    /// live run it held fails with WORKER_LOST, or is queued again when its
    /// type retries; returns how many runs it held.
    pub fn worker_lost(&mut self, worker: WorkerId) -> usize {
        let Some((info, held)) = self.workers.remove(worker) else {
            return 0;
        };
        let mut dirty = Dirty::default();
        for &id in &held {
            let Some(rec) = self.agents.get(&id) else {
                continue;
            };
            // Runs stopped here and awaiting the worker's confirmation are
            // already terminal; their capacity went with the worker.
            if rec.view.status.is_terminal() || rec.view.worker_id != Some(worker) {
                continue;
            }
            self.lose_worker_run(id, &mut dirty, |n| {
                format!(
                    "worker \"{}\" ({worker}) was lost while holding the run (attempt {n})",
                    info.name
                )
            });
        }
        self.drain(dirty);
        held.len()
    }

    /// The worker is draining: it gets no new runs; what it holds goes on.
    pub fn drain_worker(&mut self, worker: WorkerId) -> bool {
        self.workers.drain(worker)
    }

    /// The cancel grace of a stopped worker run passed: its capacity frees
    /// unless the worker already confirmed the run ended.
    pub fn release_worker_slot(&mut self, worker: WorkerId, agent: AgentId) -> bool {
        if !self.workers.release(worker, agent) {
            return false;
        }
        let mut dirty = Dirty::default();
        for key in self.workers.keys_of(worker) {
            dirty.worker_type(&key);
        }
        self.drain(dirty);
        true
    }

    /// Applies a worker's report about one of its runs. Reports about runs
    /// the worker does not hold, or that already ended, are not applied;
    /// a terminal report always frees the worker's capacity for the run.
    pub fn worker_report(
        &mut self,
        worker: WorkerId,
        agent: AgentId,
        number: ReportNumber,
        event: WorkerEvent,
    ) -> bool {
        let Some(rec) = self.agents.get(&agent) else {
            return false;
        };
        if number.attempt != 0 && number.attempt != rec.view.attempt {
            // An older attempt's handler, still running on a worker that
            // now holds the retried run: nothing of it applies, not even
            // its terminal event's freeing of the slot (the slot is the
            // new attempt's).
            return false;
        }
        if let WorkerEvent::Workspace(workspace) = event {
            return self.worker_workspace(worker, agent, number.attempt, workspace);
        }
        let seq = number.seq;
        let live = rec.view.worker_id == Some(worker)
            && rec.runner == RunnerKind::Worker
            && !rec.view.status.is_terminal()
            && self.workers.holds(worker, agent);
        // A numbered report the run has applied already: a worker sends its
        // reports again after a re-attach, and the store kept these. Output
        // is exempt: it is never stored, so after a restart the repeats
        // rebuild it.
        if live && seq != 0 && !matches!(event, WorkerEvent::Output(_)) {
            let run = self.agents.get_mut(&agent).and_then(|r| r.run.as_mut());
            if let Some(run) = run {
                if seq <= run.report_seq {
                    return true;
                }
                run.report_seq = seq;
            }
        }
        if event.is_terminal() {
            self.release_worker_slot(worker, agent);
        }
        if !live {
            return false;
        }
        match event {
            WorkerEvent::Output(chunk) => self.append_output(agent, &chunk),
            WorkerEvent::ToolCall { name, input_digest } => {
                self.record_tool_call(agent, &name, &input_digest)
            }
            WorkerEvent::Usage(usage) => self.add_usage(agent, usage),
            WorkerEvent::ApprovalRequest { tool_name, detail } => {
                return self
                    .pause_for_approval(agent, &tool_name, &detail, None)
                    .is_some();
            }
            WorkerEvent::TurnStarted => {
                self.turn_started(agent);
            }
            WorkerEvent::Workspace(_) => unreachable!("applied above"),
            WorkerEvent::Done { result, session } => {
                self.set_session(agent, session);
                return self.finish(agent, Ok(result));
            }
            WorkerEvent::Failed {
                error,
                session,
                retryable,
            } => {
                self.set_session(agent, session);
                if retryable {
                    self.mark_retryable(agent);
                }
                return self.finish(agent, Err(error));
            }
        }
        true
    }

    /// A worker saved `agent`'s workspace: during the run, after the run
    /// was stopped (the worker no longer holds it), or at the worker's
    /// start for a worktree a killed worker left (a new session). Taken only
    /// for the agent's current attempt, from a worker that serves the
    /// agent's tenant and type: while the run is live, from the worker
    /// holding it; once it ended, only if no workspace was taken yet (a
    /// repeat, as a re-attach sends, changes nothing). Refused when it does
    /// not look like one (a branch git would read as an option, commits
    /// that are not hex): a continuation checks its branch out.
    fn worker_workspace(
        &mut self,
        worker: WorkerId,
        agent: AgentId,
        attempt: u32,
        workspace: Workspace,
    ) -> bool {
        let Some(rec) = self.agents.get(&agent) else {
            return false;
        };
        let serves = rec.runner == RunnerKind::Worker
            && self
                .workers
                .serves(worker, &rec.view.tenant, &rec.view.agent);
        if !serves || attempt == 0 || attempt != rec.view.attempt || !plausible(&workspace) {
            return false;
        }
        let live = !rec.view.status.is_terminal();
        if live && rec.view.worker_id != Some(worker) {
            return false;
        }
        match rec.view.workspace.as_deref() {
            Some(taken) if *taken == workspace => return true,
            Some(_) if !live => return false,
            _ => {}
        }
        self.set_workspace(agent, workspace);
        true
    }

    /// Tells `worker` that its unnumbered workspace report of `agent` at
    /// `attempt` was answered (see [`WorkerCommand::WorkspaceAnswered`]).
    pub fn answer_workspace(&self, worker: WorkerId, agent: AgentId, attempt: u32) -> bool {
        self.workers.send(
            worker,
            WorkerCommand::WorkspaceAnswered {
                agent_id: agent,
                attempt,
            },
        )
    }

    /// Tells `worker` that its run of `agent` (at `attempt`; 0: the
    /// agent's latest) ended durably (see [`WorkerCommand::Released`]);
    /// false if the session is gone.
    pub fn release_worker_run(&self, worker: WorkerId, agent: AgentId, attempt: u32) -> bool {
        let attempt = match attempt {
            0 => self.agents.get(&agent).map_or(0, |r| r.view.attempt),
            n => n,
        };
        self.workers.send(
            worker,
            WorkerCommand::Released {
                agent_id: agent,
                attempt,
            },
        )
    }

    /// Every worker's (id, capacity, held runs), for invariant checks.
    pub fn worker_snapshot(&self) -> Vec<(WorkerId, u32, Vec<AgentId>)> {
        self.workers.snapshot()
    }
}

/// Whether a reported workspace looks like one git made: a branch name git
/// reads as a branch, commits in hex.
fn plausible(w: &Workspace) -> bool {
    let hex = |c: &str| matches!(c.len(), 40 | 64) && c.bytes().all(|b| b.is_ascii_hexdigit());
    let branch = &w.branch;
    !branch.is_empty()
        && branch.len() <= 255
        && !branch.starts_with('-')
        && !branch.contains("..")
        && !branch
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(c))
        && hex(&w.base_commit)
        && hex(&w.head_commit)
}
