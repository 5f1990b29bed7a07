//! Model-based test of the scheduler [`Core`] alone (no server, no clock):
//! random sequences of spawn / finish / fail / cancel / cancel-lead /
//! approval / resume / limit changes, with every invariant of the admission
//! contract checked after every step and at every single transition.
//!
//! The test keeps its own model of every agent, fed by the core's event log
//! (which the core publishes at each transition, in order), and judges each
//! transition against the contract (issue 2, section 3) computed from the
//! model — not from the core's own bookkeeping:
//!
//! - a background agent starts only while its bucket and its parent have room
//!   under the limits in force (so lowering a limit never pre-empts, but no
//!   start ever happens at or over a limit);
//! - it is queued only when one of them is full;
//! - FIFO among eligible agents: when an agent starts, no earlier-admitted
//!   queued agent could have started instead;
//! - eager admission: after every step no queued agent could start;
//! - the core's counters equal a recount, and the model's counts;
//! - a spawn refused by a limit changes nothing;
//! - cancels and cascades end exactly the agents the contract names;
//! - every agent ends, and all counters return to zero;
//! - tenants are apart: an agent is visible only in its own tenant's scope,
//!   a parent of another tenant does not exist for the spawn that names
//!   it, a tenant's background cap counts only its own agents, and its
//!   listings, routed watch and lead cancels reach only its own agents.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::SystemTime,
};

use proptest::{prelude::*, sample::Index, test_runner::Config as ProptestConfig};
use subagentd::store::{memory::MemoryStore, Batch, Store};
use subagentd::{
    config::{AgentTypeConfig, Limits, RunnerKind, RunsConfig, TenantLimits, WatchConfig},
    scheduler::{
        core::Counters, AgentError, AgentFilter, AgentId, AgentStatus, AgentView, ApprovalOutcome,
        Core, Error, Event, EventKind, InboxOf, Live, Received, ReportNumber, Scope, SpawnSpec,
        WatchQuery, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo,
    },
};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

const MODELS: [&str; 3] = ["p1/a", "p1/b", "p2/c"];
const PROVIDERS: [&str; 2] = ["p1", "p2"];
const LEADS: [&str; 2] = ["lead-0", "lead-1"];
/// The tenants agents belong to. Worker-type agents only in the first
/// (the model's workers connect there; a worker serves one tenant).
const TENANTS: [&str; 2] = [subagentd::scheduler::DEFAULT_TENANT, "tenant-b"];
const AGENT_TYPE: &str = "simulated";
/// `fallback_models` of `AGENT_TYPE`: an agent on `p1/a` moves to `p1/b`,
/// then `p2/c`; one on `p2/c` has no model left.
const FALLBACK: [&str; 2] = ["p1/b", "p2/c"];
/// An agent type run by workers; a lost worker's run is retried once.
const WORKER_TYPE: &str = "worker";

// ----- operations --------------------------------------------------------------

/// Which parent a spawn names.
#[derive(Debug, Clone)]
enum ParentPick {
    /// A root agent.
    None,
    /// One of the live agents (a root when there is none).
    Live(Index),
    /// Any agent ever spawned, ended ones included (a root when there is none).
    Any(Index),
}

/// Limits a reload installs.
#[derive(Debug, Clone)]
struct LimitsPick {
    default_concurrency: u32,
    provider_values: [u32; 2],
    provider_present: [bool; 2],
    model_values: [u32; 3],
    model_present: [bool; 3],
    per_parent: u32,
    max_background: u32,
    max_tree: u32,
    /// `[tenants.NAME] max_background_agents` per tenant (0 = none).
    tenant_background: [u32; 2],
}

impl LimitsPick {
    fn to_limits(&self) -> Limits {
        Limits {
            max_background_agents: self.max_background,
            default_concurrency: self.default_concurrency,
            provider_concurrency: entries(
                &PROVIDERS,
                &self.provider_values,
                &self.provider_present,
            ),
            model_concurrency: entries(&MODELS, &self.model_values, &self.model_present),
            max_concurrent_per_parent: self.per_parent,
            max_live_descendants_per_root: self.max_tree,
            ..Limits::default()
        }
    }

    fn tenant_limits(&self) -> BTreeMap<String, TenantLimits> {
        TENANTS
            .iter()
            .zip(self.tenant_background)
            .filter(|(_, cap)| *cap > 0)
            .map(|(t, cap)| {
                let limits = TenantLimits {
                    max_background_agents: cap,
                    ..TenantLimits::default()
                };
                ((*t).to_owned(), limits)
            })
            .collect()
    }
}

fn entries(keys: &[&str], values: &[u32], present: &[bool]) -> BTreeMap<String, u32> {
    keys.iter()
        .zip(values)
        .zip(present)
        .filter(|(_, present)| **present)
        .map(|((k, v), _)| ((*k).to_owned(), *v))
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Spawn {
        model: usize,
        parent: ParentPick,
        lead: Option<usize>,
        background: bool,
        detached: bool,
        /// Of the worker type rather than the simulated one.
        worker: bool,
        /// The tenant of a root (a child is in its parent's).
        tenant: usize,
        /// Spawned by the other tenant than its parent's: refused as if
        /// the parent did not exist.
        cross_tenant: bool,
    },
    /// A worker serving the worker type connects.
    ConnectWorker(u32),
    /// A connected worker is lost with the runs it holds.
    LoseWorker(Index),
    /// A worker reports one of the runs it holds ended (done or failed):
    /// applied if the run is live, a confirmation if it was stopped here.
    WorkerEnds(Index, bool),
    /// The cancel grace of a stopped worker run passes.
    GraceExpires(Index),
    /// A running agent's run reports success.
    FinishOk(Index),
    /// A running or awaiting agent's run fails (or hits its deadline).
    FinishFail(Index),
    /// A running simulated agent's run fails with a retryable provider
    /// error: it moves to the next model of `FALLBACK` (another bucket, or
    /// the same one when both models share a provider entry), or fails
    /// once the chain is exhausted.
    FallBack(Index),
    /// Cancel any agent, ended ones included.
    Cancel(Index),
    /// Cancel a lead's agents in a tenant.
    CancelLead(usize, usize),
    /// A running agent asks for approval.
    RequestApproval(Index),
    /// An awaiting agent's approval is decided (approved or denied), naming
    /// the pending approval or, when the flag says so, another one.
    Decide {
        agent: Index,
        approve: bool,
        wrong_id: bool,
    },
    /// A reload with new limits.
    Reconfigure(LimitsPick),
    /// The server process dies (everything acknowledged was committed);
    /// a new core is rebuilt from the store and recovers the runs.
    Crash,
    /// An inbox Await reads (and with the flag, collects) a lead's inbox
    /// in a tenant, or an agent's children.
    ReadInbox(InboxPick, bool),
}

#[derive(Debug, Clone)]
enum InboxPick {
    Lead(usize, usize),
    Parent(Index),
}

/// A limit of 0..=3 where 0 means unlimited; tight values are likelier so
/// that agents queue often.
fn small_limit() -> impl Strategy<Value = u32> {
    prop_oneof![1 => Just(0u32), 3 => Just(1u32), 2 => Just(2u32), 1 => Just(3u32)]
}

fn limits_pick() -> impl Strategy<Value = LimitsPick> {
    (
        small_limit(),
        prop::array::uniform2(small_limit()),
        prop::array::uniform2(any::<bool>()),
        prop::array::uniform3(small_limit()),
        prop::array::uniform3(any::<bool>()),
        small_limit(),
        1..=6u32,
        prop_oneof![3 => Just(0u32), 1 => 1..=4u32],
        prop::array::uniform2(prop_oneof![2 => Just(0u32), 1 => 1..=3u32]),
    )
        .prop_map(
            |(
                default_concurrency,
                provider_values,
                provider_present,
                model_values,
                model_present,
                per_parent,
                max_background,
                max_tree,
                tenant_background,
            )| LimitsPick {
                default_concurrency,
                provider_values,
                provider_present,
                model_values,
                model_present,
                per_parent,
                max_background,
                max_tree,
                tenant_background,
            },
        )
}

fn parent_pick() -> impl Strategy<Value = ParentPick> {
    prop_oneof![
        2 => Just(ParentPick::None),
        4 => any::<Index>().prop_map(ParentPick::Live),
        1 => any::<Index>().prop_map(ParentPick::Any),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (
            0..MODELS.len(),
            parent_pick(),
            prop::option::of(0..LEADS.len()),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.35),
            0..TENANTS.len(),
            prop::bool::weighted(0.1),
        )
            .prop_map(
                |(model, parent, lead, background, detached, worker, tenant, cross_tenant)| {
                    Op::Spawn {
                        model,
                        parent,
                        lead,
                        background,
                        detached,
                        worker,
                        tenant,
                        cross_tenant,
                    }
                }
            ),
        1 => (1..=3u32).prop_map(Op::ConnectWorker),
        1 => any::<Index>().prop_map(Op::LoseWorker),
        2 => (any::<Index>(), any::<bool>()).prop_map(|(i, ok)| Op::WorkerEnds(i, ok)),
        1 => any::<Index>().prop_map(Op::GraceExpires),
        3 => any::<Index>().prop_map(Op::FinishOk),
        1 => any::<Index>().prop_map(Op::FinishFail),
        2 => any::<Index>().prop_map(Op::FallBack),
        2 => any::<Index>().prop_map(Op::Cancel),
        1 => (0..LEADS.len(), 0..TENANTS.len()).prop_map(|(l, t)| Op::CancelLead(l, t)),
        2 => any::<Index>().prop_map(Op::RequestApproval),
        2 => (any::<Index>(), any::<bool>(), prop::bool::weighted(0.2)).prop_map(
            |(agent, approve, wrong_id)| Op::Decide {
                agent,
                approve,
                wrong_id
            }
        ),
        1 => limits_pick().prop_map(Op::Reconfigure),
        1 => Just(Op::Crash),
        2 => (
            prop_oneof![
                (0..LEADS.len(), 0..TENANTS.len()).prop_map(|(l, t)| InboxPick::Lead(l, t)),
                any::<Index>().prop_map(InboxPick::Parent),
            ],
            any::<bool>(),
        )
            .prop_map(|(pick, collect)| Op::ReadInbox(pick, collect)),
    ]
}

// ----- the model -------------------------------------------------------------------

/// Who holds an agent's per-parent slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Parent {
    None,
    /// A lead, by (tenant, lead id): two tenants' equal lead ids are
    /// unrelated.
    Lead(String, String),
    Agent(AgentId),
}

/// What the model knows about one agent.
#[derive(Debug, Clone)]
struct Meta {
    tenant: String,
    model: String,
    background: bool,
    detached: bool,
    parent: Parent,
    parent_id: Option<AgentId>,
    root: AgentId,
    lead: Option<String>,
    depth: u32,
    seq: u64,
    /// None until its first event.
    status: Option<AgentStatus>,
    /// Whether the current run was started (the core hands out a run once
    /// per attempt).
    started: bool,
    /// Of the worker type.
    worker_type: bool,
    /// The worker holding its run, from its latest event.
    worker_id: Option<WorkerId>,
}

