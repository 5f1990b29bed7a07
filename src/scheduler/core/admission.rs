//! Admission: Spawn's checks, a new agent's trace context, taking and
//! giving back slots, starting a run, and draining the queue when limits
//! free up.

use std::{sync::Arc, time::SystemTime};

use uuid::Uuid;

use super::{Children, Core, Rare, Record, RunControl, RunStart};
use crate::config::{RunnerKind, WorkspaceKind};
use crate::scheduler::conversation::{Inherited, Place, Refusal};
use crate::scheduler::{
    error::{Error, FieldViolation},
    events::EventKind,
    queue::Dirty,
    state::Held,
    trace::{random_span_id, SpanRecord, SpawnTrace, TraceContext, TraceId},
    types::*,
    workers::{Assignment, WorkerCommand},
};
use foldhash::HashMap;

impl Core {
    /// Admits an agent: starts it, queues it, or refuses it. Returns the
    /// agent and whether it is an earlier agent found by idempotency key.
    pub fn spawn(
        &mut self,
        mut spec: SpawnSpec,
        now: SystemTime,
    ) -> Result<(AgentView, bool), Error> {
        if self.closed {
            return Err(Error::ShuttingDown);
        }
        let tenant = match &*spec.tenant {
            "" => self.intern(DEFAULT_TENANT),
            named => self.intern(named),
        };
        // A continuation fills in what the request leaves out from the
        // agent it continues, first: its idempotency key is scoped by the
        // parent or lead it inherits.
        let from = match spec.continue_from {
            Some(from) => Some(self.inherit(&tenant, from, &mut spec, now)?),
            None => None,
        };
        if let Some(earlier) = self.earlier_spawn(&tenant, &spec) {
            return Ok((earlier, true));
        }
        self.default_model(&mut spec)?;
        let place = self.check_spawn(&tenant, &spec, from.as_ref())?;
        let record = self.new_record(tenant, spec, from, place, now);
        let id = self.index_new(record);
        self.place_new(id);
        Ok((self.view(id).expect("agent was just inserted"), false))
    }

    /// A Spawn that names no model (and continues no agent whose model it
    /// inherits) gets its type's `default_model`; without one it is
    /// INVALID_ARGUMENT naming `model`. An unknown type is left to
    /// `check_spec`, which names the known ones.
    fn default_model(&self, spec: &mut SpawnSpec) -> Result<(), Error> {
        if !spec.model.is_empty() {
            return Ok(());
        }
        match self.agent_types.get(&spec.agent).map(|t| &t.default_model) {
            Some(Some(model)) => spec.model.clone_from(model),
            Some(None) => {
                return Err(Error::Invalid(vec![FieldViolation::new(
                    "model",
                    format!(
                        "is required, as \"provider/model\": agent type \"{}\" has no \
                         default_model",
                        spec.agent
                    ),
                )]))
            }
            None => {}
        }
        Ok(())
    }

    /// Whether `spec` is a retry of an admitted Spawn (its idempotency key
    /// names an agent): it gets that agent back, unchecked.
    pub fn is_retry(&self, spec: &SpawnSpec) -> bool {
        if spec.idempotency_key.is_none() {
            return false;
        }
        let tenant: Arc<str> = match &*spec.tenant {
            "" => DEFAULT_TENANT.into(),
            named => named.into(),
        };
        self.earlier_spawn(&tenant, spec).is_some()
    }

    /// A retry whose first response was lost gets the first agent (by
    /// idempotency key), even if its parent has ended or the config
    /// changed since.
    fn earlier_spawn(&self, tenant: &Arc<str>, spec: &SpawnSpec) -> Option<AgentView> {
        let key = spec.idempotency_key.as_deref()?;
        let parent_key = match (spec.parent_id, spec.lead_id.as_deref()) {
            (Some(pid), _) => ParentKey::Agent(pid),
            (None, Some(lead)) => ParentKey::Lead(tenant.clone(), lead.into()),
            (None, None) => ParentKey::None,
        };
        self.idempotency
            .get(&(tenant.clone(), parent_key, Arc::from(key)))
            .and_then(|id| self.agents.get(id))
            .map(|rec| self.view_of(rec))
    }

