//! Recovery: a core rebuilt from what a store kept, and the fate of the
//! runs the previous process was executing.
//!
//! Rebuilding reads current rows, never history: each agent's record, its
//! indexes and the slots its state holds, in admission order (so queued
//! agents keep their FIFO places). Then the decisions — an in-process run
//! that was live is gone with its process: queued again (`retry_on_restart`)
//! or FAILED `SERVER_RESTARTED` — are ordinary transitions, tracked like
//! any other, so they reach the store as one batch and watchers see them.
//!
//! "Live" includes a run paused after its approval was decided, while the
//! agent waits QUEUED for the slots to run again (its stored decision
//! says so): in process, that run is as gone as a RUNNING one. A worker
//! holds such a run paused, but re-attach resumes only RUNNING and
//! AWAITING_APPROVAL runs, so it follows the worker-lost rules at once.

use std::{sync::Arc, time::SystemTime};

use super::{Children, Core, Rare, Record};
use crate::config::RunnerKind;
use crate::scheduler::{
    conversation::Inherited,
    durable::{AgentState, ProcessGroup, Recovered},
    events::EventLog,
    queue::Dirty,
    state::Held,
    types::*,
};

/// What recovery found and decided, for the start-up log line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Agents read back.
    pub agents: usize,
    /// Agents queued (again) in their original order.
    pub queued: usize,
    /// Interrupted runs queued again for another attempt.
    pub retried: usize,
    /// Interrupted runs failed (SERVER_RESTARTED, or WORKER_LOST for a
    /// worker run paused after its approval).
    pub failed: usize,
    /// Worker runs kept for their workers to re-attach.
    pub held_for_workers: Vec<AgentId>,
    /// In-process runs that were live: [`Core::recover_runs`] decides.
    pub interrupted: Vec<AgentId>,
    /// Worker runs paused after their approval, waiting for their slots:
    /// [`Core::recover_runs`] applies the worker-lost rules.
    pub paused_worker_runs: Vec<AgentId>,
    /// The recorded process groups of interrupted command runs, with their
    /// agent type: stop them before deciding (they may have outlived a
    /// SIGKILL of the server).
    pub process_groups: Vec<(AgentId, Arc<str>, ProcessGroup)>,
    /// Retained lifecycle events.
    pub events: usize,
}

/// A store's contents contradict themselves (a bug, or a damaged store).
#[derive(Debug, thiserror::Error)]
#[error("the stored state is inconsistent: {0}")]
pub struct Inconsistent(pub String);

impl Core {
    /// Loads `recovered` into this new, empty core (built with the current
    /// config). Changes are tracked from here on, so the decisions of
    /// [`Core::recover_runs`] reach the store like any other.
    pub fn restore(
        &mut self,
        recovered: Recovered,
        watch_history: usize,
        subscriber_buffer: usize,
    ) -> Result<RecoveryReport, Inconsistent> {
        assert!(self.agents.is_empty(), "restore into an empty core");
        let Recovered {
            agents,
            events,
            position,
            conversations,
        } = recovered;
        for c in conversations {
            self.conversations.restore(c);
        }
        let mut report = RecoveryReport {
            agents: agents.len(),
            events: events.len(),
            ..RecoveryReport::default()
        };
        self.events = EventLog::restored(watch_history, subscriber_buffer, events, &position);
        self.next_seq = position.next_admission.max(1);
        let mut finished = Vec::new();
        let mut interrupted = Vec::new();
        for state in agents {
            self.next_seq = self.next_seq.max(state.seq + 1);
            let (id, status) = (state.view.id, state.view.status);
            let paused = status == AgentStatus::Queued && state.decision.is_some();
            if let (Some(group), false) = (state.process_group, status.is_terminal()) {
                report
                    .process_groups
                    .push((id, state.view.agent.clone(), group));
            }
            self.insert_restored(state)?;
            match status {
                AgentStatus::Queued if paused => {
                    if self.agents[&id].runner == RunnerKind::Worker {
                        report.paused_worker_runs.push(id);
                    } else {
                        interrupted.push(id);
                    }
                }
                AgentStatus::Queued => report.queued += 1,
                AgentStatus::Running | AgentStatus::AwaitingApproval => {
                    if self.agents[&id].runner == RunnerKind::Worker {
                        report.held_for_workers.push(id);
                    } else {
                        interrupted.push(id);
                    }
                }
                _ => {
                    let at = self.agents[&id]
                        .view
                        .finished_at
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    finished.push((at, id));
                }
            }
        }
        finished.sort_unstable();
        self.finished = finished.into();
        self.restore_live_turns();
        let recount = self.recount();
        if self.counters() != recount {
            return Err(Inconsistent(format!(
                "counters rebuilt from the rows ({:?}) differ from a recount ({recount:?})",
                self.counters()
            )));
        }

        report.interrupted = interrupted;
        self.track_changes();
        Ok(report)
    }

