//! What a live run reports: output, tool calls (and their circuit
//! breakers), usage, and the progress clock the stale watch reads.

use std::{sync::Arc, time::Duration};

use super::Core;
use crate::scheduler::{
    events::{EventKind, Progress},
    types::*,
};

impl Core {
    /// Appends a chunk of output to the agent's result while it runs, and
    /// publishes it as an OUTPUT event if anyone watches progress.
    pub fn append_output(&mut self, id: AgentId, chunk: &str) {
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        let Some(run) = rec.run.as_mut() else {
            return;
        };
        if rec.view.status.is_terminal() {
            return;
        }
        // An empty chunk is a worker's "still working" (see `RunEvent`).
        run.progress.touch();
        if chunk.is_empty() {
            return;
        }
        run.output.push_str(chunk);
        if self.events.wants_progress() {
            // The record's own view has no result while it runs: progress
            // events carry the chunk, not the whole output again.
            let view = rec.view.clone();
            self.events
                .publish_progress(Progress::Output(chunk.into()), view);
            self.position_changed();
        }
    }

    /// Counts a tool call the run made, publishes it as a TOOL_CALL event
    /// if anyone watches progress, and trips the circuit breakers: past
    /// `[runs] max_tool_calls`, or `max_identical_tool_calls` identical calls
    /// in a row, the run is cancelled with CIRCUIT_BREAKER.
    pub fn record_tool_call(&mut self, id: AgentId, name: &str, input_digest: &str) {
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        if rec.view.status.is_terminal() {
            return;
        }
        let Some(run) = rec.run.as_mut() else {
            return;
        };
        run.progress.touch();
        let same = run
            .last_call
            .as_ref()
            .is_some_and(|(n, d)| **n == *name && **d == *input_digest);
        if same {
            run.identical_calls += 1;
        } else {
            run.last_call = Some((name.into(), input_digest.into()));
            run.identical_calls = 1;
        }
        let identical = run.identical_calls;
        let total = rec.view.usage.tool_calls + 1;
        self.conversations.record(
            id,
            crate::scheduler::conversation::EntryKind::ToolCall,
            name.into(),
            std::time::SystemTime::now(),
        );
        // Counted first, so the TOOL_CALL event shows the agent after it.
        self.add_usage(
            id,
            Usage {
                tool_calls: 1,
                ..Usage::default()
            },
        );
        if self.events.wants_progress() {
            let view = self.agents[&id].view.clone();
            self.events.publish_progress(
                Progress::ToolCall {
                    name: name.into(),
                    input_digest: input_digest.into(),
                },
                view,
            );
            self.position_changed();
        }
        let (max_total, max_identical) =
            (self.runs.max_tool_calls, self.runs.max_identical_tool_calls);
        let tripped = if max_total != 0 && total > max_total {
            Some(format!(
                "circuit breaker: {total} tool calls exceed [runs] max_tool_calls = {max_total}"
            ))
        } else if max_identical != 0 && identical > max_identical {
            Some(format!(
                "circuit breaker: {identical} identical calls in a row to tool \"{name}\" exceed \
                 [runs] max_identical_tool_calls = {max_identical}"
            ))
        } else {
            None
        };
        if let Some(message) = tripped {
            let error = AgentError::new(CODE_CIRCUIT_BREAKER, message);
            self.end_run(id, AgentStatus::Cancelled, error);
        }
    }

    /// Adds to the agent's usage while it runs, and to the total usage of
    /// the agent and each of its ancestors.
    pub fn add_usage(&mut self, id: AgentId, usage: Usage) {
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        if rec.view.status.is_terminal() {
            return;
        }
        if let Some(run) = &rec.run {
            run.progress.touch();
        }
        add_to(&mut rec.view.usage, usage);
        let mut next = Some(id);
        while let Some(ancestor) = next {
            let Some(rec) = self.agents.get_mut(&ancestor) else {
                break;
            };
            add_to(&mut rec.view.total_usage, usage);
            next = rec.view.parent_id;
            self.changed(ancestor);
        }
    }

    /// The run is working without reporting anything that counts as
    /// progress (e.g. output past its cap): it is not stale.
    pub fn touch_progress(&mut self, id: AgentId) {
        if let Some(run) = self.agents.get(&id).and_then(|r| r.run.as_ref()) {
            run.progress.touch();
        }
    }

