//! The scheduler core: every agent record, every counter and the admission
//! queue, changed only by synchronous methods.
//!
//! The core does no I/O and never awaits. It lives behind one mutex in
//! [`super::Scheduler`], which is held only for the duration of one method
//! call; runs are started by the caller from the [`RunStart`]s the core
//! hands out. That keeps the hot path (Spawn → admit → start) free of
//! channel hops, and lets the model-based test drive the core directly.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    error::{Error, FieldViolation},
    events::{EventKind, EventLog, Progress, SubscriberId, Subscription},
    inbox::{steer_inbox, SteerInbox, SteerSender},
    queue::{AdmissionQueue, BucketKey, Dirty, SubKey},
    state::{check_move, Held},
    stats::Stats,
    trace::{
        random_span_id, EndedRun, RunTrace, SpanEventKind, SpanRecord, SpanSink, SpawnTrace,
        TraceContext, TraceId,
    },
    types::*,
    workers::{Assignment, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo, WorkerPool},
};
use foldhash::{HashMap, HashSet};

use crate::config::{AgentTypeConfig, Limits, RunnerKind, RunsConfig, WatchConfig};

/// `tracing` target of the one log line per ended agent.
pub const LIFECYCLE: &str = "subagentd::lifecycle";

/// Longest accepted `lead_id` and `idempotency_key`, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// A run the caller must start (outside the lock).
#[derive(Debug)]
pub struct RunStart {
    /// The agent as it is at start.
    pub agent: AgentView,
    /// Which runner executes it.
    pub runner: RunnerKind,
    /// The prompt.
    pub prompt: Arc<str>,
    /// Steer messages: buffered ones are already in the inbox.
    pub steer: SteerInbox,
    /// Cancelled when the agent ends for any reason other than the run's own
    /// report.
    pub cancel: CancellationToken,
    /// Run deadline, measured from now.
    pub timeout: Duration,
    /// The agent type's config when the run started (None if a reload
    /// removed the type meanwhile).
    pub agent_type: Option<Arc<AgentTypeConfig>>,
    /// W3C `traceparent` naming the run's span (or the context it
    /// inherited when spans are not recorded), for the runner; always set.
    pub traceparent: Arc<str>,
    /// Last-report clock, for the stale watch.
    pub progress: Arc<RunProgress>,
    /// `[runs] stale_timeout` at the start (zero = off).
    pub stale_timeout: Duration,
}

/// Handles the core keeps to talk to a live run.
#[derive(Debug)]
struct RunControl {
    cancel: CancellationToken,
    steer: SteerSender,
    /// Output reported so far; the agent's result while it runs, and after
    /// it if the run ends without one (failed, cancelled).
    output: String,
    /// Where the decision on the pending approval goes (in-process
    /// runners; a worker gets it as a command).
    approval: Option<oneshot::Sender<ApprovalOutcome>>,
    /// A decision made but not yet handed over, with its approval id: the
    /// run gets it when it is RUNNING again, not while it waits in the
    /// queue.
    decision: Option<(Uuid, ApprovalOutcome)>,
    /// The last tool call (name, input digest) and how many times in a row
    /// it came, for `[runs] max_identical_tool_calls`.
    last_call: Option<(Box<str>, Box<str>)>,
    identical_calls: u32,
    /// When the run last reported anything, for `[runs] stale_timeout`.
    progress: Arc<RunProgress>,
}

/// The time of a run's last report, shared with the task that watches it
/// for staleness (an atomic, so reporting takes no extra lock).
#[derive(Debug)]
pub struct RunProgress {
    started: tokio::time::Instant,
    last_ms: std::sync::atomic::AtomicU64,
}

