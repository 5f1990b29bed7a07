//! The lifecycle: the one transition function every state change goes
//! through, a run's own end (finish) and the server's (end_run), resuming
//! after an approval, retrying after a lost worker, and the ended-run
//! records handed out for logs and spans.

use std::{sync::Arc, time::SystemTime};

use super::{cancel::Cascade, Core, LIFECYCLE};
use crate::scheduler::{
    events::EventKind,
    queue::Dirty,
    state::{check_move, Held, InvalidMove},
    trace::{EndedRun, RunTrace, SpanEventKind, SpanRecord, SpanSink},
    types::*,
    workers::WorkerCommand,
};

impl Core {
    /// The one place an agent changes state: checks the move, moves slots
    /// by the difference between the two states, keeps the queue and the
    /// indexes in step, and publishes the event.
    pub(super) fn transition(
        &mut self,
        id: AgentId,
        to: AgentStatus,
        dirty: &mut Dirty,
    ) -> Result<(), InvalidMove> {
        let kind = match to {
            AgentStatus::Queued => EventKind::Queued,
            AgentStatus::Running => EventKind::Started,
            AgentStatus::AwaitingApproval => EventKind::AwaitingApproval,
            AgentStatus::Done => EventKind::Done,
            AgentStatus::Failed => EventKind::Failed,
            AgentStatus::Cancelled => EventKind::Cancelled,
        };
        self.transition_as(id, to, kind, dirty)
    }

    /// [`Core::transition`], publishing `kind` (e.g. RETRYING for a QUEUED
    /// that is a retry).
    fn transition_as(
        &mut self,
        id: AgentId,
        to: AgentStatus,
        kind: EventKind,
        dirty: &mut Dirty,
    ) -> Result<(), InvalidMove> {
        let rec = self.agents.get(&id).expect("transition of a known agent");
        let from = rec.view.status;
        check_move(from, to)?;
        let bg = rec.view.background;
        let (before, after) = (Held::of(from, bg), Held::of(to, bg));
        let released = Held {
            global: before.global && !after.global,
            bucket: before.bucket && !after.bucket,
            parent: before.parent && !after.parent,
            tree: before.tree && !after.tree,
        };
        let acquired = Held {
            global: after.global && !before.global,
            bucket: after.bucket && !before.bucket,
            parent: after.parent && !before.parent,
            tree: after.tree && !before.tree,
        };
        self.release(id, released, dirty);
        self.acquire(id, acquired);

        let rec = self.agents.get_mut(&id).expect("known agent");
        if from == AgentStatus::Queued {
            let key = rec.sub_key();
            self.queue.remove(rec.seq, &key);
        }
        if to == AgentStatus::Queued {
            let key = rec.sub_key();
            self.queue.push(rec.seq, id, key);
        }
        rec.view.status = to;
        self.by_status
            .moved(&rec.view.tenant, rec.seq, id, Some(from), to);
        self.stats
            .moved(&rec.view.tenant, &rec.view.bucket, from, to);
        if to != AgentStatus::AwaitingApproval {
            rec.view.approval = None;
        }
        if to.is_terminal() {
            let now = SystemTime::now();
            rec.view.finished_at = Some(now);
            if let Some(ran) = rec.view.started_at.and_then(|s| now.duration_since(s).ok()) {
                self.stats.ended(&rec.view.tenant, &rec.view.bucket, ran);
            }
            if let (AgentStatus::Cancelled, Some(span)) = (to, rec.span.as_mut()) {
                let reason = rec
                    .view
                    .error
                    .as_ref()
                    .map_or_else(|| Arc::from("cancelled"), |e| Arc::from(&*e.message));
                span.push(now, SpanEventKind::Cancelled { reason });
            }
            rec.prompt = None;
            if let Some(rare) = rec.rare.as_mut() {
                rare.steer_buffer = Vec::new();
            }
            if let Some(run) = rec.run.take() {
                run.cancel.cancel();
                // A run that ended without a result keeps what it output.
                if to != AgentStatus::Done && !run.output.is_empty() {
                    rec.view.result = run.output.into();
                }
            }
            // Ended here (cancel, deadline, parent ended) while a worker
            // still holds the run: tell it to stop; its capacity stays taken
            // until it confirms or the grace passes. The agent itself no
            // longer has a worker.
            if let Some(worker) = rec.view.worker_id.take() {
                if self.workers.holds(worker, id) {
                    let reason = rec
                        .view
                        .error
                        .as_ref()
                        .map_or_else(|| "run stopped".to_owned(), |e| e.message.to_string());
                    self.workers.send(
                        worker,
                        WorkerCommand::Cancel {
                            agent_id: id,
                            reason,
                        },
                    );
                    self.grace_timers.push((worker, id, self.runs.cancel_grace));
                }
            }
            if let Some(lead) = rec.view.lead_id.clone() {
                let key = (rec.view.tenant.clone(), lead);
                if let Some(set) = self.lead_live.get_mut(&key) {
                    set.remove(&id);
                    if set.is_empty() {
                        self.lead_live.remove(&key);
                    }
                }
            }
            self.finished.push_back((now, id));
            let rec = &self.agents[&id];
            let (error, output) = (rec.view.error.clone(), rec.view.result.clone());
            let workspace = rec.view.workspace.clone();
            self.conversations
                .end(id, to, error, workspace, output, now);
        }
        if to.is_settled() {
            if let Some(waiters) = self.waiters.remove(&id) {
                for w in waiters {
                    w.notify_one();
                }
            }
            self.wake_inbox(id);
        }
        self.publish(id, kind);
        if to.is_terminal() {
            self.note_ended(id);
        }
        Ok(())
    }

