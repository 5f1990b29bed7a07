//! `subagentd-bench memory`: how much a retained finished agent costs.
//!
//! For each N: a fresh subagentd, its idle RSS, N background spawns of a
//! two-byte prompt as fast as the client can send them, Await on every id
//! until all are DONE (which also proves none was lost), then RSS again.
//! (RSS after − idle RSS) / N includes everything the server keeps per agent
//! — record, indexes, idempotency entries, allocator overhead — which is
//! what an operator pays.

use std::{
    process::ExitCode,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::transport::Channel;

use crate::{
    cli::MemoryArgs,
    load::{self, Outcome, OutcomeCounts},
    report::{self, Failure, MemoryReport, MemoryRow},
    servers::{self, ServerKind, ServerProcess},
};

/// Ids per Await call (the API's maximum).
const AWAIT_BATCH: usize = 100;
/// Await timeout per batch: generous, the agents finish at once.
const AWAIT_TIMEOUT: Duration = Duration::from_secs(600);
/// Progress line interval while filling.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
/// Prompt and result of each agent (the simulated runner echoes a prompt
/// without directives).
const PROMPT: &str = "hi";

const MIB: f64 = 1024.0 * 1024.0;

/// Runs the memory measurement for every `--agents` value.
pub async fn run(args: MemoryArgs) -> anyhow::Result<ExitCode> {
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build: RSS figures are still meaningful, rates are not");
    }
    let kind = ServerKind::Subagentd {
        bin: servers::subagentd_bin(args.server.server_bin.as_deref())?,
        config_toml: servers::MEMORY_CONFIG.into(),
        // RSS of the scheduler's records, not of a store's caches.
        store: servers::BenchStore::Memory,
    };
    let mut report = MemoryReport::new(args.concurrency, args.connections);
    for &agents in &args.agents {
        eprintln!("[memory] {agents} agents: starting subagentd");
        let (row, failure) = measure(agents, &kind, &args).await;
        report.rows.extend(row);
        if let Some(e) = failure {
            eprintln!("[memory] {agents} agents failed: {e:#}");
            report
                .failures
                .push(Failure::new(None, format!("{agents} agents: {e:#}")));
        }
    }
    report.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report::render_memory(&report));
    }
    Ok(if report.saw_errors() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One N on its own server, stopped however the measurement ended.
async fn measure(
    agents: usize,
    kind: &ServerKind,
    args: &MemoryArgs,
) -> (Option<MemoryRow>, Option<anyhow::Error>) {
    let server = match ServerProcess::start(kind, args.server.startup_timeout).await {
        Ok(server) => server,
        Err(e) => return (None, Some(e)),
    };
    let measured = fill_and_measure(agents, &server, args).await;
    let stopped = server.stop().await;
    match measured {
        Ok(row) => (Some(row), stopped.err()),
        Err(e) => (None, Some(e)),
    }
}

async fn fill_and_measure(
    agents: usize,
    server: &ServerProcess,
    args: &MemoryArgs,
) -> anyhow::Result<MemoryRow> {
    let idle = server.memory()?;
    let channels = servers::connect(server.addr(), args.connections).await?;

    let started = Instant::now();
    let (ids, mut outcomes) = spawn_all(&channels, agents, args.concurrency).await?;
    let spawn_s = started.elapsed().as_secs_f64();
    eprintln!("[memory] {agents} agents: spawned in {spawn_s:.1} s, awaiting them");

    let started = Instant::now();
    let (done, await_outcomes) = await_all(&channels, ids).await?;
    let await_s = started.elapsed().as_secs_f64();
    outcomes.merge(&await_outcomes);

    let after = server.memory()?;
    let grown = after.rss_bytes.saturating_sub(idle.rss_bytes);
    Ok(MemoryRow {
        agents,
        done,
        errors: outcomes.errors(),
        spawn_s,
        spawns_per_s: agents as f64 / spawn_s.max(1e-9),
        await_s,
        idle_rss_mib: idle.rss_bytes as f64 / MIB,
        rss_after_mib: after.rss_bytes as f64 / MIB,
        peak_rss_mib: after.peak_rss_bytes as f64 / MIB,
        bytes_per_agent: grown as f64 / done.max(1) as f64,
        text_bytes_per_agent: 2 * PROMPT.len(),
    })
}

/// Spawns `agents` background agents with `concurrency` tasks; returns each
/// task's ids of accepted agents and every outcome.
async fn spawn_all(
    channels: &[Channel],
    agents: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<Vec<String>>, OutcomeCounts)> {
    let next = Arc::new(AtomicUsize::new(0));
    let progress = {
        let next = next.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PROGRESS_INTERVAL).await;
                let sent = next.load(Ordering::Relaxed).min(agents);
                eprintln!("[memory] {agents} agents: {sent} spawned");
            }
        })
    };
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let mut client = AgentServiceClient::new(channels[i % channels.len()].clone());
            let next = next.clone();
            tokio::spawn(async move {
                let request = pb::SpawnRequest {
                    prompt: PROMPT.to_owned(),
                    ..load::spawn_request(true)
                };
                let mut ids = Vec::new();
                let mut outcomes = OutcomeCounts::default();
                while next.fetch_add(1, Ordering::Relaxed) < agents {
                    match client.spawn(request.clone()).await {
                        Ok(response) => match response.into_inner().agent {
                            Some(agent) => {
                                ids.push(agent.id);
                                outcomes.add(Outcome::Ok);
                            }
                            None => outcomes.add(Outcome::BadResponse),
                        },
                        Err(status) => outcomes.add(Outcome::Error(status.code())),
                    }
                }
                (ids, outcomes)
            })
        })
        .collect();
    let mut all_ids = Vec::with_capacity(concurrency);
    let mut all_outcomes = OutcomeCounts::default();
    let mut result = Ok(());
    for task in tasks {
        match task.await {
            Ok((ids, outcomes)) => {
                all_ids.push(ids);
                all_outcomes.merge(&outcomes);
            }
            Err(e) => result = Err(e).context("a spawn task failed"),
        }
    }
    progress.abort();
    result.map(|()| (all_ids, all_outcomes))
}