impl RunProgress {
    fn new() -> Self {
        Self {
            started: tokio::time::Instant::now(),
            last_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Records a report now.
    pub fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// When the run last reported (its start if never).
    pub fn last(&self) -> tokio::time::Instant {
        self.started
            + Duration::from_millis(self.last_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// How a steer message was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerDelivery {
    /// Handed to the running run.
    Delivered,
    /// Kept until the agent runs.
    Buffered,
}

/// Why the core moves agents to CANCELLED as a cascade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cascade {
    /// Explicit cancel: the whole subtree, detached agents included.
    Everything,
    /// The parent ended on its own: detached subtrees survive.
    SkipDetached,
}

#[derive(Debug)]
struct Record {
    view: AgentView,
    /// Admission sequence: FIFO order and creation order.
    seq: u64,
    parent_key: ParentKey,
    runner: RunnerKind,
    /// Until the agent ends (a retried run is assigned it again).
    prompt: Option<Arc<str>>,
    timeout: Duration,
    steer_buffer: Vec<String>,
    /// Boxed: only live runs have one, and inline it would push every
    /// retained record into a larger allocation size class.
    run: Option<Box<RunControl>>,
    children: Vec<AgentId>,
    idempotency_key: Option<Arc<str>>,
    /// The run's own span id in the trace `view.trace_id` names (with
    /// `sampled`, the context runners and children get). Kept inline, not
    /// as a `TraceContext`, so the record stays in its size class.
    span_id: u64,
    sampled: bool,
    /// The span being recorded, only while a sink records spans.
    span: Option<Box<SpanRecord>>,
}

// Retained records dominate memory (BENCHMARKS.md): a record must stay in
// jemalloc's 512-byte size class; the next class is 640.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Record>() <= 512);

impl Record {
    /// The trace context the run passes on: to its runner (`traceparent`)
    /// and to its children.
    fn trace_context(&self) -> TraceContext {
        TraceContext {
            trace_id: self.view.trace_id,
            span_id: self.span_id,
            sampled: self.sampled,
        }
    }

    /// The agent type, when the agent needs a worker's capacity to start:
    /// a worker type with no worker holding its run yet.
    fn needs_worker(&self) -> Option<&Arc<str>> {
        (self.runner == RunnerKind::Worker && self.view.worker_id.is_none())
            .then_some(&self.view.agent)
    }

    fn sub_key(&self) -> SubKey {
        SubKey {
            bucket: self.view.bucket.clone(),
            parent: self.parent_key.clone(),
            worker_type: self.needs_worker().cloned(),
            foreground: !self.view.background,
        }
    }
}

/// A page of a filtered listing.
#[derive(Debug)]
pub struct Page {
    /// Matching agents, oldest first.
    pub agents: Vec<AgentView>,
    /// Admission sequence to continue after; None on the last page.
    pub next_after: Option<u64>,
}

/// Counters the model-based test compares against the records.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Counters {
    /// Live background agents.
    pub live_background: u32,
    /// Running agents per bucket (non-zero entries only).
    pub buckets: BTreeMap<String, u32>,
    /// Running background children per parent (non-zero entries only).
    pub parents: BTreeMap<String, u32>,
    /// Live agents per tree (non-zero entries only).
    pub trees: BTreeMap<AgentId, u32>,
    /// Queued agents.
    pub queued: usize,
    /// (state, admission sequence) of every live agent, as the status
    /// index holds them.
    pub live_by_status: BTreeSet<(&'static str, u64)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Core {
    limits: Limits,
    runs: RunsConfig,
    /// Shared with the runs started under each version of the config.
    agent_types: BTreeMap<String, Arc<AgentTypeConfig>>,
    /// Boxed: a hash map stores values inline in up to twice as many
    /// buckets as entries, which for ~450-byte records doubled the memory of
    /// retained agents.
    agents: HashMap<AgentId, Box<Record>>,
    /// Admission sequence → agent, for listing in creation order.
    order: BTreeMap<u64, AgentId>,
    next_seq: u64,
    queue: AdmissionQueue,
    live_background: u32,
    bucket_running: HashMap<BucketKey, u32>,
    parent_running: HashMap<ParentKey, u32>,
    tree_live: HashMap<AgentId, u32>,
    lead_live: HashMap<Arc<str>, HashSet<AgentId>>,
    /// Every retained agent of a lead / of a tree, in admission order, so
    /// `lead_id` and `root_id` listings do not scan all agents under the lock.
    /// One ordered map each (not a map per lead or tree): most trees are a
    /// single agent, and a map per tree cost ~400 bytes per retained agent.
    by_lead: BTreeMap<(Arc<str>, u64), AgentId>,
    by_root: BTreeMap<(AgentId, u64), AgentId>,
    /// Live agents by state, in admission order, so `statuses` listings
    /// and snapshots (what dashboards poll) do not scan retained agents.
    /// Only live states: a finished agent costs nothing here.
    by_status: LiveByStatus,
    idempotency: HashMap<(ParentKey, Arc<str>), AgentId>,
    /// Finished agents in finish order, for retention sweeps.
    finished: VecDeque<(SystemTime, AgentId)>,
    waiters: HashMap<AgentId, Vec<Arc<Notify>>>,
    /// Agent type, model and bucket names shared by every agent that uses
    /// them, so a retained agent does not carry its own copies.
    names: HashSet<Arc<str>>,
    empty: Arc<str>,
    no_labels: Labels,
    events: EventLog,
    starts: Vec<RunStart>,
    /// Connected workers, their capacity and the runs they hold.
    workers: WorkerPool,
    /// Worker runs stopped here whose capacity frees after the cancel grace
    /// unless the worker confirms first; armed by the scheduler handle.
    grace_timers: Vec<(WorkerId, AgentId, Duration)>,
    /// Set by [`Core::shut_down`]: no more admissions, no more starts.
    closed: bool,
    /// Numbers for the metrics endpoint.
    stats: Stats,
    /// Where run spans go; None = spans are not recorded (trace context
    /// is still passed through to runners and children).
    span_sink: Option<Arc<dyn SpanSink>>,
    /// Agents that ended since the last [`Core::take_ended`], for the
    /// lifecycle log line and the span export done outside the lock.
    ended: Vec<EndedRun>,
}

impl Core {
    /// An empty core with the given configuration.
    pub fn new(
        limits: Limits,
        runs: RunsConfig,
        watch: &WatchConfig,
        agent_types: BTreeMap<String, AgentTypeConfig>,
    ) -> Self {
        Self {
            limits,
            runs,
            agent_types: shared_types(agent_types),
            agents: HashMap::default(),
            order: BTreeMap::new(),
            next_seq: 1,
            queue: AdmissionQueue::default(),
            live_background: 0,
            bucket_running: HashMap::default(),
            parent_running: HashMap::default(),
            tree_live: HashMap::default(),
            lead_live: HashMap::default(),
            by_lead: BTreeMap::new(),
            by_root: BTreeMap::new(),
            by_status: LiveByStatus::default(),
            idempotency: HashMap::default(),
            finished: VecDeque::new(),
            waiters: HashMap::default(),
            names: HashSet::default(),
            empty: Arc::from(""),
            no_labels: Labels::default(),
            events: EventLog::new(watch.history, watch.subscriber_buffer),
            starts: Vec::new(),
            workers: WorkerPool::default(),
            grace_timers: Vec::new(),
            closed: false,
            stats: Stats::default(),
            span_sink: None,
            ended: Vec::new(),
        }
    }

    /// Records a span per run into `sink` from now on.
    pub fn set_span_sink(&mut self, sink: Option<Arc<dyn SpanSink>>) {
        self.span_sink = sink;
    }

    /// Metrics numbers.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Live background agents (the global cap's usage).
    pub fn live_background(&self) -> u32 {
        self.live_background
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Running-agent limit of `bucket` (0 = unlimited).
    pub fn limit_of_bucket(&self, bucket: &str) -> u32 {
        self.bucket_limit(bucket)
    }

    /// WatchAgents subscribers now.
    pub fn watch_subscribers(&self) -> usize {
        self.events.subscriber_count()
    }

    // ----- configuration -------------------------------------------------

    /// Applies reloaded limits, run settings and agent types. Raising a limit
    /// starts queued agents at once; lowering one never pre-empts.
    pub fn reconfigure(
        &mut self,
        limits: Limits,
        runs: RunsConfig,
        agent_types: BTreeMap<String, AgentTypeConfig>,
    ) {
        self.limits = limits;
        self.runs = runs;
        self.agent_types = shared_types(agent_types);
        self.rebucket();
        let mut dirty = Dirty::default();
        dirty.everything();
        self.drain(dirty);
    }

    /// Moves live agents whose bucket key changed with the new limits (a
    /// provider or model entry added or removed) to their new bucket, so old
    /// and new agents of one provider share one count. O(live agents); only
    /// reloads call it.
    fn rebucket(&mut self) {
        let live: Vec<(AgentId, Arc<str>, BucketKey)> = self
            .agents
            .values()
            .filter(|r| !r.view.status.is_terminal())
            .map(|r| (r.view.id, r.view.model.clone(), r.view.bucket.clone()))
            .collect();
        for (id, model, old) in live {
            let new = self.bucket_for(&model);
            if new == old {
                continue;
            }
            let rec = self.agents.get_mut(&id).expect("live agent");
            let old_key = rec.sub_key();
            let held = Held::of(rec.view.status, rec.view.background);
            let queued = rec.view.status == AgentStatus::Queued;
            rec.view.bucket = new.clone();
            let (seq, new_key) = (rec.seq, rec.sub_key());
            if queued && self.queue.remove(seq, &old_key) {
                self.queue.push(seq, id, new_key);
            }
            self.stats
                .rebucketed(&old_key.bucket, &new, rec.view.status);
            if held.bucket {
                if let Some(n) = self.bucket_running.get_mut(&old_key.bucket) {
                    *n -= 1;
                    if *n == 0 {
                        self.bucket_running.remove(&old_key.bucket);
                    }
                }
                *self.bucket_running.entry(new).or_default() += 1;
            }
        }
    }

    /// Retention of finished agents.
    pub fn finished_retention(&self) -> Duration {
        self.runs.finished_retention
    }

    fn bucket_for(&mut self, model: &str) -> BucketKey {
        let provider = model.split_once('/').map_or(model, |(p, _)| p);
        if self.limits.model_concurrency.contains_key(model) {
            self.intern(model)
        } else if self.limits.provider_concurrency.contains_key(provider) {
            self.intern(provider)
        } else {
            self.intern(model)
        }
    }

    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return shared.clone();
        }
        let shared: Arc<str> = name.into();
        self.names.insert(shared.clone());
        shared
    }

    fn text(&self, s: String) -> Arc<str> {
        if s.is_empty() {
            self.empty.clone()
        } else {
            s.into()
        }
    }

    /// Running-agent limit of a bucket key; 0 = unlimited.
    fn bucket_limit(&self, bucket: &str) -> u32 {
        match bucket.split_once('/') {
            Some((provider, _)) => self
                .limits
                .model_concurrency
                .get(bucket)
                .or_else(|| self.limits.provider_concurrency.get(provider))
                .copied()
                .unwrap_or(self.limits.default_concurrency),
            None => self
                .limits
                .provider_concurrency
                .get(bucket)
                .copied()
                .unwrap_or(self.limits.default_concurrency),
        }
    }

    fn bucket_has_room(&self, bucket: &BucketKey) -> bool {
        let limit = self.bucket_limit(bucket);
        limit == 0 || self.bucket_running.get(bucket).copied().unwrap_or(0) < limit
    }

    /// Whether every limit that holds `rec` has room for it to start:
    /// bucket and parent for background agents, and worker capacity for a
    /// worker type without a worker.
    fn can_start(&self, rec: &Record) -> bool {
        let limits = !rec.view.background
            || (self.bucket_has_room(&rec.view.bucket) && self.parent_has_room(&rec.parent_key));
        limits && rec.needs_worker().is_none_or(|t| self.workers.has_room(t))
    }

    fn parent_has_room(&self, parent: &ParentKey) -> bool {
        let limit = self.limits.max_concurrent_per_parent;
        *parent == ParentKey::None
            || limit == 0
            || self.parent_running.get(parent).copied().unwrap_or(0) < limit
    }

    // ----- spawn ----------------------------------------------------------

    /// Admits an agent: starts it, queues it, or refuses it. Returns the
    /// agent and whether it is an earlier agent found by idempotency key.
    pub fn spawn(&mut self, spec: SpawnSpec, now: SystemTime) -> Result<(AgentView, bool), Error> {
        if self.closed {
            return Err(Error::ShuttingDown);
        }
        // A retry whose first response was lost gets the first agent, even
        // if its parent has ended or the config changed since.
        if let Some(key) = spec.idempotency_key.as_deref() {
            let parent_key = match (spec.parent_id, spec.lead_id.as_deref()) {
                (Some(pid), _) => ParentKey::Agent(pid),
                (None, Some(lead)) => ParentKey::Lead(lead.into()),
                (None, None) => ParentKey::None,
            };
            if let Some(rec) = self
                .idempotency
                .get(&(parent_key, Arc::from(key)))
                .and_then(|id| self.agents.get(id))
            {
                return Ok((self.view_of(rec), true));
            }
        }
        self.check_spec(&spec)?;
        let parent = match spec.parent_id {
            Some(pid) => {
                let p = self.agents.get(&pid).ok_or(Error::NotFound {
                    field: "parent_id",
                    id: pid.to_string(),
                })?;
                if p.view.status.is_terminal() {
                    return Err(Error::AgentFinished {
                        field: "parent_id",
                        id: pid.to_string(),
                        status: p.view.status,
                    });
                }
                Some(p)
            }
            None => None,
        };
        let (parent_key, root_id, lead_id, depth) = match parent {
            Some(p) => (
                ParentKey::Agent(p.view.id),
                Some(p.view.root_id),
                p.view.lead_id.clone(),
                p.view.depth + 1,
            ),
            None => {
                let lead: Option<Arc<str>> = spec.lead_id.as_deref().map(Into::into);
                let key = lead.clone().map_or(ParentKey::None, ParentKey::Lead);
                (key, None, lead, 1)
            }
        };
        let idem_key = spec.idempotency_key.as_deref().map(Arc::<str>::from);
        if depth > self.limits.max_depth {
            return Err(Error::DepthLimit {
                limit: self.limits.max_depth,
                depth,
            });
        }
        let tree_limit = self.limits.max_live_descendants_per_root;
        if let Some(root) = root_id {
            let live = self.tree_live.get(&root).copied().unwrap_or(0);
            if tree_limit != 0 && live >= tree_limit {
                return Err(Error::DescendantLimit {
                    limit: tree_limit,
                    live,
                    root_id: root,
                });
            }
        }
        if spec.background && self.live_background >= self.limits.max_background_agents {
            return Err(Error::GlobalLimit {
                limit: self.limits.max_background_agents,
                live: self.live_background,
            });
        }

        let (trace, span) = self.trace_for(
            spec.parent_id
                .and_then(|p| self.agents.get(&p))
                .map(|p| &**p),
            spec.trace,
            &spec.agent,
        );
        let id = Uuid::now_v7();
        let seq = self.next_seq;
        self.next_seq += 1;
        let bucket = self.bucket_for(&spec.model);
        let runner = self.agent_types[&spec.agent].runner;
        let view = AgentView {
            id,
            agent: self.intern(&spec.agent),
            model: self.intern(&spec.model),
            description: self.text(spec.description),
            parent_id: spec.parent_id,
            root_id: root_id.unwrap_or(id),
            lead_id,
            depth,
            status: AgentStatus::Queued,
            created_at: now,
            started_at: None,
            finished_at: None,
            result: self.empty.clone(),
            error: None,
            approval: None,
            usage: Usage::default(),
            total_usage: Usage::default(),
            labels: if spec.labels.is_empty() {
                self.no_labels.clone()
            } else {
                Arc::new(spec.labels)
            },
            background: spec.background,
            detached: spec.detached,
            queue_reason: None,
            worker_id: None,
            attempt: 0,
            bucket: bucket.clone(),
            trace_id: trace.trace_id,
        };
        let record = Record {
            view,
            seq,
            parent_key: parent_key.clone(),
            runner,
            prompt: Some(spec.prompt.into()),
            timeout: spec.timeout.unwrap_or(self.runs.default_timeout),
            steer_buffer: Vec::new(),
            run: None,
            children: Vec::new(),
            idempotency_key: idem_key.clone(),
            span_id: trace.span_id,
            sampled: trace.sampled,
            span,
        };
        if let Some(pid) = spec.parent_id {
            if let Some(p) = self.agents.get_mut(&pid) {
                p.children.push(id);
            }
        }
        if let Some(k) = idem_key {
            self.idempotency.insert((parent_key.clone(), k), id);
        }
        if let Some(lead) = &record.view.lead_id {
            self.lead_live.entry(lead.clone()).or_default().insert(id);
        }
        self.agents.insert(id, Box::new(record));
        self.order.insert(seq, id);
        let rec = &self.agents[&id];
        if let Some(lead) = &rec.view.lead_id {
            self.by_lead.insert((lead.clone(), seq), id);
        }
        self.by_root.insert((rec.view.root_id, seq), id);
        self.by_status.moved(seq, id, None, AgentStatus::Queued);
        // A new agent enters in QUEUED; account for the slots QUEUED holds.
        self.acquire(id, Held::of(AgentStatus::Queued, spec.background));
        self.stats.spawned(&bucket);

        let mut dirty = Dirty::default();
        if self.can_start(&self.agents[&id]) {
            self.start(id, &mut dirty);
        } else {
            let rec = &self.agents[&id];
            self.queue.push(seq, id, rec.sub_key());
            self.publish(id, EventKind::Queued);
        }
        self.drain(dirty);
        Ok((self.view(id).expect("agent was just inserted"), false))
    }

    /// A new agent's trace context, and its span record when spans are
    /// recorded. Inherited from its parent agent, else from the Spawn
    /// caller; otherwise the first span of a new trace. With a sink the run
    /// gets a span of its own under the inherited one; without, it passes
    /// the inherited context on as it is (nothing records a span), or a new
    /// unsampled one, so logs, workers and programs still share a trace id.
    fn trace_for(
        &self,
        parent: Option<&Record>,
        spawn: SpawnTrace,
        agent: &str,
    ) -> (TraceContext, Option<Box<SpanRecord>>) {
        let inherited = match parent {
            Some(p) => Some(p.trace_context()),
            None => spawn.caller,
        };
        let Some(sink) = &self.span_sink else {
            return (
                inherited.unwrap_or_else(|| TraceContext::new_root(false)),
                None,
            );
        };
        let trace_id = inherited.map_or_else(TraceId::random, |c| c.trace_id);
        let sampled = sink.sample(inherited.as_ref(), trace_id, agent);
        let context = TraceContext {
            trace_id,
            span_id: random_span_id(),
            sampled,
        };
        let span = SpanRecord {
            parent: inherited,
            link: spawn.rpc,
            ..SpanRecord::default()
        };
        (context, Some(Box::new(span)))
    }

    fn check_spec(&self, spec: &SpawnSpec) -> Result<(), Error> {
        let mut violations = Vec::new();
        if !self.agent_types.contains_key(&spec.agent) {
            return Err(Error::UnknownAgentType {
                name: spec.agent.clone(),
                known: self.agent_types.keys().cloned().collect(),
            });
        }
        if spec.prompt.len() > self.limits.max_prompt_bytes {
            violations.push(FieldViolation::new(
                "prompt",
                format!(
                    "prompt is {} bytes; the limit is {} bytes ([limits] max_prompt_bytes)",
                    spec.prompt.len(),
                    self.limits.max_prompt_bytes
                ),
            ));
        }
        if violations.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(violations))
        }
    }