    /// Queues an ended agent for its log line and, when its span is
    /// recorded and sampled, its span export; both happen outside the lock.
    fn note_ended(&mut self, id: AgentId) {
        let rec = self.agents.get_mut(&id).expect("known agent");
        let context = rec.trace_context();
        let trace = match rec.span.as_mut() {
            Some(span) if context.sampled => Some(RunTrace {
                context,
                span: SpanRecord {
                    events: std::mem::take(&mut span.events),
                    ..(**span).clone()
                },
            }),
            _ => None,
        };
        if trace.is_some() || tracing::enabled!(target: LIFECYCLE, tracing::Level::INFO) {
            let agent = rec.view.clone();
            self.ended.push(EndedRun { agent, trace });
        }
    }

    /// Agents that ended since the last call (see [`Core::note_ended`]).
    pub fn take_ended(&mut self) -> Vec<EndedRun> {
        std::mem::take(&mut self.ended)
    }

    /// The span sink, for exporting what [`Core::take_ended`] returned.
    pub fn span_sink(&self) -> Option<&Arc<dyn SpanSink>> {
        self.span_sink.as_ref()
    }

    /// The run ended on its own: DONE with a result, or FAILED. Reports
    /// for agents that already ended (cancelled, timed out) are ignored.
    pub fn finish(&mut self, id: AgentId, outcome: Result<String, AgentError>) -> bool {
        let mut dirty = Dirty::default();
        let finished = self.finish_into(id, outcome, &mut dirty);
        self.drain(dirty);
        finished
    }

    /// [`Core::finish`] without the drain: the limits it frees go into
    /// `dirty`. For callers that end or requeue several runs in one step
    /// and must drain once, after all of them: a drain in between could
    /// start a newer agent ahead of an older one waiting for a limit that
    /// an earlier run of the same step freed.
    pub(super) fn finish_into(
        &mut self,
        id: AgentId,
        outcome: Result<String, AgentError>,
        dirty: &mut Dirty,
    ) -> bool {
        let Some(rec) = self.agents.get_mut(&id) else {
            return false;
        };
        if rec.view.status.is_terminal() {
            return false;
        }
        let to = match outcome {
            Ok(result) => {
                rec.view.result = if result.is_empty() {
                    self.empty.clone()
                } else {
                    result.into()
                };
                AgentStatus::Done
            }
            Err(error) => {
                let retryable = rec.run.as_ref().is_some_and(|r| r.retryable);
                if let Some(next) = retryable.then(|| self.fallback_model(id)).flatten() {
                    self.fall_back(id, next, error, dirty);
                    return false;
                }
                let rec = self.agents.get_mut(&id).expect("known agent");
                rec.view.error = Some(error);
                AgentStatus::Failed
            }
        };
        if self.transition(id, to, dirty).is_err() {
            return false;
        }
        self.cascade(id, Cascade::SkipDetached, dirty, &mut Vec::new());
        true
    }