impl Meta {
    fn from_view(v: &AgentView, seq: u64) -> Self {
        let lead = v.lead_id.as_deref().map(str::to_owned);
        let parent = match (v.parent_id, &lead) {
            (Some(p), _) => Parent::Agent(p),
            (None, Some(l)) => Parent::Lead(v.tenant.to_string(), l.clone()),
            (None, None) => Parent::None,
        };
        Self {
            tenant: v.tenant.to_string(),
            model: v.model.to_string(),
            background: v.background,
            detached: v.detached,
            parent,
            parent_id: v.parent_id,
            root: v.root_id,
            lead,
            depth: v.depth,
            seq,
            status: None,
            started: false,
            worker_type: &*v.agent == WORKER_TYPE,
            worker_id: v.worker_id,
        }
    }

    fn is(&self, s: AgentStatus) -> bool {
        self.status == Some(s)
    }

    fn is_live(&self) -> bool {
        self.status.is_some_and(|s| !s.is_terminal())
    }
}

/// Running background agents per bucket key and per parent, as the
/// contract defines them under the limits in force.
#[derive(Debug, Default)]
struct Running {
    buckets: HashMap<String, u32>,
    parents: HashMap<Parent, u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryChanges {
    /// Reloads change limit values only; which models and providers have
    /// entries stays as at start, so bucket keys never move.
    ValuesOnly,
    /// Reloads also add and remove provider/model entries.
    AddAndRemove,
}

struct Harness {
    core: Core,
    /// Every event (the broadcast ring).
    events: Live,
    /// Events of `LEADS[0]`'s agents in `TENANTS[1]`, routed: must be
    /// exactly the events of `events` under that lead in that tenant.
    lead_events: Live,
    limits: Limits,
    tenant_limits: BTreeMap<String, TenantLimits>,
    initial: LimitsPick,
    entry_changes: EntryChanges,
    /// Every agent, in admission order.
    order: Vec<AgentId>,
    agents: HashMap<AgentId, Meta>,
    last_sequence: u64,
    /// Agents whose run started for the first time during this step.
    first_starts: Vec<AgentId>,
    /// Approvals requested and not yet delivered to their run.
    approvals: HashMap<AgentId, PendingApproval>,
    /// Connected workers, in connection order, with their capacity and
    /// the command channel the core writes to.
    workers: Vec<(WorkerId, u32, mpsc::UnboundedReceiver<WorkerCommand>)>,
    /// The step being checked, for failure messages.
    ctx: String,
    /// What a crash leaves: every change committed at the end of each step
    /// (each step's changes are acknowledged once it returns).
    store: MemoryStore,
    watch: WatchConfig,
    /// Agents an inbox read collected.
    collected: HashSet<AgentId>,
}

/// An approval a run asked for, from the run's side.
#[derive(Debug)]
struct PendingApproval {
    id: Uuid,
    /// Where the run receives the decision (an in-process run; a worker
    /// gets it as a command, checked with the other commands).
    decision: Option<oneshot::Receiver<ApprovalOutcome>>,
    /// The decision made through the core, not yet seen by the run.
    decided: Option<ApprovalOutcome>,
}

fn agent_types() -> BTreeMap<String, AgentTypeConfig> {
    BTreeMap::from([
        (
            AGENT_TYPE.to_owned(),
            AgentTypeConfig {
                runner: RunnerKind::Simulated,
                retry_on_worker_lost: 0,
                fallback_models: FALLBACK.map(str::to_owned).to_vec(),
                ..AgentTypeConfig::default()
            },
        ),
        (
            WORKER_TYPE.to_owned(),
            AgentTypeConfig {
                runner: RunnerKind::Worker,
                retry_on_worker_lost: 1,
                ..AgentTypeConfig::default()
            },
        ),
    ])
}

fn error_name(e: &Error) -> &'static str {
    match e {
        Error::GlobalLimit { .. } => "GlobalLimit",
        Error::DepthLimit { .. } => "DepthLimit",
        Error::DescendantLimit { .. } => "DescendantLimit",
        Error::AgentFinished { .. } => "AgentFinished",
        Error::NotFound { .. } => "NotFound",
        Error::TenantLimit { .. } => "TenantLimit",
        _ => "other",
    }
}

impl Harness {
    fn new(initial: LimitsPick, entry_changes: EntryChanges) -> Self {
        let limits = initial.to_limits();
        let tenant_limits = initial.tenant_limits();
        let watch = WatchConfig {
            history: 1,
            // Never lags: the harness drains after every step.
            subscriber_buffer: 1 << 16,
        };
        let mut core = Core::new(limits.clone(), RunsConfig::default(), &watch, agent_types());
        core.set_tenant_limits(tenant_limits.clone());
        core.track_changes();
        let (events, lead_events) = watchers(&mut core);
        Self {
            core,
            events,
            lead_events,
            limits,
            tenant_limits,
            initial,
            entry_changes,
            order: Vec::new(),
            agents: HashMap::new(),
            last_sequence: 0,
            first_starts: Vec::new(),
            approvals: HashMap::new(),
            collected: HashSet::new(),
            workers: Vec::new(),
            ctx: String::new(),
            store: MemoryStore::new(),
            watch,
        }
    }

    // ----- the contract's view of limits ---------------------------------------------

    /// Bucket key and running limit of a model under the limits in force.
    fn bucket_of(&self, model: &str) -> (String, u32) {
        let provider = model.split_once('/').map_or(model, |(p, _)| p);
        let l = &self.limits;
        if let Some(&n) = l.model_concurrency.get(model) {
            (model.to_owned(), n)
        } else if let Some(&n) = l.provider_concurrency.get(provider) {
            (provider.to_owned(), n)
        } else {
            (model.to_owned(), l.default_concurrency)
        }
    }

    fn running(&self) -> Running {
        let mut r = Running::default();
        for m in self.agents.values() {
            if m.background && m.is(AgentStatus::Running) {
                *r.buckets.entry(self.bucket_of(&m.model).0).or_default() += 1;
                if m.parent != Parent::None {
                    *r.parents.entry(m.parent.clone()).or_default() += 1;
                }
            }
        }
        r
    }

    fn bucket_has_room(&self, m: &Meta, r: &Running) -> bool {
        let (key, limit) = self.bucket_of(&m.model);
        limit == 0 || r.buckets.get(&key).copied().unwrap_or(0) < limit
    }

    fn parent_has_room(&self, m: &Meta, r: &Running) -> bool {
        let limit = self.limits.max_concurrent_per_parent;
        m.parent == Parent::None
            || limit == 0
            || r.parents.get(&m.parent).copied().unwrap_or(0) < limit
    }

    /// Whether the queued agent `m` could start now: its bucket and parent
    /// have room (background), and a worker has a free slot (worker type).
    fn eligible(&self, m: &Meta, r: &Running) -> bool {
        let limits = !m.background || (self.bucket_has_room(m, r) && self.parent_has_room(m, r));
        limits && (!m.worker_type || self.worker_has_room())
    }

    /// Some connected worker has a free slot (every worker serves the
    /// worker type).
    fn worker_has_room(&self) -> bool {
        self.core
            .worker_snapshot()
            .iter()
            .any(|(_, capacity, held)| (held.len() as u32) < *capacity)
    }

    fn live_ids(&self) -> Vec<AgentId> {
        self.order
            .iter()
            .copied()
            .filter(|id| self.agents[id].is_live())
            .collect()
    }

    /// The retained agents (still in the core) whose model entry passes
    /// `keep`, in admission order: what a listing must return.
    fn retained_where(&self, keep: impl Fn(&Meta) -> bool) -> Vec<AgentId> {
        self.order
            .iter()
            .copied()
            .filter(|id| self.core.view(*id).is_some())
            .filter(|id| keep(&self.agents[id]))
            .collect()
    }

    /// Every agent `filter` lists, read three at a time through the pages.
    fn listed_in_pages(&self, filter: &AgentFilter) -> Vec<AgentId> {
        let (mut listed, mut after) = (Vec::new(), 0);
        loop {
            let page = self.core.list(filter, after, 3);
            listed.extend(page.agents.iter().map(|a| a.id));
            match page.next_after {
                Some(next) => after = next,
                None => return listed,
            }
        }
    }

    fn ids_with(&self, s: AgentStatus) -> Vec<AgentId> {
        self.order
            .iter()
            .copied()
            .filter(|id| self.agents[id].is(s))
            .collect()
    }

    /// Live agents of the subtree under `id` (`id` excluded), reached
    /// through every child, or only through non-detached children.
    fn live_descendants(&self, id: AgentId, skip_detached: bool) -> HashSet<AgentId> {
        let mut found = HashSet::new();
        let mut stack = vec![id];
        while let Some(p) = stack.pop() {
            for c in &self.order {
                let m = &self.agents[c];
                if m.parent_id != Some(p) || (skip_detached && m.detached) {
                    continue;
                }
                if m.is_live() {
                    found.insert(*c);
                }
                stack.push(*c);
            }
        }
        found
    }

    // ----- events ------------------------------------------------------------------------

    /// Applies every event the core published since the last call, judging
    /// each transition at the moment it happened. Returns (agent, kind).
    fn drain_events(&mut self) -> Vec<(AgentId, EventKind)> {
        let mut seen = Vec::new();
        let mut of_lead = Vec::new();
        loop {
            let ev = match self.events.try_recv() {
                Received::Event(ev) => ev,
                Received::Empty => break,
                e => panic!("{}: the event log broke: {e:?}", self.ctx),
            };
            self.apply_event(&ev);
            seen.push((ev.agent.id, ev.kind));
            if ev.agent.lead_id.as_deref() == Some(LEADS[0]) && *ev.agent.tenant == *TENANTS[1] {
                of_lead.push(ev.sequence);
            }
        }
        let mut routed = Vec::new();
        loop {
            match self.lead_events.try_recv() {
                Received::Event(ev) => routed.push(ev.sequence),
                Received::Empty => break,
                e => panic!("{}: the routed watch broke: {e:?}", self.ctx),
            }
        }
        assert_eq!(
            routed, of_lead,
            "{}: a lead's routed watch gets exactly that lead's events",
            self.ctx
        );
        seen
    }

