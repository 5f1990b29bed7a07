//! Change tracking for a durable store: which agents changed since the
//! writer last took the changes, and the lifecycle events published since.
//! Off (one branch per change) when the server keeps nothing.

use std::sync::Arc;

use super::{Core, Record};
use crate::scheduler::{
    durable::{AgentState, ChangeSet, LogPosition, ProcessGroup},
    events::Event,
    types::AgentId,
};

impl Core {
    /// Keeps every change from now on for [`Core::take_changes`].
    pub fn track_changes(&mut self) {
        self.unsaved.get_or_insert_with(Box::default);
        self.conversations.track_changes();
    }

    /// The ticket of the newest change (0 when nothing is tracked): a
    /// caller that waits until it is durable waits for everything it did.
    pub fn ticket(&self) -> u64 {
        self.unsaved.as_ref().map_or(0, |u| u.ticket)
    }

    /// Everything changed since the previous call, with the ticket of the
    /// newest change in it.
    pub fn take_changes(&mut self) -> (ChangeSet, u64) {
        let position = self.log_position();
        let Some(u) = self.unsaved.as_deref_mut() else {
            return (ChangeSet::default(), 0);
        };
        let ticket = u.ticket;
        let ids = std::mem::take(&mut u.agents);
        let removed = std::mem::take(&mut u.removed);
        let events = std::mem::take(&mut u.events);
        let (conversations, conversations_removed) = self.conversations.take_changes();
        let agents = ids
            .into_iter()
            .filter_map(|id| {
                let rec = self.agents.get(&id)?;
                // A worker run restored for re-attach keeps its number here
                // until its controls come back.
                let held = self.held_report_seqs.get(&id).copied();
                Some(state_of(rec, held))
            })
            .collect();
        (
            ChangeSet {
                agents,
                removed,
                events,
                position,
                conversations,
                conversations_removed,
            },
            ticket,
        )
    }

    /// The newest event sequence number issued.
    pub fn last_sequence(&self) -> u64 {
        self.events.last_sequence()
    }

    /// The event log's and admission's counters.
    pub(super) fn log_position(&self) -> LogPosition {
        LogPosition {
            last_sequence: self.events.last_sequence(),
            evicted_through: self.events.evicted_through(),
            next_admission: self.next_seq,
        }
    }

    /// `id`'s record changed.
    pub(super) fn changed(&mut self, id: AgentId) {
        if let Some(u) = self.unsaved.as_deref_mut() {
            u.agents.insert(id);
            u.ticket += 1;
        }
    }

    /// A lifecycle event was published about `event.agent`.
    pub(super) fn published(&mut self, event: Arc<Event>) {
        if let Some(u) = self.unsaved.as_deref_mut() {
            u.agents.insert(event.agent.id);
            u.events.push(event);
            u.ticket += 1;
        }
    }

    /// Retention removed `id`.
    pub(super) fn forgotten(&mut self, id: AgentId) {
        if let Some(u) = self.unsaved.as_deref_mut() {
            u.agents.remove(&id);
            u.removed.push(id);
            u.ticket += 1;
        }
    }

    /// Only the log's counters changed (a snapshot drew sequence numbers).
    pub(super) fn position_changed(&mut self) {
        if let Some(u) = self.unsaved.as_deref_mut() {
            u.ticket += 1;
        }
    }

    /// A command run started its program as process group `group`: kept
    /// with the run (and stored), so recovery can stop a program that
    /// outlived the server.
    pub fn record_process_group(&mut self, id: AgentId, group: ProcessGroup) {
        let Some(run) = self.agents.get_mut(&id).and_then(|r| r.run.as_mut()) else {
            return;
        };
        run.process_group = Some(group);
        self.changed(id);
    }

    /// Whether changes are tracked, and how many agents wait to be saved.
    pub fn unsaved_agents(&self) -> Option<usize> {
        self.unsaved.as_ref().map(|u| u.agents.len())
    }
}

/// What the store keeps of a record.
pub(super) fn state_of(rec: &Record, held_report_seq: Option<u64>) -> AgentState {
    AgentState {
        view: rec.view.clone(),
        seq: rec.seq,
        runner: rec.runner,
        prompt: rec.prompt.clone(),
        timeout: rec.timeout(),
        steer_buffer: rec.steer_buffer().to_vec(),
        idempotency_key: rec.idempotency_key().cloned(),
        workspace_base: rec.workspace_base().cloned(),
        span_id: rec.span_id,
        sampled: rec.sampled,
        process_group: rec.run.as_ref().and_then(|r| r.process_group),
        decision: rec.run.as_ref().and_then(|r| r.decision.clone()),
        report_seq: rec
            .run
            .as_ref()
            .map(|r| r.report_seq)
            .or(held_report_seq)
            .unwrap_or(0),
    }
}