    /// Ends a live run from the server's side (circuit breaker, stale):
    /// like a failure reported by the run, it cancels the non-detached
    /// descendants.
    pub(super) fn end_run(&mut self, id: AgentId, to: AgentStatus, error: AgentError) -> bool {
        let Some(rec) = self.agents.get_mut(&id) else {
            return false;
        };
        if rec.view.status.is_terminal() {
            return false;
        }
        rec.view.error = Some(error);
        let mut dirty = Dirty::default();
        if self.transition(id, to, &mut dirty).is_err() {
            return false;
        }
        self.cascade(id, Cascade::SkipDetached, &mut dirty, &mut Vec::new());
        self.drain(dirty);
        true
    }

    /// An approval was decided: AWAITING_APPROVAL → back in its bucket's
    /// queue at its original admission sequence (ahead of newer agents), or
    /// straight to RUNNING when its limits have room.
    pub fn resume(&mut self, id: AgentId) -> bool {
        let Some(rec) = self.agents.get(&id) else {
            return false;
        };
        if rec.view.status != AgentStatus::AwaitingApproval {
            return false;
        }
        let (bucket, parent) = (rec.view.bucket.clone(), rec.parent_key());
        let mut dirty = Dirty::default();
        if !rec.view.background || (self.bucket_has_room(&bucket) && self.parent_has_room(&parent))
        {
            self.start(id, &mut dirty);
        } else if self
            .transition(id, AgentStatus::Queued, &mut dirty)
            .is_err()
        {
            return false;
        }
        self.drain(dirty);
        true
    }

    /// Queues the run for another attempt while `attempt ≤ retries`, else
    /// ends it FAILED with `code` and `message(attempt)`. True if retried.
    pub(super) fn retry_or_fail(
        &mut self,
        id: AgentId,
        retries: u32,
        code: &str,
        dirty: &mut Dirty,
        message: impl FnOnce(u32) -> String,
    ) -> bool {
        let attempt = self.agents[&id].view.attempt;
        let error = AgentError::new(code, message(attempt));
        if attempt <= retries {
            self.retry(id, error, dirty);
            true
        } else {
            self.finish_into(id, Err(error), dirty);
            false
        }
    }

    /// The model after `id`'s current one in its type's `fallback_models`
    /// (the first one while it runs on the model it was spawned with);
    /// None when the chain is exhausted.
    fn fallback_model(&self, id: AgentId) -> Option<Arc<str>> {
        let rec = &self.agents[&id];
        let chain = &self.agent_types.get(&*rec.view.agent)?.fallback_models;
        let next = match chain.iter().position(|m| **m == *rec.view.model) {
            Some(i) => chain.get(i + 1)?,
            None if rec.view.attempts.is_none() => chain.first()?,
            // Spawned on a model of the chain and already moved past it?
            // Only forward: the ended attempts name every model tried.
            None => chain.iter().find(|m| {
                !rec.view
                    .attempts
                    .iter()
                    .flat_map(|a| &a.ended)
                    .any(|x| *x.model == ***m)
            })?,
        };
        Some(next.as_str().into())
    }

