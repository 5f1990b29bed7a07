//! Wiring: the gRPC server (AgentService, health, reflection), the retention
//! sweeper, config reload and shutdown.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server};
use tracing::{error, info, warn};

use tonic::service::interceptor::InterceptedService;

use crate::{
    api::deadline::DeadlineLayer,
    api::gate::RecoveryGate,
    api::{
        ending::EndOnShutdown, service::AgentServiceImpl, watch_route::AgentServiceRouter,
        workers::WorkerServiceImpl,
    },
    cli::ServeArgs,
    config::{Config, ConfigSource},
    pb::{
        self, agent_service_server::AgentServiceServer, worker_service_server::WorkerServiceServer,
    },
    scheduler::Scheduler,
    store::{
        self,
        writer::{CommitStats, Writer},
        StoreError,
    },
    telemetry::{self, metrics::Metrics, rpc::RpcLayer},
};

/// Health-service name of the API.
pub const SERVICE_NAME: &str = "subagents.v1.AgentService";
/// How long shutdown waits for connections to close after cancelling runs.
const CONNECTION_DRAIN: Duration = Duration::from_secs(5);

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    scheduler: Scheduler,
    source: ConfigSource,
    health: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
    /// `[server] shutdown_grace`.
    shutdown_grace: Duration,
    tasks: Vec<JoinHandle<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The store's writer (None with `backend = "memory"`).
    writer: Option<Writer>,
    /// Cancelled when a commit failed: the server must stop.
    store_failed: CancellationToken,
}

impl ServerHandle {
    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound address of the metrics endpoint, if it is on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The scheduler behind the API.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Resolves when the store failed a commit; the server must then stop
    /// ([`ServerHandle::abort`]) and exit non-zero.
    pub async fn store_failed(&self) {
        self.store_failed.cancelled().await;
    }

    /// Commit counts of the store's writer, if there is a store.
    pub fn commit_stats(&self) -> Option<std::sync::Arc<CommitStats>> {
        self.writer.as_ref().map(Writer::stats)
    }

    /// Stops at once after a store failure: NOT_SERVING, streams end, no
    /// drain (the callers waiting on the failed commit have their answer).
    pub async fn abort(self) {
        self.set_not_serving().await;
        self.shutdown.cancel();
        for task in &self.tasks {
            task.abort();
        }
        self.scheduler.detach_runs();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.server).await;
    }

    async fn set_not_serving(&self) {
        self.health
            .set_not_serving::<AgentServiceServer<AgentServiceImpl>>()
            .await;
        self.health
            .set_not_serving::<WorkerServiceServer<WorkerServiceImpl>>()
            .await;
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    }

    /// Re-reads the config from its source and applies limits, run settings
    /// and agent types. An invalid config is refused and the old one stays.
    pub fn reload(&self) -> Result<Config, crate::config::ConfigError> {
        match self.source.load() {
            Ok(config) => {
                self.scheduler.reconfigure(&config);
                info!(
                    source = %crate::config::describe(self.source.file.as_deref()),
                    "config reloaded"
                );
                Ok(config)
            }
            Err(e) => {
                error!(error = %e, "config reload refused; keeping the current config");
                Err(e)
            }
        }
    }

    /// Graceful stop: NOT_SERVING and no new Spawns at once; running
    /// agents get `[server] shutdown_grace` to finish; then what is still
    /// live is cancelled (so Await callers and watchers see a terminal
    /// state), watch streams end, and the server closes.
    ///
    /// With a durable store nothing live is cancelled: the writer commits
    /// what is pending and stops, then in-process runs are stopped without
    /// a record, so the next start finds them interrupted; queued agents
    /// stay queued and worker runs stay held for re-attach.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.set_not_serving().await;
        // Queued agents stay queued (a run started now would be cut short);
        // every other RPC keeps working, so callers can await the drain.
        self.scheduler.stop_admitting();
        let running = self.scheduler.inspect(|c| c.running_count());
        if running > 0 && !self.shutdown_grace.is_zero() {
            info!(
                running,
                grace = %humantime::format_duration(self.shutdown_grace),
                "shutting down: waiting for running agents"
            );
            self.scheduler.wait_for_runs(self.shutdown_grace).await;
        }
        if let Some(writer) = self.writer.take() {
            tokio::task::spawn_blocking(move || writer.stop())
                .await
                .context("stopping the store writer")?;
            let stopped = self.scheduler.detach_runs();
            info!(stopped, "shutting down; live agents stay in the store");
        } else {
            let cancelled = self.scheduler.shut_down("server shutting down");
            info!(cancelled, "shutting down");
        }
        self.shutdown.cancel();
        for task in &self.tasks {
            task.abort();
        }
        // Programs of command runs got SIGTERM; those that ignore it get
        // SIGKILL when their kill grace ends, before this process exits.
        self.scheduler.shutdown_runners().await;
        match tokio::time::timeout(CONNECTION_DRAIN, self.server).await {
            Ok(joined) => joined.context("server task")?.context("server")?,
            Err(_) => warn!("connections did not close in time; exiting anyway"),
        }
        Ok(())
    }
}