    /// Every check of a Spawn, before anything changes: the spec, a
    /// continuation's, the parent (exists, live), depth, tree size, the
    /// tenant's and the global cap, and last the tenant's spawn rate (only
    /// a Spawn every other check admits takes a token). Returns where the
    /// agent goes in its tree.
    fn check_spawn(
        &mut self,
        tenant: &Arc<str>,
        spec: &SpawnSpec,
        from: Option<&Continued>,
    ) -> Result<Placement, Error> {
        self.check_spec(spec)?;
        if let Some(from) = from {
            self.check_continuable(tenant, from, spec)?;
        }
        let place = self.placement(tenant, spec)?;
        if place.depth > self.limits.max_depth {
            return Err(Error::DepthLimit {
                limit: self.limits.max_depth,
                depth: place.depth,
            });
        }
        let tree_limit = self.limits.max_live_descendants_per_root;
        if let Some(root) = place.root_id {
            let live = self.tree_live.get(&root).copied().unwrap_or(0);
            if tree_limit != 0 && live >= tree_limit {
                return Err(Error::DescendantLimit {
                    limit: tree_limit,
                    live,
                    root_id: root,
                });
            }
        }
        let own = self.tenant_limits.get(&**tenant).copied();
        if let Some(own) = own.filter(|t| spec.background && t.max_background_agents > 0) {
            let live = self.tenant_live.get(tenant).copied().unwrap_or(0);
            if live >= own.max_background_agents {
                return Err(Error::TenantLimit {
                    tenant: tenant.clone(),
                    limit: own.max_background_agents,
                    live,
                });
            }
        }
        if spec.background && self.live_background >= self.limits.max_background_agents {
            return Err(Error::GlobalLimit {
                limit: self.limits.max_background_agents,
                live: self.live_background,
            });
        }
        if let Some(own) = own.filter(|t| t.spawn_rate > 0.0) {
            self.take_spawn_token(tenant, own)?;
        }
        Ok(place)
    }

