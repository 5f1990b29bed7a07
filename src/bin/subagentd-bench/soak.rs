//! `subagentd-bench soak`: a long run of background Spawns at a steady rate.
//!
//! One fresh release server per store, `--agents` background Spawns offered
//! at `--rate` per second (each of `--concurrency` callers sends the next
//! Spawn at its scheduled time, or at once when the server is behind), with
//! short retentions so that memory must level off. Per tenth of the run it
//! reports the Spawns per second reached, the server's CPU per Spawn, the
//! p99 latency and the server's RSS; at the end it waits for every agent to
//! finish and reads the server's metrics: nothing live, queued or running in
//! any bucket, and as many agents finished as were spawned (no slot leaked,
//! none lost).
//!
//! A degradation shows as CPU per Spawn or latency growing from the first
//! tenth to the last, and as a rate below the offered one once the server
//! cannot keep up; RSS that keeps growing after the retentions have passed
//! is a leak.

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;
use subagentd::pb::agent_service_client::AgentServiceClient;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::{
    cli::SoakArgs,
    load::{self, Outcome, OutcomeCounts},
    procfs,
    servers::{self, BenchStore, ServerKind, ServerProcess},
};

/// Parts of the run reported apart.
const PARTS: usize = 10;
/// How often the sampler looks at progress and the server.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// How long the agents may take to finish after the last Spawn.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
const MIB: f64 = 1024.0 * 1024.0;

/// The server config of a soak: nothing limits throughput but the global
/// cap (checked at the end like every other count), and records and
/// conversations are kept briefly, so memory must level off within the run.
fn soak_config(args: &SoakArgs) -> String {
    format!(
        "# written by subagentd-bench soak
[limits]
max_background_agents = 100000
default_concurrency = 0
max_concurrent_per_parent = 0

[runs]
finished_retention = \"{}\"

[conversations]
retention = \"{}\"
",
        humantime::format_duration(args.finished_retention),
        humantime::format_duration(args.conversation_retention),
    )
}

/// One tenth of a soak.
#[derive(Debug, Serialize)]
pub struct Part {
    /// Spawns answered in it.
    pub spawns: u64,
    /// Its length.
    pub seconds: f64,
    /// Spawns per second reached.
    pub spawns_per_s: f64,
    /// Server CPU (user + system) per Spawn, µs.
    pub server_cpu_us_per_spawn: f64,
    /// Median and 99th percentile latency of its Spawns, ms.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Server RSS at its end, MiB.
    pub rss_mib: f64,
}

/// A soak against one store.
#[derive(Debug, Serialize)]
pub struct Soak {
    pub store: String,
    pub agents: usize,
    pub offered_rate: u64,
    /// Spawns answered OK.
    pub accepted: u64,
    pub idle_rss_mib: f64,
    pub peak_rss_mib: f64,
    pub parts: Vec<Part>,
    /// Spawns per second of the last tenth ÷ the first.
    pub last_over_first: f64,
    /// Non-OK answers by status code.
    pub errors: std::collections::BTreeMap<String, u64>,
    /// What the server's metrics said once every agent had finished.
    pub drained: Drained,
}

/// The server's counts once the run has drained.
#[derive(Debug, Default, Serialize)]
pub struct Drained {
    /// `subagentd_background_agents`.
    pub live_background: i64,
    /// Sum of `subagentd_agents` (queued, running, awaiting approval).
    pub live_by_state: i64,
    /// Sum of `subagentd_bucket_agents` (every bucket's occupancy).
    pub bucket_occupancy: i64,
    /// Sums of `subagentd_agents_spawned_total` and `…_finished_total`.
    pub spawned: i64,
    pub finished: i64,
    /// Seconds from the last answer until all of the above settled.
    pub seconds: f64,
}

impl Drained {
    /// Whether nothing is held and every spawned agent finished.
    fn settled(&self, accepted: u64) -> bool {
        self.live_background == 0
            && self.live_by_state == 0
            && self.bucket_occupancy == 0
            && self.spawned == accepted as i64
            && self.finished == accepted as i64
    }
}

/// Runs the soak against each store.
pub async fn run(args: SoakArgs) -> anyhow::Result<ExitCode> {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build: its rates say nothing about a release server");
    }
    let bin = servers::subagentd_bin(args.server.server_bin.as_deref())?;
    let mut soaks = Vec::new();
    let mut failed = false;
    for store in &args.stores {
        let (name, store) = match store.as_str() {
            "memory" => ("memory", BenchStore::Memory),
            "embedded" => ("embedded", BenchStore::Embedded),
            other => bail!("--stores: unknown store {other:?} (memory, embedded)"),
        };
        let kind = ServerKind::Subagentd {
            bin: bin.clone(),
            config_toml: soak_config(&args).into(),
            store,
        };
        eprintln!("[soak] {name}: starting subagentd");
        let server = ServerProcess::start(&kind, args.server.startup_timeout).await?;
        let soak = soak_one(name, &server, &args).await;
        let stopped = server.stop().await;
        let soak = soak?;
        stopped?;
        failed |= !soak.errors.is_empty() || !soak.drained.settled(soak.accepted);
        if !args.json {
            print!("{}", render(&soak));
        }
        soaks.push(soak);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&soaks)?);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// What the callers share: the next Spawn's number, the answers so far and