/// Starts a server for `config` (loaded from `source`, used again on reload).
pub async fn start(config: Config, source: ConfigSource) -> anyhow::Result<ServerHandle> {
    let listener = TcpListener::bind(config.listen_addr())
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    let addr = listener.local_addr()?;
    let scheduler = Scheduler::with_runners(&config, crate::runner::builtin(Some(addr)));
    scheduler.set_span_sink(telemetry::run_span_sink());
    let shutdown = CancellationToken::new();
    let metrics = std::sync::Arc::new(Metrics::new(scheduler.clone()));
    let mut tasks = Vec::new();
    let metrics_addr = if config.telemetry.metrics_listen.is_empty() {
        None
    } else {
        let (bound, task) = telemetry::metrics::serve(
            &config.telemetry.metrics_listen,
            metrics.clone(),
            shutdown.clone(),
        )
        .await?;
        tasks.push(task);
        Some(bound)
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    // NOT_SERVING (and RECOVERING answers) until the store is read.
    health
        .set_not_serving::<AgentServiceServer<AgentServiceImpl>>()
        .await;
    health
        .set_not_serving::<WorkerServiceServer<WorkerServiceImpl>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let gate = RecoveryGate::closed();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let service =
        AgentServiceImpl::new(scheduler.clone(), shutdown.clone()).with_metrics(metrics.api());
    let rpc_layer = RpcLayer::new(
        metrics.api(),
        &[
            pb::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ],
    );
    let workers = WorkerServiceImpl::new(scheduler.clone(), shutdown.clone());
    let shutdown_grace = config.server.shutdown_grace;
    let (keepalive_interval, keepalive_timeout) = (
        config.server.keepalive_interval,
        config.server.keepalive_timeout,
    );

    let sweeper = {
        let scheduler = scheduler.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(scheduler.sweep_interval()).await;
                scheduler.sweep();
            }
        })
    };

    let server = {
        let shutdown = shutdown.clone();
        tokio::spawn(
            Server::builder()
                // Keepalive is how a silently dead worker is noticed: an
                // unanswered PING closes the connection, which ends its
                // session and fails (or retries) its runs.
                .http2_keepalive_interval(Some(keepalive_interval))
                .http2_keepalive_timeout(Some(keepalive_timeout))
                .layer(rpc_layer)
                // Inside the RPC layer, so what it counts and traces is the
                // DEADLINE_EXCEEDED this one answers.
                .layer(DeadlineLayer)
                // Health.Watch streams end at shutdown (after the
                // NOT_SERVING update) instead of holding the exit back.
                .add_service(EndOnShutdown::new(
                    health_service,
                    shutdown.clone(),
                    &["/grpc.health.v1.Health/Watch"],
                ))
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha)
                .add_service(InterceptedService::new(
                    AgentServiceRouter::new(service),
                    gate.clone(),
                ))
                .add_service(InterceptedService::new(
                    WorkerServiceServer::new(workers),
                    gate.clone(),
                ))
                .serve_with_incoming_shutdown(
                    // Without TCP_NODELAY small responses wait for the peer's
                    // delayed ACK (Nagle): ~40 ms per call at low concurrency.
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown.cancelled_owned(),
                ),
        )
    };
    let store_failed = CancellationToken::new();
    let writer = recover(&config, &scheduler, store_failed.clone()).await?;
    if let Some(writer) = &writer {
        metrics.set_commit_stats(writer.stats());
    }
    gate.open();
    health
        .set_serving::<AgentServiceServer<AgentServiceImpl>>()
        .await;
    health
        .set_serving::<WorkerServiceServer<WorkerServiceImpl>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    info!(
        %addr,
        metrics = metrics_addr.map(tracing::field::display),
        "subagentd listening"
    );
    tasks.push(sweeper);
    Ok(ServerHandle {
        addr,
        metrics_addr,
        scheduler,
        source,
        health,
        shutdown,
        shutdown_grace,
        tasks,
        server,
        writer,
        store_failed,
    })
}