    fn apply_event(&mut self, ev: &Event) {
        use AgentStatus::*;
        let ctx = &self.ctx;
        assert!(
            ev.sequence > self.last_sequence,
            "{ctx}: event sequence {} after {}",
            ev.sequence,
            self.last_sequence
        );
        self.last_sequence = ev.sequence;
        let id = ev.agent.id;
        if !self.agents.contains_key(&id) {
            let seq = self.core.seq_of(id).expect("a published agent has a seq");
            self.agents.insert(id, Meta::from_view(&ev.agent, seq));
            self.order.push(id);
        }
        // A fallback: the agent moved to another model (and maybe bucket)
        // and is queued there even if it can start at once (the drain then
        // starts it in the same step).
        let fallback = ev.kind == EventKind::Retrying && *ev.agent.model != self.agents[&id].model;
        if fallback {
            self.agents.get_mut(&id).expect("known agent").model = ev.agent.model.to_string();
        }
        let meta = self.agents[&id].clone();
        let (to, from): (AgentStatus, &[Option<AgentStatus>]) = match ev.kind {
            EventKind::Queued => (Queued, &[None, Some(AwaitingApproval)]),
            EventKind::Retrying => (
                Queued,
                &[Some(Queued), Some(Running), Some(AwaitingApproval)],
            ),
            EventKind::Started => (Running, &[None, Some(Queued), Some(AwaitingApproval)]),
            EventKind::AwaitingApproval => (AwaitingApproval, &[Some(Running)]),
            EventKind::Done => (Done, &[Some(Queued), Some(Running), Some(AwaitingApproval)]),
            EventKind::Failed => (
                Failed,
                &[Some(Queued), Some(Running), Some(AwaitingApproval)],
            ),
            EventKind::Cancelled => (
                Cancelled,
                &[Some(Queued), Some(Running), Some(AwaitingApproval)],
            ),
            other => panic!("{ctx}: unexpected {other:?} event"),
        };
        assert!(
            from.contains(&meta.status),
            "{ctx}: agent #{} moved {:?} → {to:?}",
            meta.seq,
            meta.status
        );
        assert_eq!(
            ev.agent.status, to,
            "{ctx}: {:?} event shows agent #{} as {:?}",
            ev.kind, meta.seq, ev.agent.status
        );
        if meta.background && to == Running {
            self.check_start_allowed(&meta);
        }
        if to == Queued && !fallback {
            assert!(
                meta.background || meta.worker_type,
                "{ctx}: foreground agent #{} queued without waiting for a worker",
                meta.seq
            );
            // Only an approved run waiting for its slots keeps its worker
            // (the worker still holds the run).
            if meta.status != Some(AwaitingApproval) || ev.kind == EventKind::Retrying {
                assert_eq!(
                    ev.agent.worker_id, None,
                    "{ctx}: queued agent #{} holds a worker",
                    meta.seq
                );
            }
        }
        // Worker capacity at the moment of the event is not observable
        // here; for worker types the step-end checks decide eligibility.
        if to == Queued && !meta.worker_type && !fallback {
            let r = self.running();
            assert!(
                !self.eligible(&meta, &r),
                "{}: agent #{} was queued although its bucket {:?} and parent {:?} have room",
                self.ctx,
                meta.seq,
                self.bucket_of(&meta.model),
                meta.parent
            );
        }
        if to == Running && meta.worker_type {
            assert!(
                ev.agent.worker_id.is_some(),
                "{ctx}: worker-type agent #{} runs without a worker",
                meta.seq
            );
        }
        if ev.kind == EventKind::Retrying {
            // A new attempt: a new run, and the old run's approval is gone.
            self.agents.get_mut(&id).expect("known agent").started = false;
            self.approvals.remove(&id);
        }
        let meta = self.agents[&id].clone();
        if to == Running && !meta.started {
            self.first_starts.push(id);
        }
        let m = self.agents.get_mut(&id).expect("known agent");
        m.status = Some(to);
        m.started |= to == Running;
        m.worker_id = ev.agent.worker_id;
    }

    /// A background agent is about to count as running: its bucket and its
    /// parent must have room, and no earlier-admitted queued agent could
    /// have started instead (FIFO among eligible agents).
    fn check_start_allowed(&self, x: &Meta) {
        let ctx = &self.ctx;
        let r = self.running();
        let (key, limit) = self.bucket_of(&x.model);
        let running = r.buckets.get(&key).copied().unwrap_or(0);
        assert!(
            limit == 0 || running < limit,
            "{ctx}: agent #{} started in bucket {key} with {running} of {limit} already running",
            x.seq
        );
        let per_parent = self.limits.max_concurrent_per_parent;
        if x.parent != Parent::None && per_parent != 0 {
            let running = r.parents.get(&x.parent).copied().unwrap_or(0);
            assert!(
                running < per_parent,
                "{ctx}: agent #{} started under {:?} with {running} of {per_parent} children running",
                x.seq,
                x.parent
            );
        }
        for m in self.agents.values() {
            // Worker capacity at event time is not observable (see
            // `apply_event`); queued worker-type agents are judged at step end.
            if m.is(AgentStatus::Queued) && m.background && !m.worker_type && m.seq < x.seq {
                assert!(
                    !self.eligible(m, &r),
                    "{ctx}: agent #{} started while earlier agent #{} (bucket {:?}, parent {:?}) \
                     was queued and could start (same sub-queue: {})",
                    x.seq,
                    m.seq,
                    self.bucket_of(&m.model),
                    m.parent,
                    self.bucket_of(&m.model).0 == key && m.parent == x.parent
                );
            }
        }
    }

    fn assert_no_events(&mut self) {
        let events = self.drain_events();
        assert!(
            events.is_empty(),
            "{}: unexpected events {events:?}",
            self.ctx
        );
    }

    // ----- steps ---------------------------------------------------------------------------

    fn step(&mut self, n: usize, op: &Op) {
        self.ctx = format!("step {n} ({op:?})");
        // Agents running before the step. A reload may move them to another
        // bucket (a provider entry added or removed), which is not a start.
        let running_before: Vec<AgentId> = self
            .agents
            .iter()
            .filter(|(_, m)| m.background && m.is(AgentStatus::Running))
            .map(|(id, _)| *id)
            .collect();
        match op {
            Op::Spawn {
                model,
                parent,
                lead,
                background,
                detached,
                worker,
                tenant,
                cross_tenant,
            } => self.spawn(
                MODELS[*model],
                parent,
                lead.map(|l| LEADS[l]),
                (*background, *detached, *worker),
                *tenant,
                *cross_tenant,
            ),
            Op::ConnectWorker(capacity) => self.connect_worker(*capacity),
            Op::LoseWorker(i) => self.lose_worker(i),
            Op::WorkerEnds(i, ok) => self.worker_ends(i, *ok),
            Op::GraceExpires(i) => self.grace_expires(i),
            Op::FinishOk(i) => self.finish(i, true),
            Op::FinishFail(i) => self.finish(i, false),
            Op::FallBack(i) => self.fall_back(i),
            Op::Cancel(i) => self.cancel(i),
            Op::CancelLead(l, t) => self.cancel_lead(LEADS[*l], TENANTS[*t]),
            Op::RequestApproval(i) => self.request_approval(i),
            Op::Decide {
                agent,
                approve,
                wrong_id,
            } => self.decide(agent, *approve, *wrong_id),
            Op::Reconfigure(pick) => self.reconfigure(pick),
            Op::Crash => self.crash(),
            Op::ReadInbox(pick, collect) => self.read_inbox(pick, *collect),
        }
        self.check_collected();
        self.persist();
        self.check_invariants(&running_before);
        self.check_approvals();
        self.check_worker_commands();
        self.check_workers();
    }

    /// Commits what the step changed, as the store's writer would.
    fn persist(&mut self) {
        let (changes, _) = self.core.take_changes();
        if !changes.is_empty() {
            let mut batch = Batch::default();
            batch.add(&changes);
            self.store.commit(&batch).expect("the memory store commits");
        }
    }

    /// An inbox read returns exactly the settled, uncollected members of
    /// the inbox (approvals first, then oldest settled first) and counts the
    /// live ones; a collect marks the terminal ones, and only those.
    fn read_inbox(&mut self, pick: &InboxPick, collect: bool) {
        let (tenant, of, member): (String, InboxOf, Parent) = match pick {
            InboxPick::Lead(l, t) => {
                let (lead, tenant) = (LEADS[*l], TENANTS[*t]);
                let member = Parent::Lead(tenant.to_owned(), lead.to_owned());
                (tenant.to_owned(), InboxOf::Lead(lead.to_owned()), member)
            }
            InboxPick::Parent(i) => {
                if self.order.is_empty() {
                    return;
                }
                let id = *i.get(&self.order);
                let tenant = self.agents[&id].tenant.clone();
                (tenant, InboxOf::Parent(id), Parent::Agent(id))
            }
        };
        let members: Vec<AgentId> = self
            .order
            .iter()
            .filter(|id| self.agents[*id].parent == member)
            .copied()
            .collect();
        let settled = |m: &Meta| m.status.is_some_and(AgentStatus::is_settled);
        let live = members
            .iter()
            .filter(|id| !settled(&self.agents[*id]))
            .count();
        let expected: HashSet<AgentId> = members
            .iter()
            .filter(|id| settled(&self.agents[*id]) && !self.collected.contains(*id))
            .copied()
            .collect();
        let scope = Scope::Tenant(tenant.as_str().into());
        let mut read = self
            .core
            .read_inbox(&scope, &tenant, &of)
            .unwrap_or_else(|e| panic!("{}: read_inbox failed: {e:?}", self.ctx));
        let ctx = &self.ctx;
        assert_eq!(read.live, live, "{ctx}: live members of the inbox");
        let got: HashSet<AgentId> = read.settled.iter().map(|v| v.id).collect();
        assert_eq!(got.len(), read.settled.len(), "{ctx}: no agent twice");
        assert_eq!(got, expected, "{ctx}: the settled uncollected members");
        let order: Vec<_> = read
            .settled
            .iter()
            .map(|v| (v.status != AgentStatus::AwaitingApproval, v.finished_at))
            .collect();
        assert!(
            order.is_sorted(),
            "{ctx}: approvals first, then oldest settled first: {order:?}"
        );
        if collect {
            self.core.collect(&mut read.settled, SystemTime::now());
            for v in &read.settled {
                assert_eq!(
                    v.collected_at.is_some(),
                    v.status.is_terminal(),
                    "{}: only terminal agents are collected",
                    self.ctx
                );
                if v.status.is_terminal() {
                    self.collected.insert(v.id);
                }
            }
        }
    }

    /// Every agent shows `collected_at` exactly when an inbox read collected
    /// it, and only a terminal agent is ever collected.
    fn check_collected(&self) {
        for id in &self.order {
            let Some(view) = self.core.view(*id) else {
                continue;
            };
            let ctx = &self.ctx;
            assert_eq!(
                view.collected_at.is_some(),
                self.collected.contains(id),
                "{ctx}: collected_at of agent #{}",
                self.agents[id].seq
            );
            if view.collected_at.is_some() {
                assert!(view.status.is_terminal(), "{ctx}: collected yet {view:?}");
            }
        }
    }

    /// Kills the core and rebuilds it from the store: everything the
    /// store holds must be there as it was, counters must equal a recount,
    /// and each interrupted run must be decided by the recovery rules.
    fn crash(&mut self) {
        self.persist();
        let before: Vec<AgentView> = self
            .order
            .iter()
            .filter_map(|id| self.core.view(*id))
            .collect();
        let last_sequence = self.core.last_sequence();
        let recovered = self
            .store
            .load()
            .expect("load")
            .decode()
            .expect("the store decodes");
        let mut core = Core::new(
            self.limits.clone(),
            RunsConfig::default(),
            &self.watch,
            agent_types(),
        );
        core.set_tenant_limits(self.tenant_limits.clone());
        let mut report = core
            .restore(recovered, self.watch.history, self.watch.subscriber_buffer)
            .unwrap_or_else(|e| panic!("{}: {e}", self.ctx));
        let ctx = &self.ctx;
        assert_eq!(report.agents, before.len(), "{ctx}: agents read back");
        for old in &before {
            let new = core.view(old.id).expect("a retained agent survives");
            let mut expected = old.clone();
            if expected.status == AgentStatus::Queued && expected.agent.as_ref() == WORKER_TYPE {
                // Its worker session is gone with the process.
                expected.worker_id = None;
            }
            // Derived from the limits in force, not stored.
            expected.queue_reason = None;
            let mut got = new.clone();
            got.queue_reason = None;
            assert_eq!(
                got, expected,
                "{ctx}: agent #{} after a restart",
                self.agents[&old.id].seq
            );
        }
        assert_eq!(
            core.recount(),
            core.counters(),
            "{ctx}: counters after restore"
        );
        assert_eq!(
            core.last_sequence(),
            last_sequence,
            "{ctx}: the sequence continues from the last durable one"
        );
        // The old process's runs, approvals and worker sessions are gone.
        self.core = core;
        let (events, lead_events) = watchers(&mut self.core);
        (self.events, self.lead_events) = (events, lead_events);
        self.approvals.clear();
        self.workers.clear();
        // So is every run: whatever starts from here on is a new run.
        for m in self.agents.values_mut() {
            m.started = false;
        }
        let interrupted = report.interrupted.clone();
        let held = report.held_for_workers.clone();
        let paused = report.paused_worker_runs.clone();
        self.core.recover_runs(&mut report);
        self.core.reattach_grace_passed(&held);
        let events = self.drain_events();
        let ctx = &self.ctx;
        for id in interrupted.iter().chain(&held).chain(&paused) {
            let view = self.core.view(*id).expect("known agent");
            let code = view.error.as_ref().map(|e| e.code.to_string());
            let retried = events.contains(&(*id, EventKind::Retrying));
            let ok = match view.status {
                AgentStatus::Failed if interrupted.contains(id) => {
                    code.as_deref() == Some("SERVER_RESTARTED")
                }
                AgentStatus::Failed => code.as_deref() == Some("WORKER_LOST"),
                // Ended by the cascade of an ancestor that failed first.
                AgentStatus::Cancelled => true,
                // The worker type retries once.
                _ => retried && (held.contains(id) || paused.contains(id)),
            };
            assert!(
                ok,
                "{ctx}: interrupted agent #{} ended as {view:?}",
                self.agents[id].seq
            );
        }
    }

