//! The result data types: everything `run` and `memory` measured, in the
//! shape of the JSON document (the text report renders the same values).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    cli::{RunArgs, Scenario},
    procfs,
};

/// Everything `run` measured.
#[derive(Debug, Serialize)]
pub struct RunReport {
    /// Cores and CPU model.
    pub machine: String,
    /// `release` or `debug` (a debug run is a smoke test, not a measurement).
    pub build: &'static str,
    /// The flags that shaped the run.
    pub settings: RunSettings,
    /// One row per scenario and concurrency.
    pub rows: Vec<Row>,
    /// The targets this run can decide.
    pub verdicts: Vec<Verdict>,
    /// Servers that failed to start or stop, setups that failed.
    pub failures: Vec<Failure>,
}

/// The flags of a `run`.
#[derive(Debug, Serialize)]
pub struct RunSettings {
    /// Timed phase per row, seconds.
    pub duration_s: f64,
    /// Warm-up per row, seconds.
    pub warmup_s: f64,
    /// HTTP/2 connections of the load.
    pub connections: usize,
    /// Watchers in bg-spawn-watched.
    pub watchers: usize,
    /// Connections the watchers share.
    pub watcher_connections: usize,
    /// Passes over the scenario list.
    pub rounds: usize,
    /// Concurrencies, in order.
    pub concurrency: Vec<usize>,
    /// Scenarios, in order.
    pub scenarios: Vec<Scenario>,
    /// `--postgres-url`, its password (if any) replaced by `***`.
    pub postgres_url: Option<String>,
}

/// Something that went wrong outside of counted answers.
#[derive(Debug, Serialize)]
pub struct Failure {
    /// The scenario it happened in, if any.
    pub scenario: Option<Scenario>,
    /// What happened.
    pub message: String,
}

impl Failure {
    /// A failure of `scenario`.
    pub fn new(scenario: Option<Scenario>, message: impl Into<String>) -> Self {
        Self {
            scenario,
            message: message.into(),
        }
    }
}

/// One scenario at one concurrency.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Which pass over the scenario list (1-based, see `--rounds`).
    pub round: usize,
    /// Scenario.
    pub scenario: Scenario,
    /// In-flight requests.
    pub concurrency: usize,
    /// Answers in the timed phase.
    pub requests: u64,
    /// Length of the timed phase (to the last answer), seconds.
    pub elapsed_s: f64,
    /// Answers per second.
    pub requests_per_s: f64,
    /// Latency percentiles and maximum, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Slowest answer, ms.
    pub max_ms: f64,
    /// Non-OK answers (warm-up included) by status code name, or
    /// `BAD_RESPONSE`. Empty when all were OK.
    pub errors: BTreeMap<String, u64>,
    /// requests/s ÷ baseline requests/s at the same concurrency and round.
    pub rps_vs_baseline: Option<f64>,
    /// p99 ÷ baseline p99 at the same concurrency and round.
    pub p99_vs_baseline: Option<f64>,
    /// For a store scenario: requests/s ÷ bg-spawn's (no store) at the same
    /// concurrency and round.
    pub rps_vs_memory: Option<f64>,
    /// For a store scenario: p99 ÷ bg-spawn's p99.
    pub p99_vs_memory: Option<f64>,
    /// Server user+system CPU seconds per 1000 timed answers.
    pub server_cpu_s_per_1k: f64,
    /// The same for the load client (it shares the cores with the server).
    pub client_cpu_s_per_1k: f64,
    /// Server VmHWM after this row: the scenario's peak RSS so far, MiB.
    pub server_peak_rss_mib: f64,
    /// Watcher results, for bg-spawn-watched.
    pub watch: Option<WatchStats>,
    /// Store commits during the timed phase, for the store scenarios.
    pub store: Option<StoreStats>,
}

/// What the store's writer did during one timed phase (from the server's
/// `subagentd_store_*_total` counters, scraped before and after).
#[derive(Debug, Serialize)]
pub struct StoreStats {
    /// Commits (one fsync each with the embedded store, one transaction
    /// with PostgreSQL).
    pub commits: u64,
    /// Change sets (scheduler lock sections) they wrote.
    pub changes: u64,
    /// `commits` per second of the timed phase.
    pub commits_per_s: f64,
    /// `changes` ÷ `commits`: the group-commit batch size.
    pub changes_per_commit: f64,
    /// Timed answers ÷ `commits`: Spawn calls that shared one commit.
    pub requests_per_commit: f64,
}