/// Opens the configured store, rebuilds the scheduler from it, starts the
/// writer and decides the interrupted runs. None with `backend = "memory"`.
async fn recover(
    config: &Config,
    scheduler: &Scheduler,
    store_failed: CancellationToken,
) -> anyhow::Result<Option<Writer>> {
    let store_config = config.store.clone();
    let started = std::time::Instant::now();
    let opened = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let Some(mut store) = store::open(&store_config)? else {
            return Ok(None);
        };
        let contents = store.load()?;
        Ok(Some((store, contents.decode()?)))
    })
    .await
    .context("opening the store")??;
    let Some((store, recovered)) = opened else {
        warn!("[store] backend = \"memory\": nothing is kept; a restart loses every agent");
        return Ok(None);
    };
    let described = store.describe();
    let mut report = scheduler
        .restore(recovered, &config.watch)
        .with_context(|| format!("recovering from the {described}"))?;
    let writer = Writer::start(store, scheduler.change_source(), move |e| {
        error!(error = %e, "the store failed; stopping");
        store_failed.cancel();
    })
    .context("starting the store writer")?;
    scheduler.attach_durability(writer.durability());
    // Programs of command runs may have outlived a SIGKILL of the server:
    // stop them before their runs are decided, so no two copies overlap.
    let mut stopped_programs = 0;
    for (id, agent_type, group) in std::mem::take(&mut report.process_groups) {
        let grace = config
            .agents
            .get(&*agent_type)
            .map_or(crate::config::DEFAULT_KILL_GRACE, |t| t.kill_grace());
        if crate::runner::command::stop_orphaned_group(group, grace).await {
            info!(agent_id = %id, pgid = group.pgid, "stopped a command run's program that outlived the server");
            stopped_programs += 1;
        }
    }
    scheduler.recover_runs(&mut report, config.runs.worker_reattach_grace);
    info!(
        store = %described,
        agents = report.agents,
        queued = report.queued,
        failed = report.failed,
        retried = report.retried,
        held_for_workers = report.held_for_workers.len(),
        stopped_programs,
        events = report.events,
        took_ms = started.elapsed().as_millis() as u64,
        "store opened and state recovered"
    );
    Ok(Some(writer))
}

/// `subagentd serve`: load the config, run until SIGTERM/SIGINT, reload on
/// SIGHUP.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let source = ConfigSource {
        file: args.config.clone(),
        listen: args.listen.clone(),
    };
    let config = source.load()?;
    if args.dump_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    let telemetry = telemetry::init(&config.telemetry)?;
    let mut signals = Signals::new()?;
    let handle = start(config, source).await?;
    tokio::select! {
        () = signals.wait_for_stop(&handle) => {}
        () = handle.store_failed() => {
            handle.abort().await;
            anyhow::bail!("the store failed a commit (see the log); exiting so that a restart recovers what was written");
        }
    }
    let stopped = tokio::select! {
        stopped = handle.shutdown() => stopped,
        signal = signals.stop() => {
            // The operator asked twice: no more waiting (no flush either).
            warn!(signal, "second signal: exiting now");
            std::process::exit(128 + signal);
        }
    };
    // After the last run ended: its span is in the queue being flushed.
    // Flushing blocks until the exporter is done, and the exporter's
    // connection is driven by this runtime: block a thread meant for
    // blocking, never one that may be driving I/O.
    if let Err(e) = tokio::task::spawn_blocking(move || telemetry.shutdown()).await {
        error!(error = %e, "flushing telemetry failed");
    }
    stopped
}

/// The signals `serve` acts on: SIGHUP reloads, SIGTERM/SIGINT stop (the
/// second one at once).
#[cfg(unix)]
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Reloads on SIGHUP until SIGTERM or SIGINT arrives.
    async fn wait_for_stop(&mut self, handle: &ServerHandle) {
        loop {
            let signal = tokio::select! {
                _ = self.hup.recv() => {
                    // Errors are logged by reload; the old config stays.
                    let _ = handle.reload();
                    continue;
                }
                _ = self.term.recv() => 15,
                _ = self.int.recv() => 2,
            };
            info!(signal, "stop signal received");
            return;
        }
    }

    /// The next SIGTERM (15) or SIGINT (2).
    async fn stop(&mut self) -> i32 {
        tokio::select! {
            _ = self.term.recv() => 15,
            _ = self.int.recv() => 2,
        }
    }
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Self)
    }

    async fn wait_for_stop(&mut self, _handle: &ServerHandle) {
        let _ = tokio::signal::ctrl_c().await;
    }

    async fn stop(&mut self) -> i32 {
        let _ = tokio::signal::ctrl_c().await;
        2
    }
}