/// the latencies of each part.
struct Progress {
    next: AtomicUsize,
    answered: AtomicU64,
}

async fn soak_one(store: &str, server: &ServerProcess, args: &SoakArgs) -> anyhow::Result<Soak> {
    let idle = server.memory()?;
    let channels = servers::connect(server.addr(), args.connections).await?;
    let progress = Arc::new(Progress {
        next: AtomicUsize::new(0),
        answered: AtomicU64::new(0),
    });
    let start = Instant::now();
    let callers: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let client = AgentServiceClient::new(channels[i % channels.len()].clone());
            tokio::spawn(caller(client, progress.clone(), start, args.clone()))
        })
        .collect();

    // The sampler: the end of each tenth, with the server's CPU and RSS.
    let mut marks = vec![(start, server.cpu_ticks()?, idle.rss_bytes)];
    let mut peak_rss = idle.rss_bytes;
    while marks.len() <= PARTS {
        tokio::time::sleep(SAMPLE_INTERVAL).await;
        let answered = progress.answered.load(Ordering::Relaxed);
        let rss = server.memory()?.rss_bytes;
        peak_rss = peak_rss.max(rss);
        if answered >= part_end(marks.len(), args.agents) as u64 {
            marks.push((Instant::now(), server.cpu_ticks()?, rss));
            eprintln!(
                "[soak] {store}: {answered} answered, {:.0} s, RSS {:.1} MiB",
                start.elapsed().as_secs_f64(),
                rss as f64 / MIB
            );
        }
        if callers.iter().all(|c| c.is_finished()) && marks.len() <= PARTS {
            // Every caller stopped early (errors end no caller, so this is
            // a panic): the join below reports it.
            break;
        }
    }
    let mut outcomes = OutcomeCounts::default();
    let mut latencies: Vec<Histogram<u64>> = (0..PARTS).map(|_| load::new_histogram()).collect();
    for c in callers {
        let (o, h) = c.await.context("a Spawn caller failed")?;
        outcomes.merge(&o);
        for (all, mine) in latencies.iter_mut().zip(&h) {
            all.add(mine).context("merging latencies")?;
        }
    }
    let last_answer = Instant::now();
    let drained = drain(server, outcomes.ok(), last_answer).await?;
    let tick_us = 1e6 / procfs::clock_ticks_per_second() as f64;
    let parts: Vec<Part> = marks
        .windows(2)
        .zip(&latencies)
        .enumerate()
        .map(|(i, (w, h))| {
            let ((t0, c0, _), (t1, c1, rss)) = (w[0], w[1]);
            let seconds = (t1 - t0).as_secs_f64();
            let spawns = (part_end(i + 1, args.agents) - part_end(i, args.agents)) as u64;
            Part {
                spawns,
                seconds,
                spawns_per_s: spawns as f64 / seconds.max(1e-9),
                server_cpu_us_per_spawn: (c1 - c0) as f64 * tick_us / spawns.max(1) as f64,
                p50_ms: h.value_at_quantile(0.5) as f64 / 1000.0,
                p99_ms: h.value_at_quantile(0.99) as f64 / 1000.0,
                rss_mib: rss as f64 / MIB,
            }
        })
        .collect();
    let last_over_first = match (parts.first(), parts.last()) {
        (Some(first), Some(last)) => last.spawns_per_s / first.spawns_per_s,
        _ => 0.0,
    };
    Ok(Soak {
        store: store.to_owned(),
        agents: args.agents,
        offered_rate: args.rate,
        idle_rss_mib: idle.rss_bytes as f64 / MIB,
        peak_rss_mib: peak_rss as f64 / MIB,
        parts,
        last_over_first,
        accepted: outcomes.ok(),
        errors: outcomes.errors(),
        drained,
    })
}

/// One caller: takes the next Spawn number, waits for its time (number ÷
/// rate after the start; at once when late) and sends it.
async fn caller(
    mut client: AgentServiceClient<Channel>,
    progress: Arc<Progress>,
    start: Instant,
    args: SoakArgs,
) -> (OutcomeCounts, Vec<Histogram<u64>>) {
    let request = load::spawn_request(true);
    let mut outcomes = OutcomeCounts::default();
    let mut latencies: Vec<Histogram<u64>> = (0..PARTS).map(|_| load::new_histogram()).collect();
    loop {
        let n = progress.next.fetch_add(1, Ordering::Relaxed);
        if n >= args.agents {
            break;
        }
        if args.rate > 0 {
            let due = start + Duration::from_secs_f64(n as f64 / args.rate as f64);
            tokio::time::sleep_until(due).await;
        }
        let sent = Instant::now();
        let outcome = match client.spawn(request.clone()).await {
            Ok(response) => match response.into_inner().agent {
                Some(_) => Outcome::Ok,
                None => Outcome::BadResponse,
            },
            Err(status) => Outcome::Error(status.code()),
        };
        let micros = sent.elapsed().as_micros() as u64;
        let _ = latencies[part_of(n, args.agents)].record(micros.max(1));
        outcomes.add(outcome);
        progress.answered.fetch_add(1, Ordering::Relaxed);
    }
    (outcomes, latencies)
}

