//! `subagentd-bench run`: what each scenario sends, and the sequence of one
//! run (fresh server per scenario, every concurrency against it, server
//! counters sampled around each timed phase).

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use anyhow::Context;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::transport::Channel;

use crate::{
    cli::{RunArgs, Scenario},
    load::{self, watchers::Watchers, LoadPlan, Workload},
    procfs::{self, Pid},
    report::{self, Failure, Measurement, Row, RunReport, WatchStats},
    servers::{self, BenchStore, ServerKind, ServerProcess},
};

/// Prompt of the agent the `status` scenario reads: it sleeps an hour, so it
/// stays RUNNING (and retained) however long the run is.
const STATUS_TARGET_PROMPT: &str = "sleep 3600000";

impl Scenario {
    /// The store of this scenario's server; Err when it cannot have one.
    fn store(self, args: &RunArgs) -> Result<BenchStore, String> {
        match self {
            Scenario::BgSpawnEmbedded => Ok(BenchStore::Embedded),
            Scenario::BgSpawnPostgres | Scenario::BgSpawnForwarded => match &args.postgres_url {
                Some(url) => Ok(BenchStore::Postgres {
                    server_url: url.clone(),
                }),
                None => Err(format!(
                    "{self} needs --postgres-url URL: a PostgreSQL server where the bench may \
                     CREATE DATABASE (e.g. postgres://subagentd@127.0.0.1:55432/postgres, \
                     from `eval \"$(bash .ci/postgres.sh start)\"`)"
                )),
            },
            _ => Ok(BenchStore::Memory),
        }
    }
}

