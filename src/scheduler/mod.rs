//! The scheduler: admission, the run lifecycle, and the events they produce.
//!
//! [`Core`] is synchronous and owns all state; [`Scheduler`] is the cheap,
//! cloneable handle the API uses. It locks the core for one method call at a
//! time (never across an `.await`), then starts the runs the core admitted.

pub mod conversation;
pub mod core;
pub mod durable;
pub mod error;
pub mod events;
pub mod inbox;
pub mod queue;
pub mod state;
pub mod stats;
pub mod trace;
pub mod types;
pub mod workers;

use std::{
    collections::HashMap,
    panic::AssertUnwindSafe,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures_util::FutureExt;
use parking_lot::Mutex;
use tokio::sync::Notify;
use uuid::Uuid;

pub use self::core::{
    Core, Inconsistent, Page, RecoveryReport, RunProgress, RunStart, SteerDelivery,
};
pub use error::{Error, FieldViolation};
pub use events::{Event, EventKind, Live, Progress, Received, SubscriberId, Subscription};
pub use types::*;
pub use workers::{
    Assignment, HeldRun, ReportNumber, WorkerCommand, WorkerEvent, WorkerId, WorkerInfo,
};

use crate::{
    config::{Config, RunnerKind},
    runner::{Run, Runner},
    store::writer::{ChangeSource, Durability},
};

/// Whether Await waits for every agent or for the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AwaitMode {
    /// Every agent settled.
    #[default]
    All,
    /// At least one agent settled.
    Any,
}

/// Error code of a run whose runner panicked.
pub const CODE_RUNNER_CRASHED: &str = "RUNNER_CRASHED";

struct Shared {
    core: Mutex<Core>,
    runners: HashMap<RunnerKind, Arc<dyn Runner>>,
    /// Set when a store keeps the core's changes: answers, watch events and
    /// run starts then wait until what they depend on is durable.
    durability: std::sync::OnceLock<Durability>,
    /// Set when calls need a credential: each in-process run gets one.
    run_credentials: std::sync::OnceLock<Arc<dyn RunCredentials>>,
}

/// The core as the store's writer sees it.
struct CoreChanges(Arc<Shared>);

impl ChangeSource for CoreChanges {
    fn take_changes(&self) -> (durable::ChangeSet, u64) {
        self.0.core.lock().take_changes()
    }
}

