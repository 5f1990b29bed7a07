//! The scheduler's handle: the cheap, cloneable [`Scheduler`] the API
//! uses. It locks the core for one method call at a time (never across an
//! `.await`), then starts the runs the core admitted. Its methods live in
//! one `impl Scheduler` per file below, by concern, as `core/` does.

pub mod calls;
mod driver;
mod lifecycle;
mod reports;
#[cfg(test)]
mod tests;
pub mod watch;
mod workers;

use std::{
    collections::HashMap,
    future::Future,
    panic::AssertUnwindSafe,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::SystemTime,
};

use parking_lot::Mutex;

use super::{
    core::{self as core_mod, Core},
    durability::{ChangeSource, Durability},
    durable::ChangeSet,
    error::Error,
    run::Runner,
    trace::{self, SpanSink},
    types::RunCredentials,
};
use crate::config::{Config, RunnerKind};

struct Shared {
    core: Mutex<Core>,
    runners: HashMap<RunnerKind, Arc<dyn Runner>>,
    /// Set when a store keeps the core's changes: answers, watch events and
    /// run starts then wait until what they depend on is durable.
    durability: std::sync::OnceLock<Durability>,
    /// Set when calls need a credential: each in-process run gets one.
    run_credentials: std::sync::OnceLock<Arc<dyn RunCredentials>>,
}

/// How [`Scheduler::with_core_starting`] starts the runs the core admitted
/// (without a store; with one they wait in a task for durability).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Starting {
    /// Each in a task of its own.
    Spawned,
    /// Each polled once by the caller first, and given a task only if it
    /// is still pending: a run that ends at its first poll (the simulated
    /// runner's, a refusal) costs no task. Only for callers that are not
    /// a run themselves: a run that ends starts the next queued ones, and
    /// polling them inline would nest one run in another.
    PolledFirst,
}

/// The core as the store's writer sees it.
struct CoreChanges(Arc<Shared>);

impl ChangeSource for CoreChanges {
    fn take_changes(&self) -> (ChangeSet, u64) {
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
    /// A scheduler for `config` that executes in-process runs with
    /// `runners` (the built-in ones in a server, fakes in tests).
    pub fn new(config: &Config, runners: HashMap<RunnerKind, Arc<dyn Runner>>) -> Self {
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
        self.with_core_starting(f, Starting::Spawned)
    }
    /// [`Scheduler::with_core_ticket`], starting the runs as `starting`
    /// says.
    fn with_core_starting<R>(
        &self,
        f: impl FnOnce(&mut Core) -> R,
        starting: Starting,
    ) -> (R, u64) {
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
                    let run = self.clone().drive(start);
                    match starting {
                        Starting::Spawned => {
                            tokio::spawn(run);
                        }
                        Starting::PolledFirst => {
                            // Boxed before its first poll, so the task gets
                            // it where it was pinned.
                            let mut run = Box::pin(run);
                            let mut cx = Context::from_waker(Waker::noop());
                            // A panic outside the runner's own guard ends
                            // the run here as it would end its task, not
                            // the Spawn that admitted it.
                            let polled = std::panic::catch_unwind(AssertUnwindSafe(|| {
                                run.as_mut().poll(&mut cx)
                            }));
                            match polled {
                                // The task polls it again at once, and that
                                // poll registers the task's waker wherever
                                // the first one waits.
                                Ok(Poll::Pending) => {
                                    tokio::spawn(run);
                                }
                                Ok(Poll::Ready(())) => {}
                                Err(_) => tracing::error!("a run's first poll panicked"),
                            }
                        }
                    }
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
    pub fn set_span_sink(&self, sink: Option<Arc<dyn SpanSink>>) {
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
}

/// The lifecycle log line of each ended agent, and the span of each ended
/// recorded run; done after the core's lock is released (writing a log
/// line or building a span under it would stall every other caller).
fn report_ended(ended: Vec<trace::EndedRun>, sink: Option<&dyn SpanSink>) {
    for run in ended {
        let a = &run.agent;
        let span_id = run
            .trace
            .as_ref()
            .map(|t| format!("{:016x}", t.context.span_id));
        let ran_ms = a.elapsed(SystemTime::now()).as_millis() as u64;
        let (code, message) = a.error.as_ref().map(|e| (&*e.code, &*e.message)).unzip();
        tracing::info!(
            target: core_mod::LIFECYCLE,
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