    // ----- transitions ------------------------------------------------------

    /// Takes the slots in `held` for a record (used when it first enters).
    fn acquire(&mut self, id: AgentId, held: Held) {
        let rec = &self.agents[&id];
        let (bucket, parent, root) = (
            rec.view.bucket.clone(),
            rec.parent_key.clone(),
            rec.view.root_id,
        );
        if held.global {
            self.live_background += 1;
        }
        if held.bucket {
            *self.bucket_running.entry(bucket).or_default() += 1;
        }
        if held.parent {
            *self.parent_running.entry(parent).or_default() += 1;
        }
        if held.tree {
            *self.tree_live.entry(root).or_default() += 1;
        }
    }

    /// Gives back the slots in `held`, marking freed limits dirty.
    fn release(&mut self, id: AgentId, held: Held, dirty: &mut Dirty) {
        let rec = &self.agents[&id];
        let (bucket, parent, root) = (
            rec.view.bucket.clone(),
            rec.parent_key.clone(),
            rec.view.root_id,
        );
        fn dec<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, k: &K) {
            if let Some(n) = map.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    map.remove(k);
                }
            }
        }
        if held.global {
            self.live_background -= 1;
        }
        // Only a limit that was full can have agents waiting on it alone:
        // one that had room already held nobody back, so it need not be
        // walked (this keeps a release O(log n) when parents are not the
        // binding limit).
        if held.bucket {
            if !self.bucket_has_room(&bucket) {
                dirty.bucket(&bucket);
            }
            dec(&mut self.bucket_running, &bucket);
        }
        if held.parent {
            if !self.parent_has_room(&parent) {
                dirty.parent(&parent);
            }
            dec(&mut self.parent_running, &parent);
        }
        if held.tree {
            dec(&mut self.tree_live, &root);
        }
    }

    /// The one place an agent changes state: checks the move, moves slots
    /// by the difference between the two states, keeps the queue and the
    /// indexes in step, and publishes the event.
    fn transition(
        &mut self,
        id: AgentId,
        to: AgentStatus,
        dirty: &mut Dirty,
    ) -> Result<(), super::state::InvalidMove> {
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
    ) -> Result<(), super::state::InvalidMove> {
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
        self.by_status.moved(rec.seq, id, Some(from), to);
        self.stats.moved(&rec.view.bucket, from, to);
        if to != AgentStatus::AwaitingApproval {
            rec.view.approval = None;
        }
        if to.is_terminal() {
            let now = SystemTime::now();
            rec.view.finished_at = Some(now);
            if let Some(ran) = rec.view.started_at.and_then(|s| now.duration_since(s).ok()) {
                self.stats.ended(&rec.view.bucket, ran);
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
            rec.steer_buffer = Vec::new();
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
                if let Some(set) = self.lead_live.get_mut(&lead) {
                    set.remove(&id);
                    if set.is_empty() {
                        self.lead_live.remove(&lead);
                    }
                }
            }
            self.finished.push_back((now, id));
        }
        if to.is_settled() {
            if let Some(waiters) = self.waiters.remove(&id) {
                for w in waiters {
                    w.notify_one();
                }
            }
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

    /// QUEUED (or AWAITING_APPROVAL) → RUNNING, creating the run's controls
    /// on first start.
    fn start(&mut self, id: AgentId, dirty: &mut Dirty) {
        let rec = self.agents.get_mut(&id).expect("known agent");
        // A worker type takes a slot of the serving worker with the most
        // free capacity. Admission checked there is one; the agent leaves
        // the queue under its key *before* the assignment changes that key
        // (the removal in `transition` then finds nothing to do).
        if let Some(agent_type) = rec.needs_worker() {
            let Some(worker) = self.workers.pick(agent_type) else {
                debug_assert!(false, "started without worker capacity");
                return;
            };
            if rec.view.status == AgentStatus::Queued {
                self.queue.remove(rec.seq, &rec.sub_key());
            }
            self.workers.hold(worker, id);
            rec.view.worker_id = Some(worker);
        }
        let now = SystemTime::now();
        if rec.view.started_at.is_none() {
            rec.view.started_at = Some(now);
            let waited = now.duration_since(rec.view.created_at).unwrap_or_default();
            self.stats.first_start(&rec.view.bucket, waited);
        }
        let first_start = rec.run.is_none();
        let steer_rx = if first_start {
            rec.view.attempt += 1;
            let (tx, rx) = steer_inbox();
            rec.run = Some(Box::new(RunControl {
                cancel: CancellationToken::new(),
                steer: tx,
                output: String::new(),
                approval: None,
                decision: None,
                last_call: None,
                identical_calls: 0,
                progress: Arc::new(RunProgress::new()),
            }));
            Some(rx)
        } else {
            None
        };
        let on_worker = rec
            .view
            .worker_id
            .filter(|_| rec.runner == RunnerKind::Worker);
        let run = rec.run.as_ref().expect("run controls exist");
        // Steer messages that waited: a worker gets them in its assignment
        // (or after the approval decision), an in-process run in its inbox.
        let mut waiting_steers = std::mem::take(&mut rec.steer_buffer);
        if on_worker.is_none() {
            for msg in waiting_steers.drain(..) {
                // The inbox lives as long as the run task; a closed one means
                // the run is ending and the message has nowhere to go.
                let _ = run.steer.send(msg);
            }
        }
        let cancel = run.cancel.clone();
        if self.transition(id, AgentStatus::Running, dirty).is_err() {
            return;
        }
        let rec = self.agents.get_mut(&id).expect("known agent");
        // Resuming after an approval: the run learns the decision now, and
        // the stale clock restarts (waiting for a person is not being stuck).
        if let Some(run) = rec.run.as_mut() {
            run.progress.touch();
            if let Some((approval_id, outcome)) = run.decision.take() {
                match (on_worker, run.approval.take()) {
                    (Some(worker), _) => {
                        self.workers.send(
                            worker,
                            WorkerCommand::Approval {
                                agent_id: id,
                                approval_id,
                                outcome,
                            },
                        );
                    }
                    (None, Some(tx)) => {
                        let _ = tx.send(outcome);
                    }
                    (None, None) => {}
                }
            }
        }
        if let (Some(worker), false) = (on_worker, first_start) {
            for message in waiting_steers.drain(..) {
                self.workers.send(
                    worker,
                    WorkerCommand::Steer {
                        agent_id: id,
                        message,
                    },
                );
            }
        }
        if let Some(steer) = steer_rx {
            // Kept until the agent ends: a retried run needs it again.
            let prompt = rec.prompt.clone().unwrap_or_else(|| "".into());
            let traceparent: Arc<str> = rec.trace_context().traceparent().into();
            if let Some(worker) = on_worker {
                self.workers.send(
                    worker,
                    WorkerCommand::Assign(Box::new(Assignment {
                        agent: rec.view.clone(),
                        prompt: prompt.clone(),
                        steer_messages: waiting_steers,
                        deadline: now + rec.timeout,
                        traceparent: traceparent.clone(),
                    })),
                );
            }
            let start = RunStart {
                agent: rec.view.clone(),
                runner: rec.runner,
                prompt,
                steer,
                cancel,
                timeout: rec.timeout,
                agent_type: self.agent_types.get(&*rec.view.agent).cloned(),
                traceparent,
                progress: rec
                    .run
                    .as_ref()
                    .map(|r| r.progress.clone())
                    .expect("run controls exist"),
                stale_timeout: self.runs.stale_timeout,
            };
            self.starts.push(start);
        }
    }

    /// Starts queued agents while limits freed by `dirty` have room, earliest
    /// admission first.
    fn drain(&mut self, dirty: Dirty) {
        while !self.closed && !dirty.is_empty() && !self.queue.is_empty() {
            let next = self.queue.next_eligible(
                &dirty,
                |b| self.bucket_has_room(b),
                |p| self.parent_has_room(p),
                |t| self.workers.has_room(t),
            );
            let Some((_, id, _)) = next else { break };
            let mut more = Dirty::default();
            self.start(id, &mut more);
            // Starting takes slots and never frees one, so `more` stays empty;
            // keep draining the same freed limits.
            debug_assert!(more.is_empty());
        }
    }

    /// Runs to hand to the runners since the last call.
    pub fn take_starts(&mut self) -> Vec<RunStart> {
        std::mem::take(&mut self.starts)
    }

    /// Cancel-grace timers to arm since the last call: after the duration,
    /// [`Core::release_worker_slot`] the (worker, agent) pair.
    pub fn take_grace_timers(&mut self) -> Vec<(WorkerId, AgentId, Duration)> {
        std::mem::take(&mut self.grace_timers)
    }

    // ----- run reports -------------------------------------------------------

    /// The run ended on its own: DONE with a result, or FAILED. Reports
    /// for agents that already ended (cancelled, timed out) are ignored.
    pub fn finish(&mut self, id: AgentId, outcome: Result<String, AgentError>) -> bool {
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
                rec.view.error = Some(error);
                AgentStatus::Failed
            }
        };
        let mut dirty = Dirty::default();
        if self.transition(id, to, &mut dirty).is_err() {
            return false;
        }
        self.cascade(id, Cascade::SkipDetached, &mut dirty, &mut Vec::new());
        self.drain(dirty);
        true
    }

    /// Appends a chunk of output to the agent's result while it runs, and
    /// publishes it as an OUTPUT event if anyone watches progress.
    pub fn append_output(&mut self, id: AgentId, chunk: &str) {
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        let Some(run) = rec.run.as_mut() else {
            return;
        };
        if chunk.is_empty() || rec.view.status.is_terminal() {
            return;
        }
        run.output.push_str(chunk);
        run.progress.touch();
        if self.events.wants_progress() {
            // The record's own view has no result while it runs: progress
            // events carry the chunk, not the whole output again.
            let view = rec.view.clone();
            self.events
                .publish_progress(Progress::Output(chunk.into()), view);
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
        }
    }

    /// Ends a live run from the server's side (circuit breaker, stale):
    /// like a failure reported by the run, it cancels the non-detached
    /// descendants.
    fn end_run(&mut self, id: AgentId, to: AgentStatus, error: AgentError) -> bool {
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

    /// The run asks for approval of a tool call: RUNNING → AWAITING_APPROVAL,
    /// freeing its bucket and parent slots (the global slot and a worker's
    /// capacity stay). Returns the new approval and where its decision will
    /// arrive (once the agent runs again), or None if the agent is not
    /// running.
    pub fn request_approval(
        &mut self,
        id: AgentId,
        tool_name: &str,
        detail: &str,
    ) -> Option<(Approval, oneshot::Receiver<ApprovalOutcome>)> {
        let (tx, rx) = oneshot::channel();
        let approval = self.pause_for_approval(id, tool_name, detail, Some(tx))?;
        Some((approval, rx))
    }

    fn pause_for_approval(
        &mut self,
        id: AgentId,
        tool_name: &str,
        detail: &str,
        decision_to: Option<oneshot::Sender<ApprovalOutcome>>,
    ) -> Option<Approval> {
        let rec = self.agents.get_mut(&id)?;
        if rec.view.status != AgentStatus::Running {
            return None;
        }
        let run = rec.run.as_mut()?;
        run.progress.touch();
        run.approval = decision_to;
        run.decision = None;
        let approval = Approval {
            id: Uuid::new_v4(),
            tool_name: tool_name.into(),
            detail: if detail.is_empty() {
                self.empty.clone()
            } else {
                detail.into()
            },
        };
        rec.view.approval = Some(Arc::new(approval.clone()));
        if let Some(span) = rec.span.as_mut() {
            let tool = approval.tool_name.clone();
            span.push(SystemTime::now(), SpanEventKind::ApprovalRequested { tool });
        }
        let mut dirty = Dirty::default();
        self.transition(id, AgentStatus::AwaitingApproval, &mut dirty)
            .ok()?;
        self.drain(dirty);
        Some(approval)
    }

    /// Decides an agent's pending approval: the agent goes back to its
    /// bucket's queue (or runs at once, see [`Core::resume`]) and its run
    /// receives `outcome` when it is RUNNING again.
    pub fn decide_approval(
        &mut self,
        id: AgentId,
        approval_id: Uuid,
        outcome: ApprovalOutcome,
    ) -> Result<AgentView, Error> {
        let rec = self.agents.get_mut(&id).ok_or_else(|| Error::NotFound {
            field: "id",
            id: id.to_string(),
        })?;
        let pending = match (&rec.view.approval, rec.view.status) {
            (Some(approval), AgentStatus::AwaitingApproval) => approval.id,
            (_, status) => return Err(Error::NotAwaitingApproval { id, status }),
        };
        if pending != approval_id {
            return Err(Error::ApprovalMismatch {
                id,
                given: approval_id,
                pending,
            });
        }
        if let Some(run) = rec.run.as_mut() {
            run.decision = Some((approval_id, outcome));
        }
        self.resume(id);
        Ok(self.view(id).expect("known agent"))
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
        let (bucket, parent) = (rec.view.bucket.clone(), rec.parent_key.clone());
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

    // ----- workers --------------------------------------------------------------

    /// Registers a connected worker; queued agents of its types may start
    /// at once.
    pub fn register_worker(
        &mut self,
        info: WorkerInfo,
        commands: tokio::sync::mpsc::UnboundedSender<WorkerCommand>,
    ) -> WorkerId {
        let mut dirty = Dirty::default();
        for agent_type in &info.agents {
            dirty.worker_type(agent_type);
        }
        let id = self.workers.register(info, commands);
        self.drain(dirty);
        id
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
            let retries = self
                .agent_types
                .get(&*rec.view.agent)
                .map_or(0, |t| t.retry_on_worker_lost);
            if rec.view.attempt <= retries {
                self.retry(id, &mut dirty);
            } else {
                let error = AgentError::new(
                    CODE_WORKER_LOST,
                    format!(
                        "worker \"{}\" ({worker}) was lost while holding the run (attempt {})",
                        info.name, rec.view.attempt
                    ),
                );
                self.finish(id, Err(error));
            }
        }
        self.drain(dirty);
        held.len()
    }

    /// Queues a run whose worker was lost for another attempt, ahead of
    /// newer agents (it keeps its admission sequence).
    fn retry(&mut self, id: AgentId, dirty: &mut Dirty) {
        let rec = self.agents.get_mut(&id).expect("known agent");
        if let Some(run) = rec.run.take() {
            // Ends this attempt's run task without a report.
            run.cancel.cancel();
        }
        let agent_type = rec.view.agent.clone();
        if let Some(span) = rec.span.as_mut() {
            let attempt = rec.view.attempt + 1;
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
        dirty.worker_type(&agent_type);
    }

    /// The cancel grace of a stopped worker run passed: its capacity frees
    /// unless the worker already confirmed the run ended.
    pub fn release_worker_slot(&mut self, worker: WorkerId, agent: AgentId) -> bool {
        if !self.workers.release(worker, agent) {
            return false;
        }
        let mut dirty = Dirty::default();
        for agent_type in self.workers.agents_of(worker) {
            dirty.worker_type(agent_type);
        }
        self.drain(dirty);
        true
    }

    /// Applies a worker's report about one of its runs. Reports about runs
    /// the worker does not hold, or that already ended, are not applied;
    /// a terminal report always frees the worker's capacity for the run.
    pub fn worker_report(&mut self, worker: WorkerId, agent: AgentId, event: WorkerEvent) -> bool {
        let live = self.agents.get(&agent).is_some_and(|r| {
            r.view.worker_id == Some(worker)
                && r.runner == RunnerKind::Worker
                && !r.view.status.is_terminal()
        }) && self.workers.holds(worker, agent);
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
            WorkerEvent::Done(result) => return self.finish(agent, Ok(result)),
            WorkerEvent::Failed(error) => return self.finish(agent, Err(error)),
        }
        true
    }

    /// Every worker's (id, capacity, held runs), for invariant checks.
    pub fn worker_snapshot(&self) -> Vec<(WorkerId, u32, Vec<AgentId>)> {
        self.workers.snapshot()
    }

    // ----- cancel -------------------------------------------------------------

    /// Cancels an agent and its live descendants (detached ones included,
    /// also when the agent itself already ended). Returns every agent moved
    /// to CANCELLED.
    pub fn cancel(&mut self, id: AgentId, reason: &str) -> Result<Vec<AgentView>, Error> {
        if !self.agents.contains_key(&id) {
            return Err(Error::NotFound {
                field: "id",
                id: id.to_string(),
            });
        }
        // An agent that already ended is not listed, but live descendants
        // that outlived it (detached ones) are still part of its subtree.
        let mut dirty = Dirty::default();
        let mut cancelled = Vec::new();
        self.cancel_one(id, cancel_message(reason), &mut dirty, &mut cancelled);
        self.cascade(id, Cascade::Everything, &mut dirty, &mut cancelled);
        self.drain(dirty);
        Ok(cancelled)
    }

    /// Cancels every live agent under a lead, with their descendants.
    pub fn cancel_lead(&mut self, lead: &str, reason: &str) -> Vec<AgentView> {
        let mut ids: Vec<AgentId> = self
            .lead_live
            .get(lead)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        // Cancel in admission order so events read naturally (parents first).
        ids.sort_by_key(|id| self.agents.get(id).map_or(0, |r| r.seq));
        let mut dirty = Dirty::default();
        let mut cancelled = Vec::new();
        let message = cancel_message(reason);
        for id in ids {
            if self
                .agents
                .get(&id)
                .is_some_and(|r| !r.view.status.is_terminal())
            {
                self.cancel_one(id, message.clone(), &mut dirty, &mut cancelled);
                self.cascade(id, Cascade::Everything, &mut dirty, &mut cancelled);
            }
        }
        self.drain(dirty);
        cancelled
    }

    fn cancel_one(
        &mut self,
        id: AgentId,
        message: String,
        dirty: &mut Dirty,
        cancelled: &mut Vec<AgentView>,
    ) {
        let Some(rec) = self.agents.get_mut(&id) else {
            return;
        };
        if rec.view.status.is_terminal() {
            return;
        }
        rec.view.error = Some(AgentError::new(CODE_CANCELLED, message));
        if self.transition(id, AgentStatus::Cancelled, dirty).is_ok() {
            if let Some(v) = self.view(id) {
                cancelled.push(v);
            }
        }
    }

    /// Cancels the live descendants of `id`, which has just ended.
    fn cascade(
        &mut self,
        id: AgentId,
        mode: Cascade,
        dirty: &mut Dirty,
        cancelled: &mut Vec<AgentView>,
    ) {
        let mut stack = vec![id];
        while let Some(parent) = stack.pop() {
            let Some(rec) = self.agents.get(&parent) else {
                continue;
            };
            let (children, status) = (rec.children.clone(), rec.view.status);
            for child in children {
                let Some(c) = self.agents.get(&child) else {
                    continue;
                };
                if mode == Cascade::SkipDetached && c.view.detached {
                    continue;
                }
                if !c.view.status.is_terminal() {
                    let message = format!(
                        "parent agent {parent} ended ({})",
                        format!("{status:?}").to_uppercase()
                    );
                    self.cancel_one(child, message, dirty, cancelled);
                }
                stack.push(child);
            }
        }
    }

    // ----- steer ----------------------------------------------------------------

    /// Delivers a steer message now (RUNNING) or buffers it (QUEUED,
    /// AWAITING_APPROVAL).
    pub fn steer(
        &mut self,
        id: AgentId,
        message: String,
    ) -> Result<(AgentView, SteerDelivery), Error> {
        let rec = self.agents.get_mut(&id).ok_or(Error::NotFound {
            field: "id",
            id: id.to_string(),
        })?;
        let agent_type = self.agent_types.get(&*rec.view.agent);
        if !rec.view.status.is_terminal() && agent_type.is_some_and(|t| !t.accepts_steer()) {
            return Err(Error::SteerNotAccepted {
                id,
                agent_type: rec.view.agent.to_string(),
            });
        }
        // A program reading steer messages as lines would see this one as
        // several: refuse it rather than change it.
        let line_based = agent_type.is_some_and(|t| t.runner == RunnerKind::Command);
        if line_based && message.contains(['\n', '\r']) {
            return Err(Error::invalid(
                "message",
                format!(
                    "agent type \"{}\" reads steer messages as lines on standard input: \
                     the message must be a single line",
                    rec.view.agent
                ),
            ));
        }
        let delivered_bytes = message.len();
        let delivery = match rec.view.status {
            AgentStatus::Running => {
                match (rec.view.worker_id, &rec.run) {
                    (Some(worker), _) if rec.runner == RunnerKind::Worker => {
                        self.workers.send(
                            worker,
                            WorkerCommand::Steer {
                                agent_id: id,
                                message,
                            },
                        );
                    }
                    (_, Some(run)) => {
                        // A closed inbox means the run is ending; the message
                        // would be lost either way.
                        let _ = run.steer.send(message);
                    }
                    (_, None) => {}
                }
                if let Some(span) = rec.span.as_mut() {
                    let bytes = delivered_bytes;
                    span.push(SystemTime::now(), SpanEventKind::SteerDelivered { bytes });
                }
                SteerDelivery::Delivered
            }
            AgentStatus::Queued | AgentStatus::AwaitingApproval => {
                rec.steer_buffer.push(message);
                SteerDelivery::Buffered
            }
            status => {
                return Err(Error::AgentFinished {
                    field: "id",
                    id: id.to_string(),
                    status,
                })
            }
        };
        if delivery == SteerDelivery::Delivered {
            self.publish(id, EventKind::Steered);
        }
        Ok((self.view(id).expect("known agent"), delivery))
    }

    // ----- reads ------------------------------------------------------------------

    fn view_of(&self, rec: &Record) -> AgentView {
        let mut v = rec.view.clone();
        if v.status == AgentStatus::Queued {
            v.queue_reason = Some(self.queue_reason(rec).into());
        }
        if let Some(run) = &rec.run {
            if !run.output.is_empty() {
                v.result = run.output.as_str().into();
            }
        }
        v
    }

    fn queue_reason(&self, rec: &Record) -> String {
        if !rec.view.background {
            // Foreground agents bypass bucket and parent: only a worker can
            // be missing.
            return self
                .worker_reason(rec)
                .unwrap_or_else(|| "waiting for a slot".to_owned());
        }
        let bucket = &rec.view.bucket;
        let limit = self.bucket_limit(bucket);
        let running = self.bucket_running.get(bucket).copied().unwrap_or(0);
        if limit != 0 && running >= limit {
            return format!("bucket \"{bucket}\" {running}/{limit} running");
        }
        let limit = self.limits.max_concurrent_per_parent;
        let running = self
            .parent_running
            .get(&rec.parent_key)
            .copied()
            .unwrap_or(0);
        // A root without a lead has no per-parent limit.
        if rec.parent_key != ParentKey::None && limit != 0 && running >= limit {
            return format!("parent limit {running}/{limit}");
        }
        self.worker_reason(rec)
            .unwrap_or_else(|| "waiting for a slot".to_owned())
    }

    /// Why a worker type's agent cannot get a worker, if it cannot.
    fn worker_reason(&self, rec: &Record) -> Option<String> {
        let agent_type = rec.needs_worker()?;
        let cap = self.workers.capacity_of(agent_type);
        if cap.workers == 0 {
            Some(format!(
                "no worker connected for agent type \"{agent_type}\""
            ))
        } else if !self.workers.has_room(agent_type) {
            Some(format!(
                "all {} workers for agent type \"{agent_type}\" are busy ({}/{} runs)",
                cap.workers, cap.held, cap.capacity
            ))
        } else {
            None
        }
    }

    /// One agent as the API shows it.
    pub fn view(&self, id: AgentId) -> Option<AgentView> {
        self.agents.get(&id).map(|r| self.view_of(r))
    }

    /// Agents matching `filter`, oldest first, starting after admission
    /// sequence `after`, at most `limit`.
    pub fn list(&self, filter: &AgentFilter, after: u64, limit: usize) -> Page {
        let mut agents = Vec::new();
        let mut last = None;
        for (seq, rec) in self.candidates(filter, after) {
            if agents.len() == limit {
                return Page {
                    agents,
                    next_after: last,
                };
            }
            agents.push(self.view_of(rec));
            last = Some(seq);
        }
        Page {
            agents,
            next_after: None,
        }
    }

    /// The records matching `filter` after admission sequence `after`,
    /// oldest first. Filters with an index (ids, parent's child list,
    /// tree, lead, live statuses) read only their own agents, so a listing
    /// or a snapshot does not scan every retained agent under the lock;
    /// only a filter on finished states alone (or none) scans, testing
    /// each record before a view is built.
    fn candidates<'a>(
        &'a self,
        filter: &'a AgentFilter,
        after: u64,
    ) -> impl Iterator<Item = (u64, &'a Record)> + 'a {
        let record = move |(seq, id): (u64, &AgentId)| self.agents.get(id).map(|r| (seq, &**r));
        let after_seq = after.saturating_add(1);
        let candidates: Box<dyn Iterator<Item = (u64, &Record)>> = if !filter.ids.is_empty() {
            let mut recs: Vec<(u64, &Record)> = filter
                .ids
                .iter()
                .filter_map(|id| self.agents.get(id))
                .map(|rec| (rec.seq, &**rec))
                .filter(|(seq, _)| *seq > after)
                .collect();
            recs.sort_unstable_by_key(|(seq, _)| *seq);
            recs.dedup_by_key(|(seq, _)| *seq);
            Box::new(recs.into_iter())
        } else if let Some(parent) = filter.parent_id.and_then(|p| self.agents.get(&p)) {
            Box::new(
                parent
                    .children
                    .iter()
                    .filter_map(|c| self.agents.get(c))
                    .map(|rec| (rec.seq, &**rec))
                    .filter(move |(seq, _)| *seq > after),
            )
        } else if let Some(root) = filter.root_id {
            Box::new(
                self.by_root
                    .range((root, after_seq)..=(root, u64::MAX))
                    .map(|(&(_, seq), id)| (seq, id))
                    .filter_map(record),
            )
        } else if let Some(lead) = &filter.lead_id {
            let lead: Arc<str> = lead.as_str().into();
            Box::new(
                self.by_lead
                    .range((lead.clone(), after_seq)..=(lead, u64::MAX))
                    .map(|(&(_, seq), id)| (seq, id))
                    .filter_map(record),
            )
        } else if let Some(live) = self.by_status.ranges(&filter.statuses, after_seq) {
            Box::new(live.filter_map(record))
        } else {
            Box::new(
                self.order
                    .range(after_seq..)
                    .filter_map(move |(&seq, id)| record((seq, id))),
            )
        };
        candidates.filter(move |(_, rec)| filter.matches(&rec.view))
    }

    /// Registers `waiter` to be notified when `id` settles. Returns false if
    /// it is settled already.
    pub fn add_waiter(&mut self, id: AgentId, waiter: &Arc<Notify>) -> bool {
        match self.agents.get(&id) {
            Some(rec) if !rec.view.status.is_settled() => {
                let list = self.waiters.entry(id).or_default();
                if !list.iter().any(|w| Arc::ptr_eq(w, waiter)) {
                    list.push(waiter.clone());
                }
                true
            }
            _ => false,
        }
    }

    /// Forgets a waiter (its Await returned or its caller went away).
    pub fn remove_waiter(&mut self, id: AgentId, waiter: &Arc<Notify>) {
        if let Some(list) = self.waiters.get_mut(&id) {
            list.retain(|w| !Arc::ptr_eq(w, waiter));
            if list.is_empty() {
                self.waiters.remove(&id);
            }
        }
    }

    /// Registered Await waiters over all agents (tests check that callers
    /// who went away left none behind).
    pub fn waiter_count(&self) -> usize {
        self.waiters.values().map(Vec::len).sum()
    }

    /// Subscribes to events, see [`EventLog::subscribe`].
    pub fn subscribe(&mut self, query: &WatchQuery) -> Subscription {
        let WatchQuery {
            filter,
            after_sequence,
            include_snapshot,
            include_progress,
        } = query;
        let (after_sequence, include_snapshot) = (*after_sequence, *include_snapshot);
        let needs_snapshot = include_snapshot
            || (after_sequence > 0 && !self.events.can_replay_after(after_sequence));
        // Built only when sent, and filtered on the record before a view is
        // made, since this runs under the scheduler lock.
        let snapshot = needs_snapshot.then(|| {
            self.candidates(filter, 0)
                .map(|(_, rec)| self.view_of(rec))
                .collect()
        });
        self.events
            .subscribe(filter, after_sequence, snapshot, *include_progress)
    }

    /// Ends a routed subscription (see [`EventLog::unsubscribe`]).
    pub fn unsubscribe(&mut self, id: SubscriberId) {
        self.events.unsubscribe(id);
    }

    fn publish(&mut self, id: AgentId, kind: EventKind) {
        let view = self.view(id).expect("known agent");
        self.events.publish(kind, view);
    }

    /// Stops admitting and starting agents (the drain before shutdown):
    /// Spawn is refused with [`Error::ShuttingDown`], queued agents stay
    /// queued, running ones go on.
    pub fn stop_admitting(&mut self) {
        self.closed = true;
    }

    /// Agents RUNNING now (not waiting for a slot or an approval).
    pub fn running_count(&self) -> u32 {
        self.stats.buckets().map(|(_, b)| b.running).sum()
    }

    /// Stops admitting and cancels every live agent with `reason`, oldest
    /// first, in one step: nothing queued is started by the slots this
    /// frees. Returns how many agents were cancelled.
    pub fn shut_down(&mut self, reason: &str) -> usize {
        self.closed = true;
        let live: Vec<AgentId> = self
            .order
            .values()
            .filter(|id| !self.agents[*id].view.status.is_terminal())
            .copied()
            .collect();
        let mut dirty = Dirty::default();
        let mut cancelled = Vec::new();
        for id in live {
            self.cancel_one(id, reason.to_owned(), &mut dirty, &mut cancelled);
        }
        cancelled.len()
    }

    // ----- retention -----------------------------------------------------------------

    /// Forgets agents that finished more than `finished_retention` before
    /// `now`. Returns how many were forgotten.
    pub fn sweep(&mut self, now: SystemTime) -> usize {
        let retention = self.runs.finished_retention;
        let mut n = 0;
        while let Some(&(at, id)) = self.finished.front() {
            if at + retention > now {
                break;
            }
            self.finished.pop_front();
            if let Some(rec) = self.agents.remove(&id) {
                self.order.remove(&rec.seq);
                if let Some(lead) = &rec.view.lead_id {
                    self.by_lead.remove(&(lead.clone(), rec.seq));
                }
                self.by_root.remove(&(rec.view.root_id, rec.seq));
                if let Some(k) = rec.idempotency_key {
                    self.idempotency.remove(&(rec.parent_key, k));
                }
                n += 1;
            }
        }
        if n > 0 {
            // Names no agent uses any more (a model nobody spawns now).
            self.names.retain(|name| Arc::strong_count(name) > 1);
        }
        n
    }

    // ----- invariants (tests) ------------------------------------------------------

    /// The core's counters, for comparison with [`Core::recount`].
    pub fn counters(&self) -> Counters {
        Counters {
            live_background: self.live_background,
            buckets: self
                .bucket_running
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            parents: self
                .parent_running
                .iter()
                .map(|(k, v)| (format!("{k:?}"), *v))
                .collect(),
            trees: self.tree_live.iter().map(|(k, v)| (*k, *v)).collect(),
            queued: self.queue.len(),
            live_by_status: self.by_status.entries(),
        }
    }

    /// The counters recomputed from the agents' states.
    pub fn recount(&self) -> Counters {
        let mut c = Counters::default();
        for rec in self.agents.values() {
            let held = Held::of(rec.view.status, rec.view.background);
            if held.global {
                c.live_background += 1;
            }
            if held.bucket {
                *c.buckets.entry(rec.view.bucket.to_string()).or_default() += 1;
            }
            if held.parent {
                *c.parents
                    .entry(format!("{:?}", rec.parent_key))
                    .or_default() += 1;
            }
            if held.tree {
                *c.trees.entry(rec.view.root_id).or_default() += 1;
            }
            if rec.view.status == AgentStatus::Queued {
                c.queued += 1;
            }
            if !rec.view.status.is_terminal() {
                c.live_by_status.insert((rec.view.status.name(), rec.seq));
            }
        }
        c
    }

    /// Whether a queued agent could start now (its limits all have room).
    /// After every public method this is false for every queued agent.
    pub fn startable_queued(&self) -> Vec<AgentId> {
        self.agents
            .values()
            .filter(|r| r.view.status == AgentStatus::Queued && self.can_start(r))
            .map(|r| r.view.id)
            .collect()
    }

    /// Running agents per bucket and their limits, for invariant checks.
    pub fn bucket_usage(&self) -> Vec<(String, u32, u32)> {
        self.bucket_running
            .iter()
            .map(|(k, v)| (k.to_string(), *v, self.bucket_limit(k)))
            .collect()
    }

    /// Admission sequence of an agent.
    pub fn seq_of(&self, id: AgentId) -> Option<u64> {
        self.agents.get(&id).map(|r| r.seq)
    }
}