/// Handle to the scheduler; clone freely.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler with the built-in runners.
    pub fn new(config: &Config) -> Self {
        Self::with_runners(config, crate::runner::builtin(None))
    }

    /// A scheduler with the given runners (tests use fakes).
    pub fn with_runners(config: &Config, runners: HashMap<RunnerKind, Arc<dyn Runner>>) -> Self {
        let mut core = Core::new(
            config.limits.clone(),
            config.runs.clone(),
            &config.watch,
            config.agents.clone(),
        );
        core.set_tenant_limits(config.tenants.clone());
        core.set_conversations(config.conversations);
        Self {
            shared: Arc::new(Shared {
                core: Mutex::new(core),
                runners,
                durability: std::sync::OnceLock::new(),
                run_credentials: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Runs `f` on the locked core, then starts the runs it admitted. The
    /// lock is released before anything is spawned.
    fn with_core<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        self.with_core_ticket(f).0
    }

    /// [`Scheduler::with_core`], also returning the ticket of the newest
    /// change, for [`Scheduler::durable`]. With a store, runs start only
    /// once the change that admitted them is durable.
    fn with_core_ticket<R>(&self, f: impl FnOnce(&mut Core) -> R) -> (R, u64) {
        let (out, starts, grace_timers, ended, sink, ticket) = {
            let mut core = self.shared.core.lock();
            let out = f(&mut core);
            let ended = core.take_ended();
            let sink = (!ended.is_empty())
                .then(|| core.span_sink().cloned())
                .flatten();
            (
                out,
                core.take_starts(),
                core.take_grace_timers(),
                ended,
                sink,
                core.ticket(),
            )
        };
        report_ended(ended, sink.as_deref());
        for (worker, agent, grace) in grace_timers {
            tokio::spawn(self.clone().release_after(worker, agent, grace));
        }
        match self.shared.durability.get() {
            None => {
                for start in starts {
                    tokio::spawn(self.clone().drive(start));
                }
            }
            Some(d) => {
                d.poke_if_behind(ticket);
                if !starts.is_empty() {
                    let (this, d) = (self.clone(), d.clone());
                    tokio::spawn(async move {
                        // A store that failed never wrote the admission:
                        // the run must not start (the server is exiting).
                        if d.wait(ticket).await.is_ok() {
                            for start in starts {
                                tokio::spawn(this.clone().drive(start));
                            }
                        }
                    });
                }
            }
        }
        (out, ticket)
    }

    /// Returns once every change up to `ticket` is durable (at once without
    /// a store); `STORE_FAILED` if the store failed first.
    async fn durable(&self, ticket: u64) -> Result<(), Error> {
        match self.shared.durability.get() {
            None => Ok(()),
            Some(d) => d.wait(ticket).await.map_err(|_| Error::StoreFailed),
        }
    }

    /// Waits until what the core holds now is durable, so a read never
    /// shows what a crash could take back.
    async fn durable_now(&self) -> Result<(), Error> {
        if self.shared.durability.get().is_none() {
            return Ok(());
        }
        let ticket = self.shared.core.lock().ticket();
        self.durable(ticket).await
    }

    /// The store's writer: takes the core's changes under its lock.
    pub fn change_source(&self) -> Arc<dyn ChangeSource> {
        Arc::new(CoreChanges(self.shared.clone()))
    }

    /// From now on answers, watch events and run starts wait for `d`
    /// (called once, before serving).
    pub fn attach_durability(&self, d: Durability) {
        self.shared.core.lock().track_changes();
        let _ = self.shared.durability.set(d);
    }

    /// Watermark of the durable event sequence (None without a store).
    pub fn durability(&self) -> Option<&Durability> {
        self.shared.durability.get()
    }

    /// Loads a store's contents into this (new) scheduler; see
    /// [`Core::restore`]. Call [`Scheduler::recover_runs`] once the writer
    /// is attached.
    pub fn restore(
        &self,
        recovered: durable::Recovered,
        watch: &crate::config::WatchConfig,
    ) -> Result<RecoveryReport, Inconsistent> {
        self.shared
            .core
            .lock()
            .restore(recovered, watch.history, watch.subscriber_buffer)
    }

    /// Decides interrupted in-process runs and starts what may start (see
    /// [`Core::recover_runs`]); worker runs nobody re-attaches within
    /// `grace` then follow the worker-lost rules.
    pub fn recover_runs(&self, report: &mut RecoveryReport, grace: Duration) {
        self.with_core(|c| c.recover_runs(report));
        if report.held_for_workers.is_empty() {
            return;
        }
        let (this, held) = (self.clone(), report.held_for_workers.clone());
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let ended = this.with_core(|c| c.reattach_grace_passed(&held));
            if ended > 0 {
                tracing::info!(ended, "worker runs not re-attached within the grace");
            }
        });
    }

    /// The server's side of a run's end, on one timer: resolves `true` when
    /// the deadline passes (the caller reports DEADLINE_EXCEEDED), or `false`
    /// once the core ended the run as stale (nothing left to report). Wakes
    /// early only when the run could be stale, and then lets the core decide.
    async fn watch(
        &self,
        id: AgentId,
        timeout: Duration,
        progress: &RunProgress,
        stale_timeout: Duration,
    ) -> bool {
        let Some(deadline) = tokio::time::Instant::now().checked_add(timeout) else {
            return std::future::pending().await;
        };
        let mut stale_due = (!stale_timeout.is_zero()).then(|| progress.last() + stale_timeout);
        loop {
            let wake = stale_due.map_or(deadline, |due| due.min(deadline));
            tokio::time::sleep_until(wake).await;
            if tokio::time::Instant::now() >= deadline {
                return true;
            }
            match self.with_core(|c| c.check_stale(id)) {
                Some(next) => stale_due = Some(next),
                None => return false,
            }
        }
    }

    /// Frees a stopped worker run's capacity once its cancel grace passed
    /// (a no-op if the worker confirmed first).
    async fn release_after(self, worker: WorkerId, agent: AgentId, grace: Duration) {
        tokio::time::sleep(grace).await;
        self.with_core(|c| c.release_worker_slot(worker, agent));
    }

    /// Mutates the core for a change that cannot start or end runs (run
    /// reports such as output).
    fn inspect_mut<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let (out, ticket) = {
            let mut core = self.shared.core.lock();
            let out = f(&mut core);
            debug_assert!(core.take_starts().is_empty() && core.take_ended().is_empty());
            (out, core.ticket())
        };
        if let Some(d) = self.shared.durability.get() {
            d.poke_if_behind(ticket);
        }
        out
    }

    /// Records a span per run into `sink` from now on (set before serving).
    pub fn set_span_sink(&self, sink: Option<Arc<dyn trace::SpanSink>>) {
        self.shared.core.lock().set_span_sink(sink);
    }

    /// Gives every in-process run started from now on a credential from
    /// `issuer` (`Run::credential`); a second call changes nothing.
    pub fn set_run_credentials(&self, issuer: Arc<dyn RunCredentials>) {
        let _ = self.shared.run_credentials.set(issuer);
    }

    /// Reads the core without starting anything.
    pub fn inspect<R>(&self, f: impl FnOnce(&Core) -> R) -> R {
        f(&self.shared.core.lock())
    }

    /// Executes one run: the runner future races the cancel token and the
    /// deadline; whatever wins is reported to the core exactly once (the
    /// core ignores reports for agents that already ended).
    async fn drive(self, start: RunStart) {
        let id = start.agent.id;
        let cancel = start.cancel.clone();
        if start.runner == RunnerKind::Worker {
            // A worker's reports reach the core directly (`worker_report`):
            // this task only keeps the run's deadline and stale watch.
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                expired = self.watch(id, start.timeout, &start.progress, start.stale_timeout) => {
                    if expired {
                        let error = deadline_error(start.timeout);
                        self.with_core(|c| c.finish(id, Err(error)));
                    }
                }
            }
            return;
        }
        let (Some(runner), Some(agent_type)) = (
            self.shared.runners.get(&start.runner).cloned(),
            start.agent_type.clone(),
        ) else {
            let error = AgentError::new(
                "RUNNER_UNAVAILABLE",
                format!(
                    "no runner of kind {:?} is available for agent type \"{}\"",
                    start.runner, start.agent.agent
                ),
            );
            self.with_core(|c| c.finish(id, Err(error)));
            return;
        };
        let timeout = start.timeout;
        let (progress, stale_timeout) = (start.progress.clone(), start.stale_timeout);
        // Lives as long as this task, which outlives the run: the token is
        // revoked on every way the run ends.
        let credential = self
            .shared
            .run_credentials
            .get()
            .and_then(|issuer| issuer.issue(&start.agent.tenant, id));
        let run = Run {
            agent: start.agent,
            prompt: start.prompt,
            steer: start.steer,
            cancel: cancel.clone(),
            reporter: RunReporter {
                id,
                sink: ReportSink::Core(self.clone()),
            },
            agent_type,
            traceparent: start.trace.traceparent().into(),
            credential: credential.as_ref().map(|c| c.token().clone()),
            history: start.history,
        };
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            expired = self.watch(id, timeout, &progress, stale_timeout) => {
                if !expired {
                    // The core already failed the run as STALE.
                    return;
                }
                Err(deadline_error(timeout))
            }
            out = AssertUnwindSafe(runner.run(run)).catch_unwind() => out.unwrap_or_else(|panic| Err(crashed(&*panic))),
        };
        self.with_core(|c| c.finish(id, outcome));
    }

    /// Lets every runner finish stopping its runs (see
    /// [`Runner::shutdown`]); call after [`Scheduler::shut_down`].
    pub async fn shutdown_runners(&self) {
        let runners: Vec<_> = self.shared.runners.values().cloned().collect();
        futures_util::future::join_all(runners.iter().map(|r| r.shutdown())).await;
    }

    /// Registers a connected worker (see [`Core::register_worker`]).
    pub fn register_worker(
        &self,
        info: WorkerInfo,
        commands: tokio::sync::mpsc::UnboundedSender<WorkerCommand>,
        held: &[HeldRun],
    ) -> WorkerId {
        self.with_core(|c| c.register_worker(info, commands, held))
    }

    /// Agent types with `runner = "worker"` in the current config.
    pub fn worker_agent_types(&self) -> Vec<String> {
        self.inspect(Core::worker_agent_types)
    }

    /// A worker is draining (see [`Core::drain_worker`]).
    pub fn drain_worker(&self, worker: WorkerId) -> bool {
        self.inspect_mut(|c| c.drain_worker(worker))
    }

    /// A worker's session ended (see [`Core::worker_lost`]).
    pub fn worker_lost(&self, worker: WorkerId) -> usize {
        self.with_core(|c| c.worker_lost(worker))
    }

    /// A worker reported on one of its runs (see [`Core::worker_report`]).
    ///
    /// A terminal report is answered with `released` once it is durable:
    /// until then the worker keeps the run, so a crash of the server that
    /// loses the report finds the run still held and the worker sends it
    /// again after the re-attach.
    pub fn worker_report(
        &self,
        worker: WorkerId,
        agent: AgentId,
        number: ReportNumber,
        event: WorkerEvent,
    ) -> bool {
        let terminal = event.is_terminal();
        let (accepted, ticket) =
            self.with_core_ticket(|c| c.worker_report(worker, agent, number, event));
        if terminal {
            let this = self.clone();
            tokio::spawn(async move {
                // A failed store stops the server: the worker keeps the run
                // for the next one.
                if this.durable(ticket).await.is_ok() {
                    this.inspect(|c| c.release_worker_run(worker, agent, number.attempt));
                }
            });
        }
        accepted
    }

    /// Admits an agent and returns at once (RUNNING or QUEUED; for a
    /// foreground spec it is already running).
    pub async fn spawn(&self, spec: SpawnSpec) -> Result<AgentView, Error> {
        let (spawned, ticket) = self.with_core_ticket(|c| c.spawn(spec, SystemTime::now()));
        let (view, _) = spawned?;
        self.durable(ticket).await?;
        Ok(view)
    }

    /// Foreground spawn: admits the agent, then waits until it settles. If
    /// the returned future is dropped first (the caller went away), the
    /// agent is cancelled; from `deadline` on (the call's deadline), the
    /// cancel says that the deadline passed.
    pub async fn spawn_foreground(
        &self,
        spec: SpawnSpec,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<AgentView, Error> {
        let (spawned, ticket) = self.with_core_ticket(|c| c.spawn(spec, SystemTime::now()));
        let (view, existing) = spawned?;
        let guard = CancelOnDrop {
            scheduler: self.clone(),
            id: view.id,
            deadline,
            // A retried foreground Spawn that found an earlier agent must not
            // cancel it when this caller leaves: the first caller owns it.
            armed: !existing,
        };
        self.durable(ticket).await?;
        let (mut agents, _) = self
            .await_agents(&Scope::All, &[view.id], None, AwaitMode::All)
            .await?;
        guard.disarm();
        Ok(agents.pop().unwrap_or(view))
    }

    /// Current views of `ids`, in order; the first id unknown in `scope`
    /// is NOT_FOUND. With a store, what they show is durable.
    pub async fn status(
        &self,
        scope: &Scope,
        ids: &[AgentId],
        field: &'static str,
    ) -> Result<Vec<AgentView>, Error> {
        let views = self.status_now(scope, ids, field)?;
        self.durable_now().await?;
        Ok(views)
    }

    /// A page of a transcript visible in `scope` (see
    /// [`Core::transcript`]), once what it shows is durable.
    pub async fn transcript(
        &self,
        scope: &Scope,
        target: conversation::TranscriptOf,
        after: usize,
        limit: usize,
    ) -> Result<conversation::TranscriptPage, Error> {
        let page =
            self.inspect(|c| c.transcript(scope, target, after, limit, SystemTime::now()))?;
        self.durable_now().await?;
        Ok(page)
    }

    fn status_now(
        &self,
        scope: &Scope,
        ids: &[AgentId],
        field: &'static str,
    ) -> Result<Vec<AgentView>, Error> {
        self.inspect(|c| {
            ids.iter()
                .map(|id| {
                    c.view_in(scope, *id).ok_or(Error::NotFound {
                        field,
                        id: id.to_string(),
                    })
                })
                .collect()
        })
    }

    /// A page of agents matching `filter` (durable, with a store).
    pub async fn list(
        &self,
        filter: &AgentFilter,
        after: u64,
        limit: usize,
    ) -> Result<Page, Error> {
        let page = self.inspect(|c| c.list(filter, after, limit));
        self.durable_now().await?;
        Ok(page)
    }

    /// Waits until all (or any) of `ids` are settled, or `timeout` passes
    /// (None = no timeout). Returns the agents in order and whether it timed
    /// out. Leaves no waiter behind however it ends.
    pub async fn await_agents(
        &self,
        scope: &Scope,
        ids: &[AgentId],
        timeout: Option<Duration>,
        mode: AwaitMode,
    ) -> Result<(Vec<AgentView>, bool), Error> {
        let notify = Arc::new(Notify::new());
        let _guard = WaiterGuard {
            scheduler: self,
            ids,
            notify: &notify,
        };
        let deadline = timeout.and_then(|t| tokio::time::Instant::now().checked_add(t));
        loop {
            let (views, done) = self.with_core(|c| -> Result<_, Error> {
                let views = ids
                    .iter()
                    .map(|id| {
                        c.view_in(scope, *id).ok_or(Error::NotFound {
                            field: "ids",
                            id: id.to_string(),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let settled = views.iter().filter(|v| v.status.is_settled()).count();
                let done = match mode {
                    AwaitMode::All => settled == views.len(),
                    AwaitMode::Any => settled > 0,
                };
                if !done {
                    for v in views.iter().filter(|v| !v.status.is_settled()) {
                        c.add_waiter(v.id, &notify);
                    }
                }
                Ok((views, done))
            })?;
            if done {
                self.durable_now().await?;
                return Ok((views, false));
            }
            let timer = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = notify.notified() => {}
                () = timer => {
                    let views = self.status(scope, ids, "ids").await?;
                    let settled = views.iter().filter(|v| v.status.is_settled()).count();
                    let done = match mode {
                        AwaitMode::All => settled == views.len(),
                        AwaitMode::Any => settled > 0,
                    };
                    return Ok((views, !done));
                }
            }
        }
    }

    /// Cancels an agent and its live descendants; returns once durable.
    pub async fn cancel(
        &self,
        scope: &Scope,
        id: AgentId,
        reason: &str,
    ) -> Result<Vec<AgentView>, Error> {
        let (cancelled, ticket) = self.with_core_ticket(|c| c.cancel(scope, id, reason));
        let cancelled = cancelled?;
        self.durable(ticket).await?;
        Ok(cancelled)
    }

    /// Cancels every live agent under `tenant`'s lead; returns once durable.
    pub async fn cancel_lead(
        &self,
        tenant: &str,
        lead: &str,
        reason: &str,
    ) -> Result<Vec<AgentView>, Error> {
        let (cancelled, ticket) = self.with_core_ticket(|c| c.cancel_lead(tenant, lead, reason));
        self.durable(ticket).await?;
        Ok(cancelled)
    }

    /// Decides an agent's pending approval (see [`Core::decide_approval`]);
    /// returns once durable.
    pub async fn approve(
        &self,
        scope: &Scope,
        id: AgentId,
        approval_id: Uuid,
        outcome: ApprovalOutcome,
    ) -> Result<AgentView, Error> {
        let (decided, ticket) =
            self.with_core_ticket(|c| c.decide_approval(scope, id, approval_id, outcome));
        let view = decided?;
        self.durable(ticket).await?;
        Ok(view)
    }

    /// Sends a steer message; returns once durable.
    pub async fn steer(
        &self,
        scope: &Scope,
        id: AgentId,
        message: String,
    ) -> Result<(AgentView, SteerDelivery), Error> {
        let (steered, ticket) = self.with_core_ticket(|c| c.steer(scope, id, message));
        let steered = steered?;
        self.durable(ticket).await?;
        Ok(steered)
    }

    /// Subscribes to lifecycle events; the subscription ends when the
    /// returned value is dropped.
    pub fn subscribe(&self, query: &WatchQuery) -> Watch {
        let (sub, ticket) = self.with_core_ticket(|c| c.subscribe(query));
        Watch {
            initial: sub.initial,
            live: WatchLive {
                live: sub.live,
                scheduler: self.clone(),
                watcher: None,
            },
            position: sub.position,
            ticket,
        }
    }

    /// A WatchAgents stream of `tenant`: [`Scheduler::subscribe`], counted
    /// against `[limits] max_watchers_per_tenant` until it is dropped.
    pub fn watch_agents(&self, query: &WatchQuery, tenant: Arc<str>) -> Result<Watch, Error> {
        let (sub, ticket) = self.with_core_ticket(|c| {
            c.admit_watcher(&tenant)?;
            Ok::<_, Error>(c.subscribe(query))
        });
        let sub = sub?;
        Ok(Watch {
            initial: sub.initial,
            live: WatchLive {
                live: sub.live,
                scheduler: self.clone(),
                watcher: Some(tenant),
            },
            position: sub.position,
            ticket,
        })
    }

    /// Stops admitting and starting agents; running ones go on (see
    /// [`Core::stop_admitting`]).
    pub fn stop_admitting(&self) {
        self.with_core(Core::stop_admitting);
    }

    /// Waits until `count` (e.g. [`Core::running_count`]) is 0, or `grace`
    /// passed. Returns whether it reached 0. Woken by lifecycle events, not
    /// a clock.
    pub async fn wait_for_runs(&self, grace: Duration, count: fn(&Core) -> u32) -> bool {
        let mut events = self.subscribe(&WatchQuery::default()).live;
        let deadline = tokio::time::Instant::now().checked_add(grace);
        loop {
            if self.inspect(count) == 0 {
                return true;
            }
            let next = events.recv();
            let received = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                    Ok(received) => received,
                    Err(_) => return false,
                },
                None => next.await,
            };
            // Lagged: some events were missed; the count above is what
            // matters, so look again.
            if let Received::Closed = received {
                return self.inspect(count) == 0;
            }
        }
    }

    /// Applies a reloaded config (limits, runs, agent types).
    pub fn reconfigure(&self, config: &Config) {
        self.with_core(|c| {
            c.set_tenant_limits(config.tenants.clone());
            c.set_conversations(config.conversations);
            c.reconfigure(
                config.limits.clone(),
                config.runs.clone(),
                config.agents.clone(),
            )
        });
    }

    /// Forgets finished agents past retention; returns how many.
    pub fn sweep(&self) -> usize {
        self.with_core(|c| c.sweep(SystemTime::now()))
    }

    /// How often [`Scheduler::sweep`] should run for the current retention.
    pub fn sweep_interval(&self) -> Duration {
        let retention = self.inspect(Core::finished_retention);
        (retention / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// See [`Core::detach_runs`].
    pub fn detach_runs(&self) -> usize {
        self.with_core(Core::detach_runs)
    }

    /// Stops admitting (every Spawn from now on is UNAVAILABLE) and cancels
    /// every live agent with `reason`, in one step under the lock, so no
    /// Spawn slips in between and nothing queued starts. Returns how many
    /// agents were cancelled.
    pub fn shut_down(&self, reason: &str) -> usize {
        self.with_core(|c| c.shut_down(reason))
    }
}

/// A subscription through the handle (see [`Scheduler::subscribe`]).
#[derive(Debug)]
pub struct Watch {
    /// Snapshot or replayed events, in sequence order.
    pub initial: Vec<Arc<Event>>,
    /// Live events published after the subscription.
    pub live: WatchLive,
    /// Newest sequence number at subscription (see [`Subscription`]).
    pub position: u64,
    /// With a store: the initial events may be sent once this ticket is
    /// durable (a snapshot draws sequence numbers).
    pub ticket: u64,
}

/// Live events of a [`Watch`]; dropping it unsubscribes.
#[derive(Debug)]
pub struct WatchLive {
    live: Live,
    scheduler: Scheduler,
    /// The tenant whose watcher count it holds (API streams only).
    watcher: Option<Arc<str>>,
}

impl WatchLive {
    /// Waits for the next event (see [`Live::recv`]).
    pub async fn recv(&mut self) -> Received {
        self.live.recv().await
    }

    /// The next event if one is ready (see [`Live::try_recv`]).
    pub fn try_recv(&mut self) -> Received {
        self.live.try_recv()
    }
}

impl Drop for WatchLive {
    fn drop(&mut self) {
        // A routed subscriber is registered in the core; a broadcast
        // receiver unsubscribes by being dropped.
        let routed = self.live.routed_id();
        if routed.is_none() && self.watcher.is_none() {
            return;
        }
        let mut core = self.scheduler.shared.core.lock();
        if let Some(id) = routed {
            core.unsubscribe(id);
        }
        if let Some(tenant) = &self.watcher {
            core.watcher_left(tenant);
        }
    }
}

/// Removes an Await's waiter from every agent when the Await ends, however
/// it ends (returned, timed out, or dropped because the client went away).
struct WaiterGuard<'a> {
    scheduler: &'a Scheduler,
    ids: &'a [AgentId],
    notify: &'a Arc<Notify>,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let mut core = self.scheduler.shared.core.lock();
        for id in self.ids {
            core.remove_waiter(*id, self.notify);
        }
    }
}

/// Cancels a foreground agent whose caller went away.
struct CancelOnDrop {
    scheduler: Scheduler,
    id: AgentId,
    deadline: Option<tokio::time::Instant>,
    armed: bool,
}

impl CancelOnDrop {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            // NotFound cannot happen for a live foreground agent; an agent
            // that ended meanwhile is simply not cancelled.
            let reason = match self.deadline {
                Some(d) if tokio::time::Instant::now() >= d => {
                    "the foreground Spawn call's deadline passed"
                }
                _ => "the foreground caller went away",
            };
            let _ = self
                .scheduler
                .with_core(|c| c.cancel(&Scope::All, self.id, reason));
        }
    }
}

