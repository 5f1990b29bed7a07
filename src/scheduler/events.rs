//! The lifecycle event log behind WatchAgents: server-wide sequence numbers,
//! a bounded history for `after_sequence` replay, and the fan-out.
//!
//! Two fan-outs, by what a subscriber filters on:
//! - Filtered by agent ids, parent, root, lead or tenant: *routed*. Each
//!   such subscriber has a bounded queue of its own, registered under one
//!   route key (see [`route_of`]); publishing looks up the event's five keys and
//!   pushes only to the subscribers registered there whose filter matches.
//!   So an event costs O(subscribers it matches), not O(subscribers), and
//!   a subscriber's buffer counts only the events routed to it.
//! - Unfiltered (or by status only: an admin watching every tenant): a
//!   `broadcast` ring, one O(1) send per event whatever the number of such
//!   subscribers; each filters on read.
//!
//! Publishing never waits either way: the ring overwrites its oldest slot,
//! and a full routed queue stops taking events and counts what it missed.
//! A subscriber that fell behind learns it once it has read what it was
//! sent (`Lagged`) and is cut off by the API layer with the sequence to
//! resume after. So a slow subscriber costs the scheduler nothing.

use std::{
    collections::VecDeque,
    sync::{Arc, OnceLock},
    time::SystemTime,
};

use bytes::Bytes;
use foldhash::HashMap;
use tokio::sync::{
    broadcast::{
        self,
        error::{RecvError, TryRecvError},
    },
    Notify,
};

use super::types::{AgentFilter, AgentId, AgentView};