fn cancel_message(reason: &str) -> String {
    if reason.is_empty() {
        "cancelled by request".to_owned()
    } else {
        reason.to_owned()
    }
}

fn add_to(total: &mut Usage, more: Usage) {
    total.input_tokens += more.input_tokens;
    total.output_tokens += more.output_tokens;
    total.tool_calls += more.tool_calls;
}

fn shared_types(
    types: BTreeMap<String, AgentTypeConfig>,
) -> BTreeMap<String, Arc<AgentTypeConfig>> {
    types.into_iter().map(|(k, v)| (k, Arc::new(v))).collect()
}

/// Live agents by state (QUEUED, RUNNING, AWAITING_APPROVAL), each in
/// admission order. Terminal states are not indexed: retained finished
/// agents far outnumber live ones and would cost an entry each.
#[derive(Debug, Default)]
struct LiveByStatus {
    queued: BTreeMap<u64, AgentId>,
    running: BTreeMap<u64, AgentId>,
    awaiting_approval: BTreeMap<u64, AgentId>,
}

impl LiveByStatus {
    fn of(&mut self, status: AgentStatus) -> Option<&mut BTreeMap<u64, AgentId>> {
        match status {
            AgentStatus::Queued => Some(&mut self.queued),
            AgentStatus::Running => Some(&mut self.running),
            AgentStatus::AwaitingApproval => Some(&mut self.awaiting_approval),
            AgentStatus::Done | AgentStatus::Failed | AgentStatus::Cancelled => None,
        }
    }

