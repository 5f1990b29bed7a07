//! Durable state in domain terms: what the core hands a store after a
//! change, and what recovery hands back. The core never sees a store; the
//! `store` module converts these to rows and back.

use std::{sync::Arc, time::Duration};

use crate::config::RunnerKind;

use uuid::Uuid;

pub use super::events::LogPosition;
use super::{
    conversation::{Conversation, ConversationId},
    events::Event,
    types::{AgentView, ApprovalOutcome},
    AgentId,
};

/// Everything needed to rebuild an agent's record after a restart: its
/// public view plus what the core keeps beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentState {
    /// The agent as Status shows it.
    pub view: AgentView,
    /// Admission sequence: FIFO order among queued agents, creation order.
    pub seq: u64,
    /// Which runner executes it.
    pub runner: RunnerKind,
    /// The prompt, until the agent ends.
    pub prompt: Option<Arc<str>>,
    /// The run deadline it was admitted with.
    pub timeout: Duration,
    /// Steer messages not yet handed to a run.
    pub steer_buffer: Vec<String>,
    /// Deduplication key of its Spawn.
    pub idempotency_key: Option<Arc<str>>,
    /// Its Spawn's `workspace_base`.
    pub workspace_base: Option<Arc<str>>,
    /// The run's span id in `view.trace_id`, and whether it is sampled.
    pub span_id: u64,
    /// Whether the run's trace is sampled.
    pub sampled: bool,
    /// The process group of a live command run, so that recovery can stop
    /// a program that outlived a crash of the server.
    pub process_group: Option<ProcessGroup>,
    /// An approval decided while the agent waits QUEUED for the slots to
    /// run again, with the approval's id: its run is paused, and receives
    /// the decision when it resumes. Recovery uses it to tell such a run
    /// (interrupted by a restart) from an agent that has not started.
    pub decision: Option<(Uuid, ApprovalOutcome)>,
    /// The highest numbered report of a worker run applied (see
    /// `RunEvent.seq`).
    pub report_seq: u64,
}

/// A command run's process group, as the runner recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGroup {
    /// The group id (the program's pid; it leads the group).
    pub pgid: i32,
    /// The leader's start time (`/proc/PID/stat` field 22, clock ticks
    /// since boot): tells the program from a later process given the same
    /// pid.
    pub start_ticks: u64,
}

/// What changed since the previous change set, in the order it happened.
#[derive(Debug, Default)]
pub struct ChangeSet {
    /// Agents whose state changed: their state now (one entry per agent).
    pub agents: Vec<AgentState>,
    /// Agents retention removed.
    pub removed: Vec<AgentId>,
    /// Lifecycle events published, in sequence order (progress events are
    /// live only and never stored).
    pub events: Vec<Arc<Event>>,
    /// The log's counters after the change.
    pub position: LogPosition,
    /// Conversations whose transcript changed: each one's row
    /// ([`super::conversation::row`]), whole, as it is now (one entry per
    /// conversation).
    pub conversations: Vec<(ConversationId, Vec<u8>)>,
    /// Conversations retention removed.
    pub conversations_removed: Vec<ConversationId>,
}

impl ChangeSet {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
            && self.removed.is_empty()
            && self.events.is_empty()
            && self.conversations.is_empty()
            && self.conversations_removed.is_empty()
    }
}

/// A store's contents, as recovery reads them.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Every retained agent, in admission order.
    pub agents: Vec<AgentState>,
    /// The retained lifecycle events, in sequence order.
    pub events: Vec<Event>,
    /// The log's counters as last committed.
    pub position: LogPosition,
    /// Every retained conversation as last written (a live agent's own
    /// turn may be missing: it is written when the turn ends).
    pub conversations: Vec<Conversation>,
}