/// The failure of a run whose runner panicked with `panic`.
pub fn crashed(panic: &(dyn std::any::Any + Send)) -> AgentError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    AgentError::new(CODE_RUNNER_CRASHED, format!("runner crashed: {what}"))
}

/// A run's channel back to the scheduler. Reports after the agent ended
/// are ignored.
///
/// In the server the reports go straight to the core; in a worker process
/// (`subagentd worker`) the same runners report through a [`RemoteReports`]
/// that sends them over the worker's session.
#[derive(Clone)]
pub struct RunReporter {
    id: AgentId,
    sink: ReportSink,
}

#[derive(Clone)]
enum ReportSink {
    Core(Scheduler),
    Remote(Arc<dyn RemoteReports>),
}

/// Where a run's reports go when the run executes away from the core (in
/// a worker process). Every method returns at once except
/// `request_approval`, which resolves to the decision.
pub trait RemoteReports: Send + Sync + 'static {
    /// A chunk of output; an empty one says the run is still working.
    fn output(&self, chunk: &str);
    /// A tool call.
    fn tool_call(&self, name: &str, input_digest: &str);
    /// Tokens used.
    fn usage(&self, usage: Usage);
    /// The run's own session, sent with its terminal report.
    fn session(&self, session: &str);
    /// The run starts a turn.
    fn turn_started(&self);
    /// The failure the run is about to return is a retryable provider
    /// error (sent as `RunFailed.retryable`).
    fn retryable_failure(&self);
    /// Asks for a decision and resolves to it; never resolves if the run
    /// is stopped first (the run future is dropped then).
    fn request_approval(
        &self,
        tool_name: &str,
        detail: &str,
    ) -> futures_util::future::BoxFuture<'static, ApprovalOutcome>;
}

