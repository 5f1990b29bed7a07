//! Wiring: the gRPC server (AgentService, health, reflection), the retention
//! sweeper, config reload and shutdown.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server};
use tracing::{error, info, warn};

use crate::{
    api::deadline::DeadlineLayer,
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
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.health
            .set_not_serving::<AgentServiceServer<AgentServiceImpl>>()
            .await;
        self.health
            .set_not_serving::<WorkerServiceServer<WorkerServiceImpl>>()
            .await;
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
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
        let cancelled = self.scheduler.shut_down("server shutting down");
        info!(cancelled, "shutting down");
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
    health
        .set_serving::<AgentServiceServer<AgentServiceImpl>>()
        .await;
    health
        .set_serving::<WorkerServiceServer<WorkerServiceImpl>>()
        .await;
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
                .add_service(AgentServiceRouter::new(service))
                .add_service(WorkerServiceServer::new(workers))
                .serve_with_incoming_shutdown(
                    // Without TCP_NODELAY small responses wait for the peer's
                    // delayed ACK (Nagle): ~40 ms per call at low concurrency.
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown.cancelled_owned(),
                ),
        )
    };
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
    })
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
    signals.wait_for_stop(&handle).await;
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
