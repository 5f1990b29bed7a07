//! The closed-loop load driver: `concurrency` tasks, each sending its next
//! request as soon as the previous answer arrives, spread over a few HTTP/2
//! connections, for a fixed time.
//!
//! Every latency goes into an HDR histogram (µs), and every answer is
//! classified: OK, the gRPC status code it carried, or `BAD_RESPONSE` when it
//! was OK but not what the request must produce. An error is never mistaken
//! for a fast success.

pub mod watchers;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Largest latency the histograms resolve (60 s, in µs); longer ones are
/// recorded as 60 s.
const HISTOGRAM_MAX_MICROS: u64 = 60_000_000;
/// Significant digits of the histograms: 0.1 % resolution.
const HISTOGRAM_SIGFIGS: u8 = 3;

/// Canonical names of gRPC status codes 0..=16, as the gRPC spec spells them.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];
/// Name of an OK answer whose body is wrong (e.g. a foreground spawn that is
/// not DONE).
pub const BAD_RESPONSE: &str = "BAD_RESPONSE";

/// The canonical name of a status code.
pub fn code_name(code: tonic::Code) -> &'static str {
    CODE_NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

/// What one task sends, over and over.
#[derive(Debug, Clone)]
pub enum Workload {
    /// Spawn. A background spawn must come back QUEUED, RUNNING or DONE; a
    /// foreground one DONE (the prompt finishes at once).
    Spawn(pb::SpawnRequest),
    /// Spawn as [`Workload::Spawn`], each call carrying `authorization`.
    KeyedSpawn {
        /// The request.
        request: pb::SpawnRequest,
        /// The `authorization` header's value.
        authorization: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    },
    /// Status by ids: must return exactly those agents.
    Status(pb::StatusRequest),
    /// Background Spawn under the leads of `leads`, round-robin; each
    /// accepted Spawn is counted for its lead.
    SpawnRoundRobin {
        /// The request (its `lead_id` is replaced).
        request: pb::SpawnRequest,
        /// Lead names and counters.
        leads: Arc<LeadTally>,
    },
}

/// Leads of the round-robin load, and the Spawns each one got accepted.
#[derive(Debug)]
pub struct LeadTally {
    next: std::sync::atomic::AtomicUsize,
    /// Lead names, `bench-lead-<i>`.
    pub names: Vec<String>,
    /// Accepted Spawns per lead, by index.
    pub spawned: Vec<std::sync::atomic::AtomicU64>,
}

impl LeadTally {
    /// `count` leads.
    pub fn new(count: usize) -> Self {
        Self {
            next: Default::default(),
            names: (0..count).map(|i| format!("bench-lead-{i}")).collect(),
            spawned: (0..count).map(|_| Default::default()).collect(),
        }
    }
}

/// The bench's Spawn: agent `simulated`, model `bench/m`, prompt `hi` (no
/// directives, so the run finishes at once with result `hi`).
pub fn spawn_request(background: bool) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: "simulated".to_owned(),
        model: "bench/m".to_owned(),
        prompt: "hi".to_owned(),
        background,
        ..Default::default()
    }
}

/// How one call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// OK with the expected body.
    Ok,
    /// A non-OK status.
    Error(tonic::Code),
    /// OK, but the body is not what the request must produce.
    BadResponse,
}

/// Sends one request of `workload` and classifies the answer.
pub async fn call(client: &mut AgentServiceClient<Channel>, workload: &Workload) -> Outcome {
    use std::sync::atomic::Ordering::Relaxed;
    match workload {
        Workload::SpawnRoundRobin { request, leads } => {
            let lead = leads.next.fetch_add(1, Relaxed) % leads.names.len();
            let request = pb::SpawnRequest {
                lead_id: leads.names[lead].clone(),
                ..request.clone()
            };
            let outcome = Box::pin(call(client, &Workload::Spawn(request))).await;
            if outcome == Outcome::Ok {
                leads.spawned[lead].fetch_add(1, Relaxed);
            }
            outcome
        }
        Workload::KeyedSpawn {
            request,
            authorization,
        } => {
            let mut keyed = tonic::Request::new(request.clone());
            keyed
                .metadata_mut()
                .insert("authorization", authorization.clone());
            spawned(request, client.spawn(keyed).await)
        }
        Workload::Spawn(request) => spawned(request, client.spawn(request.clone()).await),
        Workload::Status(request) => match client.status(request.clone()).await {
            Ok(response) => {
                let agents = response.into_inner().agents;
                let ids_match = agents.len() == request.ids.len()
                    && agents.iter().zip(&request.ids).all(|(a, id)| &a.id == id);
                if ids_match {
                    Outcome::Ok
                } else {
                    Outcome::BadResponse
                }
            }
            Err(status) => Outcome::Error(status.code()),
        },
    }
}

/// Classifies the answer to a Spawn of `request`.
fn spawned(
    request: &pb::SpawnRequest,
    answer: Result<tonic::Response<pb::SpawnResponse>, tonic::Status>,
) -> Outcome {
    match answer {
        Ok(response) => {
            let status = response.into_inner().agent.map(|a| a.status());
            let expected = if request.background {
                matches!(
                    status,
                    Some(
                        pb::AgentStatus::Queued | pb::AgentStatus::Running | pb::AgentStatus::Done
                    )
                )
            } else {
                status == Some(pb::AgentStatus::Done)
            };
            if expected {
                Outcome::Ok
            } else {
                Outcome::BadResponse
            }
        }
        Err(status) => Outcome::Error(status.code()),
    }
}

/// Answers counted by outcome: a fixed array in the hot loop, names only
/// when reported.
#[derive(Debug, Clone, Default)]
pub struct OutcomeCounts {
    /// Index = status code; index 17 = [`BAD_RESPONSE`].
    counts: [u64; 18],
}