    /// Decides the fate of the in-process runs [`Core::restore`] found
    /// live (`report.interrupted`): queued again while `retry_on_restart`
    /// allows, else FAILED `SERVER_RESTARTED`; then starts what may start.
    /// Separate from `restore` so watchers can subscribe in between.
    pub fn recover_runs(&mut self, report: &mut RecoveryReport) {
        let mut dirty = Dirty::default();
        dirty.everything();
        for &id in &report.interrupted {
            // A parent's end may already have ended it (cascade).
            let Some(rec) = self.agents.get(&id) else {
                continue;
            };
            if rec.view.status.is_terminal() {
                continue;
            }
            let retries = self
                .agent_types
                .get(&*rec.view.agent)
                .map_or(0, |t| t.retry_on_restart);
            let retried = self.retry_or_fail(id, retries, CODE_SERVER_RESTARTED, &mut dirty, |n| {
                format!(
                    "the run (attempt {n}) was interrupted by a server restart; \
                     it may have had side effects before it stopped"
                )
            });
            if retried {
                report.retried += 1;
            } else {
                report.failed += 1;
            }
        }
        for &id in &report.paused_worker_runs {
            if self
                .agents
                .get(&id)
                .is_none_or(|r| r.view.status.is_terminal())
            {
                continue;
            }
            let retried = self.lose_worker_run(id, &mut dirty, |n| {
                format!(
                    "the run (attempt {n}) was approved and waiting for its slots when the \
                     server restarted; a worker cannot re-attach a paused run"
                )
            });
            if retried {
                report.retried += 1;
            } else {
                report.failed += 1;
            }
        }
        self.drain(dirty);
    }

    /// The first turn of each live agent that began a conversation: it is
    /// stored when it ends, so until then it is rebuilt from the agent's
    /// own record (its prompt). Steers and tool calls of a live turn are
    /// kept in memory only and are lost with a crash; ended turns never.
    fn restore_live_turns(&mut self) {
        let live: Vec<AgentId> = self
            .order
            .ids()
            .filter(|id| {
                let rec = &self.agents[*id];
                !rec.view.status.is_terminal() && rec.view.continuation.is_none()
            })
            .copied()
            .collect();
        for id in live {
            if self.conversations.place(id).is_some() {
                continue;
            }
            let rec = &self.agents[&id];
            let inherited = Inherited {
                agent: rec.view.agent.clone(),
                model: rec.view.model.clone(),
                parent_id: rec.view.parent_id,
                lead_id: rec.view.lead_id.clone(),
                labels: rec.view.labels.clone(),
            };
            let prompt = rec.prompt.clone().unwrap_or_else(|| "".into());
            let (tenant, at) = (rec.view.tenant.clone(), rec.view.created_at);
            self.conversations.begin(id, tenant, inherited, prompt, at);
        }
    }