    /// Moves agent `id` (admission sequence `seq`) from `from` (None: new)
    /// to `to`.
    fn moved(&mut self, seq: u64, id: AgentId, from: Option<AgentStatus>, to: AgentStatus) {
        if let Some(map) = from.and_then(|f| self.of(f)) {
            map.remove(&seq);
        }
        if let Some(map) = self.of(to) {
            map.insert(seq, id);
        }
    }

    /// The agents in any of `statuses` from admission sequence `from` on,
    /// oldest first, when every one of them is a live state (None when the
    /// index cannot answer: no statuses, or a terminal one among them).
    fn ranges<'a>(
        &'a self,
        statuses: &[AgentStatus],
        from: u64,
    ) -> Option<impl Iterator<Item = (u64, &'a AgentId)> + 'a> {
        if statuses.is_empty() {
            return None;
        }
        let mut maps: Vec<&BTreeMap<u64, AgentId>> = Vec::with_capacity(3);
        for status in statuses {
            let map = match status {
                AgentStatus::Queued => &self.queued,
                AgentStatus::Running => &self.running,
                AgentStatus::AwaitingApproval => &self.awaiting_approval,
                AgentStatus::Done | AgentStatus::Failed | AgentStatus::Cancelled => return None,
            };
            if !maps.iter().any(|m| std::ptr::eq(*m, map)) {
                maps.push(map);
            }
        }
        let mut heads: Vec<_> = maps
            .into_iter()
            .map(|m| m.range(from..).map(|(&seq, id)| (seq, id)).peekable())
            .collect();
        // A merge of at most three ordered ranges by sequence.
        Some(std::iter::from_fn(move || {
            let next = heads
                .iter_mut()
                .enumerate()
                .filter_map(|(i, h)| h.peek().map(|(seq, _)| (*seq, i)))
                .min()?;
            heads[next.1].next()
        }))
    }

    /// Every (state, sequence) held, for [`Core::counters`].
    fn entries(&self) -> BTreeSet<(&'static str, u64)> {
        [
            (AgentStatus::Queued, &self.queued),
            (AgentStatus::Running, &self.running),
            (AgentStatus::AwaitingApproval, &self.awaiting_approval),
        ]
        .into_iter()
        .flat_map(|(status, map)| map.keys().map(move |seq| (status.name(), *seq)))
        .collect()
    }
}