impl OutcomeCounts {
    /// Counts one answer.
    pub fn add(&mut self, outcome: Outcome) {
        let index = match outcome {
            Outcome::Ok => 0,
            Outcome::Error(code) => (code as usize).min(16),
            Outcome::BadResponse => 17,
        };
        self.counts[index] += 1;
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
    }

    /// Answers that were OK with the expected body.
    pub fn ok(&self) -> u64 {
        self.counts[0]
    }

    /// Every answer that was not OK with the expected body, by name.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.counts
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| {
                let name = CODE_NAMES.get(i).copied().unwrap_or(BAD_RESPONSE);
                (name.to_owned(), n)
            })
            .collect()
    }
}

/// An empty latency histogram (µs).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_MICROS, HISTOGRAM_SIGFIGS)
        .expect("constant histogram bounds are valid")
}

/// Records `elapsed` in µs (at least 1, at most the histogram's top).
pub fn record(histogram: &mut Histogram<u64>, elapsed: Duration) {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    histogram.saturating_record(micros.max(1));
}

/// Timing of one load run.
#[derive(Debug, Clone, Copy)]
pub struct LoadPlan {
    /// In-flight requests.
    pub concurrency: usize,
    /// Untimed load first.
    pub warmup: Duration,
    /// Timed load.
    pub duration: Duration,
}

/// What one timed run measured.
#[derive(Debug)]
pub struct LoadResult {
    /// Latencies of the timed requests, µs.
    pub histogram: Histogram<u64>,
    /// Outcomes of the timed requests.
    pub timed: OutcomeCounts,
    /// Outcomes during warm-up (only its errors are reported).
    pub warmup: OutcomeCounts,
    /// From the start of the timed phase to the last timed answer.
    pub elapsed: Duration,
}

impl LoadResult {
    /// Timed requests answered (any outcome).
    pub fn requests(&self) -> u64 {
        self.histogram.len()
    }

    /// Answers per second in the timed phase.
    pub fn requests_per_second(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Errors of warm-up and timed phase together: every non-OK answer the
    /// run saw.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        let mut all = self.timed.clone();
        all.merge(&self.warmup);
        all.errors()
    }
}

/// A load run in progress. The caller samples server counters at
/// [`RunningLoad::timed_start`] and again after [`RunningLoad::finish`].
#[derive(Debug)]
pub struct RunningLoad {
    timed_start: Instant,
    tasks: Vec<JoinHandle<TaskResult>>,
}

#[derive(Debug)]
struct TaskResult {
    histogram: Histogram<u64>,
    timed: OutcomeCounts,
    warmup: OutcomeCounts,
    last_answer: Option<Instant>,
}

/// Starts `plan.concurrency` tasks; task `i` uses connection `i % n`. A
/// request belongs to the timed phase if it was *sent* inside it; requests
/// in flight at the end are awaited and counted.
pub fn start(channels: &[Channel], workload: Workload, plan: LoadPlan) -> RunningLoad {
    assert!(!channels.is_empty(), "at least one connection");
    let workload = Arc::new(workload);
    let timed_start = Instant::now() + plan.warmup;
    let end = timed_start + plan.duration;
    let tasks = (0..plan.concurrency)
        .map(|i| {
            let mut client = AgentServiceClient::new(channels[i % channels.len()].clone());
            let workload = workload.clone();
            tokio::spawn(async move {
                let mut result = TaskResult {
                    histogram: new_histogram(),
                    timed: OutcomeCounts::default(),
                    warmup: OutcomeCounts::default(),
                    last_answer: None,
                };
                loop {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    let outcome = call(&mut client, &workload).await;
                    let answered = Instant::now();
                    if sent < timed_start {
                        result.warmup.add(outcome);
                    } else {
                        record(&mut result.histogram, answered - sent);
                        result.timed.add(outcome);
                        result.last_answer = Some(answered);
                    }
                }
                result
            })
        })
        .collect();
    RunningLoad { timed_start, tasks }
}

impl RunningLoad {
    /// When the timed phase starts.
    pub fn timed_start(&self) -> Instant {
        self.timed_start
    }

    /// Waits for every task and merges their results.
    pub async fn finish(self) -> anyhow::Result<LoadResult> {
        let mut merged = LoadResult {
            histogram: new_histogram(),
            timed: OutcomeCounts::default(),
            warmup: OutcomeCounts::default(),
            elapsed: Duration::ZERO,
        };
        let mut last = self.timed_start;
        for task in self.tasks {
            let result = task.await?;
            merged.histogram.add(&result.histogram)?;
            merged.timed.merge(&result.timed);
            merged.warmup.merge(&result.warmup);
            last = last.max(result.last_answer.unwrap_or(last));
        }
        merged.elapsed = last - self.timed_start;
        Ok(merged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_counts_name_every_non_ok_answer() {
        let mut counts = OutcomeCounts::default();
        counts.add(Outcome::Ok);
        counts.add(Outcome::Error(tonic::Code::Unavailable));
        counts.add(Outcome::Error(tonic::Code::Unavailable));
        counts.add(Outcome::BadResponse);
        assert_eq!(counts.counts[0], 1);
        let errors = counts.errors();
        assert_eq!(errors["UNAVAILABLE"], 2);
        assert_eq!(errors[BAD_RESPONSE], 1);
        assert_eq!(errors.len(), 2);
    }

    #[test]
    fn code_names_follow_the_numbering() {
        assert_eq!(
            code_name(tonic::Code::ResourceExhausted),
            "RESOURCE_EXHAUSTED"
        );
        assert_eq!(code_name(tonic::Code::Unauthenticated), "UNAUTHENTICATED");
    }
}
