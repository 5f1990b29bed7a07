//! The lifecycle event log behind WatchAgents: server-wide sequence numbers,
//! a bounded history for `after_sequence` replay, and a broadcast fan-out.
//!
//! Publishing never waits: `broadcast::Sender::send` overwrites the oldest
//! slot of its ring, and a subscriber that falls more than the ring's size
//! behind learns it on its next receive (`Lagged`) and is cut off by the
//! API layer with the sequence to resume after. So a slow subscriber costs
//! the scheduler nothing.

use std::{
    collections::VecDeque,
    sync::{Arc, OnceLock},
    time::SystemTime,
};

use bytes::Bytes;

use tokio::sync::broadcast;

use super::types::{AgentFilter, AgentView};

/// What happened to an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// State at subscription time.
    Snapshot,
    /// Queued for a slot.
    Queued,
    /// Run started or resumed.
    Started,
    /// Steer message delivered to the running run.
    Steered,
    /// Paused for approval.
    AwaitingApproval,
    /// Finished.
    Done,
    /// Failed.
    Failed,
    /// Cancelled.
    Cancelled,
    /// Queued again after its worker was lost.
    Retrying,
    /// Progress: output (see [`Event::progress`]).
    Output,
    /// Progress: a tool call (see [`Event::progress`]).
    ToolCall,
}

/// What a progress event reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// A chunk of output.
    Output(Arc<str>),
    /// A tool call.
    ToolCall {
        /// Tool name.
        name: Arc<str>,
        /// Digest of the call's input; may be empty.
        input_digest: Arc<str>,
    },
}

/// One event: the agent as it is after the event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Server-wide, strictly increasing, from 1.
    pub sequence: u64,
    /// What happened.
    pub kind: EventKind,
    /// The agent after the event (without its result for progress events).
    pub agent: AgentView,
    /// The payload of a progress event.
    pub progress: Option<Progress>,
    /// When the event happened (fixes `elapsed_ms` in what subscribers see,
    /// however late they receive it).
    pub at: SystemTime,
    /// The event's wire encoding, made once by the first subscriber that
    /// sends it and shared by all others (the scheduler never fills it).
    pub wire: OnceLock<Bytes>,
}

impl Event {
    fn new(sequence: u64, kind: EventKind, agent: AgentView) -> Self {
        Self {
            sequence,
            kind,
            agent,
            progress: None,
            at: SystemTime::now(),
            wire: OnceLock::new(),
        }
    }
}

/// Sequence numbering, history and fan-out. Owned by the scheduler core,
/// so events are numbered in the order the core applies transitions.
#[derive(Debug)]
pub struct EventLog {
    next: u64,
    history: VecDeque<Arc<Event>>,
    capacity: usize,
    /// Highest sequence number no longer in `history`; replay from below it
    /// would miss events.
    evicted_through: u64,
    /// Lifecycle events, for subscribers that did not ask for progress.
    tx: broadcast::Sender<Arc<Event>>,
    /// Lifecycle and progress events, for subscribers that asked for
    /// progress. A separate ring, so a burst of output never fills the
    /// buffer of a subscriber that will not receive it; with no such
    /// subscriber, sends to it cost a receiver-count check and progress is
    /// not even built.
    tx_progress: broadcast::Sender<Arc<Event>>,
}

/// What a new subscriber starts with, taken atomically with its receiver so
/// nothing falls between the two.
#[derive(Debug)]
pub struct Subscription {
    /// Snapshot or replayed events, in sequence order.
    pub initial: Vec<Arc<Event>>,
    /// Live events published after the subscription.
    pub live: broadcast::Receiver<Arc<Event>>,
    /// Newest sequence number at subscription: every event up to it is
    /// covered by `initial` (or was not asked for).
    pub position: u64,
}

impl EventLog {
    /// A log keeping `history` events, fanning out through a ring of
    /// `subscriber_buffer` events per subscriber.
    pub fn new(history: usize, subscriber_buffer: usize) -> Self {
        Self {
            next: 1,
            history: VecDeque::with_capacity(history.min(1024)),
            capacity: history.max(1),
            evicted_through: 0,
            tx: broadcast::channel(subscriber_buffer.max(1)).0,
            tx_progress: broadcast::channel(subscriber_buffer.max(1)).0,
        }
    }

    /// Open subscriptions (WatchAgents streams).
    pub fn subscriber_count(&self) -> usize {
        self.tx.receiver_count() + self.tx_progress.receiver_count()
    }

    /// Whether some subscriber wants progress events.
    pub fn wants_progress(&self) -> bool {
        self.tx_progress.receiver_count() > 0
    }

    /// Numbers and broadcasts one progress event. Not kept in the history:
    /// progress is live only, and a chatty run must not push lifecycle
    /// events out of the replay window.
    pub fn publish_progress(&mut self, progress: Progress, agent: AgentView) {
        let kind = match progress {
            Progress::Output(_) => EventKind::Output,
            Progress::ToolCall { .. } => EventKind::ToolCall,
        };
        let mut event = Event::new(self.take_sequence(), kind, agent);
        event.progress = Some(progress);
        let _ = self.tx_progress.send(Arc::new(event));
    }

    /// Numbers, records and broadcasts one event.
    pub fn publish(&mut self, kind: EventKind, agent: AgentView) {
        let event = Arc::new(Event::new(self.take_sequence(), kind, agent));
        if self.history.len() == self.capacity {
            if let Some(old) = self.history.pop_front() {
                self.evicted_through = old.sequence;
            }
        }
        self.history.push_back(event.clone());
        // No receivers is not an error: nobody is watching.
        if self.tx_progress.receiver_count() > 0 {
            let _ = self.tx_progress.send(event.clone());
        }
        let _ = self.tx.send(event);
    }

    fn take_sequence(&mut self) -> u64 {
        let seq = self.next;
        self.next += 1;
        seq
    }

    /// The sequence of the newest event (0 before the first).
    pub fn last_sequence(&self) -> u64 {
        self.next - 1
    }

    /// Whether the retained history holds every event after
    /// `after_sequence`. A sequence this server never issued (from before a
    /// restart) cannot be replayed either.
    pub fn can_replay_after(&self, after_sequence: u64) -> bool {
        after_sequence >= self.evicted_through && after_sequence <= self.last_sequence()
    }

    /// Subscribes.
    ///
    /// - `snapshot = Some(agents)`: one SNAPSHOT per agent (already
    ///   filtered, oldest first), then live. The caller passes it when
    ///   `include_snapshot` is set, or when `after_sequence > 0` but
    ///   [`EventLog::can_replay_after`] is false.
    /// - otherwise, `after_sequence > 0`: the retained events after it, then
    ///   live.
    /// - otherwise: live events only.
    ///
    /// Snapshot events draw fresh sequence numbers so every stream stays
    /// strictly increasing and resumable.
    pub fn subscribe(
        &mut self,
        filter: &AgentFilter,
        after_sequence: u64,
        snapshot: Option<Vec<AgentView>>,
        include_progress: bool,
    ) -> Subscription {
        let live = if include_progress {
            self.tx_progress.subscribe()
        } else {
            self.tx.subscribe()
        };
        let initial = if let Some(agents) = snapshot {
            agents
                .into_iter()
                .map(|agent| Arc::new(Event::new(self.take_sequence(), EventKind::Snapshot, agent)))
                .collect()
        } else if after_sequence > 0 {
            let start = self
                .history
                .partition_point(|e| e.sequence <= after_sequence);
            self.history
                .range(start..)
                .filter(|e| filter.matches(&e.agent))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        Subscription {
            initial,
            live,
            position: self.last_sequence(),
        }
    }
}