impl std::fmt::Debug for RunReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunReporter").field("id", &self.id).finish()
    }
}

impl RunReporter {
    /// A reporter of `id`'s run that sends to `remote` (a worker process).
    pub fn remote(id: AgentId, remote: Arc<dyn RemoteReports>) -> Self {
        Self {
            id,
            sink: ReportSink::Remote(remote),
        }
    }

    /// The agent this run belongs to.
    pub fn agent_id(&self) -> AgentId {
        self.id
    }

    /// Appends a chunk of output to the agent's result (and streams it to
    /// progress watchers).
    pub fn output(&self, chunk: &str) {
        match &self.sink {
            ReportSink::Core(s) => s.inspect_mut(|c| c.append_output(self.id, chunk)),
            ReportSink::Remote(r) if !chunk.is_empty() => r.output(chunk),
            ReportSink::Remote(_) => {}
        }
    }

    /// A command run's program is about to run as process group `group`:
    /// recorded with the run, and resolves once that is durable, so a
    /// restart after a crash can stop it. Err when the store failed. A
    /// worker process records nothing: its programs are its own, and it
    /// stops them itself.
    pub async fn process_group(&self, group: durable::ProcessGroup) -> Result<(), Error> {
        let ReportSink::Core(scheduler) = &self.sink else {
            return Ok(());
        };
        let ticket = scheduler.inspect_mut(|c| {
            c.record_process_group(self.id, group);
            c.ticket()
        });
        scheduler.durable(ticket).await
    }