/// The number of Spawns in the first `k` tenths of `agents`.
fn part_end(k: usize, agents: usize) -> usize {
    agents * k / PARTS
}

/// The tenth Spawn number `n` of `agents` falls in.
fn part_of(n: usize, agents: usize) -> usize {
    (0..PARTS)
        .find(|&k| n < part_end(k + 1, agents))
        .unwrap_or(PARTS - 1)
}

/// Waits until the server's metrics show nothing live and every accepted
/// agent finished (at most [`DRAIN_TIMEOUT`]); returns what they showed
/// last.
async fn drain(server: &ServerProcess, accepted: u64, since: Instant) -> anyhow::Result<Drained> {
    loop {
        let metrics = server.scrape().await?;
        let sum = |family: &str| sum_of(&metrics, family);
        let drained = Drained {
            live_background: sum("subagentd_background_agents"),
            live_by_state: sum("subagentd_agents"),
            bucket_occupancy: sum("subagentd_bucket_agents"),
            spawned: sum("subagentd_agents_spawned_total"),
            finished: sum("subagentd_agents_finished_total"),
            seconds: since.elapsed().as_secs_f64(),
        };
        if drained.settled(accepted) || since.elapsed() > DRAIN_TIMEOUT {
            return Ok(drained);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The sum of every series of metric `family` in a Prometheus text
/// exposition (0 when it has none).
fn sum_of(exposition: &str, family: &str) -> i64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            (name == family).then(|| value.parse::<f64>().ok())?
        })
        .sum::<f64>() as i64
}

fn render(s: &Soak) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## soak: {} store, {} background Spawns offered at {}/s\n",
        s.store,
        s.agents,
        if s.offered_rate == 0 {
            "as many as answered".to_owned()
        } else {
            s.offered_rate.to_string()
        }
    );
    let _ = writeln!(
        out,
        "| tenth | Spawns/s | server CPU µs/Spawn | p50 ms | p99 ms | RSS MiB |\n|---|---|---|---|---|---|"
    );
    for (i, p) in s.parts.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.1} | {:.2} | {:.2} | {:.1} |",
            i + 1,
            p.spawns_per_s,
            p.server_cpu_us_per_spawn,
            p.p50_ms,
            p.p99_ms,
            p.rss_mib
        );
    }
    let d = &s.drained;
    let _ = writeln!(
        out,
        "\nidle RSS {:.1} MiB, peak {:.1} MiB; last tenth ÷ first: {:.2}×; errors: {:?}\n\
         after {:.1} s: {} live background, {} live by state, {} in buckets; {} spawned, {} finished ({})",
        s.idle_rss_mib,
        s.peak_rss_mib,
        s.last_over_first,
        s.errors,
        d.seconds,
        d.live_background,
        d.live_by_state,
        d.bucket_occupancy,
        d.spawned,
        d.finished,
        if d.settled(s.accepted) && s.errors.is_empty() {
            "nothing leaked"
        } else {
            "NOT SETTLED"
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spawn_falls_in_the_tenth_the_sampler_counts_it_in() {
        for agents in [1, 9, 10, 11, 1_000_003] {
            assert_eq!(part_end(0, agents), 0);
            assert_eq!(part_end(PARTS, agents), agents);
            for n in [0, agents / 2, agents - 1] {
                let k = part_of(n, agents);
                assert!(
                    part_end(k, agents) <= n && n < part_end(k + 1, agents),
                    "{n} of {agents}"
                );
            }
        }
    }

    #[test]
    fn a_family_sums_its_series_and_only_its_own() {
        let exposition = "\
# HELP subagentd_agents Agents by state.
# TYPE subagentd_agents gauge
subagentd_agents{tenant=\"a\",state=\"queued\"} 2
subagentd_agents{tenant=\"b\",state=\"running\"} 3
subagentd_agents_spawned_total{tenant=\"a\",bucket=\"x\"} 7
subagentd_background_agents 0
";
        assert_eq!(sum_of(exposition, "subagentd_agents"), 5);
        assert_eq!(sum_of(exposition, "subagentd_agents_spawned_total"), 7);
        assert_eq!(sum_of(exposition, "subagentd_background_agents"), 0);
        assert_eq!(sum_of(exposition, "subagentd_bucket_agents"), 0);
    }
}