    fn spawn(
        &mut self,
        model: &str,
        parent: &ParentPick,
        lead: Option<&str>,
        (background, detached, worker): (bool, bool, bool),
        tenant: usize,
        cross_tenant: bool,
    ) {
        let parent_id = match parent {
            ParentPick::None => None,
            ParentPick::Live(i) => {
                let live = self.live_ids();
                (!live.is_empty()).then(|| *i.get(&live))
            }
            ParentPick::Any(i) => (!self.order.is_empty()).then(|| *i.get(&self.order)),
        };
        let tenant = match parent_id.map(|p| &*self.agents[&p].tenant) {
            Some(own) if cross_tenant => TENANTS.iter().find(|t| **t != own).unwrap(),
            Some(own) => own,
            None => TENANTS[tenant],
        }
        .to_owned();
        let worker = worker && tenant == TENANTS[0];
        let expected_errors = self.predict_spawn_errors(parent_id, background, &tenant);
        let spec = SpawnSpec {
            tenant: tenant.as_str().into(),
            agent: if worker { WORKER_TYPE } else { AGENT_TYPE }.to_owned(),
            model: model.to_owned(),
            prompt: "work".to_owned(),
            parent_id,
            lead_id: lead.map(str::to_owned),
            background,
            detached,
            ..SpawnSpec::default()
        };
        let counters_before = self.core.counters();
        match self.core.spawn(spec, SystemTime::now()) {
            Ok((view, existing)) => {
                let ctx = &self.ctx;
                assert!(!existing, "{ctx}: no idempotency key, yet an earlier agent");
                assert!(
                    expected_errors.is_empty(),
                    "{ctx}: spawn succeeded, expected one of {expected_errors:?}"
                );
                self.drain_events();
                let ctx = &self.ctx;
                let meta = self
                    .agents
                    .get(&view.id)
                    .unwrap_or_else(|| panic!("{ctx}: a new agent published no event"));
                assert_eq!(meta.status, Some(view.status), "{ctx}: spawn's view");
                assert_eq!(
                    meta.tenant, tenant,
                    "{ctx}: the agent is in the spawner's tenant"
                );
                assert!(
                    matches!(view.status, AgentStatus::Running | AgentStatus::Queued),
                    "{ctx}: a new agent is {:?}",
                    view.status
                );
                match parent_id {
                    Some(p) => {
                        let pm = &self.agents[&p];
                        assert_eq!(view.depth, pm.depth + 1, "{ctx}: depth");
                        assert_eq!(view.root_id, pm.root, "{ctx}: root");
                        assert_eq!(meta.lead, pm.lead, "{ctx}: a child inherits the lead");
                    }
                    None => {
                        assert_eq!(view.depth, 1, "{ctx}: depth of a root");
                        assert_eq!(view.root_id, view.id, "{ctx}: a root is its own root");
                        assert_eq!(meta.lead.as_deref(), lead, "{ctx}: lead");
                    }
                }
            }
            Err(e) => {
                let ctx = &self.ctx;
                assert!(
                    expected_errors.contains(&error_name(&e)),
                    "{ctx}: spawn refused with {e:?}, expected {expected_errors:?}"
                );
                assert_eq!(
                    self.core.counters(),
                    counters_before,
                    "{ctx}: a refused spawn changed counters"
                );
                self.assert_no_events();
            }
        }
    }