    /// A run failed with a retryable provider error and its type has a
    /// model left in `fallback_models`: the attempt ends with `error` and
    /// the agent moves to `model` — back to QUEUED with a RETRYING event
    /// (it may start at once in the drain), in that model's bucket at its
    /// original place in line, keeping its global and tree slots and its
    /// conversation.
    fn fall_back(&mut self, id: AgentId, model: Arc<str>, error: AgentError, dirty: &mut Dirty) {
        self.end_attempt(id, error);
        let model = self.intern(&model);
        let bucket = self.bucket_for(&model);
        // The running slot moves to the new bucket first, so the move to
        // QUEUED gives back a slot of the bucket the agent now waits in.
        let old = self.agents[&id].view.bucket.clone();
        if !self.bucket_has_room(&old) {
            dirty.bucket(&old);
        }
        self.move_bucket(id, bucket.clone());
        self.agents.get_mut(&id).expect("known agent").view.model = model;
        self.requeue(id, dirty);
        let rec = &self.agents[&id];
        if !rec.view.background && rec.needs_worker().is_none() {
            // A foreground agent bypasses bucket limits, so no drain would
            // look for it: it starts again at once (as after an approval).
            self.start(id, dirty);
        } else {
            // Its new bucket's queue is walked even if that bucket had room.
            dirty.bucket(&bucket);
        }
    }

    /// A worker run lost its worker (the session ended, or nobody
    /// re-attached it after a restart): another attempt per the type's
    /// `retry_on_worker_lost`, else FAILED `WORKER_LOST` with `message`.
    /// True if retried.
    pub(super) fn lose_worker_run(
        &mut self,
        id: AgentId,
        dirty: &mut Dirty,
        message: impl FnOnce(u32) -> String,
    ) -> bool {
        let retries = self
            .agent_types
            .get(&*self.agents[&id].view.agent)
            .map_or(0, |t| t.retry_on_worker_lost);
        self.retry_or_fail(id, retries, CODE_WORKER_LOST, dirty, message)
    }

    /// Queues a run for another attempt (its worker was lost, a restart
    /// interrupted it, or it falls back to another model), ahead of newer
    /// agents (it keeps its admission sequence). The attempt that ended
    /// with `error` is kept in the agent's attempts.
    pub(super) fn retry(&mut self, id: AgentId, error: AgentError, dirty: &mut Dirty) {
        self.end_attempt(id, error);
        self.requeue(id, dirty);
    }

    /// Ends the current attempt of `id` with `error`: its run is stopped
    /// without a report and the attempt is kept in the agent's attempts.
    fn end_attempt(&mut self, id: AgentId, error: AgentError) {
        let rec = self.agents.get_mut(&id).expect("known agent");
        if let Some(run) = rec.run.take() {
            // Ends this attempt's run task without a report.
            run.cancel.cancel();
        }
        if rec.view.has_current_attempt() {
            let ended = Attempt {
                model: rec.view.model.clone(),
                error,
                started_at: rec.view.attempt_started_at(),
                ended_at: SystemTime::now(),
            };
            let attempts = Arc::make_mut(rec.view.attempts.get_or_insert_with(Default::default));
            attempts.ended.push(ended);
            attempts.current_started_at = None;
        }
    }

    /// Puts `id`, whose attempt ended, back in its queue for the next one.
    /// The next attempt counts from here: the RETRYING event and Status
    /// show it (not started yet) after the ended ones.
    fn requeue(&mut self, id: AgentId, dirty: &mut Dirty) {
        let rec = self.agents.get_mut(&id).expect("known agent");
        let worker_key = (rec.view.tenant.clone(), rec.view.agent.clone());
        rec.view.attempt += 1;
        if let Some(span) = rec.span.as_mut() {
            let attempt = rec.view.attempt;
            span.push(SystemTime::now(), SpanEventKind::Retrying { attempt });
        }
        if rec.view.status == AgentStatus::Queued {
            // Approved and waiting for a slot: it stays queued, now also
            // for a worker (its queue key changes with that).
            self.queue.remove(rec.seq, &rec.sub_key());
            rec.view.worker_id = None;
            self.queue.push(rec.seq, id, rec.sub_key());
            self.publish(id, EventKind::Retrying);
        } else {
            rec.view.worker_id = None;
            rec.view.approval = None;
            if self
                .transition_as(id, AgentStatus::Queued, EventKind::Retrying, dirty)
                .is_err()
            {
                return;
            }
        }
        // Not started here even if a worker has room: the drain starts the
        // earliest eligible agent, which may be an older one that waits for
        // the bucket slot this run just gave back.
        dirty.worker_type(&worker_key);
    }
}