    /// Says the run is still working although it reports nothing (output
    /// past its cap, say), so it does not count as stale.
    pub fn still_working(&self) {
        match &self.sink {
            ReportSink::Core(s) => s.inspect_mut(|c| c.touch_progress(self.id)),
            ReportSink::Remote(r) => r.output(""),
        }
    }

    /// Reports a tool call: counted in `usage.tool_calls` and streamed to
    /// progress watchers.
    pub fn tool_call(&self, name: &str, input_digest: &str) {
        match &self.sink {
            // May trip a circuit breaker, which ends the run and frees slots.
            ReportSink::Core(s) => s.with_core(|c| c.record_tool_call(self.id, name, input_digest)),
            ReportSink::Remote(r) => r.tool_call(name, input_digest),
        }
    }

    /// The run starts a turn (one model call of its loop); see
    /// [`Core::turn_started`]. In a worker process the server decides, and
    /// sends a wrap-up as a steer and a stop as a cancel: this says Go.
    pub fn turn_started(&self) -> TurnVerdict {
        match &self.sink {
            ReportSink::Core(s) => s.with_core(|c| c.turn_started(self.id)),
            ReportSink::Remote(r) => {
                r.turn_started();
                TurnVerdict::Go
            }
        }
    }

    /// The failure this run is about to return is a provider's that
    /// another model may not have: rate limit or quota exhausted, 5xx,
    /// overloaded, unknown model, missing credentials. With the type's
    /// `fallback_models` the agent then moves to the next model instead of
    /// failing (see [`Core::finish`]).
    pub fn retryable_failure(&self) {
        match &self.sink {
            ReportSink::Core(s) => s.inspect_mut(|c| c.mark_retryable(self.id)),
            ReportSink::Remote(r) => r.retryable_failure(),
        }
    }