    /// The refusals the contract allows for this spawn (empty = it must be
    /// admitted).
    fn predict_spawn_errors(
        &self,
        parent_id: Option<AgentId>,
        background: bool,
        tenant: &str,
    ) -> Vec<&'static str> {
        let l = &self.limits;
        let mut errors = Vec::new();
        if let Some(p) = parent_id {
            let pm = &self.agents[&p];
            if pm.tenant != tenant {
                // Checked first, and it hides everything else about it.
                return vec!["NotFound"];
            }
            if !pm.is_live() {
                errors.push("AgentFinished");
            }
            if pm.depth + 1 > l.max_depth {
                errors.push("DepthLimit");
            }
            let tree_live = self
                .agents
                .values()
                .filter(|m| m.root == pm.root && m.is_live())
                .count() as u32;
            if l.max_live_descendants_per_root != 0 && tree_live >= l.max_live_descendants_per_root
            {
                errors.push("DescendantLimit");
            }
        }
        let live_background = self
            .agents
            .values()
            .filter(|m| m.background && m.is_live())
            .count() as u32;
        if background && live_background >= l.max_background_agents {
            errors.push("GlobalLimit");
        }
        let tenant_cap = self.tenant_limits.get(tenant);
        if let Some(cap) = tenant_cap.map(|t| t.max_background_agents) {
            let live = self
                .agents
                .values()
                .filter(|m| m.background && m.is_live() && m.tenant == tenant)
                .count() as u32;
            if background && live >= cap {
                errors.push("TenantLimit");
            }
        }
        errors
    }

    fn finish(&mut self, i: &Index, ok: bool) {
        let candidates: Vec<AgentId> = if ok {
            self.ids_with(AgentStatus::Running)
        } else {
            self.order
                .iter()
                .copied()
                .filter(|id| {
                    let m = &self.agents[id];
                    m.is(AgentStatus::Running) || m.is(AgentStatus::AwaitingApproval)
                })
                .collect()
        };
        let outcome = || {
            if ok {
                Ok("result".to_owned())
            } else {
                Err(AgentError::new("RUN_FAILED", "boom"))
            }
        };
        if candidates.is_empty() {
            // A late report for an agent that already ended is ignored.
            let ended: Vec<AgentId> = self
                .order
                .iter()
                .copied()
                .filter(|id| !self.agents[id].is_live())
                .collect();
            if !ended.is_empty() {
                let id = *i.get(&ended);
                assert!(
                    !self.core.finish(id, outcome()),
                    "{}: finish of an ended agent was accepted",
                    self.ctx
                );
                self.assert_no_events();
            }
            return;
        }
        let id = *i.get(&candidates);
        let cascade = self.live_descendants(id, true);
        assert!(
            self.core.finish(id, outcome()),
            "{}: finish refused",
            self.ctx
        );
        let events = self.drain_events();
        let ctx = &self.ctx;
        let ended = if ok {
            EventKind::Done
        } else {
            EventKind::Failed
        };
        assert!(events.contains(&(id, ended)), "{ctx}: no {ended:?} event");
        let cancelled: HashSet<AgentId> = events
            .iter()
            .filter(|(_, k)| *k == EventKind::Cancelled)
            .map(|(a, _)| *a)
            .collect();
        assert_eq!(
            cancelled, cascade,
            "{ctx}: an agent that ends cancels exactly its live non-detached descendants"
        );
    }

    fn fall_back(&mut self, i: &Index) {
        let candidates: Vec<AgentId> = self
            .ids_with(AgentStatus::Running)
            .into_iter()
            .filter(|id| !self.agents[id].worker_type)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let id = *i.get(&candidates);
        let from = self.agents[&id].model.clone();
        let next = match FALLBACK.iter().position(|m| *m == from) {
            Some(at) => FALLBACK.get(at + 1).copied(),
            None => Some(FALLBACK[0]),
        };
        let cascade = self.live_descendants(id, true);
        let attempts_before = self.core.view(id).expect("live agent").attempt;
        self.core.mark_retryable(id);
        let finished = self
            .core
            .finish(id, Err(AgentError::new("PROVIDER_503", "overloaded")));
        let events = self.drain_events();
        let ctx = &self.ctx;
        let view = self.core.view(id).expect("known agent");
        match next {
            Some(model) => {
                assert!(!finished, "{ctx}: a fallback is not the end of the agent");
                assert!(
                    events.contains(&(id, EventKind::Retrying)),
                    "{ctx}: no RETRYING event for the fallback"
                );
                assert!(
                    !events
                        .iter()
                        .any(|(a, k)| *a != id && *k == EventKind::Cancelled),
                    "{ctx}: a fallback cancels nobody"
                );
                assert_eq!(*view.model, *model, "{ctx}: the next model of the chain");
                assert_eq!(
                    self.agents[&id].model, model,
                    "{ctx}: events show the model"
                );
                assert!(view.status == AgentStatus::Queued || view.status == AgentStatus::Running);
                let ended = &view.attempts.as_ref().expect("an ended attempt").ended;
                let last = ended.last().expect("an ended attempt");
                assert_eq!(
                    (&*last.model, &*last.error.code),
                    (from.as_str(), "PROVIDER_503"),
                    "{ctx}: the ended attempt"
                );
                assert_eq!(
                    ended.len() as u32,
                    attempts_before,
                    "{ctx}: one per ended run"
                );
            }
            None => {
                assert!(finished, "{ctx}: the exhausted chain ends the agent");
                assert!(
                    events.contains(&(id, EventKind::Failed)),
                    "{ctx}: no FAILED event"
                );
                assert_eq!(view.error.as_ref().map(|e| &*e.code), Some("PROVIDER_503"));
                let cancelled: HashSet<AgentId> = events
                    .iter()
                    .filter(|(_, k)| *k == EventKind::Cancelled)
                    .map(|(a, _)| *a)
                    .collect();
                assert_eq!(cancelled, cascade, "{ctx}: the failure cascades");
            }
        }
    }

    fn cancel(&mut self, i: &Index) {
        if self.order.is_empty() {
            return;
        }
        let id = *i.get(&self.order);
        let target_live = self.agents[&id].is_live();
        let mut expected = self.live_descendants(id, false);
        if target_live {
            expected.insert(id);
        }
        let returned: HashSet<AgentId> = self
            .core
            .cancel(&subagentd::scheduler::Scope::All, id, "model test")
            .unwrap_or_else(|e| panic!("{}: cancel failed: {e:?}", self.ctx))
            .into_iter()
            .map(|v| v.id)
            .collect();
        let events = self.drain_events();
        let ctx = &self.ctx;
        let cancelled: HashSet<AgentId> = events
            .iter()
            .filter(|(_, k)| *k == EventKind::Cancelled)
            .map(|(a, _)| *a)
            .collect();
        assert_eq!(returned, cancelled, "{ctx}: cancel lists what it cancelled");
        if target_live {
            assert_eq!(
                returned, expected,
                "{ctx}: cancel ends the target and its whole live subtree"
            );
        } else {
            // An ended target is never listed. Whether its surviving
            // (detached) descendants are cancelled is pinned down by
            // `cancelling_an_ended_agent_cancels_its_live_detached_descendants`;
            // here either outcome is accepted so that one question does not
            // hide every other invariant.
            assert!(
                returned.is_empty() || returned == expected,
                "{ctx}: cancel of an ended agent listed {returned:?}, live subtree {expected:?}"
            );
        }
    }

    fn cancel_lead(&mut self, lead: &str, tenant: &str) {
        let expected: HashSet<AgentId> = self
            .live_ids()
            .into_iter()
            .filter(|id| {
                let m = &self.agents[id];
                m.lead.as_deref() == Some(lead) && m.tenant == tenant
            })
            .collect();
        let returned: HashSet<AgentId> = self
            .core
            .cancel_lead(tenant, lead, "")
            .into_iter()
            .map(|v| v.id)
            .collect();
        let events = self.drain_events();
        let ctx = &self.ctx;
        assert_eq!(
            returned, expected,
            "{ctx}: cancel_lead lists every live agent of the lead"
        );
        let cancelled: HashSet<AgentId> = events
            .iter()
            .filter(|(_, k)| *k == EventKind::Cancelled)
            .map(|(a, _)| *a)
            .collect();
        assert_eq!(cancelled, expected, "{ctx}: CANCELLED events");
    }

    fn request_approval(&mut self, i: &Index) {
        let running = self.ids_with(AgentStatus::Running);
        if running.is_empty() {
            if !self.order.is_empty() {
                let id = *i.get(&self.order);
                assert!(
                    self.core.request_approval(id, "shell", "").is_none(),
                    "{}: approval requested by an agent that is not running",
                    self.ctx
                );
                self.assert_no_events();
            }
            return;
        }
        let id = *i.get(&running);
        let ctx = &self.ctx;
        let (approval, decision) = match self.agents[&id].worker_id {
            // A worker asks through its session.
            Some(worker) => {
                let event = WorkerEvent::ApprovalRequest {
                    tool_name: "shell".into(),
                    detail: "rm -rf /tmp/x".into(),
                };
                assert!(
                    self.core
                        .worker_report(worker, id, ReportNumber::default(), event),
                    "{ctx}: a worker's approval request was refused"
                );
                let view = self.core.view(id).expect("known agent");
                ((*view.approval.expect("approval pending")).clone(), None)
            }
            None => {
                let approval = self.core.request_approval(id, "shell", "rm -rf /tmp/x");
                let (approval, decision) =
                    approval.unwrap_or_else(|| panic!("{ctx}: approval refused"));
                (approval, Some(decision))
            }
        };
        assert_eq!(&*approval.tool_name, "shell");
        assert_eq!(&*approval.detail, "rm -rf /tmp/x");
        self.approvals.insert(
            id,
            PendingApproval {
                id: approval.id,
                decision,
                decided: None,
            },
        );
        let events = self.drain_events();
        assert_eq!(
            events.first(),
            Some(&(id, EventKind::AwaitingApproval)),
            "{}: first event",
            self.ctx
        );
    }

    fn decide(&mut self, i: &Index, approve: bool, wrong_id: bool) {
        let outcome = ApprovalOutcome {
            approved: approve,
            note: if approve { String::new() } else { "no".into() },
        };
        let awaiting = self.ids_with(AgentStatus::AwaitingApproval);
        if awaiting.is_empty() {
            if !self.order.is_empty() {
                let id = *i.get(&self.order);
                let refused = self.core.decide_approval(
                    &subagentd::scheduler::Scope::All,
                    id,
                    Uuid::new_v4(),
                    outcome,
                );
                assert!(
                    matches!(refused, Err(Error::NotAwaitingApproval { .. })),
                    "{}: decided an agent that was not awaiting approval: {refused:?}",
                    self.ctx
                );
                self.assert_no_events();
            }
            return;
        }
        let id = *i.get(&awaiting);
        let pending = self.approvals[&id].id;
        if wrong_id {
            let refused = self.core.decide_approval(
                &subagentd::scheduler::Scope::All,
                id,
                Uuid::new_v4(),
                outcome,
            );
            assert!(
                matches!(refused, Err(Error::ApprovalMismatch { .. })),
                "{}: a wrong approval id was accepted: {refused:?}",
                self.ctx
            );
            self.assert_no_events();
            return;
        }
        let ctx = &self.ctx;
        let view = self
            .core
            .decide_approval(
                &subagentd::scheduler::Scope::All,
                id,
                pending,
                outcome.clone(),
            )
            .unwrap_or_else(|e| panic!("{ctx}: decision refused: {e}"));
        self.approvals.get_mut(&id).expect("pending").decided = Some(outcome);
        self.drain_events();
        let m = &self.agents[&id];
        assert!(
            m.is(AgentStatus::Running) || m.is(AgentStatus::Queued),
            "{}: a decided agent is {:?}",
            self.ctx,
            m.status
        );
        assert_eq!(Some(view.status), m.status, "{}: returned view", self.ctx);
    }

    /// A run learns its decision exactly when it runs again: not while it
    /// waits for the decision or for a slot, and never twice.
    fn check_approvals(&mut self) {
        let ctx = &self.ctx;
        let mut delivered = Vec::new();
        for (id, pending) in &mut self.approvals {
            let status = self.agents[id].status.expect("agent has a status");
            let Some(decision) = pending.decision.as_mut() else {
                // A worker's run: the decision is a command (see
                // `check_worker_commands`).
                if status != AgentStatus::AwaitingApproval && status != AgentStatus::Queued {
                    delivered.push(*id);
                }
                continue;
            };
            match (status, decision.try_recv()) {
                (AgentStatus::Running, Ok(got)) => {
                    assert_eq!(
                        Some(&got),
                        pending.decided.as_ref(),
                        "{ctx}: the run got another decision"
                    );
                    delivered.push(*id);
                }
                (AgentStatus::Running, Err(e)) => {
                    panic!("{ctx}: a running agent's run did not get its decision: {e:?}")
                }
                (AgentStatus::AwaitingApproval | AgentStatus::Queued, Err(e)) => assert_eq!(
                    e,
                    oneshot::error::TryRecvError::Empty,
                    "{ctx}: decision channel of a waiting agent"
                ),
                (AgentStatus::AwaitingApproval | AgentStatus::Queued, Ok(got)) => {
                    panic!("{ctx}: the run got {got:?} before running again")
                }
                (_, Ok(got)) => panic!("{ctx}: an ended agent's run got {got:?}"),
                (_, Err(_)) => delivered.push(*id),
            }
        }
        for id in delivered {
            self.approvals.remove(&id);
        }
    }

    // ----- workers ---------------------------------------------------------------

    fn connect_worker(&mut self, capacity: u32) {
        let (tx, rx) = mpsc::unbounded_channel();
        let info = WorkerInfo {
            tenant: subagentd::scheduler::DEFAULT_TENANT.into(),
            name: format!("w{}", self.workers.len()).into(),
            agents: vec![WORKER_TYPE.into()],
            capacity,
            labels: BTreeMap::new(),
        };
        let id = self.core.register_worker(info, tx, &[]);
        self.workers.push((id, capacity, rx));
        self.drain_events();
    }

    fn lose_worker(&mut self, i: &Index) {
        if self.workers.is_empty() {
            return;
        }
        let (worker, _, _) = self.workers.remove(i.index(self.workers.len()));
        let holding: Vec<AgentId> = self
            .order
            .iter()
            .copied()
            .filter(|id| {
                let m = &self.agents[id];
                m.is_live() && m.worker_id == Some(worker)
            })
            .collect();
        let attempts: HashMap<AgentId, u32> = holding
            .iter()
            .map(|id| (*id, self.core.view(*id).expect("known agent").attempt))
            .collect();
        self.core.worker_lost(worker);
        let events = self.drain_events();
        let ctx = &self.ctx;
        for id in holding {
            let m = &self.agents[&id];
            let retried = events.contains(&(id, EventKind::Retrying));
            let failed = events.contains(&(id, EventKind::Failed));
            // Or cancelled by the cascade of an ancestor that failed first.
            let cancelled = events.contains(&(id, EventKind::Cancelled));
            assert_eq!(
                [retried, failed, cancelled].iter().filter(|x| **x).count(),
                1,
                "{ctx}: agent #{} of a lost worker: retried {retried}, failed {failed}, \
                 cancelled {cancelled}; events {events:?}",
                m.seq
            );
            // The worker type retries once: a first attempt is retried, a
            // second fails.
            assert!(
                cancelled || retried == (attempts[&id] <= 1),
                "{ctx}: agent #{} on attempt {} retried: {retried}",
                m.seq,
                attempts[&id]
            );
            if failed {
                let view = self.core.view(id).expect("known agent");
                let code = view.error.map(|e| e.code.to_string());
                assert_eq!(code.as_deref(), Some("WORKER_LOST"), "{ctx}: error code");
            }
            assert_ne!(m.worker_id, Some(worker), "{ctx}: still on the lost worker");
        }
    }

    /// Runs a worker holds: (worker, agent), in a stable order.
    fn held_runs(&self) -> Vec<(WorkerId, AgentId)> {
        self.core
            .worker_snapshot()
            .into_iter()
            .flat_map(|(w, _, held)| held.into_iter().map(move |a| (w, a)))
            .collect()
    }

    fn worker_ends(&mut self, i: &Index, ok: bool) {
        let held = self.held_runs();
        if held.is_empty() {
            return;
        }
        let (worker, id) = held[i.index(held.len())];
        let live = self.agents[&id].is_live();
        let event = if ok {
            WorkerEvent::Done {
                result: "from worker".into(),
                session: None,
            }
        } else {
            WorkerEvent::Failed {
                error: AgentError::new("TOOL_ERROR", "boom"),
                session: None,
                retryable: false,
            }
        };
        let applied = self
            .core
            .worker_report(worker, id, ReportNumber::default(), event);
        let ctx = &self.ctx;
        assert_eq!(
            applied, live,
            "{ctx}: a worker's final report applied iff the run is live"
        );
        assert!(
            !self.held_runs().contains(&(worker, id)),
            "{ctx}: a final report did not free the worker's slot"
        );
        let events = self.drain_events();
        let ctx = &self.ctx;
        if live {
            let ended = if ok {
                EventKind::Done
            } else {
                EventKind::Failed
            };
            assert!(events.contains(&(id, ended)), "{ctx}: no {ended:?} event");
        } else {
            assert!(
                !events.iter().any(|(a, _)| *a == id),
                "{ctx}: a confirmation changed a stopped agent"
            );
        }
    }

    fn grace_expires(&mut self, i: &Index) {
        let stopped: Vec<(WorkerId, AgentId)> = self
            .held_runs()
            .into_iter()
            .filter(|(_, a)| !self.agents[a].is_live())
            .collect();
        if stopped.is_empty() {
            return;
        }
        let (worker, id) = stopped[i.index(stopped.len())];
        assert!(
            self.core.release_worker_slot(worker, id),
            "{}: grace release refused",
            self.ctx
        );
        assert!(
            !self.core.release_worker_slot(worker, id),
            "{}: a slot was released twice",
            self.ctx
        );
        self.drain_events();
    }

    /// What the core told each worker this step fits the agents' states:
    /// assignments go to the worker now holding the run, cancels name runs
    /// that ended, decisions reach runs that run again.
    fn check_worker_commands(&mut self) {
        let ctx = &self.ctx;
        for (worker, _, rx) in &mut self.workers {
            while let Ok(command) = rx.try_recv() {
                match command {
                    WorkerCommand::Assign(a) => {
                        let m = &self.agents[&a.agent.id];
                        assert!(m.worker_type, "{ctx}: a simulated agent was assigned");
                        assert_eq!(
                            a.agent.worker_id,
                            Some(*worker),
                            "{ctx}: assigned elsewhere"
                        );
                        assert_eq!(&*a.prompt, "work", "{ctx}: assigned without its prompt");
                    }
                    WorkerCommand::Cancel { agent_id, .. } => {
                        assert!(
                            !self.agents[&agent_id].is_live(),
                            "{ctx}: cancel sent for a live agent"
                        );
                    }
                    WorkerCommand::Approval { agent_id, .. } => {
                        let m = &self.agents[&agent_id];
                        assert!(
                            m.worker_id == Some(*worker) || !m.is_live(),
                            "{ctx}: a decision went to another worker"
                        );
                    }
                    WorkerCommand::Steer { .. } => {}
                    // Sent by the scheduler once a terminal report is
                    // durable, never by the core.
                    WorkerCommand::Released { agent_id, .. }
                    | WorkerCommand::WorkspaceAnswered { agent_id, .. } => {
                        panic!("{ctx}: the core released {agent_id}")
                    }
                }
            }
        }
    }

    /// Capacity is never exceeded and every slot is accounted for: a held
    /// run is a live agent on that worker or a stopped one awaiting its
    /// confirmation, and every live agent on a worker is held by it.
    fn check_workers(&self) {
        let ctx = &self.ctx;
        let snapshot = self.core.worker_snapshot();
        assert_eq!(
            snapshot.len(),
            self.workers.len(),
            "{ctx}: connected workers"
        );
        for (worker, capacity, held) in &snapshot {
            assert!(
                held.len() as u32 <= *capacity,
                "{ctx}: worker holds {} runs, capacity {capacity}",
                held.len()
            );
            for id in held {
                let m = &self.agents[id];
                assert!(
                    !m.is_live() || m.worker_id == Some(*worker),
                    "{ctx}: worker holds agent #{} which is on {:?}",
                    m.seq,
                    m.worker_id
                );
            }
        }
        for (id, m) in &self.agents {
            let on_worker = m.is(AgentStatus::Running) || m.is(AgentStatus::AwaitingApproval);
            if m.worker_type && on_worker {
                let worker = m.worker_id.unwrap_or_else(|| {
                    panic!("{ctx}: running worker agent #{} has no worker", m.seq)
                });
                assert!(
                    snapshot
                        .iter()
                        .any(|(w, _, held)| *w == worker && held.contains(id)),
                    "{ctx}: agent #{} runs on a worker that does not hold it",
                    m.seq
                );
            }
        }
    }

    fn reconfigure(&mut self, pick: &LimitsPick) {
        let mut pick = pick.clone();
        if self.entry_changes == EntryChanges::ValuesOnly {
            pick.provider_present = self.initial.provider_present;
            pick.model_present = self.initial.model_present;
        }
        self.limits = pick.to_limits();
        self.tenant_limits = pick.tenant_limits();
        self.core
            .reconfigure(self.limits.clone(), RunsConfig::default(), agent_types());
        self.core.set_tenant_limits(self.tenant_limits.clone());
        self.drain_events();
    }

    // ----- invariants after every step -----------------------------------------------------

    fn check_invariants(&mut self, running_before: &[AgentId]) {
        let ctx = &self.ctx;
        // Every transition was published: the model agrees with the core.
        for id in &self.order {
            let m = &self.agents[id];
            let view = self
                .core
                .view(*id)
                .unwrap_or_else(|| panic!("{ctx}: agent #{} forgotten", m.seq));
            assert_eq!(
                Some(view.status),
                m.status,
                "{ctx}: agent #{} changed state without an event",
                m.seq
            );
        }

        let counters = self.core.counters();
        assert_eq!(
            counters,
            self.core.recount(),
            "{ctx}: counters drifted from the records"
        );
        // Listings by state (the status index, merged by admission order,
        // paged three at a time) list exactly the model's agents in it.
        use AgentStatus::{AwaitingApproval, Done, Queued, Running};
        // The same per tenant (the per-tenant halves of the indexes), and
        // every retained agent of a tenant.
        let every_tenant = [
            vec![Running],
            vec![Queued, AwaitingApproval],
            vec![Running, Queued, AwaitingApproval, Running],
            vec![Done, Running],
        ]
        .map(|statuses| (None, statuses));
        let per_tenant = TENANTS.map(|t| {
            [
                (Some(t), vec![Running, Queued, AwaitingApproval]),
                (Some(t), vec![]),
            ]
        });
        for (tenant, statuses) in every_tenant.iter().chain(per_tenant.iter().flatten()) {
            let expected = self.retained_where(|m| {
                (statuses.is_empty() || statuses.iter().any(|s| m.is(*s)))
                    && tenant.is_none_or(|t| m.tenant == t)
            });
            let listed = self.listed_in_pages(&AgentFilter {
                statuses: statuses.clone(),
                tenant: tenant.map(Into::into),
                ..AgentFilter::default()
            });
            assert_eq!(
                listed, expected,
                "{ctx}: Status{{statuses={statuses:?}, tenant={tenant:?}}}"
            );
        }
        // Listings by lead (the lead index): in one tenant, and over every
        // tenant (an admin's, or any call with authentication off), merged
        // by admission order, paged three at a time.
        for lead in LEADS {
            for tenant in std::iter::once(None).chain(TENANTS.map(Some)) {
                let expected = self.retained_where(|m| {
                    m.lead.as_deref() == Some(lead) && tenant.is_none_or(|t| m.tenant == t)
                });
                let listed = self.listed_in_pages(&AgentFilter {
                    lead_id: Some(lead.to_owned()),
                    tenant: tenant.map(Into::into),
                    ..AgentFilter::default()
                });
                assert_eq!(
                    listed, expected,
                    "{ctx}: Status{{lead_id={lead}, tenant={tenant:?}}}"
                );
            }
        }
        // An agent exists only in its own tenant's scope.
        for id in &self.order {
            let own = &self.agents[id].tenant;
            for t in TENANTS {
                let seen = self.core.view_in(&Scope::Tenant(t.into()), *id).is_some();
                let retained = self.core.view(*id).is_some();
                assert_eq!(
                    seen,
                    retained && own == t,
                    "{ctx}: agent #{} seen from {t}",
                    self.agents[id].seq
                );
            }
        }
        let queued = self.ids_with(AgentStatus::Queued).len();
        assert_eq!(
            counters.queued, queued,
            "{ctx}: queue length vs QUEUED agents"
        );
        // The metrics gauges (live agents per bucket and state) follow every
        // transition, reload moves included.
        let mut by_bucket: std::collections::BTreeMap<String, [u32; 3]> = Default::default();
        for id in &self.order {
            let view = self.core.view(*id).expect("known agent");
            let slot = match view.status {
                AgentStatus::Queued => 0,
                AgentStatus::Running => 1,
                AgentStatus::AwaitingApproval => 2,
                _ => continue,
            };
            by_bucket
                .entry(format!("{}/{}", view.tenant, view.bucket))
                .or_default()[slot] += 1;
        }
        let gauges: std::collections::BTreeMap<String, [u32; 3]> = self
            .core
            .stats()
            .buckets()
            .map(|(t, b, st)| {
                (
                    format!("{t}/{b}"),
                    [st.queued, st.running, st.awaiting_approval],
                )
            })
            .filter(|(_, g)| *g != [0, 0, 0])
            .collect();
        assert_eq!(gauges, by_bucket, "{ctx}: per-bucket gauges vs records");
        let live_background = self
            .agents
            .values()
            .filter(|m| m.background && m.is_live())
            .count() as u32;
        assert_eq!(
            counters.live_background, live_background,
            "{ctx}: live background agents"
        );

        // Eager admission: nothing queued could start now.
        assert_eq!(
            self.core.startable_queued(),
            Vec::<AgentId>::new(),
            "{ctx}: startable_queued"
        );
        let r = self.running();
        for m in self.agents.values() {
            if m.is(AgentStatus::Queued) {
                assert!(
                    m.background || m.worker_type,
                    "{ctx}: a foreground agent is queued without waiting for a worker"
                );
                assert!(
                    !self.eligible(m, &r),
                    "{ctx}: agent #{} stays queued although bucket {:?} and parent {:?} have room",
                    m.seq,
                    self.bucket_of(&m.model),
                    m.parent
                );
            }
        }

        // The core's own buckets: one that gained running agents this step
        // is within its limit (lowering never pre-empts, so a bucket may
        // stay over a lowered limit only without new starts).
        for (bucket, running, limit) in self.core.bucket_usage() {
            let before = running_before
                .iter()
                .filter(|id| {
                    self.agents
                        .get(*id)
                        .is_some_and(|m| self.bucket_of(&m.model).0 == bucket)
                })
                .count() as u32;
            assert!(
                running <= before || limit == 0 || running <= limit,
                "{ctx}: bucket {bucket} went from {before} to {running} running, limit {limit}"
            );
        }

        // Cascades: a live agent's parent is live, unless it is detached.
        for m in self.agents.values() {
            if let (true, Some(p)) = (m.is_live(), m.parent_id) {
                assert!(
                    m.detached || self.agents[&p].is_live(),
                    "{ctx}: agent #{} outlived its parent #{} without being detached",
                    m.seq,
                    self.agents[&p].seq
                );
            }
        }

        // The core hands out exactly one run per first start, in order.
        let handed_out: Vec<AgentId> = self
            .core
            .take_starts()
            .into_iter()
            .map(|s| s.agent.id)
            .collect();
        let first_starts = std::mem::take(&mut self.first_starts);
        assert_eq!(
            handed_out, first_starts,
            "{ctx}: runs handed out by take_starts"
        );

        assert!(
            matches!(self.events.try_recv(), Received::Empty),
            "{ctx}: events left over"
        );
    }

    /// Cancels every live agent; then every counter must be zero.
    fn finish_all(&mut self) {
        self.ctx = "final cancel of every live agent".to_owned();
        for id in self.order.clone() {
            if self.agents[&id].is_live() {
                let cancelled = self
                    .core
                    .cancel(&subagentd::scheduler::Scope::All, id, "end of test")
                    .expect("cancel of a known agent");
                assert!(!cancelled.is_empty());
            }
            self.drain_events();
        }
        let ctx = &self.ctx;
        assert!(self.live_ids().is_empty(), "{ctx}: agents still live");
        assert_eq!(
            live_only(self.core.counters()),
            Counters::default(),
            "{ctx}: counters"
        );
        assert_eq!(
            live_only(self.core.recount()),
            Counters::default(),
            "{ctx}: recount"
        );
        assert!(self.core.startable_queued().is_empty());
        let _ = self.core.take_starts();
    }
}

