//! WatchAgents subscribers for the bg-spawn-watched scenario.
//!
//! Each watcher is one unfiltered stream with no snapshot, read by its own
//! task as fast as the client can, on a few connections of its own (so the
//! load's connections are not shared with the event firehose). Counters are
//! per watcher, so 100 tasks do not contend on one cache line.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tokio::task::JoinHandle;
use tonic::Streaming;

use super::code_name;

/// How long [`Watchers::settle`] waits at most for streams to drain.
const SETTLE_LIMIT: Duration = Duration::from_secs(5);
/// Streams count as drained once no event arrived for this long.
const SETTLE_QUIET: Duration = Duration::from_millis(200);

#[derive(Debug, Default)]
struct Counters {
    events: AtomicU64,
    /// DONE events received.
    done: AtomicU64,
    /// Events of an agent that the watcher's filter excludes (must stay 0).
    foreign: AtomicU64,
    /// Largest lag since the last [`Watchers::take_max_lag`], µs.
    max_lag_micros: AtomicU64,
    /// How the stream ended, if it did: a status code name, or
    /// `STREAM_ENDED` when the server closed it without a status.
    ended: Mutex<Option<String>>,
}

/// Open watchers.
#[derive(Debug)]
pub struct Watchers {
    counters: Vec<Arc<Counters>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Watchers {
    /// Opens `count` watchers over `connections` connections to `addr` and
    /// returns once every stream is established (the server has subscribed
    /// it), so no event of the load that follows can be missed.
    pub async fn open(addr: SocketAddr, count: usize, connections: usize) -> anyhow::Result<Self> {
        Self::open_filtered(addr, vec![None; count], connections).await
    }

    /// Opens one watcher per lead of `leads`, each filtered to its lead.
    pub async fn open_leads(
        addr: SocketAddr,
        leads: &[String],
        connections: usize,
    ) -> anyhow::Result<Self> {
        Self::open_filtered(addr, leads.iter().cloned().map(Some).collect(), connections).await
    }

    async fn open_filtered(
        addr: SocketAddr,
        leads: Vec<Option<String>>,
        connections: usize,
    ) -> anyhow::Result<Self> {
        let count = leads.len();
        let channels = crate::servers::connect(addr, connections.min(count)).await?;
        let mut watchers = Self {
            counters: Vec::with_capacity(count),
            tasks: Vec::with_capacity(count),
        };
        for (i, lead) in leads.into_iter().enumerate() {
            let mut client = AgentServiceClient::new(channels[i % channels.len()].clone());
            let stream = client
                .watch_agents(pb::WatchAgentsRequest {
                    lead_id: lead.clone().unwrap_or_default(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let counters = Arc::new(Counters::default());
            watchers.counters.push(counters.clone());
            watchers
                .tasks
                .push(tokio::spawn(receive(stream, lead, counters)));
        }
        Ok(watchers)
    }

    /// DONE events each watcher received, in opening order.
    pub fn done_per_watcher(&self) -> Vec<u64> {
        self.counters
            .iter()
            .map(|c| c.done.load(Ordering::Relaxed))
            .collect()
    }

    /// Events received that the watcher's filter excludes (a routing bug).
    pub fn foreign_events(&self) -> u64 {
        self.counters
            .iter()
            .map(|c| c.foreign.load(Ordering::Relaxed))
            .sum()
    }

    /// Events received by all watchers so far.
    pub fn events(&self) -> u64 {
        self.counters
            .iter()
            .map(|c| c.events.load(Ordering::Relaxed))
            .sum()
    }

    /// The largest lag seen by any watcher since the previous call, and
    /// resets it.
    pub fn take_max_lag(&self) -> Duration {
        let micros = self
            .counters
            .iter()
            .map(|c| c.max_lag_micros.swap(0, Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        Duration::from_micros(micros)
    }

    /// Waits until no watcher received anything for a short while (at most
    /// a few seconds), so the lag of the last events of a run is seen.
    pub async fn settle(&self) {
        let give_up = Instant::now() + SETTLE_LIMIT;
        let mut seen = self.events();
        while Instant::now() < give_up {
            tokio::time::sleep(SETTLE_QUIET).await;
            let now = self.events();
            if now == seen {
                return;
            }
            seen = now;
        }
    }

    /// Streams that ended, by how: the status code name, or `STREAM_ENDED`.
    /// A healthy run has none while the server is up.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        let mut errors = BTreeMap::new();
        for counters in &self.counters {
            let ended = counters.ended.lock().expect("not poisoned").clone();
            if let Some(how) = ended {
                *errors.entry(how).or_insert(0) += 1;
            }
        }
        errors
    }

    /// Number of watchers.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// Stops reading and drops the streams (before the server is stopped,
    /// so its shutdown does not look like a stream failure).
    pub fn close(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

async fn receive(
    mut stream: Streaming<pb::WatchAgentsResponse>,
    lead: Option<String>,
    counters: Arc<Counters>,
) {
    let ended = loop {
        match stream.message().await {
            Ok(Some(event)) => {
                let lag = event.agent.as_ref().map_or(0, lag_micros);
                counters.events.fetch_add(1, Ordering::Relaxed);
                counters.max_lag_micros.fetch_max(lag, Ordering::Relaxed);
                if event.kind == pb::AgentEventKind::Done as i32 {
                    counters.done.fetch_add(1, Ordering::Relaxed);
                }
                let agent_lead = event.agent.as_ref().map(|a| a.lead_id.as_str());
                if lead.as_deref().is_some_and(|l| agent_lead != Some(l)) {
                    counters.foreign.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(None) => break "STREAM_ENDED".to_owned(),
            Err(status) => break code_name(status.code()).to_owned(),
        }
    };
    *counters.ended.lock().expect("not poisoned") = Some(ended);
}

/// Receive time minus the newest of the agent's `finished_at`, `started_at`
/// and `created_at`: how long after the transition the watcher learnt of
/// it. Both clocks are this machine's wall clock.
fn lag_micros(agent: &pb::Agent) -> u64 {
    let newest = [&agent.finished_at, &agent.started_at, &agent.created_at]
        .into_iter()
        .flatten()
        .filter_map(|t| SystemTime::try_from(*t).ok())
        .max();
    newest
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .map_or(0, |lag| u64::try_from(lag.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_measured_from_the_newest_timestamp() {
        let now = SystemTime::now();
        let agent = pb::Agent {
            created_at: Some((now - Duration::from_secs(60)).into()),
            started_at: Some((now - Duration::from_secs(30)).into()),
            finished_at: Some(now.into()),
            ..Default::default()
        };
        assert!(lag_micros(&agent) < 10_000_000);
        let started_only = pb::Agent {
            created_at: Some((now - Duration::from_secs(60)).into()),
            started_at: Some((now - Duration::from_secs(30)).into()),
            ..Default::default()
        };
        assert!(lag_micros(&started_only) >= 30_000_000);
    }
}
