//! WatchAgents subscriptions through the handle, the one owner of what a
//! watcher is sent: the initial events, live events once they are durable
//! and only those the subscription's filter matches, the position a
//! client resumes after, and the unsubscribe (and the tenant's watcher
//! count) on drop.

use std::sync::Arc;

use super::Scheduler;
use crate::scheduler::{
    error::Error,
    events::{Event, Live, Received},
    types::{AgentFilter, WatchQuery},
};

impl Scheduler {
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
                filter: query.filter.clone(),
                resume_after: sub.position,
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
                filter: query.filter.clone(),
                resume_after: sub.position,
            },
            position: sub.position,
            ticket,
        })
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
    /// What the subscriber asked for: a live event it does not match is
    /// seen (a resume starts after it) but not yielded.
    filter: AgentFilter,
    /// The sequence a client resumes after if cut off now.
    resume_after: u64,
}

impl WatchLive {
    /// Returns once the change numbered `ticket` (the subscription's own:
    /// a snapshot draws sequence numbers) is durable; at once without a
    /// store.
    pub async fn initial_durable(&self, ticket: u64) -> Result<(), Error> {
        self.scheduler.durable(ticket).await
    }

    /// A received live event once it is durable (a watcher never sees
    /// what a crash could take back), when the subscription's filter
    /// matches it; None for one it does not. `STORE_FAILED` when the store
    /// failed first.
    pub async fn settle(&mut self, event: Arc<Event>) -> Result<Option<Arc<Event>>, Error> {
        if let Some(d) = self.scheduler.durability() {
            if d.wait_sequence(event.sequence).await.is_err() {
                return Err(Error::StoreFailed);
            }
        }
        // Seen, matching or not: a resume starts after it.
        self.resume_after = event.sequence;
        Ok(self.filter.matches(&event.agent).then_some(event))
    }

    /// The sequence a client should resume after if cut off now.
    pub fn resume_after(&self) -> u64 {
        self.resume_after
    }

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