/// The full watch and one lead's routed watch.
/// The counters of live agents only (retained finished agents stay
/// indexed after every agent ended).
fn live_only(c: Counters) -> Counters {
    Counters {
        retained: Default::default(),
        ..c
    }
}

fn watchers(core: &mut Core) -> (Live, Live) {
    let all = core.subscribe(&WatchQuery::default()).live;
    let lead = core
        .subscribe(&WatchQuery {
            filter: AgentFilter {
                lead_id: Some(LEADS[0].to_owned()),
                tenant: Some(TENANTS[1].into()),
                ..AgentFilter::default()
            },
            ..WatchQuery::default()
        })
        .live;
    (all, lead)
}

fn run_model(initial: LimitsPick, ops: &[Op], entry_changes: EntryChanges) {
    let mut h = Harness::new(initial, entry_changes);
    for (n, op) in ops.iter().enumerate() {
        h.step(n, op);
    }
    h.finish_all();
}

/// `cases` random schedules, or `share` of `MODEL_CASES` when that is set
/// (CI runs 10,000 in a release build; the default keeps `cargo test`
/// quick).
fn config(cases: u32, share: f64) -> ProptestConfig {
    let cases = std::env::var("MODEL_CASES")
        .ok()
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(cases, |n| (n * share).ceil() as u32);
    ProptestConfig {
        cases,
        // Regressions are printed on failure; the test files stay untouched.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(400, 0.75))]

    #[test]
    fn admission_invariants_hold_after_every_step_of_random_operations(
        initial in limits_pick(),
        ops in prop::collection::vec(op(), 1..=200),
    ) {
        run_model(initial, &ops, EntryChanges::ValuesOnly);
    }
}

proptest! {
    #![proptest_config(config(128, 0.25))]

    #[test]
    fn admission_invariants_hold_when_reloads_add_and_remove_bucket_entries(
        initial in limits_pick(),
        ops in prop::collection::vec(op(), 1..=200),
    ) {
        run_model(initial, &ops, EntryChanges::AddAndRemove);
    }
}

// ----- single behaviours -------------------------------------------------------------

fn root_spec(background: bool) -> SpawnSpec {
    SpawnSpec {
        agent: AGENT_TYPE.to_owned(),
        model: MODELS[0].to_owned(),
        prompt: "work".to_owned(),
        background,
        ..SpawnSpec::default()
    }
}

fn core_with(limits: Limits) -> Core {
    let watch = WatchConfig {
        history: 16,
        subscriber_buffer: 16,
    };
    Core::new(limits, RunsConfig::default(), &watch, agent_types())
}

fn spawn_bg(core: &mut Core, model: &str) -> AgentView {
    let spec = SpawnSpec {
        model: model.to_owned(),
        ..root_spec(true)
    };
    core.spawn(spec, SystemTime::now()).expect("admitted").0
}

/// No bucket or parent limit; room for 6 background agents.
fn unlimited() -> Limits {
    Limits {
        max_background_agents: 6,
        default_concurrency: 0,
        max_concurrent_per_parent: 0,
        ..Limits::default()
    }
}

/// Contract (issue 2, section 2): "Cancelling an agent cancels all its live
/// descendants. [...] Cancelling an agent that already ended is not an
/// error; it is just not listed in the response."
#[test]
fn cancelling_an_ended_agent_cancels_its_live_detached_descendants() {
    let mut core = core_with(unlimited());
    let now = SystemTime::now();
    let (parent, _) = core.spawn(root_spec(true), now).unwrap();
    let detached_child = SpawnSpec {
        parent_id: Some(parent.id),
        detached: true,
        ..root_spec(true)
    };
    let (detached, _) = core.spawn(detached_child, now).unwrap();
    assert!(core.finish(parent.id, Ok("done".to_owned())));
    assert_eq!(
        core.view(detached.id).unwrap().status,
        AgentStatus::Running,
        "a detached child survives its parent"
    );

    let listed: Vec<AgentId> = core
        .cancel(
            &subagentd::scheduler::Scope::All,
            parent.id,
            "cancel the tree",
        )
        .unwrap()
        .into_iter()
        .map(|v| v.id)
        .collect();
    assert_eq!(
        core.view(detached.id).unwrap().status,
        AgentStatus::Cancelled,
        "the ended agent's live descendant is cancelled"
    );
    assert_eq!(listed, [detached.id], "only the descendant is listed");
    assert_eq!(live_only(core.counters()), Counters::default());
}

/// Contract (issue 2, section 3): "a provider limit is shared by all of that
/// provider's models"; "lowering never pre-empts running agents". An agent
/// admitted before the provider entry existed still runs on that provider,
/// so the provider is full and a new agent of another of its models queues.
#[test]
fn a_provider_limit_added_by_reload_counts_agents_admitted_before_it() {
    let mut core = core_with(unlimited());
    let first = spawn_bg(&mut core, "p1/a");
    assert_eq!(first.status, AgentStatus::Running);

    let lowered = Limits {
        provider_concurrency: BTreeMap::from([("p1".to_owned(), 1)]),
        ..unlimited()
    };
    core.reconfigure(lowered, RunsConfig::default(), agent_types());
    assert_eq!(
        core.view(first.id).unwrap().status,
        AgentStatus::Running,
        "lowering never pre-empts"
    );
    let second = spawn_bg(&mut core, "p1/b");
    assert_eq!(
        second.status,
        AgentStatus::Queued,
        "provider p1 (limit 1) already runs {}",
        first.model
    );
}

/// Contract (issue 2, section 3): "Raising a limit starts queued agents at
/// once." Removing a provider entry gives each of its models its own bucket
/// under `default_concurrency`; an agent queued behind the old shared limit
/// now has room in its own bucket.
#[test]
fn removing_a_provider_limit_by_reload_starts_agents_queued_behind_it() {
    let shared = Limits {
        provider_concurrency: BTreeMap::from([("p1".to_owned(), 1)]),
        ..unlimited()
    };
    let mut core = core_with(shared);
    let first = spawn_bg(&mut core, "p1/a");
    let second = spawn_bg(&mut core, "p1/b");
    assert_eq!(first.status, AgentStatus::Running);
    assert_eq!(second.status, AgentStatus::Queued);

    let per_model = Limits {
        default_concurrency: 1,
        ..unlimited()
    };
    core.reconfigure(per_model, RunsConfig::default(), agent_types());
    assert_eq!(
        core.view(second.id).unwrap().status,
        AgentStatus::Running,
        "p1/b has its own bucket (limit 1, nothing running) after the reload"
    );
}

/// Issue 13, "What is durable": buffered steers, usage and total usage,
/// idempotency keys and the watch history survive a restart; the
/// interrupted run fails SERVER_RESTARTED and the queued agent then starts
/// with its buffered steer.
#[test]
fn a_restart_keeps_steers_usage_keys_and_history_and_fails_the_interrupted_run() {
    let limits = Limits {
        default_concurrency: 1,
        ..unlimited()
    };
    let mut core = core_with(limits.clone());
    core.track_changes();
    let store = MemoryStore::new();
    let now = SystemTime::now();
    let (parent, _) = core.spawn(root_spec(true), now).unwrap();
    let child_spec = SpawnSpec {
        parent_id: Some(parent.id),
        idempotency_key: Some("child-1".to_owned()),
        ..root_spec(true)
    };
    let (child, _) = core.spawn(child_spec.clone(), now).unwrap();
    assert_eq!(child.status, AgentStatus::Queued, "the bucket holds one");
    core.steer(
        &subagentd::scheduler::Scope::All,
        child.id,
        "remember this".to_owned(),
    )
    .unwrap();
    core.add_usage(
        parent.id,
        subagentd::scheduler::Usage {
            input_tokens: 5,
            output_tokens: 7,
            tool_calls: 0,
        },
    );
    let _ = core.take_starts();
    let last_sequence = core.last_sequence();
    let (changes, ticket) = core.take_changes();
    assert!(ticket > 0);
    let mut batch = Batch::default();
    batch.add(&changes);
    store.clone().commit(&batch).unwrap();

    let recovered = store.clone().load().unwrap().decode().unwrap();
    assert_eq!(
        recovered.events.len(),
        2,
        "the STARTED and QUEUED events are kept"
    );
    let mut again = core_with(limits);
    let mut report = again.restore(recovered, 16, 16).unwrap();
    assert_eq!(report.interrupted, vec![parent.id]);
    assert_eq!(again.view(parent.id).unwrap().usage.output_tokens, 7);
    assert_eq!(again.view(parent.id).unwrap().total_usage.input_tokens, 5);
    let (found, existing) = again.spawn(child_spec, now).unwrap();
    assert!(
        existing && found.id == child.id,
        "the key returns the first agent"
    );
    assert_eq!(again.last_sequence(), last_sequence);

    again.recover_runs(&mut report);
    let parent_now = again.view(parent.id).unwrap();
    assert_eq!(parent_now.status, AgentStatus::Failed);
    assert_eq!(parent_now.error.unwrap().code.as_ref(), "SERVER_RESTARTED");
    // The child was not detached: the parent's end cancels it.
    assert_eq!(again.view(child.id).unwrap().status, AgentStatus::Cancelled);
    assert!(again.last_sequence() > last_sequence);
    let (changes, _) = again.take_changes();
    let ids: HashSet<AgentId> = changes.agents.iter().map(|a| a.view.id).collect();
    assert_eq!(
        ids,
        HashSet::from([parent.id, child.id]),
        "decisions are tracked"
    );
}

/// A queued root keeps its buffered steer across a restart and gets it when
/// it starts.
#[test]
fn a_buffered_steer_reaches_the_run_that_starts_after_a_restart() {
    let limits = Limits {
        default_concurrency: 1,
        ..unlimited()
    };
    let mut core = core_with(limits.clone());
    core.track_changes();
    let now = SystemTime::now();
    let (first, _) = core.spawn(root_spec(true), now).unwrap();
    let (second, _) = core.spawn(root_spec(true), now).unwrap();
    core.steer(
        &subagentd::scheduler::Scope::All,
        second.id,
        "go left".to_owned(),
    )
    .unwrap();
    let (changes, _) = core.take_changes();
    let mut batch = Batch::default();
    batch.add(&changes);
    let store = MemoryStore::new();
    store.clone().commit(&batch).unwrap();

    let mut again = core_with(limits);
    let mut report = again
        .restore(store.clone().load().unwrap().decode().unwrap(), 16, 16)
        .unwrap();
    again.recover_runs(&mut report);
    assert_eq!(again.view(first.id).unwrap().status, AgentStatus::Failed);
    let mut starts = again.take_starts();
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].agent.id, second.id);
    assert_eq!(starts[0].steer.try_recv().as_deref(), Some("go left"));
}