/// What the watchers saw during one timed phase.
#[derive(Debug, Serialize)]
pub struct WatchStats {
    /// Open watchers.
    pub watchers: usize,
    /// Events received by all watchers during the timed phase.
    pub events: u64,
    /// `events` per second of the timed phase.
    pub events_per_s: f64,
    /// Largest receive time − newest agent timestamp of any event, ms.
    pub max_lag_ms: f64,
    /// Streams that ended, by status code name (or `STREAM_ENDED`).
    pub stream_errors: BTreeMap<String, u64>,
}

/// Whether a target was met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictStatus {
    /// Met.
    Met,
    /// Not met.
    NotMet,
    /// This run lacks the rows to decide.
    NotMeasured,
}

/// One target of the issue and how this run did.
#[derive(Debug, Serialize)]
pub struct Verdict {
    /// The target, as the issue states it.
    pub target: String,
    /// Met, not met, or not measured.
    pub status: VerdictStatus,
    /// The numbers behind it.
    pub detail: String,
}

fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

impl RunReport {
    /// An empty report for `args`.
    pub fn new(args: &RunArgs) -> Self {
        Self {
            machine: procfs::machine_description(),
            build: build_profile(),
            settings: RunSettings {
                duration_s: args.duration.as_secs_f64(),
                warmup_s: args.warmup.as_secs_f64(),
                connections: args.connections,
                watchers: args.watchers,
                watcher_connections: args.watcher_connections,
                rounds: args.rounds,
                concurrency: args.concurrency.clone(),
                scenarios: args.scenarios.clone(),
                postgres_url: args
                    .postgres_url
                    .as_deref()
                    .map(subagentd::config::redact_url),
            },
            rows: Vec::new(),
            verdicts: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// The row of `scenario` at `concurrency` in `round`, if measured.
    pub(super) fn row(&self, round: usize, scenario: Scenario, concurrency: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.round == round && r.scenario == scenario && r.concurrency == concurrency)
    }
}

/// Everything `memory` measured.
#[derive(Debug, Serialize)]
pub struct MemoryReport {
    /// Cores and CPU model.
    pub machine: String,
    /// `release` or `debug`.
    pub build: &'static str,
    /// Concurrent spawns while filling.
    pub concurrency: usize,
    /// Connections the spawns used.
    pub connections: usize,
    /// One row per number of agents.
    pub rows: Vec<MemoryRow>,
    /// The memory targets.
    pub verdicts: Vec<Verdict>,
    /// Servers that failed to start or stop, measurements that failed.
    pub failures: Vec<Failure>,
}

/// One `memory` measurement.
#[derive(Debug, Serialize)]
pub struct MemoryRow {
    /// Agents asked for.
    pub agents: usize,
    /// Agents confirmed DONE (by Await) when RSS was read.
    pub done: u64,
    /// Non-OK answers by name (spawns and awaits), or agents not DONE
    /// (`BAD_RESPONSE`).
    pub errors: BTreeMap<String, u64>,
    /// Time to send all spawns, seconds.
    pub spawn_s: f64,
    /// Spawns per second while filling.
    pub spawns_per_s: f64,
    /// Time to confirm all DONE afterwards, seconds.
    pub await_s: f64,
    /// VmRSS once ready, before any agent, MiB.
    pub idle_rss_mib: f64,
    /// VmRSS with every agent DONE and retained, MiB.
    pub rss_after_mib: f64,
    /// VmHWM at the end, MiB.
    pub peak_rss_mib: f64,
    /// (RSS after − idle RSS) / done.
    pub bytes_per_agent: f64,
    /// Prompt + result text per agent, bytes (the target excludes it).
    pub text_bytes_per_agent: usize,
}

impl MemoryReport {
    /// An empty report.
    pub fn new(concurrency: usize, connections: usize) -> Self {
        Self {
            machine: procfs::machine_description(),
            build: build_profile(),
            concurrency,
            connections,
            rows: Vec::new(),
            verdicts: Vec::new(),
            failures: Vec::new(),
        }
    }
}