    /// Where a new agent sits: under its parent (which must exist in the
    /// tenant and be live), or a root of its lead.
    fn placement(&self, tenant: &Arc<str>, spec: &SpawnSpec) -> Result<Placement, Error> {
        let Some(pid) = spec.parent_id else {
            let lead: Option<Arc<str>> = spec.lead_id.as_deref().map(Into::into);
            return Ok(Placement {
                root_id: None,
                lead_id: lead,
                depth: 1,
            });
        };
        // Another tenant's agent is not a parent: it does not exist for
        // this caller.
        let p = self
            .agents
            .get(&pid)
            .filter(|p| p.view.tenant == *tenant)
            .ok_or(Error::NotFound {
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
        Ok(Placement {
            root_id: Some(p.view.root_id),
            lead_id: p.view.lead_id.clone(),
            depth: p.view.depth + 1,
        })
    }

    /// The record of an admitted Spawn, QUEUED, with its trace context, its
    /// admission sequence and its conversation turn (begun, continued or
    /// forked).
    fn new_record(
        &mut self,
        tenant: Arc<str>,
        spec: SpawnSpec,
        from: Option<Continued>,
        place: Placement,
        now: SystemTime,
    ) -> Record {
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
        let prompt: Arc<str> = spec.prompt.into();
        let labels = if spec.labels.is_empty() {
            self.no_labels.clone()
        } else {
            Arc::new(spec.labels)
        };
        let inherited = Inherited {
            agent: self.intern(&spec.agent),
            model: self.intern(&spec.model),
            parent_id: spec.parent_id,
            lead_id: place.lead_id.clone(),
            labels: labels.clone(),
        };
        let continuation = self.turn_of(
            id,
            &tenant,
            from.map(|f| (f, spec.fork)),
            inherited,
            &prompt,
            now,
        );
        let view = AgentView {
            id,
            tenant,
            agent: self.intern(&spec.agent),
            model: self.intern(&spec.model),
            description: self.text(spec.description),
            parent_id: spec.parent_id,
            root_id: place.root_id.unwrap_or(id),
            lead_id: place.lead_id,
            depth: place.depth,
            status: AgentStatus::Queued,
            created_at: now,
            started_at: None,
            finished_at: None,
            collected_at: None,
            workspace: None,
            result: self.empty.clone(),
            error: None,
            approval: None,
            usage: Usage::default(),
            total_usage: Usage::default(),
            labels,
            background: spec.background,
            detached: spec.detached,
            queue_reason: None,
            worker_id: None,
            attempt: 0,
            bucket,
            trace_id: trace.trace_id,
            continuation,
            attempts: None,
        };
        let idem_key = spec.idempotency_key.as_deref().map(Arc::<str>::from);
        Record {
            view,
            seq,
            runner,
            prompt: Some(prompt),
            timeout_ms: Record::timeout_ms(spec.timeout.unwrap_or(self.runs.default_timeout)),
            rare: Record::rare(Rare {
                steer_buffer: Vec::new(),
                idempotency_key: idem_key,
                workspace_base: spec.workspace_base.map(Arc::from),
            }),
            run: None,
            children: Children::default(),
            span_id: trace.span_id,
            sampled: trace.sampled,
            span,
        }
    }

    /// The new agent's conversation turn: a conversation of its own, or
    /// the next turn of the one it continues (or a fork of it: `from`'s
    /// flag).
    fn turn_of(
        &mut self,
        id: AgentId,
        tenant: &Arc<str>,
        from: Option<(Continued, bool)>,
        inherited: Inherited,
        prompt: &Arc<str>,
        now: SystemTime,
    ) -> Option<Arc<Continuation>> {
        let Some((from, fork)) = from else {
            self.conversations
                .begin(id, tenant.clone(), inherited, prompt.clone(), now);
            return None;
        };
        let (conversation_id, turn) = if fork {
            let turn = self
                .conversations
                .fork(from.from, id, inherited, prompt.clone(), now);
            (id, turn)
        } else {
            let turn =
                self.conversations
                    .continue_with(from.from, id, inherited, prompt.clone(), now);
            (from.from.conversation, turn)
        };
        Some(Arc::new(Continuation {
            conversation_id,
            continues_id: from.id,
            turn,
        }))
    }

    /// Puts a new record in every index (its parent's children, the
    /// idempotency key, its lead's live set, admission order, the lead,
    /// tree and status indexes) with the slots QUEUED holds.
    fn index_new(&mut self, record: Record) -> AgentId {
        let (id, seq) = (record.view.id, record.seq);
        if let Some(pid) = record.view.parent_id {
            if let Some(p) = self.agents.get_mut(&pid) {
                p.children.push(id);
            }
        }
        if let Some(k) = record.idempotency_key().cloned() {
            self.idempotency
                .insert((record.view.tenant.clone(), record.parent_key(), k), id);
        }
        if let Some(lead) = &record.view.lead_id {
            self.lead_live
                .entry((record.view.tenant.clone(), lead.clone()))
                .or_default()
                .insert(id);
        }
        let background = record.view.background;
        self.agents.insert(id, Box::new(record));
        let rec = &self.agents[&id];
        self.order.insert(&rec.view.tenant, seq, id);
        if let Some(lead) = &rec.view.lead_id {
            self.by_lead.insert(&rec.view.tenant, lead, seq, id);
        }
        self.by_root.insert((rec.view.root_id, seq), id);
        self.by_status
            .moved(&rec.view.tenant, seq, id, None, AgentStatus::Queued);
        // A new agent enters in QUEUED; account for the slots QUEUED holds.
        self.acquire(id, Held::of(AgentStatus::Queued, background));
        let rec = &self.agents[&id];
        self.stats.spawned(&rec.view.tenant, &rec.view.bucket);
        id
    }

    /// Starts a new agent when its limits have room, else queues it (with
    /// a QUEUED event); then starts whatever else may start.
    fn place_new(&mut self, id: AgentId) {
        let mut dirty = Dirty::default();
        if self.can_start(&self.agents[&id]) {
            self.start(id, &mut dirty);
        } else {
            let rec = &self.agents[&id];
            self.queue.push(rec.seq, id, rec.sub_key());
            self.publish(id, EventKind::Queued);
        }
        self.drain(dirty);
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

    /// Fills in what a continuation of `from` inherits and the request
    /// leaves unset: agent type, model, labels (merged, the request's win),
    /// lead, and the parent while it is live. Refuses an agent whose
    /// conversation is not retained (or of another tenant) and a live one.
    fn inherit(
        &self,
        tenant: &Arc<str>,
        from: AgentId,
        spec: &mut SpawnSpec,
        now: SystemTime,
    ) -> Result<Continued, Error> {
        let found = self
            .conversations
            .continuable(tenant, from, true)
            .map_err(|refusal| self.refusal(tenant, from, refusal, now))?;
        let inherited = &found.inherited;
        if spec.agent.is_empty() {
            spec.agent = inherited.agent.to_string();
        }
        if spec.model.is_empty() {
            spec.model = inherited.model.to_string();
        }
        for (k, v) in inherited.labels.iter() {
            spec.labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if spec.parent_id.is_none() {
            // A parent that has ended (or is forgotten) is replaced by none:
            // the continuation is a root agent under the same lead.
            spec.parent_id = inherited.parent_id.filter(|p| {
                self.agents
                    .get(p)
                    .is_some_and(|r| r.view.tenant == *tenant && !r.view.status.is_terminal())
            });
        }
        if spec.lead_id.is_none() {
            spec.lead_id = inherited.lead_id.as_deref().map(str::to_owned);
        }
        Ok(Continued {
            id: from,
            from: found.from,
            agent: inherited.agent.clone(),
        })
    }

    /// The refusals that come after the idempotency lookup: not the latest
    /// turn (without `fork`), and an agent type that takes no history.
    fn check_continuable(
        &self,
        tenant: &str,
        from: &Continued,
        spec: &SpawnSpec,
    ) -> Result<(), Error> {
        if !spec.fork {
            self.conversations
                .continuable(tenant, from.id, false)
                .map_err(|refusal| self.refusal(tenant, from.id, refusal, SystemTime::now()))?;
        }
        for name in [&*from.agent, spec.agent.as_str()] {
            if self.agent_types.get(name).is_some_and(|t| !t.continuable()) {
                return Err(Error::NotResumable {
                    id: from.id,
                    agent_type: name.to_owned(),
                });
            }
        }
        Ok(())
    }

    fn refusal(&self, tenant: &str, id: AgentId, refusal: Refusal, now: SystemTime) -> Error {
        match refusal {
            Refusal::Expired => {
                // Another tenant's agent is answered like an unknown id.
                let retained = self
                    .agents
                    .get(&id)
                    .is_some_and(|r| *r.view.tenant == *tenant);
                self.expired_or_unknown("continue_from", id, retained, now)
            }
            Refusal::Busy(_) => Error::AgentBusy {
                id,
                status: self
                    .agents
                    .get(&id)
                    .map_or(AgentStatus::Running, |r| r.view.status),
            },
            Refusal::NotLatest { latest } => Error::NotLatest {
                id,
                conversation_id: self.conversations.place(id).map_or(id, |p| p.conversation),
                latest,
            },
        }
    }

    /// An id whose conversation is not found: CONVERSATION_EXPIRED when it
    /// may have existed and expired — its record is still retained, or its
    /// (time-ordered) id is older than the conversation retention — else
    /// not found like any unknown id.
    pub(super) fn expired_or_unknown(
        &self,
        field: &'static str,
        id: AgentId,
        retained: bool,
        now: SystemTime,
    ) -> Error {
        let old = id.get_timestamp().is_some_and(|ts| {
            let (secs, nanos) = ts.to_unix();
            let created = SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
            created + self.conversations.retention() <= now
        });
        if retained || old {
            Error::ConversationExpired { field, id }
        } else {
            Error::NotFound {
                field,
                id: id.to_string(),
            }
        }
    }

    fn check_spec(&self, spec: &SpawnSpec) -> Result<(), Error> {
        let mut violations = Vec::new();
        let Some(agent_type) = self.agent_types.get(&spec.agent) else {
            return Err(Error::UnknownAgentType {
                name: spec.agent.clone(),
                known: self.agent_types.keys().cloned().collect(),
            });
        };
        // A worker type's workspace is in the worker's config, which the
        // server does not see: the worker checks.
        if spec.workspace_base.is_some()
            && agent_type.workspace == WorkspaceKind::None
            && agent_type.runner != RunnerKind::Worker
        {
            violations.push(FieldViolation::new(
                "workspace_base",
                format!(
                    "agent type \"{}\" has no workspace ([agents.{}] workspace = \"none\")",
                    spec.agent, spec.agent
                ),
            ));
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

    /// Takes one token of `tenant`'s spawn bucket, refilled at
    /// `spawn_rate` per second up to its burst; RATE_LIMITED when empty.
    fn take_spawn_token(
        &mut self,
        tenant: &Arc<str>,
        own: crate::config::TenantLimits,
    ) -> Result<(), Error> {
        let now = tokio::time::Instant::now();
        let burst = own.burst();
        let (tokens, at) = self
            .spawn_tokens
            .entry(tenant.clone())
            .or_insert((burst, now));
        let refilled =
            (*tokens + now.duration_since(*at).as_secs_f64() * own.spawn_rate).min(burst);
        *at = now;
        if refilled >= 1.0 {
            *tokens = refilled - 1.0;
            Ok(())
        } else {
            *tokens = refilled;
            Err(Error::RateLimited {
                tenant: tenant.clone(),
                rate: own.spawn_rate.to_string(),
                burst: burst as u32,
                retry_after: std::time::Duration::from_secs_f64((1.0 - refilled) / own.spawn_rate),
            })
        }
    }

    /// Takes the slots in `held` for a record (used when it first enters).
    pub(super) fn acquire(&mut self, id: AgentId, held: Held) {
        let rec = &self.agents[&id];
        let (bucket, parent, root) = (rec.view.bucket.clone(), rec.parent_key(), rec.view.root_id);
        if held.global {
            self.live_background += 1;
            *self.tenant_live.entry(rec.view.tenant.clone()).or_default() += 1;
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
    pub(super) fn release(&mut self, id: AgentId, held: Held, dirty: &mut Dirty) {
        let rec = &self.agents[&id];
        let (bucket, parent, root) = (rec.view.bucket.clone(), rec.parent_key(), rec.view.root_id);
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
            let tenant = rec.view.tenant.clone();
            dec(&mut self.tenant_live, &tenant);
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

    /// QUEUED (or AWAITING_APPROVAL) → RUNNING, creating the run's controls
    /// on first start.
    pub(super) fn start(&mut self, id: AgentId, dirty: &mut Dirty) {
        let rec = self.agents.get_mut(&id).expect("known agent");
        // A worker type takes a slot of the serving worker with the most
        // free capacity. Admission checked there is one; the agent leaves
        // the queue under its key *before* the assignment changes that key
        // (the removal in `transition` then finds nothing to do).
        if let Some(key) = rec.needs_worker() {
            let Some(worker) = self.workers.pick(&key) else {
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
            self.stats
                .first_start(&rec.view.tenant, &rec.view.bucket, waited);
        }
        let first_start = rec.run.is_none();
        let steer_rx = if first_start {
            // A retry's attempt was counted when it was queued again.
            if !rec.view.has_current_attempt() {
                rec.view.attempt += 1;
            }
            if let Some(attempts) = rec.view.attempts.as_mut() {
                Arc::make_mut(attempts).current_started_at = Some(now);
            }
            let (control, rx) = RunControl::fresh();
            rec.run = Some(control);
            Some(rx)
        } else {
            None
        };
        let on_worker = rec
            .view
            .worker_id
            .filter(|_| rec.runner == RunnerKind::Worker);
        // Steer messages that waited: a worker gets them in its assignment
        // (or after the approval decision), an in-process run in its inbox.
        let mut waiting_steers = rec.take_steer_buffer();
        let run = rec.run.as_ref().expect("run controls exist");
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
            let rec = &self.agents[&id];
            // Kept until the agent ends: a retried run needs it again.
            let prompt = rec.prompt.clone().unwrap_or_else(|| "".into());
            let trace = rec.trace_context();
            let history = rec
                .view
                .continuation
                .as_ref()
                .and_then(|_| self.conversations.history(id))
                .map(Arc::new);
            // A continuation starts its worktree where the agent it
            // continues left its own (a lookup only for continuations).
            let continues_workspace = rec
                .view
                .continuation
                .as_ref()
                .and_then(|c| self.agents.get(&c.continues_id))
                .and_then(|continued| continued.view.workspace.clone());
            let workspace_base = rec.workspace_base().cloned();
            if let Some(worker) = on_worker {
                self.workers.send(
                    worker,
                    WorkerCommand::Assign(Box::new(Assignment {
                        agent: rec.view.clone(),
                        prompt: prompt.clone(),
                        steer_messages: waiting_steers,
                        deadline: now + rec.timeout(),
                        trace,
                        history: history.clone(),
                        workspace_base: workspace_base.clone(),
                        continues_workspace: continues_workspace.clone(),
                    })),
                );
            }
            let start = RunStart {
                agent: rec.view.clone(),
                runner: rec.runner,
                prompt,
                steer,
                cancel,
                timeout: rec.timeout(),
                agent_type: self.agent_types.get(&*rec.view.agent).cloned(),
                trace,
                progress: rec
                    .run
                    .as_ref()
                    .map(|r| r.progress.clone())
                    .expect("run controls exist"),
                stale_timeout: self.runs.stale_timeout,
                history,
                workspace_base,
                continues_workspace,
            };
            self.starts.push(start);
        }
    }

    /// Starts queued agents while limits freed by `dirty` have room, earliest
    /// admission first.
    pub(super) fn drain(&mut self, dirty: Dirty) {
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
}

/// The agent a continuation continues: its id, its place, its type.
#[derive(Debug)]
struct Continued {
    id: AgentId,
    from: Place,
    agent: Arc<str>,
}

/// Where an admitted agent sits in its tree.
struct Placement {
    /// None for a root (its own id).
    root_id: Option<AgentId>,
    lead_id: Option<Arc<str>>,
    depth: u32,
}
