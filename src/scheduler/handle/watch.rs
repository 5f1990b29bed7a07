//! WatchAgents subscriptions through the handle: the initial events, the
//! live receiver, and the unsubscribe (and the tenant's watcher count) on
//! drop.

use std::sync::Arc;

use super::Scheduler;
use crate::scheduler::{
    error::Error,
    events::{Event, Live, Received},
    types::WatchQuery,
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