/// Runs every scenario, prints the report, and turns breakage (not missed
/// targets) into a failing exit status.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if cfg!(debug_assertions) {
        eprintln!(
            "note: this is a debug build: fine as a smoke test, meaningless as a measurement \
             (use `cargo build --release --bins` and target/release/subagentd-bench)"
        );
    }
    let needs_subagentd = args.scenarios.iter().any(|&s| s != Scenario::Baseline);
    let subagentd = if needs_subagentd {
        Some(
            servers::subagentd_bin(args.server.server_bin.as_deref()).map_err(|e| format!("{e:#}")),
        )
    } else {
        None
    };

    let mut report = RunReport::new(&args);
    for round in 1..=args.rounds {
        run_round(round, &args, subagentd.as_ref(), &mut report).await;
    }
    report.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report::render_run(&report));
    }
    Ok(if report.saw_errors() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One pass over the scenario list; its rows carry `round`.
async fn run_round(
    round: usize,
    args: &RunArgs,
    subagentd: Option<&Result<std::path::PathBuf, String>>,
    report: &mut RunReport,
) {
    for &scenario in &args.scenarios {
        let store = match scenario.store(args) {
            Ok(store) => store,
            Err(message) => {
                report.failures.push(Failure::new(Some(scenario), message));
                continue;
            }
        };
        let kind = match (scenario, subagentd) {
            (Scenario::Baseline, _) => ServerKind::Noop,
            (_, Some(Ok(bin))) => ServerKind::Subagentd {
                bin: bin.clone(),
                config_toml: match scenario {
                    Scenario::BgSpawnKeyed => servers::THROUGHPUT_KEYED_CONFIG,
                    _ => servers::THROUGHPUT_CONFIG,
                }
                .into(),
                store,
            },
            (_, Some(Err(message))) => {
                report
                    .failures
                    .push(Failure::new(Some(scenario), message.clone()));
                continue;
            }
            (_, None) => unreachable!("subagentd is looked up whenever a scenario needs it"),
        };
        eprintln!("[{scenario}] round {round}: starting server");
        let (rows, failure) = run_scenario(scenario, &kind, args).await;
        report
            .rows
            .extend(rows.into_iter().map(|row| Row { round, ..row }));
        if let Some(e) = failure {
            eprintln!("[{scenario}] failed: {e:#}");
            report
                .failures
                .push(Failure::new(Some(scenario), format!("{e:#}")));
        }
    }
}

/// One scenario on its own server. Rows measured before a failure are kept;
/// the server is stopped however the measurement ended.
async fn run_scenario(
    scenario: Scenario,
    kind: &ServerKind,
    args: &RunArgs,
) -> (Vec<Row>, Option<anyhow::Error>) {
    let servers = match UnderTest::start(scenario, kind, args).await {
        Ok(servers) => servers,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut rows = Vec::new();
    let measured = measure_scenario(scenario, &servers, args, &mut rows).await;
    let stopped = servers.stop().await;
    let failure = match (measured, stopped) {
        (Ok(()), Ok(())) => None,
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Some(e),
        (Err(e), Err(stop)) => Some(anyhow::anyhow!(
            "{e:#}; then stopping the server failed too: {stop:#}"
        )),
    };
    (rows, failure)
}

/// The servers of one scenario: the one that schedules and, for
/// [`Scenario::BgSpawnForwarded`], a standby on its database that the load
/// is sent to.
struct UnderTest {
    server: ServerProcess,
    standby: Option<ServerProcess>,
}

impl UnderTest {
    async fn start(scenario: Scenario, kind: &ServerKind, args: &RunArgs) -> anyhow::Result<Self> {
        let timeout = args.server.startup_timeout;
        let server = ServerProcess::start(kind, timeout).await?;
        let standby = match (scenario, kind) {
            (
                Scenario::BgSpawnForwarded,
                ServerKind::Subagentd {
                    bin, config_toml, ..
                },
            ) => {
                let url = server
                    .database_url()
                    .context("the forwarded scenario's leader has no database")?
                    .to_owned();
                let standby_kind = ServerKind::Subagentd {
                    bin: bin.clone(),
                    config_toml: config_toml.clone(),
                    store: BenchStore::PostgresShared { url },
                };
                // The first server holds the lease once it is SERVING, so
                // this one starts as its standby (SERVING once it reaches
                // the leader).
                match ServerProcess::start(&standby_kind, timeout).await {
                    Ok(standby) => Some(standby),
                    Err(e) => {
                        let _ = server.stop().await;
                        return Err(e.context("starting the standby"));
                    }
                }
            }
            _ => None,
        };
        Ok(Self { server, standby })
    }

    /// Where the load goes.
    fn target(&self) -> &ServerProcess {
        self.standby.as_ref().unwrap_or(&self.server)
    }

    /// CPU ticks of every server process: a forwarded Spawn costs both.
    fn cpu_ticks(&self) -> anyhow::Result<u64> {
        let standby = match &self.standby {
            Some(standby) => standby.cpu_ticks()?,
            None => 0,
        };
        Ok(self.server.cpu_ticks()? + standby)
    }

    /// The standby first: stopping the leader first would start an election.
    async fn stop(self) -> anyhow::Result<()> {
        let standby = match self.standby {
            Some(standby) => standby.stop().await,
            None => Ok(()),
        };
        let server = self.server.stop().await;
        standby.and(server)
    }
}

async fn measure_scenario(
    scenario: Scenario,
    servers: &UnderTest,
    args: &RunArgs,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let addr = servers.target().addr();
    let channels = servers::connect(addr, args.connections).await?;
    let workload = prepare(scenario, &channels[0], args).await?;
    let watchers = match (scenario, &workload) {
        (Scenario::BgSpawnWatched, _) => {
            Some(open_watchers(addr, args.watchers, args.watcher_connections).await?)
        }
        (Scenario::BgSpawnLeadWatched, Workload::SpawnRoundRobin { leads, .. }) => {
            eprintln!("[{scenario}] opening {} lead watchers", leads.names.len());
            Some(
                Watchers::open_leads(addr, &leads.names, args.watcher_connections)
                    .await
                    .context("opening the lead watchers")?,
            )
        }
        _ => None,
    };
    let mut result = Ok(());
    for &concurrency in &args.concurrency {
        let plan = LoadPlan {
            concurrency,
            warmup: args.warmup,
            duration: args.duration,
        };
        match measure_once(
            scenario,
            servers,
            &channels,
            &workload,
            watchers.as_ref(),
            plan,
        )
        .await
        {
            Ok(row) => rows.push(row),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if let Some(watchers) = watchers {
        watchers.close();
    }
    result
}

/// What the scenario sends, after any setup it needs.
async fn prepare(
    scenario: Scenario,
    channel: &Channel,
    args: &RunArgs,
) -> anyhow::Result<Workload> {
    Ok(match scenario {
        Scenario::BgSpawnLeadWatched => Workload::SpawnRoundRobin {
            request: load::spawn_request(true),
            leads: std::sync::Arc::new(load::LeadTally::new(args.lead_watchers)),
        },
        Scenario::Baseline
        | Scenario::BgSpawn
        | Scenario::BgSpawnEmbedded
        | Scenario::BgSpawnPostgres
        | Scenario::BgSpawnForwarded
        | Scenario::BgSpawnWatched => Workload::Spawn(load::spawn_request(true)),
        Scenario::FgSpawn => Workload::Spawn(load::spawn_request(false)),
        Scenario::BgSpawnKeyed => Workload::KeyedSpawn {
            request: load::spawn_request(true),
            authorization: format!("Bearer {}", servers::BENCH_KEY)
                .parse()
                .context("the bench key as a header")?,
        },
        Scenario::Status => {
            let mut client = AgentServiceClient::new(channel.clone());
            let target = client
                .spawn(pb::SpawnRequest {
                    prompt: STATUS_TARGET_PROMPT.to_owned(),
                    ..load::spawn_request(true)
                })
                .await
                .context("spawning the agent the status scenario reads")?
                .into_inner()
                .agent
                .context("Spawn answered without an agent")?;
            Workload::Status(pb::StatusRequest {
                ids: vec![target.id],
                ..Default::default()
            })
        }
    })
}

async fn open_watchers(
    addr: SocketAddr,
    count: usize,
    connections: usize,
) -> anyhow::Result<Watchers> {
    eprintln!("[{}] opening {count} watchers", Scenario::BgSpawnWatched);
    Watchers::open(addr, count, connections)
        .await
        .context("opening the watchers")
}

/// One timed run at one concurrency.
async fn measure_once(
    scenario: Scenario,
    servers: &UnderTest,
    channels: &[Channel],
    workload: &Workload,
    watchers: Option<&Watchers>,
    plan: LoadPlan,
) -> anyhow::Result<Row> {
    eprintln!(
        "[{scenario}] concurrency {}: {} warm-up + {} timed",
        plan.concurrency,
        humantime::format_duration(plan.warmup),
        humantime::format_duration(plan.duration)
    );
    let running = load::start(channels, workload.clone(), plan);
    tokio::time::sleep_until(running.timed_start().into()).await;
    let server = &servers.server;
    let server_cpu_before = servers.cpu_ticks()?;
    let client_cpu_before = procfs::cpu_ticks(Pid::This)?;
    let events_before = watchers.map(|w| {
        w.take_max_lag();
        w.events()
    });
    // A scrape takes about a millisecond, next to seconds of timed load.
    let commits_before = if scenario.has_store() {
        Some(server.commit_counts().await?)
    } else {
        None
    };

    let result = running.finish().await?;

    let server_cpu = servers.cpu_ticks()?.saturating_sub(server_cpu_before);
    let client_cpu = procfs::cpu_ticks(Pid::This)?.saturating_sub(client_cpu_before);
    // Every answer counted was durable when it was sent (the store's
    // durable-answer rule), so its commit is in this count.
    let commits = match commits_before {
        Some(before) => Some(server.commit_counts().await?.since(before)),
        None => None,
    };
    let watch = match (watchers, events_before) {
        (Some(w), Some(before)) => {
            let events = w.events() - before;
            w.settle().await;
            if let Workload::SpawnRoundRobin { leads, .. } = workload {
                check_lead_counts(w, leads)?;
            }
            Some(WatchStats {
                watchers: w.len(),
                events,
                events_per_s: events as f64 / result.elapsed.as_secs_f64().max(1e-9),
                max_lag_ms: ms(w.take_max_lag()),
                stream_errors: w.errors(),
            })
        }
        _ => None,
    };
    let memory = server.memory()?;
    Ok(Row::new(
        scenario,
        plan.concurrency,
        Measurement {
            result: &result,
            server_cpu_s: procfs::ticks_to_seconds(server_cpu),
            client_cpu_s: procfs::ticks_to_seconds(client_cpu),
            server_peak_rss_bytes: memory.peak_rss_bytes,
            commits,
        },
        watch,
    ))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Every lead watcher received one DONE per agent its lead spawned (all
/// phases so far; the agents finish at once) and nothing of other leads.
fn check_lead_counts(watchers: &Watchers, leads: &load::LeadTally) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let foreign = watchers.foreign_events();
    anyhow::ensure!(
        foreign == 0,
        "lead watchers received {foreign} events of other leads"
    );
    let wrong: Vec<String> = watchers
        .done_per_watcher()
        .into_iter()
        .zip(&leads.spawned)
        .zip(&leads.names)
        .filter(|((done, spawned), _)| *done != spawned.load(Relaxed))
        .map(|((done, spawned), name)| format!("{name}: {done} DONE of {}", spawned.load(Relaxed)))
        .take(5)
        .collect();
    anyhow::ensure!(
        wrong.is_empty(),
        "lead watchers missed or duplicated their leads' agents: {}",
        wrong.join(", ")
    );
    Ok(())
}