    /// The run's own session (an agent CLI's session id, say), handed to
    /// the run that continues this agent; the latest report wins. Empty:
    /// none.
    pub fn session(&self, session: &str) {
        match &self.sink {
            ReportSink::Core(s) => s.inspect_mut(|c| c.set_session(self.id, Some(session.into()))),
            ReportSink::Remote(r) => r.session(session),
        }
    }

    /// Adds token usage or tool calls.
    pub fn usage(&self, usage: Usage) {
        match &self.sink {
            ReportSink::Core(s) => s.inspect_mut(|c| c.add_usage(self.id, usage)),
            ReportSink::Remote(r) => r.usage(usage),
        }
    }

    /// Pauses the run in AWAITING_APPROVAL for `tool_name` and resolves
    /// to the decision once the agent runs again (after Approve, and after
    /// waiting for a slot if its limits are full).
    ///
    /// If the agent ends instead (cancel, deadline) the scheduler drops the
    /// run future, so this never resolves then.
    pub async fn request_approval(&self, tool_name: &str, detail: &str) -> ApprovalOutcome {
        let scheduler = match &self.sink {
            ReportSink::Core(s) => s,
            ReportSink::Remote(r) => return r.request_approval(tool_name, detail).await,
        };
        let pending = scheduler.with_core(|c| c.request_approval(self.id, tool_name, detail));
        match pending {
            Some((_, decision)) => match decision.await {
                Ok(outcome) => outcome,
                Err(_) => std::future::pending().await,
            },
            // Not running: the run is ending and about to be dropped.
            None => std::future::pending().await,
        }
    }
}

/// The lifecycle log line of each ended agent, and the span of each ended
/// recorded run; done after the core's lock is released (writing a log
/// line or building a span under it would stall every other caller).
fn report_ended(ended: Vec<trace::EndedRun>, sink: Option<&dyn trace::SpanSink>) {
    for run in ended {
        let a = &run.agent;
        let span_id = run
            .trace
            .as_ref()
            .map(|t| format!("{:016x}", t.context.span_id));
        let ran_ms = a.elapsed(SystemTime::now()).as_millis() as u64;
        let (code, message) = a.error.as_ref().map(|e| (&*e.code, &*e.message)).unzip();
        tracing::info!(
            target: self::core::LIFECYCLE,
            agent_id = %a.id,
            tenant = %a.tenant,
            parent_id = a.parent_id.map(tracing::field::display),
            root_id = %a.root_id,
            agent = %a.agent,
            model = %a.model,
            status = a.status.name(),
            error_code = code,
            error = message,
            ran_ms,
            trace_id = %a.trace_id,
            span_id = span_id.as_deref(),
            "agent ended"
        );
        if let (Some(sink), Some(_)) = (sink, &run.trace) {
            sink.export(run);
        }
    }
}

