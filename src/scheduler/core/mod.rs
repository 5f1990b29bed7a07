//! The scheduler core: every agent record, every counter and the admission
//! queue, changed only by synchronous methods.
//!
//! The core does no I/O and never awaits. It lives behind one mutex in
//! [`super::Scheduler`], which is held only for the duration of one method
//! call; runs are started by the caller from the [`RunStart`]s the core
//! hands out. That keeps the hot path (Spawn → admit → start) free of
//! channel hops, and lets the model-based test drive the core directly.
//!
//! This file holds the types, the records and their invariants, the
//! configuration and the limit checks; `Core`'s methods are split by
//! concern into one `impl Core` block per child module: `admission`,
//! `lifecycle`, `cancel`, `steer`, `approval`, `workers`, `reports`,
//! `reads`, `inbox`, `retention` and `counters`.

mod admission;
mod approval;
mod cancel;
mod counters;
mod inbox;
mod indexes;
mod lifecycle;
mod reads;
pub mod recovery;
mod reports;
mod retention;
mod steer;
mod tracking;
mod unsaved;
mod workers;

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    conversation::{self, Conversations},
    events::EventLog,
    inbox::{SteerInbox, SteerSender},
    queue::{AdmissionQueue, BucketKey, Dirty, SubKey, WorkerKey},
    state::Held,
    stats::Stats,
    trace::{EndedRun, SpanRecord, SpanSink, TraceContext},
    types::*,
    workers::{WorkerId, WorkerPool},
};
use foldhash::{HashMap, HashSet};

use self::indexes::{InboxKey, LeadIndex, LiveByStatus, SeqIndex};
use self::unsaved::Unsaved;

use crate::config::{AgentTypeConfig, Limits, RunnerKind, RunsConfig, TenantLimits, WatchConfig};

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
    /// The trace context naming the run's span (or the context it
    /// inherited when spans are not recorded), for the runner's
    /// `traceparent`: formatted by the run task, not under the core's lock.
    pub trace: TraceContext,
    /// Last-report clock, for the stale watch.
    pub progress: Arc<RunProgress>,
    /// `[runs] stale_timeout` at the start (zero = off).
    pub stale_timeout: Duration,
    /// A continuation's history: the turns before its own (None for the
    /// first turn of a conversation).
    pub history: Option<Arc<conversation::History>>,
    /// Spawn's `workspace_base`: where the run's worktree starts.
    pub workspace_base: Option<Arc<str>>,
    /// The workspace of the agent a continuation or fork continues.
    pub continues_workspace: Option<Arc<Workspace>>,
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
    /// Turns the run started, for `[agents.NAME] max_turns`.
    turns: u32,
    /// The failure the run is about to report is a provider's that another
    /// model may not have (`[agents.NAME] fallback_models`).
    retryable: bool,
    /// When the run last reported anything, for `[runs] stale_timeout`.
    progress: Arc<RunProgress>,
    /// A command run's process group, once the runner reported it.
    process_group: Option<super::durable::ProcessGroup>,
    /// The highest `seq` of the worker's reports applied to this run (0:
    /// none, or not numbered). Stored with the agent, so that after a
    /// restart the worker's repeated reports apply only where the store
    /// did not have them.
    report_seq: u64,
}

impl RunControl {
    /// Controls for a new run (a first start, or a worker run that
    /// re-attached), and the steer inbox its runner reads.
    fn fresh() -> (Box<Self>, SteerInbox) {
        let (steer, inbox) = crate::scheduler::inbox::steer_inbox();
        let control = Box::new(Self {
            cancel: CancellationToken::new(),
            steer,
            output: String::new(),
            approval: None,
            decision: None,
            last_call: None,
            identical_calls: 0,
            turns: 0,
            retryable: false,
            progress: Arc::new(RunProgress::new()),
            process_group: None,
            report_seq: 0,
        });
        (control, inbox)
    }
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

#[derive(Debug)]
struct Record {
    view: AgentView,
    /// Admission sequence: FIFO order and creation order.
    seq: u64,
    runner: RunnerKind,
    /// Until the agent ends (a retried run is assigned it again).
    prompt: Option<Arc<str>>,
    /// The run deadline in milliseconds, rounded up, at most ~49 days (a
    /// `Duration` takes 16 bytes, and the record must stay in its size
    /// class).
    timeout_ms: u32,
    /// Boxed for the same reason as `run`: few agents have either part.
    rare: Option<Box<Rare>>,
    /// Boxed: only live runs have one, and inline it would push every
    /// retained record into a larger allocation size class.
    run: Option<Box<RunControl>>,
    children: Children,
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

/// A record's direct children, in spawn order. One word: most agents
/// have none, and a `Vec` inline (three words) would push the record out
/// of its size class.
#[derive(Debug, Default)]
#[allow(clippy::box_collection)] // one word inline, not three: see above
struct Children(Option<Box<Vec<AgentId>>>);

impl Children {
    fn push(&mut self, id: AgentId) {
        self.0.get_or_insert_with(Box::default).push(id);
    }

    fn iter(&self) -> std::slice::Iter<'_, AgentId> {
        self.0.as_deref().map_or(&[][..], Vec::as_slice).iter()
    }