/// Tests of one agent type `t`: its config, a small watch history and the
/// limits, for a core with one worker `w` serving `t` and for the core a
/// restart rebuilds.
struct TypeT {
    types: BTreeMap<String, AgentTypeConfig>,
    limits: Limits,
    watch: WatchConfig,
}

impl TypeT {
    fn new(config: AgentTypeConfig, limits: Limits) -> Self {
        Self {
            types: BTreeMap::from([("t".to_owned(), config)]),
            limits,
            watch: WatchConfig {
                history: 64,
                subscriber_buffer: 64,
            },
        }
    }

    /// A new core with these settings.
    fn core(&self) -> Core {
        Core::new(
            self.limits.clone(),
            RunsConfig::default(),
            &self.watch,
            self.types.clone(),
        )
    }

    /// A core tracking its changes, with worker `w` (capacity 4) serving
    /// `t`, and the worker's command channel.
    fn core_with_worker(&self) -> (Core, WorkerId, mpsc::UnboundedReceiver<WorkerCommand>) {
        let mut core = self.core();
        core.track_changes();
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = core.register_worker(
            WorkerInfo {
                tenant: subagentd::scheduler::DEFAULT_TENANT.into(),
                name: "w".into(),
                agents: vec!["t".into()],
                capacity: 4,
                labels: BTreeMap::new(),
            },
            tx,
            &[],
        );
        (core, worker, rx)
    }