fn deadline_error(timeout: Duration) -> AgentError {
    AgentError::new(
        CODE_DEADLINE_EXCEEDED,
        format!(
            "run exceeded its deadline of {}",
            humantime::format_duration(timeout)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::future::BoxFuture;

    /// A runner whose run panics: the crash must end the agent and free its
    /// slots like any other terminal path.
    struct PanickingRunner;

    impl Runner for PanickingRunner {
        fn run(&self, _run: Run) -> BoxFuture<'static, crate::runner::RunOutcome> {
            Box::pin(async { panic!("runner bug") })
        }
    }

    /// Counts the runs it is given; each finishes at once.
    #[derive(Default)]
    struct CountingRunner(std::sync::atomic::AtomicUsize);

    impl Runner for CountingRunner {
        fn run(&self, _run: Run) -> BoxFuture<'static, crate::runner::RunOutcome> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Ok("ran".to_owned()) })
        }
    }

    /// A scheduler over `store`, with its writer started and attached.
    fn durable_scheduler(
        runner: Arc<CountingRunner>,
        store: impl crate::store::Store + 'static,
    ) -> (Scheduler, crate::store::writer::Writer) {
        let s = scheduler_with(runner, "");
        let writer =
            crate::store::writer::Writer::start(Box::new(store), s.change_source(), |_| {})
                .unwrap();
        s.attach_durability(writer.durability());
        (s, writer)
    }

    /// Issue 13 §3: answers wait for the commit; a run starts only after
    /// its admission is durable; a failed commit answers STORE_FAILED and
    /// starts nothing, and what was written is all the store holds.
    #[tokio::test(start_paused = true)]
    async fn a_failed_commit_answers_store_failed_and_starts_nothing() {
        use crate::store::{
            memory::{FailingStore, MemoryStore},
            Store,
        };
        let runner = Arc::new(CountingRunner::default());
        let memory = MemoryStore::new();
        let failing = FailingStore::new(memory.clone(), usize::MAX);
        let (s, _writer) = durable_scheduler(runner.clone(), failing.clone());
        let first = s.spawn(spec()).await.expect("the first commit succeeds");
        let (done, _) = s
            .await_agents(
                &crate::scheduler::Scope::All,
                &[first.id],
                // No deadline: the writer commits on its own thread, which
                // the paused clock does not see, so it would auto-advance
                // past any timeout while the commit is still in flight.
                None,
                AwaitMode::All,
            )
            .await
            .unwrap();
        assert_eq!(done[0].status, AgentStatus::Done);
        assert_eq!(runner.0.load(std::sync::atomic::Ordering::SeqCst), 1);

        failing.fail_after(0);
        let err = s.spawn(spec()).await.unwrap_err();
        assert!(matches!(err, Error::StoreFailed), "{err:?}");
        let err = s
            .status(&crate::scheduler::Scope::All, &[first.id], "ids")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::StoreFailed), "{err:?}");
        // Every task that could start the refused agent's run has run.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            runner.0.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "no run starts for a change that was not written"
        );
        let stored = memory.clone().load().unwrap().decode().unwrap();
        assert_eq!(stored.agents.len(), 1, "only the first agent was written");
        assert_eq!(stored.agents[0].view.id, first.id);
    }

    /// Issue 13 §2: a worker's terminal report is answered with
    /// `released` only once the store has it; until then the worker must
    /// keep the run (a crash would lose the report).
    #[tokio::test]
    async fn a_worker_run_is_released_only_once_its_end_is_durable() {
        use crate::store::{memory::MemoryStore, Batch, Contents, Store, StoreError};

        /// Commits into memory, holding each commit while `held` is set.
        struct Held {
            inner: MemoryStore,
            held: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
        }
        impl Store for Held {
            fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
                let (lock, cvar) = &*self.held;
                let mut held = lock.lock();
                while *held {
                    cvar.wait(&mut held);
                }
                self.inner.commit(batch)
            }
            fn load(&mut self) -> Result<Contents, StoreError> {
                self.inner.load()
            }
            fn describe(&self) -> String {
                "held".into()
            }
        }

        let s = scheduler_with(
            Arc::new(CountingRunner::default()),
            "[agents.coder]\nrunner = \"worker\"\n",
        );
        let held = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
        let store = Held {
            inner: MemoryStore::new(),
            held: held.clone(),
        };
        let writer =
            crate::store::writer::Writer::start(Box::new(store), s.change_source(), |_| {})
                .unwrap();
        s.attach_durability(writer.durability());
        let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel();
        let worker = s.register_worker(
            WorkerInfo {
                tenant: DEFAULT_TENANT.into(),
                name: "w".into(),
                agents: vec!["coder".into()],
                capacity: 1,
                labels: Default::default(),
            },
            tx,
            &[],
        );
        let agent = s
            .spawn(SpawnSpec {
                agent: "coder".into(),
                ..spec()
            })
            .await
            .unwrap();
        let Some(WorkerCommand::Assign(_)) = commands.recv().await else {
            panic!("expected the assignment");
        };

        *held.0.lock() = true;
        assert!(s.worker_report(
            worker,
            agent.id,
            ReportNumber::default(),
            WorkerEvent::Done {
                result: "ok".into(),
                session: None,
            }
        ));
        // Proving that something does not happen takes a bound.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            commands.try_recv().is_err(),
            "nothing is released while the commit is held"
        );
        *held.0.lock() = false;
        held.1.notify_all();
        match commands.recv().await {
            Some(WorkerCommand::Released { agent_id, attempt }) => {
                assert_eq!((agent_id, attempt), (agent.id, 1));
            }
            other => panic!("expected released, got {other:?}"),
        }
    }

    fn scheduler_with(runner: Arc<dyn Runner>, toml: &str) -> Scheduler {
        let config = crate::config::ConfigSource::from_toml_str(toml).unwrap();
        Scheduler::with_runners(&config, HashMap::from([(RunnerKind::Simulated, runner)]))
    }

    fn spec() -> SpawnSpec {
        SpawnSpec {
            agent: "simulated".into(),
            model: "acme/m".into(),
            prompt: "hi".into(),
            background: true,
            ..SpawnSpec::default()
        }
    }

    #[tokio::test]
    async fn a_runner_panic_fails_the_agent_and_releases_its_slots() {
        let s = scheduler_with(
            Arc::new(PanickingRunner),
            "[limits]\nmax_background_agents = 1\n",
        );
        let agent = s.spawn(spec()).await.unwrap();
        let (agents, timed_out) = s
            .await_agents(
                &crate::scheduler::Scope::All,
                &[agent.id],
                Some(Duration::from_secs(10)),
                AwaitMode::All,
            )
            .await
            .unwrap();
        assert!(!timed_out);
        assert_eq!(agents[0].status, AgentStatus::Failed);
        let error = agents[0].error.as_ref().unwrap();
        assert_eq!(&*error.code, CODE_RUNNER_CRASHED);
        assert!(error.message.contains("runner bug"), "{}", error.message);
        s.inspect(|c| assert_eq!(c.counters(), c.recount()));
        assert_eq!(s.inspect(|c| c.counters().live_background), 0);
        // The freed global slot admits the next agent.
        s.spawn(spec()).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_run_deadline_fails_the_agent_with_deadline_exceeded() {
        let s = Scheduler::new(&crate::config::ConfigSource::from_toml_str("").unwrap());
        let agent = s
            .spawn(SpawnSpec {
                prompt: "sleep 3600000".into(),
                timeout: Some(Duration::from_secs(60)),
                ..spec()
            })
            .await
            .unwrap();
        // The paused clock jumps to the deadline as soon as everything idles.
        let (agents, _) = s
            .await_agents(
                &crate::scheduler::Scope::All,
                &[agent.id],
                None,
                AwaitMode::All,
            )
            .await
            .unwrap();
        assert_eq!(agents[0].status, AgentStatus::Failed);
        assert_eq!(
            &*agents[0].error.as_ref().unwrap().code,
            CODE_DEADLINE_EXCEEDED
        );
        assert_eq!(s.inspect(|c| c.counters().live_background), 0);
    }

    fn paused_scheduler(toml: &str) -> Scheduler {
        Scheduler::new(&crate::config::ConfigSource::from_toml_str(toml).unwrap())
    }

    async fn settle(s: &Scheduler, id: AgentId) -> AgentView {
        let (mut agents, timed_out) = s
            .await_agents(&crate::scheduler::Scope::All, &[id], None, AwaitMode::All)
            .await
            .unwrap();
        assert!(!timed_out);
        agents.pop().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_that_reports_nothing_for_the_stale_timeout_fails_stale() {
        let s = paused_scheduler("[runs]\nstale_timeout = \"10m\"\n");
        let started = tokio::time::Instant::now();
        let agent = s
            .spawn(SpawnSpec {
                prompt: "output one\nsleep 3600000".into(),
                ..spec()
            })
            .await
            .unwrap();
        // The paused clock jumps ahead whenever everything idles.
        let ended = settle(&s, agent.id).await;
        assert_eq!(ended.status, AgentStatus::Failed);
        let error = ended.error.as_ref().unwrap();
        assert_eq!(&*error.code, CODE_STALE);
        assert!(error.message.contains("stale_timeout"), "{}", error.message);
        assert_eq!(&*ended.result, "one", "what it output is kept");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(600) && waited < Duration::from_secs(601),
            "stale after {waited:?}"
        );
        assert_eq!(s.inspect(|c| c.counters().live_background), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn reports_keep_a_run_fresh_and_waiting_for_approval_is_not_stale() {
        let s = paused_scheduler("[runs]\nstale_timeout = \"10m\"\n");
        // Output every 9 minutes: never 10 without a report.
        let fresh = s
            .spawn(SpawnSpec {
                prompt: "sleep 540000\noutput a\nsleep 540000\noutput b\nsleep 540000\nusage 1 1\nsleep 540000".into(),
                timeout: Some(Duration::from_secs(7200)),
                ..spec()
            })
            .await
            .unwrap();
        let paused = s
            .spawn(SpawnSpec {
                prompt: "approve shell\noutput after".into(),
                timeout: Some(Duration::from_secs(7200)),
                ..spec()
            })
            .await
            .unwrap();
        assert_eq!(settle(&s, fresh.id).await.status, AgentStatus::Done);
        // 36 minutes later the approval is still pending, not stale.
        let waiting = s
            .status(&crate::scheduler::Scope::All, &[paused.id], "id")
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(waiting.status, AgentStatus::AwaitingApproval);
        let approval = waiting.approval.as_ref().unwrap().id;
        s.approve(
            &crate::scheduler::Scope::All,
            paused.id,
            approval,
            ApprovalOutcome {
                approved: true,
                note: String::new(),
            },
        )
        .await
        .unwrap();
        assert_eq!(settle(&s, paused.id).await.status, AgentStatus::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_timeout_of_zero_is_off() {
        let s = paused_scheduler("[runs]\nstale_timeout = \"0s\"\n");
        let agent = s
            .spawn(SpawnSpec {
                prompt: "sleep 86400000".into(),
                timeout: Some(Duration::from_secs(2 * 86400)),
                ..spec()
            })
            .await
            .unwrap();
        let ended = settle(&s, agent.id).await;
        assert_eq!(ended.status, AgentStatus::Done, "{:?}", ended.error);
    }
}