    fn to_vec(&self) -> Vec<AgentId> {
        self.iter().copied().collect()
    }
}

/// The parts of a record most agents never have.
#[derive(Debug, Default)]
struct Rare {
    /// Steer messages waiting for the run.
    steer_buffer: Vec<String>,
    idempotency_key: Option<Arc<str>>,
    /// Spawn's `workspace_base`: where the run's worktree starts.
    workspace_base: Option<Arc<str>>,
}

impl Record {
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.into())
    }

    fn timeout_ms(timeout: Duration) -> u32 {
        u32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(u32::MAX)
    }

    fn rare(rare: Rare) -> Option<Box<Rare>> {
        (!rare.steer_buffer.is_empty()
            || rare.idempotency_key.is_some()
            || rare.workspace_base.is_some())
        .then(|| Box::new(rare))
    }

    fn idempotency_key(&self) -> Option<&Arc<str>> {
        self.rare.as_ref()?.idempotency_key.as_ref()
    }

    fn workspace_base(&self) -> Option<&Arc<str>> {
        self.rare.as_ref()?.workspace_base.as_ref()
    }

    fn steer_buffer(&self) -> &[String] {
        self.rare.as_ref().map_or(&[], |r| &r.steer_buffer)
    }

    fn buffer_steer(&mut self, message: String) {
        self.rare
            .get_or_insert_with(Box::default)
            .steer_buffer
            .push(message);
    }

    /// The waiting steer messages, oldest first, leaving none.
    fn take_steer_buffer(&mut self) -> Vec<String> {
        self.rare
            .as_mut()
            .map(|r| std::mem::take(&mut r.steer_buffer))
            .unwrap_or_default()
    }

    /// The trace context the run passes on: to its runner (`traceparent`)
    /// and to its children.
    fn trace_context(&self) -> TraceContext {
        TraceContext {
            trace_id: self.view.trace_id,
            span_id: self.span_id,
            sampled: self.sampled,
        }
    }

    /// Its tenant and agent type, when the agent needs a worker's capacity
    /// to start: a worker type with no worker holding its run yet.
    fn needs_worker(&self) -> Option<WorkerKey> {
        (self.runner == RunnerKind::Worker && self.view.worker_id.is_none())
            .then(|| (self.view.tenant.clone(), self.view.agent.clone()))
    }

    /// The parent whose per-parent limit this agent counts against: its
    /// parent agent, else its lead (tenant and lead id), else none. Derived
    /// from the view rather than kept: a record must stay in its size class.
    fn parent_key(&self) -> ParentKey {
        match (self.view.parent_id, &self.view.lead_id) {
            (Some(p), _) => ParentKey::Agent(p),
            (None, Some(lead)) => ParentKey::Lead(self.view.tenant.clone(), lead.clone()),
            (None, None) => ParentKey::None,
        }
    }

    fn sub_key(&self) -> SubKey {
        SubKey {
            bucket: self.view.bucket.clone(),
            parent: self.parent_key(),
            worker_type: self.needs_worker(),
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
    /// Live background agents per tenant (non-zero entries only).
    pub tenants: BTreeMap<String, u32>,
    /// Running agents per bucket (non-zero entries only).
    pub buckets: BTreeMap<String, u32>,
    /// Running background children per parent (non-zero entries only).
    pub parents: BTreeMap<String, u32>,
    /// Live agents per tree (non-zero entries only).
    pub trees: BTreeMap<AgentId, u32>,
    /// Queued agents.
    pub queued: usize,
    /// (state, tenant, admission sequence) of every live agent, as the
    /// status index holds them; the tenant is None in the index over
    /// every tenant.
    pub live_by_status: BTreeSet<(&'static str, Option<String>, u64)>,
    /// (tenant, admission sequence) of every retained agent, likewise.
    pub retained: BTreeSet<(Option<String>, u64)>,
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
    /// Every retained agent by admission sequence (and per tenant), for
    /// listing in creation order.
    order: SeqIndex,
    next_seq: u64,
    queue: AdmissionQueue,
    live_background: u32,
    /// `[tenants.NAME]`.
    tenant_limits: BTreeMap<String, TenantLimits>,
    /// Live background agents per tenant (non-zero entries only).
    tenant_live: HashMap<Arc<str>, u32>,
    /// Open WatchAgents streams per tenant (non-zero entries only).
    tenant_watchers: HashMap<Arc<str>, u32>,
    /// Spawn token buckets of tenants with a `spawn_rate`: tokens left and
    /// when they were counted.
    spawn_tokens: HashMap<Arc<str>, (f64, tokio::time::Instant)>,
    bucket_running: HashMap<BucketKey, u32>,
    parent_running: HashMap<ParentKey, u32>,
    tree_live: HashMap<AgentId, u32>,
    /// Live agents by (tenant, lead id).
    lead_live: HashMap<(Arc<str>, Arc<str>), HashSet<AgentId>>,
    /// Every retained agent of a lead / of a tree, in admission order, so
    /// `lead_id` and `root_id` listings do not scan all agents under the lock.
    /// One ordered map each (not a map per lead or tree): most trees are a
    /// single agent, and a map per tree cost ~400 bytes per retained agent.
    by_lead: LeadIndex,
    by_root: BTreeMap<(AgentId, u64), AgentId>,
    /// Live agents by state, in admission order, so `statuses` listings
    /// and snapshots (what dashboards poll) do not scan retained agents.
    /// Only live states: a finished agent costs nothing here.
    by_status: LiveByStatus,
    /// By (tenant, parent, key): a key names an agent only within its
    /// tenant and parent.
    idempotency: HashMap<(Arc<str>, ParentKey, Arc<str>), AgentId>,
    /// Finished agents in finish order, for retention sweeps.
    finished: VecDeque<(SystemTime, AgentId)>,
    waiters: HashMap<AgentId, Vec<Arc<Notify>>>,
    /// Inbox Await waiters, by whose inbox they read: woken when an agent
    /// of that inbox settles. Empty unless an inbox Await is waiting, so a
    /// settle pays one `is_empty` for it.
    inbox_waiters: HashMap<InboxKey, Vec<Arc<Notify>>>,
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
    /// Changes the store has not been handed yet; None when nothing is
    /// stored (`[store] backend = "memory"`).
    unsaved: Option<Box<Unsaved>>,
    /// Stored report numbers of worker runs restored for re-attach: the
    /// run's controls (where the number lives) come back only then.
    held_report_seqs: HashMap<AgentId, u64>,
    /// Every retained conversation and its transcript.
    conversations: Conversations,
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
            order: SeqIndex::default(),
            next_seq: 1,
            queue: AdmissionQueue::default(),
            live_background: 0,
            tenant_limits: BTreeMap::new(),
            tenant_live: HashMap::default(),
            tenant_watchers: HashMap::default(),
            spawn_tokens: HashMap::default(),
            bucket_running: HashMap::default(),
            parent_running: HashMap::default(),
            tree_live: HashMap::default(),
            lead_live: HashMap::default(),
            by_lead: LeadIndex::default(),
            by_root: BTreeMap::new(),
            by_status: LiveByStatus::default(),
            idempotency: HashMap::default(),
            finished: VecDeque::new(),
            waiters: HashMap::default(),
            inbox_waiters: HashMap::default(),
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
            unsaved: None,
            held_report_seqs: HashMap::default(),
            conversations: Conversations::new(
                conversation::DEFAULT_RETENTION,
                conversation::DEFAULT_MAX_TRANSCRIPT_BYTES,
            ),
        }
    }

    /// Applies `[conversations]` (at start and on reload).
    pub fn set_conversations(&mut self, config: crate::config::ConversationsConfig) {
        self.conversations
            .configure(config.retention, config.max_transcript_bytes);
    }

    /// Retained conversations.
    pub fn conversation_count(&self) -> usize {
        self.conversations.len()
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

    /// Live background agents of each tenant that has some.
    pub fn live_background_by_tenant(&self) -> impl Iterator<Item = (&str, u32)> {
        self.tenant_live.iter().map(|(t, n)| (&**t, *n))
    }

    /// Applies `[tenants.NAME]` (at start and on reload). A tenant's spawn
    /// bucket starts full again when its rate or burst changed.
    pub fn set_tenant_limits(&mut self, limits: BTreeMap<String, TenantLimits>) {
        self.spawn_tokens.retain(|tenant, _| {
            let (old, new) = (self.tenant_limits.get(&**tenant), limits.get(&**tenant));
            new.is_some_and(|n| n.spawn_rate > 0.0 && old == Some(n))
        });
        self.tenant_limits = limits;
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
            if new != old {
                self.move_bucket(id, new);
            }
        }
    }

    /// Moves live agent `id` to bucket `new`: its place in the queue, its
    /// gauges and the bucket slot it holds go with it.
    fn move_bucket(&mut self, id: AgentId, new: BucketKey) {
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
            .rebucketed(&rec.view.tenant, &old_key.bucket, &new, rec.view.status);
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

    /// The configured agent types, by name (sorted), each as of now.
    pub fn agent_types(&self) -> Vec<(String, Arc<AgentTypeConfig>)> {
        self.agent_types
            .iter()
            .map(|(name, t)| (name.clone(), t.clone()))
            .collect()
    }

    /// The agent type `name`.
    pub fn agent_type(&self, name: &str) -> Option<Arc<AgentTypeConfig>> {
        self.agent_types.get(name).cloned()
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
            || (self.bucket_has_room(&rec.view.bucket) && self.parent_has_room(&rec.parent_key()));
        limits && rec.needs_worker().is_none_or(|t| self.workers.has_room(&t))
    }

    fn parent_has_room(&self, parent: &ParentKey) -> bool {
        let limit = self.limits.max_concurrent_per_parent;
        *parent == ParentKey::None
            || limit == 0
            || self.parent_running.get(parent).copied().unwrap_or(0) < limit
    }
}

fn shared_types(
    types: BTreeMap<String, AgentTypeConfig>,
) -> BTreeMap<String, Arc<AgentTypeConfig>> {
    types.into_iter().map(|(k, v)| (k, Arc::new(v))).collect()
}