    /// The stale watch of a run woke: if the agent is RUNNING and its run
    /// reported nothing for `[runs] stale_timeout`, it fails with STALE.
    /// Otherwise returns when to look again (None: stop watching).
    pub fn check_stale(&mut self, id: AgentId) -> Option<tokio::time::Instant> {
        let timeout = self.runs.stale_timeout;
        let rec = self.agents.get(&id)?;
        // No run (ended, or a retry replaced it): its task is being stopped.
        let run = rec.run.as_ref()?;
        if rec.view.status.is_terminal() {
            return None;
        }
        let now = tokio::time::Instant::now();
        if timeout.is_zero() {
            // Turned off by a reload: look again in a day, in case it is
            // turned back on.
            return Some(now + Duration::from_secs(86_400));
        }
        if rec.view.status != AgentStatus::Running {
            // Waiting for a decision or a slot: not the run's fault.
            run.progress.touch();
            return Some(now + timeout);
        }
        let due = run.progress.last() + timeout;
        if now < due {
            return Some(due);
        }
        let error = AgentError::new(
            CODE_STALE,
            format!(
                "the run reported nothing (output, tool call, usage) for {}; [runs] stale_timeout",
                humantime::format_duration(timeout)
            ),
        );
        self.end_run(id, AgentStatus::Failed, error);
        None
    }

    /// The run of `id` starts a turn. With `[agents.NAME] max_turns` set,
    /// the first turn past it gets the type's wrap-up message as input (a
    /// worker gets it as a steer when turn `max_turns` starts, to read as
    /// its next turn's input), and a turn past `max_turns + grace_turns`
    /// ends the run FAILED `TURN_LIMIT`, its output so far kept as the
    /// result.
    pub fn turn_started(&mut self, id: AgentId) -> TurnVerdict {
        let Some(rec) = self.agents.get_mut(&id) else {
            return TurnVerdict::Stop;
        };
        let Some(run) = rec.run.as_mut() else {
            return TurnVerdict::Go;
        };
        if rec.view.status != AgentStatus::Running {
            // Ending, or waiting for an approval.
            return TurnVerdict::Go;
        }
        run.progress.touch();
        run.turns += 1;
        let turn = run.turns;
        let (agent, worker) = (rec.view.agent.clone(), rec.view.worker_id);
        let on_worker = rec.runner == crate::config::RunnerKind::Worker;
        let Some(cfg) = self.agent_types.get(&*agent) else {
            return TurnVerdict::Go;
        };
        let (max, grace) = (cfg.max_turns(), cfg.grace_turns());
        if max == 0 {
            return TurnVerdict::Go;
        }
        let message: Arc<str> = cfg.wrap_up_message().into();
        if u64::from(turn) > u64::from(max) + u64::from(grace) {
            let error = AgentError::new(
                CODE_TURN_LIMIT,
                format!(
                    "the run was still going after {} turns: [agents.{agent}] max_turns = {max} \
                     plus grace_turns = {grace}",
                    turn - 1,
                ),
            );
            self.end_run(id, AgentStatus::Failed, error);
            return TurnVerdict::Stop;
        }
        let now = std::time::SystemTime::now();
        let steer = crate::scheduler::conversation::EntryKind::Steer;
        match (on_worker, worker) {
            (true, Some(worker)) if turn == max => {
                self.workers.send(
                    worker,
                    crate::scheduler::workers::WorkerCommand::Steer {
                        agent_id: id,
                        message: message.to_string(),
                    },
                );
                self.conversations.record(id, steer, message, now);
                TurnVerdict::Go
            }
            (false, _) if turn == max + 1 => {
                self.conversations.record(id, steer, message.clone(), now);
                TurnVerdict::WrapUp(message)
            }
            _ => TurnVerdict::Go,
        }
    }

    /// The failure `id`'s run is about to report is a retryable provider
    /// error (see `RunReporter::retryable_failure`).
    pub fn mark_retryable(&mut self, id: AgentId) {
        if let Some(run) = self.agents.get_mut(&id).and_then(|r| r.run.as_mut()) {
            run.retryable = true;
        }
    }

    /// A run's workspace was saved: the agent shows it from now on. Saved
    /// after the agent ended (a stopped run), it is announced with a
    /// WORKSPACE_SAVED event.
    pub fn set_workspace(&mut self, id: AgentId, workspace: Workspace) {
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        let workspace = Arc::new(workspace);
        rec.view.workspace = Some(workspace.clone());
        let ended = rec.view.status.is_terminal();
        self.changed(id);
        if ended {
            self.conversations.set_workspace(id, &workspace);
            self.publish(id, EventKind::WorkspaceSaved);
        }
    }

    /// A run reported its own session (a worker's, a program's session
    /// id): the run that continues `id` gets it back.
    pub fn set_session(&mut self, id: AgentId, session: Option<String>) {
        if let Some(session) = session.filter(|s| !s.is_empty()) {
            self.conversations.set_session(id, session.into());
        }
    }
}

fn add_to(total: &mut Usage, more: Usage) {
    total.input_tokens += more.input_tokens;
    total.output_tokens += more.output_tokens;
    total.tool_calls += more.tool_calls;
}
