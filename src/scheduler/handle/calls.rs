//! The calls the API makes: Spawn (background and foreground), Status,
//! transcripts, listings, Await, Cancel, Approve, Steer — each answered
//! once what it shows is durable.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::Notify;
use uuid::Uuid;

use super::{Scheduler, Starting};
use crate::config::AgentTypeConfig;
use crate::scheduler::{
    conversation,
    core::{Core, Page, SteerDelivery},
    error::Error,
    types::{AgentFilter, AgentId, AgentView, ApprovalOutcome, InboxOf, Scope, SpawnSpec},
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

impl Scheduler {
    /// The configured agent types, by name, as of now (a reload changes
    /// them).
    pub fn agent_types(&self) -> Vec<(String, Arc<AgentTypeConfig>)> {
        self.inspect(Core::agent_types)
    }

    /// Whether `spec` repeats an admitted Spawn (see [`Core::is_retry`]).
    pub fn is_retry(&self, spec: &SpawnSpec) -> bool {
        self.inspect(|c| c.is_retry(spec))
    }

    /// The agent type `name` as configured now.
    pub fn agent_type(&self, name: &str) -> Option<Arc<AgentTypeConfig>> {
        self.inspect(|c| c.agent_type(name))
    }

    /// Admits an agent and returns at once (RUNNING or QUEUED; for a
    /// foreground spec it is already running).
    pub async fn spawn(&self, spec: SpawnSpec) -> Result<AgentView, Error> {
        let (spawned, ticket) =
            self.with_core_starting(|c| c.spawn(spec, SystemTime::now()), Starting::PolledFirst);
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
    /// Waits on an inbox (see [`Core::read_inbox`]): `tenant`'s lead's root
    /// agents or a parent's children visible in `scope`. ANY returns once
    /// one of them is settled and uncollected, ALL once none is live, or
    /// when `timeout` passes; either way with the settled uncollected ones,
    /// collected when `collect`, and whether it timed out. Returns once what
    /// it shows (a collect included) is durable; leaves no waiter behind.
    pub async fn await_inbox(
        &self,
        scope: &Scope,
        tenant: &str,
        of: &InboxOf,
        timeout: Duration,
        mode: AwaitMode,
        collect: bool,
    ) -> Result<(Vec<AgentView>, bool), Error> {
        let notify = Arc::new(Notify::new());
        let _guard = InboxWaiterGuard {
            scheduler: self,
            tenant,
            of,
            notify: &notify,
        };
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        let done = |read: &crate::scheduler::InboxRead| match mode {
            AwaitMode::All => read.live == 0,
            AwaitMode::Any => !read.settled.is_empty(),
        };
        loop {
            let (read, ticket) = self.with_core_ticket(|c| -> Result<_, Error> {
                // Register before reading, under the same lock: a settle
                // after this read wakes the loop.
                c.add_inbox_waiter(tenant, of, &notify);
                let mut read = c.read_inbox(scope, tenant, of)?;
                if done(&read) && collect {
                    c.collect(&mut read.settled, SystemTime::now());
                }
                Ok(read)
            });
            let read = read?;
            if done(&read) {
                self.durable(ticket).await?;
                return Ok((read.settled, false));
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
                    let (read, ticket) = self.with_core_ticket(|c| -> Result<_, Error> {
                        let mut read = c.read_inbox(scope, tenant, of)?;
                        if collect {
                            c.collect(&mut read.settled, SystemTime::now());
                        }
                        Ok(read)
                    });
                    let read = read?;
                    self.durable(ticket).await?;
                    let timed_out = !done(&read);
                    return Ok((read.settled, timed_out));
                }
            }
        }
    }
    /// Marks the terminal agents of `views` (as an Await returned them)
    /// collected; returns once durable.
    pub async fn collect(&self, views: &mut [AgentView]) -> Result<(), Error> {
        let ((), ticket) = self.with_core_ticket(|c| c.collect(views, SystemTime::now()));
        self.durable(ticket).await
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
}

/// Removes an inbox Await's waiter when the Await ends, however it ends.
struct InboxWaiterGuard<'a> {
    scheduler: &'a Scheduler,
    tenant: &'a str,
    of: &'a InboxOf,
    notify: &'a Arc<Notify>,
}

impl Drop for InboxWaiterGuard<'_> {
    fn drop(&mut self) {
        self.scheduler
            .with_core(|c| c.remove_inbox_waiter(self.tenant, self.of, self.notify));
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