    /// A background root agent of type `t`.
    fn spec() -> SpawnSpec {
        SpawnSpec {
            agent: "t".to_owned(),
            ..root_spec(true)
        }
    }
}

/// Issue 13 §5, the recovery matrix at the core: each live state × each
/// runner kind × `retry_on_restart` 0 / 1 (worker types: their re-attach
/// grace passing with no worker back, under `retry_on_worker_lost` 0 / 1).
#[test]
fn the_recovery_matrix_each_live_state_each_runner_each_retry_setting() {
    let kinds = [
        RunnerKind::Simulated,
        RunnerKind::Command,
        RunnerKind::Openai,
        RunnerKind::Worker,
    ];
    for kind in kinds {
        for retry in [0u32, 1] {
            for state in [
                AgentStatus::Queued,
                AgentStatus::Running,
                AgentStatus::AwaitingApproval,
            ] {
                let ctx = format!("{kind:?} retry {retry} {state:?}");
                let t = TypeT::new(
                    AgentTypeConfig {
                        runner: kind,
                        retry_on_restart: if kind == RunnerKind::Worker { 0 } else { retry },
                        retry_on_worker_lost: if kind == RunnerKind::Worker { retry } else { 0 },
                        ..AgentTypeConfig::default()
                    },
                    Limits {
                        default_concurrency: 1,
                        ..unlimited()
                    },
                );
                let (mut core, worker, _rx) = t.core_with_worker();
                let spec = TypeT::spec();
                let now = SystemTime::now();
                let (first, _) = core.spawn(spec.clone(), now).unwrap();
                let (second, _) = core.spawn(spec, now).unwrap();
                assert_eq!(
                    second.status,
                    AgentStatus::Queued,
                    "{ctx}: the bucket holds one"
                );
                let subject = match state {
                    AgentStatus::Queued => second.id,
                    AgentStatus::Running => first.id,
                    _ => {
                        if kind == RunnerKind::Worker {
                            core.worker_report(
                                worker,
                                first.id,
                                ReportNumber::default(),
                                WorkerEvent::ApprovalRequest {
                                    tool_name: "shell".into(),
                                    detail: "ls".into(),
                                },
                            );
                        } else {
                            core.request_approval(first.id, "shell", "ls").unwrap();
                        }
                        first.id
                    }
                };
                assert_eq!(core.view(subject).unwrap().status, state, "{ctx}");
                let _ = core.take_starts();
                let (changes, _) = core.take_changes();
                let mut batch = Batch::default();
                batch.add(&changes);
                let store = MemoryStore::new();
                store.clone().commit(&batch).unwrap();

                let mut again = t.core();
                let mut report = again
                    .restore(store.clone().load().unwrap().decode().unwrap(), 64, 64)
                    .unwrap();
                again.recover_runs(&mut report);
                let held = report.held_for_workers.clone();
                let view = again.view(subject).unwrap();
                let code = view.error.as_ref().map(|e| e.code.to_string());
                match (state, kind) {
                    (AgentStatus::Queued, _) => {
                        // Still queued behind the interrupted one, or started
                        // once the interrupted one ended.
                        assert!(
                            matches!(view.status, AgentStatus::Queued | AgentStatus::Running),
                            "{ctx}: {view:?}"
                        );
                        let expected = u32::from(view.status == AgentStatus::Running);
                        assert_eq!(view.attempt, expected, "{ctx}: its first attempt, if any");
                    }
                    (_, RunnerKind::Worker) => {
                        assert_eq!(view.status, state, "{ctx}: held for re-attach");
                        assert!(held.contains(&subject), "{ctx}");
                        if let Some(approval) = &view.approval {
                            // Nothing could receive a decision before the
                            // worker is back.
                            let outcome = ApprovalOutcome {
                                approved: true,
                                note: String::new(),
                            };
                            let err = again
                                .decide_approval(
                                    &subagentd::scheduler::Scope::All,
                                    subject,
                                    approval.id,
                                    outcome,
                                )
                                .unwrap_err();
                            assert!(
                                matches!(err, Error::AwaitingReattach { id } if id == subject),
                                "{ctx}: {err:?}"
                            );
                        }
                        again.reattach_grace_passed(&held);
                        let after = again.view(subject).unwrap();
                        if retry == 1 {
                            assert_eq!(after.status, AgentStatus::Queued, "{ctx}: retried");
                        } else {
                            assert_eq!(after.status, AgentStatus::Failed, "{ctx}");
                            assert_eq!(after.error.unwrap().code.as_ref(), "WORKER_LOST");
                        }
                    }
                    (_, _) if retry == 1 => {
                        assert!(
                            matches!(view.status, AgentStatus::Queued | AgentStatus::Running),
                            "{ctx}: queued again: {view:?}"
                        );
                        assert_eq!(
                            report.retried,
                            report.interrupted.len(),
                            "{ctx}: every interrupted run"
                        );
                        if view.status == AgentStatus::Running {
                            assert_eq!(view.attempt, 2, "{ctx}: the next attempt");
                        }
                    }
                    _ => {
                        assert_eq!(view.status, AgentStatus::Failed, "{ctx}");
                        assert_eq!(code.as_deref(), Some("SERVER_RESTARTED"), "{ctx}");
                        assert!(
                            view.approval.is_none(),
                            "{ctx}: no approval is left pending"
                        );
                    }
                }
                assert_eq!(again.counters(), again.recount(), "{ctx}");
            }
        }
    }
}

/// Issue 13 §4: an agent whose approval was decided while its bucket was
/// full waits QUEUED with its run paused. The store keeps the decision,
/// and recovery treats that run as interrupted: in process by the restart
/// rules (`retry_on_restart`), on a worker by the worker-lost rules at once
/// (a worker re-attaches only RUNNING and AWAITING_APPROVAL runs), never
/// as an agent that has not started.
#[test]
fn an_approved_run_waiting_for_its_slot_is_interrupted_by_a_restart() {
    for kind in [RunnerKind::Simulated, RunnerKind::Worker] {
        for retry in [0u32, 1] {
            let ctx = format!("{kind:?} retry {retry}");
            let t = TypeT::new(
                AgentTypeConfig {
                    runner: kind,
                    retry_on_restart: retry,
                    retry_on_worker_lost: retry,
                    ..AgentTypeConfig::default()
                },
                Limits {
                    default_concurrency: 1,
                    ..unlimited()
                },
            );
            let (mut core, worker, _rx) = t.core_with_worker();
            let spec = TypeT::spec();
            let now = SystemTime::now();
            let (first, _) = core.spawn(spec.clone(), now).unwrap();
            let (second, _) = core.spawn(spec, now).unwrap();
            if kind == RunnerKind::Worker {
                core.worker_report(
                    worker,
                    first.id,
                    ReportNumber::default(),
                    WorkerEvent::ApprovalRequest {
                        tool_name: "shell".into(),
                        detail: "ls".into(),
                    },
                );
            } else {
                core.request_approval(first.id, "shell", "ls").unwrap();
            }
            assert_eq!(
                core.view(second.id).unwrap().status,
                AgentStatus::Running,
                "{ctx}: the paused run's bucket slot went to the next agent"
            );
            let approval = core.view(first.id).unwrap().approval.unwrap().id;
            let outcome = ApprovalOutcome {
                approved: true,
                note: "ok".into(),
            };
            let decided = core
                .decide_approval(
                    &subagentd::scheduler::Scope::All,
                    first.id,
                    approval,
                    outcome.clone(),
                )
                .unwrap();
            assert_eq!(
                decided.status,
                AgentStatus::Queued,
                "{ctx}: waits for its slot"
            );

            let _ = core.take_starts();
            let (changes, _) = core.take_changes();
            let stored = changes.agents.iter().find(|s| s.view.id == first.id);
            assert_eq!(
                stored.and_then(|s| s.decision.clone()),
                Some((approval, outcome)),
                "{ctx}: the decision is part of the stored state"
            );
            let mut batch = Batch::default();
            batch.add(&changes);
            let store = MemoryStore::new();
            store.clone().commit(&batch).unwrap();

            let mut again = t.core();
            let mut report = again
                .restore(store.clone().load().unwrap().decode().unwrap(), 64, 64)
                .unwrap();
            assert_eq!(report.queued, 0, "{ctx}: not counted as a queued agent");
            again.recover_runs(&mut report);
            let view = again.view(first.id).unwrap();
            let code = view.error.as_ref().map(|e| e.code.to_string());
            let counted = if retry == 1 {
                assert!(
                    matches!(view.status, AgentStatus::Queued | AgentStatus::Running),
                    "{ctx}: queued again: {view:?}"
                );
                if view.status == AgentStatus::Running {
                    assert_eq!(view.attempt, 2, "{ctx}: a new attempt");
                }
                report.retried
            } else {
                assert_eq!(view.status, AgentStatus::Failed, "{ctx}: {view:?}");
                let expected = match kind {
                    RunnerKind::Worker => "WORKER_LOST",
                    _ => "SERVER_RESTARTED",
                };
                assert_eq!(code.as_deref(), Some(expected), "{ctx}");
                report.failed
            };
            assert!(counted >= 1, "{ctx}: counted in the report: {report:?}");
            assert_eq!(again.counters(), again.recount(), "{ctx}");
        }
    }
}

/// Issue 13 §2: a worker's numbered reports apply once each, so a worker
/// that sends a run's reports again after a re-attach counts nothing twice;
/// unnumbered ones (0) always apply.
#[test]
fn a_numbered_worker_report_applies_once() {
    use subagentd::scheduler::Usage;
    let t = TypeT::new(
        AgentTypeConfig {
            runner: RunnerKind::Worker,
            ..AgentTypeConfig::default()
        },
        unlimited(),
    );
    let (mut core, worker, _rx) = t.core_with_worker();
    let (agent, _) = core.spawn(TypeT::spec(), SystemTime::now()).unwrap();
    let usage = |n| {
        WorkerEvent::Usage(Usage {
            input_tokens: n,
            ..Usage::default()
        })
    };
    for (seq, n) in [(1, 10), (1, 10), (2, 5), (1, 10), (0, 1), (0, 1)] {
        let number = ReportNumber { seq, attempt: 0 };
        assert!(core.worker_report(worker, agent.id, number, usage(n)));
    }
    let view = core.view(agent.id).unwrap();
    assert_eq!(
        view.usage.input_tokens, 17,
        "10 and 5 once, the unnumbered 1 twice"
    );
    // Another attempt's reports (an old handler of a retried run) apply
    // nothing, not even an end.
    let stale = ReportNumber { seq: 9, attempt: 7 };
    assert!(!core.worker_report(worker, agent.id, stale, usage(100)));
    let end = WorkerEvent::Failed {
        error: AgentError::new("CANCELLED", "old attempt"),
        session: None,
        retryable: false,
    };
    assert!(!core.worker_report(worker, agent.id, stale, end));
    let view = core.view(agent.id).unwrap();
    assert_eq!(
        (view.status, view.usage.input_tokens),
        (AgentStatus::Running, 17)
    );
    let current = ReportNumber { seq: 3, attempt: 1 };
    assert!(core.worker_report(worker, agent.id, current, usage(3)));
    assert_eq!(core.view(agent.id).unwrap().usage.input_tokens, 20);
}