/// Awaits every id (batches of [`AWAIT_BATCH`], one task per id list) and
/// counts the agents that are DONE; any other state is a `BAD_RESPONSE`.
async fn await_all(
    channels: &[Channel],
    ids: Vec<Vec<String>>,
) -> anyhow::Result<(u64, OutcomeCounts)> {
    let tasks: Vec<_> = ids
        .into_iter()
        .enumerate()
        .map(|(i, ids)| {
            let mut client = AgentServiceClient::new(channels[i % channels.len()].clone());
            tokio::spawn(async move {
                let mut done = 0u64;
                let mut outcomes = OutcomeCounts::default();
                for batch in ids.chunks(AWAIT_BATCH) {
                    let request = pb::AwaitRequest {
                        ids: batch.to_vec(),
                        timeout: Some(prost_types::Duration {
                            seconds: AWAIT_TIMEOUT.as_secs() as i64,
                            nanos: 0,
                        }),
                        mode: pb::AwaitMode::All as i32,
                        ..Default::default()
                    };
                    match client.r#await(request).await {
                        Ok(response) => {
                            for agent in response.into_inner().agents {
                                if agent.status() == pb::AgentStatus::Done {
                                    done += 1;
                                } else {
                                    outcomes.add(Outcome::BadResponse);
                                }
                            }
                        }
                        Err(status) => outcomes.add(Outcome::Error(status.code())),
                    }
                }
                (done, outcomes)
            })
        })
        .collect();
    let mut done = 0;
    let mut outcomes = OutcomeCounts::default();
    for task in tasks {
        let (d, o) = task.await.context("an await task failed")?;
        done += d;
        outcomes.merge(&o);
    }
    Ok((done, outcomes))
}