    /// Inserts one stored agent with its indexes and the slots its state
    /// holds. Agents come in admission order, so a parent precedes its
    /// children.
    fn insert_restored(&mut self, state: AgentState) -> Result<(), Inconsistent> {
        let AgentState {
            mut view,
            seq,
            runner,
            prompt,
            timeout,
            steer_buffer,
            idempotency_key,
            workspace_base,
            span_id,
            sampled,
            process_group: _,
            // Its run is gone; recovery decides the agent's fate.
            decision: _,
            report_seq,
        } = state;
        let held = matches!(
            view.status,
            AgentStatus::Running | AgentStatus::AwaitingApproval
        );
        if report_seq > 0 && runner == RunnerKind::Worker && held {
            self.held_report_seqs.insert(view.id, report_seq);
        }
        let id = view.id;
        if self.agents.contains_key(&id) || self.order.contains(seq) {
            return Err(Inconsistent(format!(
                "agent {id} (admission {seq}) appears twice"
            )));
        }
        view.tenant = self.intern(&view.tenant);
        view.agent = self.intern(&view.agent);
        view.model = self.intern(&view.model);
        // The bucket follows the current limits (they may have changed
        // while the server was down), as a SIGHUP reload would move it.
        let bucket = if view.status.is_terminal() {
            self.intern(&view.bucket)
        } else {
            self.bucket_for(&view.model.clone())
        };
        view.bucket = bucket;
        if status_is_queued_worker(&view, runner) {
            // Approved and waiting for its slots while a worker held the
            // run: that worker's session is gone, so it needs a new one.
            view.worker_id = None;
        }
        let parent_key = match (view.parent_id, view.lead_id.as_ref()) {
            (Some(p), _) => ParentKey::Agent(p),
            (None, Some(lead)) => ParentKey::Lead(view.tenant.clone(), lead.clone()),
            (None, None) => ParentKey::None,
        };
        let (status, background) = (view.status, view.background);
        if let Some(pid) = view.parent_id {
            if let Some(p) = self.agents.get_mut(&pid) {
                p.children.push(id);
            } else if !status.is_terminal() {
                // A retained parent is kept at least as long as a live child.
                return Err(Inconsistent(format!(
                    "live agent {id} has no parent record ({pid})"
                )));
            }
        }
        if let Some(k) = &idempotency_key {
            self.idempotency
                .insert((view.tenant.clone(), parent_key.clone(), k.clone()), id);
        }
        if !status.is_terminal() {
            if let Some(lead) = &view.lead_id {
                self.lead_live
                    .entry((view.tenant.clone(), lead.clone()))
                    .or_default()
                    .insert(id);
            }
        }
        if let Some(lead) = &view.lead_id {
            self.by_lead.insert(&view.tenant, lead, seq, id);
        }
        self.by_root.insert((view.root_id, seq), id);
        self.order.insert(&view.tenant, seq, id);
        self.stats.restored(&view.tenant, &view.bucket, status);
        let record = Record {
            view,
            seq,
            runner,
            prompt,
            timeout_ms: Record::timeout_ms(timeout),
            rare: Record::rare(Rare {
                steer_buffer,
                idempotency_key,
                workspace_base,
            }),
            run: None,
            children: Children::default(),
            span_id,
            sampled,
            span: None,
        };
        self.agents.insert(id, Box::new(record));
        if !status.is_terminal() {
            let tenant = self.agents[&id].view.tenant.clone();
            self.by_status.moved(&tenant, seq, id, None, status);
        }
        self.acquire(id, Held::of(status, background));
        if status == AgentStatus::Queued {
            let rec = &self.agents[&id];
            self.queue.push(seq, id, rec.sub_key());
        }
        Ok(())
    }

    /// The re-attach grace after a restart passed: each of `held` that no
    /// worker re-attached follows the worker-lost rules (queued again per
    /// `retry_on_worker_lost`, else FAILED `WORKER_LOST`). Returns how many
    /// it ended or re-queued.
    pub fn reattach_grace_passed(&mut self, held: &[AgentId]) -> usize {
        let mut dirty = Dirty::default();
        let mut n = 0;
        for &id in held {
            // Re-attached runs took theirs; the rest have no worker to
            // count for any more (a retry starts from 0).
            self.held_report_seqs.remove(&id);
            let Some(rec) = self.agents.get(&id) else {
                continue;
            };
            let live = matches!(
                rec.view.status,
                AgentStatus::Running | AgentStatus::AwaitingApproval
            );
            // Re-attached (a session holds it now) or already ended.
            if !live
                || rec
                    .view
                    .worker_id
                    .is_some_and(|w| self.workers.holds(w, id))
            {
                continue;
            }
            n += 1;
            self.lose_worker_run(id, &mut dirty, |n| {
                format!(
                    "no worker re-attached the run (attempt {n}) within [runs] \
                     worker_reattach_grace after a server restart"
                )
            });
        }
        self.drain(dirty);
        n
    }
}

fn status_is_queued_worker(view: &AgentView, runner: RunnerKind) -> bool {
    view.status == AgentStatus::Queued && runner == RunnerKind::Worker
}