/// The watch log's counters, durable beside the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogPosition {
    /// Newest sequence number issued (0 before the first).
    pub last_sequence: u64,
    /// Highest sequence no longer retained: replay only after it.
    pub evicted_through: u64,
    /// The admission sequence the next Spawn gets.
    pub next_admission: u64,
}

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
    /// A stopped run's workspace was saved after its terminal event.
    WorkspaceSaved,
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

    /// An event as a store kept it (lifecycle events only, so no progress).
    pub fn recovered(sequence: u64, kind: EventKind, agent: AgentView, at: SystemTime) -> Self {
        Self {
            at,
            ..Self::new(sequence, kind, agent)
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
    /// Filtered subscribers, by route key.
    routes: Routes,
    /// Events a routed subscriber may hold unread.
    subscriber_buffer: usize,
}

/// What a new subscriber starts with, taken atomically with its receiver so
/// nothing falls between the two.
#[derive(Debug)]
pub struct Subscription {
    /// Snapshot or replayed events, in sequence order.
    pub initial: Vec<Arc<Event>>,
    /// Live events published after the subscription.
    pub live: Live,
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
            routes: Routes::default(),
            subscriber_buffer: subscriber_buffer.max(1),
        }
    }

    /// Open subscriptions (WatchAgents streams).
    pub fn subscriber_count(&self) -> usize {
        self.tx.receiver_count() + self.tx_progress.receiver_count() + self.routes.sinks.len()
    }

    /// Whether some subscriber wants progress events.
    pub fn wants_progress(&self) -> bool {
        self.tx_progress.receiver_count() > 0 || self.routes.progress > 0
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
        let event = Arc::new(event);
        if self.routes.progress > 0 {
            self.routes.route(&event, true, self.subscriber_buffer);
        }
        if self.tx_progress.receiver_count() > 0 {
            let _ = self.tx_progress.send(event);
        }
    }

    /// A log that continues a store's: `events` are the retained history
    /// (in sequence order), and numbering goes on after
    /// `position.last_sequence`.
    pub fn restored(
        history: usize,
        subscriber_buffer: usize,
        events: Vec<Event>,
        position: &LogPosition,
    ) -> Self {
        let mut log = Self::new(history, subscriber_buffer);
        let skip = events.len().saturating_sub(log.capacity);
        log.evicted_through = position.evicted_through;
        for event in events.into_iter().skip(skip) {
            log.history.push_back(Arc::new(event));
        }
        if skip > 0 || log.history.is_empty() {
            // A smaller `[watch] history` than the store was written with
            // evicts the oldest; replay starts after what is gone.
            let first = log
                .history
                .front()
                .map_or(position.last_sequence + 1, |e| e.sequence);
            log.evicted_through = log.evicted_through.max(first - 1);
        }
        log.next = position.last_sequence + 1;
        log
    }

    /// Highest sequence no longer retained (replay only after it).
    pub fn evicted_through(&self) -> u64 {
        self.evicted_through
    }

    /// Numbers, records and broadcasts one event; returns it.
    pub fn publish(&mut self, kind: EventKind, agent: AgentView) -> Arc<Event> {
        let event = Arc::new(Event::new(self.take_sequence(), kind, agent));
        if self.history.len() == self.capacity {
            if let Some(old) = self.history.pop_front() {
                self.evicted_through = old.sequence;
            }
        }
        self.history.push_back(event.clone());
        if !self.routes.sinks.is_empty() {
            self.routes.route(&event, false, self.subscriber_buffer);
        }
        // No receivers is not an error: nobody is watching.
        if self.tx_progress.receiver_count() > 0 {
            let _ = self.tx_progress.send(event.clone());
        }
        let _ = self.tx.send(event.clone());
        event
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
        let live = match route_of(filter) {
            Some(_) => Live::Routed(self.routes.add(filter, include_progress)),
            None if include_progress => Live::Broadcast(self.tx_progress.subscribe()),
            None => Live::Broadcast(self.tx.subscribe()),
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

    /// Forgets a routed subscriber (its stream ended). Unknown ids are
    /// ignored, so this may be called more than once.
    pub fn unsubscribe(&mut self, id: SubscriberId) {
        self.routes.remove(id);
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        // Like dropping the broadcast senders: routed subscribers read what
        // they have, then learn the log is gone.
        for sink in self.routes.sinks.values() {
            sink.queue.close();
        }
    }
}

/// Identifies a routed subscriber, for [`EventLog::unsubscribe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubscriberId(u64);

/// What a subscriber receives live.
#[derive(Debug)]
pub enum Live {
    /// Every event (the subscriber filters): unfiltered subscribers.
    Broadcast(broadcast::Receiver<Arc<Event>>),
    /// Only events that match its filter: subscribers filtered by ids,
    /// parent, root or lead. Must be unsubscribed when dropped (the
    /// scheduler handle's subscription does that).
    Routed(RoutedReceiver),
}

/// One live read.
#[derive(Debug)]
pub enum Received {
    /// The next event.
    Event(Arc<Event>),
    /// The subscriber fell behind: this many events were not delivered,
    /// all after the ones it received.
    Lagged(u64),
    /// The log is gone (the scheduler was dropped).
    Closed,
    /// Nothing to read now (only from [`Live::try_recv`]).
    Empty,
}

impl Live {
    /// Waits for the next event (never [`Received::Empty`]).
    pub async fn recv(&mut self) -> Received {
        match self {
            Live::Broadcast(rx) => match rx.recv().await {
                Ok(event) => Received::Event(event),
                Err(RecvError::Lagged(missed)) => Received::Lagged(missed),
                Err(RecvError::Closed) => Received::Closed,
            },
            Live::Routed(rx) => rx.recv().await,
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Received {
        match self {
            Live::Broadcast(rx) => match rx.try_recv() {
                Ok(event) => Received::Event(event),
                Err(TryRecvError::Lagged(missed)) => Received::Lagged(missed),
                Err(TryRecvError::Closed) => Received::Closed,
                Err(TryRecvError::Empty) => Received::Empty,
            },
            Live::Routed(rx) => rx.queue.try_recv(),
        }
    }

    /// The routed subscriber's id, to unsubscribe it.
    pub fn routed_id(&self) -> Option<SubscriberId> {
        match self {
            Live::Broadcast(_) => None,
            Live::Routed(rx) => Some(rx.id),
        }
    }
}

/// A routed subscriber's end of its queue.
#[derive(Debug)]
pub struct RoutedReceiver {
    id: SubscriberId,
    queue: Arc<RoutedQueue>,
}

impl RoutedReceiver {
    async fn recv(&self) -> Received {
        loop {
            match self.queue.try_recv() {
                // A push between the check and the wait leaves a permit, so
                // the wait returns at once: no wake-up is lost.
                Received::Empty => self.queue.notify.notified().await,
                received => return received,
            }
        }
    }
}

/// A routed subscriber's bounded queue. The producer (the core, under its
/// lock) and the one consumer each hold the mutex only to push or pop.
#[derive(Debug, Default)]
struct RoutedQueue {
    state: parking_lot::Mutex<QueueState>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct QueueState {
    events: VecDeque<Arc<Event>>,
    /// Events not delivered since the queue was first full. Once it is
    /// non-zero nothing more is queued, so what the subscriber reads stays
    /// gap-free up to its resume point.
    missed: u64,
    closed: bool,
}

impl RoutedQueue {
    fn push(&self, event: &Arc<Event>, capacity: usize) {
        let mut state = self.state.lock();
        if state.missed > 0 || state.events.len() >= capacity {
            state.missed += 1;
            if state.missed > 1 {
                return;
            }
        } else {
            state.events.push_back(event.clone());
        }
        drop(state);
        self.notify.notify_one();
    }

    fn try_recv(&self) -> Received {
        let mut state = self.state.lock();
        match state.events.pop_front() {
            Some(event) => Received::Event(event),
            None if state.missed > 0 => Received::Lagged(state.missed),
            None if state.closed => Received::Closed,
            None => Received::Empty,
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.notify.notify_one();
    }
}

/// The one key a filtered subscriber is registered under: the most
/// selective filter it sets. None for a subscriber the broadcast ring
/// serves (no filter, or statuses only).
fn route_of(filter: &AgentFilter) -> Option<RouteKey<'_>> {
    if !filter.ids.is_empty() {
        Some(RouteKey::Ids(&filter.ids))
    } else if let Some(parent) = filter.parent_id {
        Some(RouteKey::Parent(parent))
    } else if let Some(root) = filter.root_id {
        Some(RouteKey::Root(root))
    } else if let Some(lead) = filter.lead_id.as_deref() {
        Some(RouteKey::Lead(lead))
    } else {
        filter.tenant.as_deref().map(RouteKey::Tenant)
    }
}

enum RouteKey<'a> {
    Ids(&'a [AgentId]),
    Parent(AgentId),
    Root(AgentId),
    Lead(&'a str),
    Tenant(&'a str),
}

#[derive(Debug)]
struct Sink {
    filter: AgentFilter,
    progress: bool,
    queue: Arc<RoutedQueue>,
}

type SinkList = Vec<(SubscriberId, Arc<Sink>)>;

/// The routed subscribers, each under its one route key.
#[derive(Debug, Default)]
struct Routes {
    next: u64,
    sinks: HashMap<SubscriberId, Arc<Sink>>,
    by_agent: HashMap<AgentId, SinkList>,
    by_parent: HashMap<AgentId, SinkList>,
    by_root: HashMap<AgentId, SinkList>,
    by_lead: HashMap<Arc<str>, SinkList>,
    by_tenant: HashMap<Arc<str>, SinkList>,
    /// Routed subscribers that asked for progress events.
    progress: usize,
}

impl Routes {
    fn add(&mut self, filter: &AgentFilter, progress: bool) -> RoutedReceiver {
        self.next += 1;
        let id = SubscriberId(self.next);
        let queue = Arc::new(RoutedQueue::default());
        let sink = Arc::new(Sink {
            filter: filter.clone(),
            progress,
            queue: queue.clone(),
        });
        let entry = (id, sink.clone());
        match route_of(filter).expect("a routed filter") {
            RouteKey::Ids(ids) => {
                let mut ids = ids.to_vec();
                ids.sort_unstable();
                ids.dedup();
                for agent in ids {
                    self.by_agent.entry(agent).or_default().push(entry.clone());
                }
            }
            RouteKey::Parent(p) => self.by_parent.entry(p).or_default().push(entry),
            RouteKey::Root(r) => self.by_root.entry(r).or_default().push(entry),
            RouteKey::Lead(l) => self.by_lead.entry(l.into()).or_default().push(entry),
            RouteKey::Tenant(t) => self.by_tenant.entry(t.into()).or_default().push(entry),
        }
        self.progress += usize::from(progress);
        self.sinks.insert(id, sink);
        RoutedReceiver { id, queue }
    }

    fn remove(&mut self, id: SubscriberId) {
        let Some(sink) = self.sinks.remove(&id) else {
            return;
        };
        self.progress -= usize::from(sink.progress);
        fn forget<K: std::hash::Hash + Eq>(
            map: &mut HashMap<K, SinkList>,
            key: &K,
            id: SubscriberId,
        ) {
            if let Some(list) = map.get_mut(key) {
                list.retain(|(s, _)| *s != id);
                if list.is_empty() {
                    map.remove(key);
                }
            }
        }
        match route_of(&sink.filter).expect("a routed filter") {
            RouteKey::Ids(ids) => {
                for agent in ids {
                    forget(&mut self.by_agent, agent, id);
                }
            }
            RouteKey::Parent(p) => forget(&mut self.by_parent, &p, id),
            RouteKey::Root(r) => forget(&mut self.by_root, &r, id),
            RouteKey::Lead(l) => forget(&mut self.by_lead, &Arc::<str>::from(l), id),
            RouteKey::Tenant(t) => forget(&mut self.by_tenant, &Arc::<str>::from(t), id),
        }
    }

    /// Pushes `event` to every subscriber registered under one of its keys
    /// whose filter it passes (progress only to those that asked for it).
    /// A subscriber is under one key only, so it gets an event at most once.
    fn route(&self, event: &Arc<Event>, is_progress: bool, capacity: usize) {
        let a = &event.agent;
        let lists = [
            self.by_agent.get(&a.id),
            a.parent_id.and_then(|p| self.by_parent.get(&p)),
            self.by_root.get(&a.root_id),
            a.lead_id.as_ref().and_then(|l| self.by_lead.get(l)),
            self.by_tenant.get(&a.tenant),
        ];
        for (_, sink) in lists.into_iter().flatten().flatten() {
            if (sink.progress || !is_progress) && sink.filter.matches(a) {
                sink.queue.push(event, capacity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{trace::TraceId, AgentStatus};

    fn agent(lead: &str) -> AgentView {
        let id = uuid::Uuid::now_v7();
        AgentView {
            tenant: "t".into(),
            id,
            agent: "a".into(),
            model: "p/m".into(),
            description: "".into(),
            parent_id: None,
            root_id: id,
            lead_id: Some(lead.into()),
            depth: 1,
            status: AgentStatus::Running,
            created_at: SystemTime::now(),
            started_at: None,
            finished_at: None,
            collected_at: None,
            workspace: None,
            result: "".into(),
            error: None,
            approval: None,
            usage: Default::default(),
            total_usage: Default::default(),
            labels: Default::default(),
            background: true,
            detached: false,
            queue_reason: None,
            bucket: "p/m".into(),
            worker_id: None,
            trace_id: TraceId::random(),
            attempt: 1,
            continuation: None,
            attempts: None,
        }
    }

    fn lead(name: &str) -> AgentFilter {
        AgentFilter {
            lead_id: Some(name.into()),
            ..AgentFilter::default()
        }
    }

    fn drain(live: &mut Live) -> (Vec<u64>, Received) {
        let mut seqs = Vec::new();
        loop {
            match live.try_recv() {
                Received::Event(e) => seqs.push(e.sequence),
                other => return (seqs, other),
            }
        }
    }

    #[test]
    fn a_routed_buffer_counts_only_the_events_routed_to_it() {
        let mut log = EventLog::new(16, 4);
        let mut quiet = log.subscribe(&lead("quiet"), 0, None, false).live;
        for _ in 0..100 {
            log.publish(EventKind::Started, agent("loud"));
        }
        let mine = agent("quiet");
        log.publish(EventKind::Started, mine.clone());
        log.publish(EventKind::Done, mine);
        let (seqs, end) = drain(&mut quiet);
        assert_eq!(seqs, [101, 102]);
        assert!(matches!(end, Received::Empty), "{end:?}");
    }

    #[test]
    fn a_full_routed_queue_delivers_what_it_holds_then_lags_without_gaps() {
        let mut log = EventLog::new(16, 4);
        let mut slow = log.subscribe(&lead("a"), 0, None, false).live;
        for _ in 0..7 {
            log.publish(EventKind::Started, agent("a"));
        }
        let (seqs, end) = drain(&mut slow);
        assert_eq!(seqs, [1, 2, 3, 4], "the first four, in order");
        assert!(matches!(end, Received::Lagged(3)), "{end:?}");
        // Nothing is queued after the first miss, even once it was read.
        log.publish(EventKind::Started, agent("a"));
        assert!(matches!(slow.try_recv(), Received::Lagged(4)));
    }

    #[test]
    fn routes_pick_the_most_selective_filter_and_unsubscribe_leaves_none() {
        let mut log = EventLog::new(16, 64);
        let a = agent("l");
        let by_ids = AgentFilter {
            ids: vec![a.id, a.id],
            lead_id: Some("l".into()),
            ..AgentFilter::default()
        };
        let mut ids = log.subscribe(&by_ids, 0, None, false).live;
        let mut root = log
            .subscribe(
                &AgentFilter {
                    root_id: Some(a.root_id),
                    statuses: vec![AgentStatus::Done],
                    ..AgentFilter::default()
                },
                0,
                None,
                false,
            )
            .live;
        let mut all = log.subscribe(&AgentFilter::default(), 0, None, false).live;
        assert!(matches!(all, Live::Broadcast(_)));
        log.publish(EventKind::Started, a.clone());
        log.publish(
            EventKind::Done,
            AgentView {
                status: AgentStatus::Done,
                ..a.clone()
            },
        );
        log.publish(EventKind::Started, agent("l"));
        assert_eq!(
            drain(&mut ids).0,
            [1, 2],
            "one copy per event, only its agent"
        );
        assert_eq!(drain(&mut root).0, [2], "statuses still apply");
        assert_eq!(drain(&mut all).0, [1, 2, 3]);
        assert_eq!(log.subscriber_count(), 3);
        for live in [&ids, &root] {
            log.unsubscribe(live.routed_id().expect("routed"));
        }
        assert_eq!(log.subscriber_count(), 1);
        assert!(log.routes.by_agent.is_empty() && log.routes.by_root.is_empty());
    }

    #[test]
    fn progress_reaches_only_routed_subscribers_that_asked_for_it() {
        let mut log = EventLog::new(16, 64);
        let mut plain = log.subscribe(&lead("l"), 0, None, false).live;
        let mut chatty = log.subscribe(&lead("l"), 0, None, true).live;
        assert!(log.wants_progress());
        log.publish_progress(Progress::Output("x".into()), agent("l"));
        assert!(matches!(plain.try_recv(), Received::Empty));
        assert!(matches!(chatty.try_recv(), Received::Event(e) if e.kind == EventKind::Output));
        log.unsubscribe(chatty.routed_id().unwrap());
        assert!(!log.wants_progress());
    }
}
