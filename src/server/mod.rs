//! Wiring: the gRPC server (AgentService, health, reflection), the retention
//! sweeper, config reload and shutdown.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use parking_lot::Mutex;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server};
use tracing::{error, info, warn};

use tonic::service::interceptor::InterceptedService;

use crate::{
    api::auth::AuthLayer,
    api::deadline::DeadlineLayer,
    api::forward::{ForwardLayer, ForwardSettings, LeaderTls, Route},
    api::gate::RecoveryGate,
    api::{
        ending::EndOnShutdown, rpc::RpcLayer, service::AgentServiceImpl,
        watch_route::AgentServiceRouter, workers::WorkerServiceImpl,
    },
    auth::Keyring,
    cli::ServeArgs,
    config::{Config, ConfigSource, StoreBackend},
    ha::{self, Elector, PgLease, Role, Timing},
    pb::{self, worker_service_server::WorkerServiceServer},
    scheduler::{Core, Scheduler},
    store::{
        self,
        writer::{CommitStats, Writer},
        StoreError,
    },
    telemetry::{self, metrics::Metrics},
};

/// Health-service name of the API.
pub const SERVICE_NAME: &str = "subagents.v1.AgentService";
/// How long shutdown waits for connections to close after cancelling runs.
const CONNECTION_DRAIN: Duration = Duration::from_secs(5);

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    /// `[server] health_listen`'s bound address.
    health_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    scheduler: Scheduler,
    source: ConfigSource,
    health: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
    /// `[server] shutdown_grace`.
    shutdown_grace: Duration,
    tasks: Vec<JoinHandle<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The store's writer (None with `backend = "memory"`, and on a
    /// standby until it leads).
    writer: Arc<Mutex<Option<Writer>>>,
    /// Cancelled when a commit failed: the server must stop.
    store_failed: CancellationToken,
    /// With PostgreSQL: the election, and the task that follows it (forward
    /// while a standby; recover and serve once elected; step down).
    ha: Option<HaHandle>,
    /// The keys calls are checked against; SIGHUP reconfigures it.
    keyring: Arc<Keyring>,
    /// With `[server.tls]`: the certificate new connections get; SIGHUP
    /// and a change of its files reload it.
    tls: Option<Arc<crate::tls::Acceptor>>,
}

#[derive(Debug)]
struct HaHandle {
    elector: Elector,
    task: JoinHandle<()>,
    /// Cancelled when this server stopped leading: it must exit.
    deposed: CancellationToken,
}

impl ServerHandle {
    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound address of `[server] health_listen`, if it is on.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
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

    /// Resolves when this server, having led, lost the leader lease (it
    /// could not renew it, or was frozen past it): its runs are stopped
    /// already; it must then stop ([`ServerHandle::abort`]) and come back
    /// as a standby (`serve` starts a new server in its place). Never
    /// resolves without a PostgreSQL store.
    pub async fn deposed(&self) {
        match &self.ha {
            Some(ha) => ha.deposed.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// Commit counts of the store's writer, if there is a store.
    pub fn commit_stats(&self) -> Option<std::sync::Arc<CommitStats>> {
        self.writer.lock().as_ref().map(Writer::stats)
    }

    /// Stops at once after a store failure: NOT_SERVING, streams end, no
    /// drain (the callers waiting on the failed commit have their answer).
    pub async fn abort(self) {
        self.set_not_serving().await;
        self.shutdown.cancel();
        for task in &self.tasks {
            task.abort();
        }
        if let Some(ha) = &self.ha {
            ha.task.abort();
        }
        self.scheduler.detach_runs();
        let mut server = self.server;
        if tokio::time::timeout(Duration::from_secs(2), &mut server)
            .await
            .is_err()
        {
            server.abort();
            let _ = server.await;
        }
        // Every listener is closed once its task is gone (a server started
        // again binds the same addresses).
        for task in self.tasks {
            let _ = task.await;
        }
        if let Some(ha) = self.ha {
            let _ = ha.task.await;
        }
    }

    async fn set_not_serving(&self) {
        set_serving(&self.health, false).await;
    }

    /// Re-reads the config from its source and applies limits, run settings
    /// and agent types. An invalid config is refused and the old one stays.
    pub fn reload(&self) -> Result<Config, crate::config::ConfigError> {
        match self.source.load() {
            Ok(config) => {
                self.scheduler.reconfigure(&config);
                self.keyring.reconfigure(&config.auth);
                self.reload_tls(&config.server.tls);
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

    fn reload_tls(&self, tls: &crate::config::ServerTls) {
        match (&self.tls, tls.enabled()) {
            (Some(acceptor), true) => match acceptor.reload(tls) {
                Ok(true) => info!("TLS certificate reloaded; new connections use it"),
                Ok(false) => {}
                Err(e) => error!(error = %e, "TLS reload refused; keeping the certificate in use"),
            },
            (None, false) => {}
            (Some(_), false) | (None, true) => warn!(
                "[server.tls] was turned on or off; that takes a restart (the listener keeps \
                 what it started with)"
            ),
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
    ///
    /// A leader on PostgreSQL then releases its lease at once, so that a
    /// standby takes over without waiting for it to expire.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.set_not_serving().await;
        let leading = self.writer.lock().is_some();
        if let (Some(ha), false) = (&self.ha, leading) {
            // A standby (or a server still recovering) has nothing to hand
            // over; it stops following the election.
            ha.task.abort();
        }
        // Queued agents stay queued (a run started now would be cut short);
        // every other RPC keeps working, so callers can await the drain.
        self.scheduler.stop_admitting();
        // Over a durable store worker runs go on and re-attach to the next
        // start or leader: only in-process runs are worth the grace (a
        // standby takes over as soon as they are done). Over the memory
        // store every run is cancelled at the end, so all of them get it.
        let count: fn(&Core) -> u32 = if self.writer.lock().is_some() {
            Core::in_process_running_count
        } else {
            Core::running_count
        };
        let running = self.scheduler.inspect(count);
        if running > 0 && !self.shutdown_grace.is_zero() {
            info!(
                running,
                grace = %humantime::format_duration(self.shutdown_grace),
                "shutting down: waiting for running agents"
            );
            self.scheduler
                .wait_for_runs(self.shutdown_grace, count)
                .await;
        }
        let writer = self.writer.lock().take();
        if let Some(writer) = writer {
            tokio::task::spawn_blocking(move || writer.stop())
                .await
                .context("stopping the store writer")?;
            let stopped = self.scheduler.detach_runs();
            info!(stopped, "shutting down; live agents stay in the store");
        } else if self.ha.is_some() {
            info!("shutting down a standby");
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
        if let Some(ha) = self.ha {
            ha.task.abort();
            // Everything is recorded and nothing of ours runs any more: a
            // standby may lead now, not at the lease's expiry.
            ha.elector.resign().await;
        }
        match tokio::time::timeout(CONNECTION_DRAIN, self.server).await {
            Ok(joined) => joined.context("server task")?.context("server")?,
            Err(_) => warn!("connections did not close in time; exiting anyway"),
        }
        Ok(())
    }
}

/// Starts a server for `config` (loaded from `source`, used again on reload).
pub async fn start(config: Config, source: ConfigSource) -> anyhow::Result<ServerHandle> {
    check_exposure(&config)?;
    let listener = TcpListener::bind(config.listen_addr())
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    let addr = listener.local_addr()?;
    let tls = if config.server.tls.enabled() {
        Some(Arc::new(crate::tls::Acceptor::new(&config.server.tls)?))
    } else {
        None
    };
    let keyring = Arc::new(Keyring::new(&config.auth));
    let scheduler = Scheduler::new(
        &config,
        crate::runner::builtin(Some(crate::runner::command::CommandRunner::local_api_url(
            addr,
        ))),
    );
    scheduler.set_span_sink(telemetry::run_span_sink());
    scheduler.set_run_credentials(Arc::new(crate::auth::keyring::RunTokenIssuer(
        keyring.shared(),
    )));
    let shutdown = CancellationToken::new();
    let metrics = std::sync::Arc::new(Metrics::new(scheduler.clone()));
    let mut tasks = Vec::new();
    let metrics_addr = if config.telemetry.metrics_listen.is_empty() {
        None
    } else {
        let guard = telemetry::metrics::Guard {
            token_file: (!config.telemetry.metrics_token_file.is_empty())
                .then(|| config.telemetry.metrics_token_file.clone()),
            tls: tls.clone().filter(|_| config.telemetry.metrics_tls),
        };
        let (bound, task) = telemetry::metrics::serve(
            &config.telemetry.metrics_listen,
            metrics.clone(),
            guard,
            shutdown.clone(),
        )
        .await?;
        tasks.push(task);
        Some(bound)
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    // NOT_SERVING (and RECOVERING answers) until the store is read.
    set_serving(&health, false).await;
    let gate = RecoveryGate::closed();
    // With PostgreSQL, servers elect a leader; the others forward to it.
    let advertised = config
        .ha
        .advertised(addr, std::env::var("POD_IP").ok().as_deref());
    let (route, routes) = watch::channel(Route::Local);
    let election = (config.store.backend == StoreBackend::Postgres).then(|| {
        route.send_replace(Route::NoLeader {
            why: "electing a leader".into(),
        });
        let options = store::postgres::ConnectOptions::of(&config.store);
        // A bad URL is reported by every connection attempt; a CA that the
        // mode never uses only here.
        if let Ok((_, tls)) = store::postgres::tls::split_url(&config.store.url, &options) {
            if let Some(ca) = tls.unused_ca() {
                warn!(
                    ca = %ca.path.display(), by = ca.by, sslmode = %tls.mode,
                    "store: this CA is not used: the sslmode does not check the server's \
                     certificate (set sslmode=verify-full or verify-ca in store.url)"
                );
            }
        }
        let lease = PgLease::new(&config.store.url, options);
        let timing = Timing {
            ttl: config.ha.lease_ttl,
        };
        let elector = Elector::start(Arc::new(lease), ha::holder_name(&advertised), timing);
        (route, elector)
    });
    let forward_tls = match (&tls, election.is_some()) {
        (Some(acceptor), true) => Some(Arc::new(LeaderTls::new(
            acceptor.generation(),
            leader_tls(&config, acceptor, &advertised)?,
        ))),
        _ => None,
    };
    // Only servers that can be standbys pay for the routing decision.
    let forward = election.is_some().then(|| {
        ForwardLayer::new(
            routes,
            &advertised,
            ForwardSettings {
                tls: forward_tls.clone(),
                connect_timeout: config.ha.lease_ttl / 5,
                keepalive_interval: config.server.keepalive_interval,
                keepalive_timeout: config.server.keepalive_timeout,
            },
        )
    });
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
    let abuse = config.server.clone();
    let message_limit = config.server.message_limit(&config.limits);

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
        let router = Server::builder()
            // Keepalive is how a silently dead worker is noticed: an
            // unanswered PING closes the connection, which ends its
            // session and fails (or retries) its runs.
            .http2_keepalive_interval(Some(keepalive_interval))
            .http2_keepalive_timeout(Some(keepalive_timeout))
            // Bounds hyper and tonic leave open or lax, set explicitly
            // (docs/security.md, "Limits against abuse").
            .max_concurrent_streams(abuse.max_concurrent_streams)
            .http2_max_header_list_size(abuse.max_header_list_bytes)
            .http2_max_pending_accept_reset_streams(Some(abuse.max_pending_reset_streams))
            .layer(rpc_layer)
            // Inside the RPC layer, so what it counts and traces is the
            // DEADLINE_EXCEEDED this one answers.
            .layer(DeadlineLayer)
            // Every call but health and reflection is authenticated
            // here, a standby's before it forwards (the leader checks
            // the same header again) and refusals counted above.
            .layer(AuthLayer::new(keyring.shared(), tls.clone()))
            // A standby relays AgentService and WorkerService calls to
            // the leader; counted and deadline-checked here as well.
            .layer(tower::util::option_layer(forward))
            // Health.Watch streams end at shutdown (after the
            // NOT_SERVING update) instead of holding the exit back.
            .add_service(EndOnShutdown::new(
                health_service.clone(),
                shutdown.clone(),
                &["/grpc.health.v1.Health/Watch"],
            ))
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(InterceptedService::new(
                AgentServiceRouter::new(service, message_limit),
                gate.clone(),
            ))
            .add_service(InterceptedService::new(
                // A worker's report carries a run's whole result: never
                // less than tonic's own 4 MiB default.
                WorkerServiceServer::new(workers)
                    .max_decoding_message_size(message_limit.max(4 << 20)),
                gate.clone(),
            ));
        match &tls {
            Some(acceptor) => tokio::spawn(router.serve_with_incoming_shutdown(
                crate::tls::incoming(listener, acceptor.clone(), shutdown.clone()),
                shutdown.cancelled_owned(),
            )),
            None => tokio::spawn(router.serve_with_incoming_shutdown(
                // Without TCP_NODELAY small responses wait for the peer's
                // delayed ACK (Nagle): ~40 ms per call at low concurrency.
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                shutdown.cancelled_owned(),
            )),
        }
    };
    let health_addr = if config.server.health_listen.is_empty() {
        None
    } else {
        let listen = &config.server.health_listen;
        let (bound, task) = serve_health(listen, health_service, shutdown.clone()).await?;
        tasks.push(task);
        Some(bound)
    };
    let store_failed = CancellationToken::new();
    let writer = Arc::new(Mutex::new(None));
    let ha = if let Some((route, elector)) = election {
        let deposed = CancellationToken::new();
        let task = tokio::spawn(
            Follower {
                config: config.clone(),
                scheduler: scheduler.clone(),
                metrics: metrics.clone(),
                health: health.clone(),
                gate: gate.clone(),
                writer: writer.clone(),
                store_failed: store_failed.clone(),
                deposed: deposed.clone(),
                route,
                timing: Timing {
                    ttl: config.ha.lease_ttl,
                },
                leader_tls: forward_tls.clone(),
            }
            .run(elector.role(), elector.leader()),
        );
        info!(
            %addr,
            advertise = advertised,
            metrics = metrics_addr.map(tracing::field::display),
            "subagentd listening as a standby; electing a leader"
        );
        Some(HaHandle {
            elector,
            task,
            deposed,
        })
    } else {
        let recovered = recover(&config, &scheduler, store_failed.clone(), None).await?;
        if let Some(recovered) = &recovered {
            metrics.set_commit_stats(recovered.stats());
        }
        *writer.lock() = recovered;
        metrics.set_leader(true);
        gate.open();
        set_serving(&health, true).await;
        info!(
            %addr,
            metrics = metrics_addr.map(tracing::field::display),
            "subagentd listening"
        );
        None
    };
    tasks.push(sweeper);
    if !config.auth.keys_dir.is_empty() {
        let keyring = keyring.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::auth::keyring::KEYS_DIR_POLL).await;
                let keyring = keyring.clone();
                // File reads: off the runtime's worker threads.
                let _ = tokio::task::spawn_blocking(move || keyring.refresh()).await;
            }
        }));
    }
    let http = reqwest::Client::new();
    if let Some(verifier) = keyring.jwt() {
        match verifier.load(&http).await {
            Ok(keys) => info!(keys, "JWKS loaded"),
            Err(e) if verifier.config().jwks_url.is_empty() => {
                anyhow::bail!("[auth.jwt] jwks_file: {e}")
            }
            // The issuer may be briefly away: the refresh task retries.
            Err(e) => warn!(error = %e, "JWKS not loaded yet; no JWT is accepted until it is"),
        }
    }
    tasks.push(tokio::spawn(refresh_jwks(keyring.clone(), http)));
    if let Some(acceptor) = &tls {
        let acceptor = acceptor.clone();
        let (config, advertised) = (Arc::new(config.clone()), Arc::new(advertised.clone()));
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::tls::TLS_FILES_POLL).await;
                let (acceptor, leader) = (acceptor.clone(), forward_tls.clone());
                let (config, advertised) = (config.clone(), advertised.clone());
                // File reads: off the async workers.
                let _ = tokio::task::spawn_blocking(move || {
                    acceptor.refresh();
                    // A changed certificate (polled or SIGHUP) is also what
                    // a standby presents to the leader from now on.
                    let Some(leader) = leader else { return };
                    let generation = acceptor.generation();
                    if leader.current().0 == generation {
                        return;
                    }
                    match leader_tls(&config, &acceptor, &advertised) {
                        Ok(fresh) => {
                            leader.replace(generation, fresh);
                            info!("TLS to the leader uses the new certificate");
                        }
                        Err(e) => warn!(error = %e, "TLS to the leader keeps the old certificate"),
                    }
                })
                .await;
            }
        }));
    }
    Ok(ServerHandle {
        addr,
        health_addr,
        tls,
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
        ha,
        keyring,
    })
}

/// Keeps `[auth.jwt]`'s keys fresh: every `jwks_refresh` (every 10 s
/// while fetches fail), at once when a call names an unknown key id (at
/// most once a minute, see `JwtVerifier::request_early_fetch`), and at
/// once for a verifier a reload made.
async fn refresh_jwks(keyring: Arc<Keyring>, http: reqwest::Client) {
    let mut loaded: Option<Arc<crate::auth::jwt::JwtVerifier>> = keyring.jwt();
    loop {
        let Some(verifier) = keyring.jwt() else {
            loaded = None;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let fresh = !loaded.as_ref().is_some_and(|l| Arc::ptr_eq(l, &verifier));
        let mut ok = true;
        if fresh {
            ok = load_jwks(&verifier, &http).await;
            loaded = Some(verifier.clone());
        }
        let every = verifier.config().jwks_refresh;
        let wait = if ok {
            every
        } else {
            every.min(Duration::from_secs(10))
        };
        let replaced = async {
            while keyring
                .jwt()
                .is_some_and(|now| Arc::ptr_eq(&now, &verifier))
            {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = verifier.early_fetch_wanted() => {}
            () = replaced => continue,
        }
        if !load_jwks(&verifier, &http).await {
            // Retry soon: the next turn sees it as not loaded.
            loaded = None;
        }
    }
}

async fn load_jwks(verifier: &crate::auth::jwt::JwtVerifier, http: &reqwest::Client) -> bool {
    match verifier.load(http).await {
        Ok(keys) => {
            tracing::debug!(keys, "JWKS refreshed");
            true
        }
        Err(e) => {
            warn!(error = %e, "JWKS refresh failed; keeping the keys in use");
            false
        }
    }
}

/// `[server] health_listen`: `grpc.health.v1` alone, in plaintext (it
/// tells nothing but SERVING or not), for probes that cannot do TLS.
async fn serve_health<H: tonic_health::pb::health_server::Health>(
    listen: &str,
    health: tonic_health::pb::health_server::HealthServer<H>,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} ([server] health_listen)"))?;
    let bound = listener.local_addr()?;
    Ok((
        bound,
        tokio::spawn(async move {
            let served = Server::builder()
                .add_service(EndOnShutdown::new(
                    health,
                    shutdown.clone(),
                    &["/grpc.health.v1.Health/Watch"],
                ))
                .serve_with_incoming_shutdown(
                    TcpIncoming::from(listener).with_nodelay(Some(true)),
                    shutdown.cancelled_owned(),
                )
                .await;
            if let Err(e) = served {
                error!(error = %e, "health endpoint stopped");
            }
        }),
    ))
}

/// How a standby reaches the leader over TLS: the leader's certificate
/// verified with `[ha] tls_ca_file` (else the client CA, else the web
/// roots) for `[ha] tls_server_name` (else this server's own certificate's
/// DNS name: replicas share one), presenting this server's certificate, so
/// that the leader knows a replica and trusts the callers it forwards.
fn leader_tls(
    config: &Config,
    acceptor: &crate::tls::Acceptor,
    advertised: &str,
) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    let (ha, tls) = (&config.ha, &config.server.tls);
    let ca = [&ha.tls_ca_file, &tls.client_ca_file]
        .into_iter()
        .find(|f| !f.is_empty())
        .cloned();
    let client = crate::tls::ClientTls {
        ca_file: ca,
        cert_file: Some(tls.cert_file.clone()),
        key_file: Some(tls.key_file.clone()),
    };
    let name = if ha.tls_server_name.is_empty() {
        acceptor
            .own_dns_name()
            .map(|n| n.to_string())
            .unwrap_or_else(|| {
                advertised
                    .rsplit_once(':')
                    .map_or(advertised, |(host, _)| host)
                    .to_owned()
            })
    } else {
        ha.tls_server_name.clone()
    };
    Ok(client
        .config()
        .context("TLS to the leader ([ha] tls_ca_file, [server.tls])")?
        .domain_name(name))
}

/// Secure by default: without authentication, only loopback listeners,
/// unless `[auth] allow_unauthenticated` says otherwise (then a warning at
/// every start).
fn check_exposure(config: &Config) -> anyhow::Result<()> {
    let auth = &config.auth;
    if auth.mode != crate::auth::AuthMode::None {
        return Ok(());
    }
    let listen = config.listen_addr();
    if listen.ip().is_loopback() {
        return Ok(());
    }
    if !auth.allow_unauthenticated {
        anyhow::bail!(
            "refusing to listen on {listen} without authentication: anyone who reaches the port \
             could read every prompt and result. Set [auth] mode = \"required\" with API keys \
             (`subagentd keys new`), or listen on a loopback address, or set \
             [auth] allow_unauthenticated = true to accept the risk"
        );
    }
    warn!(
        %listen,
        "authentication is off ([auth] allow_unauthenticated = true) on a non-loopback address: \
         anyone who reaches the port can read and control every agent"
    );
    Ok(())
}

async fn set_serving(health: &tonic_health::server::HealthReporter, serving: bool) {
    let status = if serving {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    health.set_service_status(SERVICE_NAME, status).await;
    health
        .set_service_status(
            <WorkerServiceServer<WorkerServiceImpl> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    health.set_service_status("", status).await;
}

/// What a server on PostgreSQL does as the election goes: forward while a
/// standby, recover and serve once elected, stop its runs and exit when it
/// stops leading.
struct Follower {
    config: Config,
    scheduler: Scheduler,
    metrics: Arc<Metrics>,
    health: tonic_health::server::HealthReporter,
    gate: RecoveryGate,
    writer: Arc<Mutex<Option<Writer>>>,
    store_failed: CancellationToken,
    deposed: CancellationToken,
    route: watch::Sender<Route>,
    timing: Timing,
    /// With `[server.tls]`: how to reach the leader.
    leader_tls: Option<Arc<LeaderTls>>,
}

impl Drop for Follower {
    /// A standby that stops (SIGTERM) ends the calls it relays at once
    /// rather than hold its exit until they end.
    fn drop(&mut self) {
        if let Route::Forward { gone, .. } = &*self.route.borrow() {
            gone.cancel();
        }
    }
}

impl Follower {
    async fn run(self, mut role: watch::Receiver<Role>, leader: watch::Receiver<Option<String>>) {
        self.metrics.set_leader(false);
        let lease = tokio::select! {
            lease = role.wait_for(|r| matches!(r, Role::Leader(_))) => match lease.as_deref() {
                Ok(Role::Leader(lease)) => *lease,
                _ => return,
            },
            () = self.forward(leader) => return,
        };
        self.set_route(Route::Local);
        self.metrics.set_leader(true);
        // A standby that was SERVING (its leader answered) is not ready
        // again until it has recovered as the leader.
        set_serving(&self.health, false).await;
        info!(epoch = lease.epoch, "leading: recovering the store");
        let recovered = tokio::select! {
            recovered = recover(&self.config, &self.scheduler, self.store_failed.clone(), Some(lease.epoch)) => Some(recovered),
            _ = role.wait_for(|r| *r == Role::Standby) => None,
        };
        let Some(recovered) = recovered else {
            self.step_down(lease.epoch).await;
            return;
        };
        match recovered {
            Ok(recovered) => {
                if let Some(writer) = &recovered {
                    self.metrics.set_commit_stats(writer.stats());
                }
                *self.writer.lock() = recovered;
            }
            Err(e) => {
                error!(
                    error = format!("{e:#}"),
                    "recovery as the new leader failed; stopping"
                );
                self.store_failed.cancel();
                return;
            }
        }
        self.gate.open();
        set_serving(&self.health, true).await;
        info!(epoch = lease.epoch, "leading: serving");
        let lost = role.wait_for(|r| *r == Role::Standby).await.is_ok();
        if lost {
            self.step_down(lease.epoch).await;
        }
    }

    /// Stops acting as leader at once: no admission, no in-process run
    /// (so none runs twice once another server leads), no more answers.
    async fn step_down(&self, epoch: u64) {
        self.scheduler.stop_admitting();
        let stopped = self.scheduler.detach_runs();
        self.metrics.set_leader(false);
        self.set_route(Route::NoLeader {
            why: "this server stopped leading".into(),
        });
        error!(
            epoch,
            stopped, "lost the leader lease: stopped every in-process run; becoming a standby"
        );
        self.deposed.cancel();
        set_serving(&self.health, false).await;
    }

    fn set_route(&self, route: Route) {
        let old = self.route.send_replace(route);
        if let Route::Forward { gone, .. } = old {
            gone.cancel();
        }
    }

    /// As a standby: routes calls to the leader the election names, and
    /// is SERVING while that leader answers its health check. Runs until
    /// dropped.
    async fn forward(&self, mut leader: watch::Receiver<Option<String>>) {
        let mut serving = false;
        let mut check =
            tokio::time::interval(self.timing.interval().max(Duration::from_millis(200)));
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let holder = leader.borrow_and_update().clone();
            let address = holder.as_deref().map(|h| ha::address_of(h).to_owned());
            let current = match &*self.route.borrow() {
                Route::Forward { address, .. } => Some(address.clone()),
                _ => None,
            };
            if address != current {
                match &address {
                    Some(address) => {
                        info!(leader = address, "forwarding to the leader");
                        self.set_route(Route::Forward {
                            address: address.clone(),
                            gone: CancellationToken::new(),
                        });
                    }
                    None => self.set_route(Route::NoLeader {
                        why: "no leader elected yet".into(),
                    }),
                }
            }
            let healthy = match &address {
                Some(address) => {
                    let tls = self.leader_tls.as_ref().map(|t| t.current());
                    leader_serving(
                        address,
                        tls.as_ref().map(|t| &t.1),
                        self.timing.call_timeout(),
                    )
                    .await
                }
                None => false,
            };
            if healthy != serving {
                serving = healthy;
                set_serving(&self.health, serving).await;
            }
            tokio::select! {
                changed = leader.changed() => if changed.is_err() { return },
                _ = check.tick() => {}
            }
        }
    }
}

/// Whether the leader at `address` answers its health check SERVING.
async fn leader_serving(
    address: &str,
    tls: Option<&tonic::transport::ClientTlsConfig>,
    timeout: Duration,
) -> bool {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let scheme = if tls.is_some() { "https" } else { "http" };
    let Ok(mut endpoint) = tonic::transport::Endpoint::from_shared(format!("{scheme}://{address}"))
    else {
        return false;
    };
    if let Some(tls) = tls {
        let Ok(with_tls) = endpoint.tls_config(tls.clone()) else {
            return false;
        };
        endpoint = with_tls;
    }
    let check = async {
        let channel = endpoint.connect_timeout(timeout).connect().await.ok()?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: SERVICE_NAME.into(),
            })
            .await
            .ok()?;
        Some(
            answer.into_inner().status
                == tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
        )
    };
    matches!(tokio::time::timeout(timeout, check).await, Ok(Some(true)))
}

/// Opens the configured store, rebuilds the scheduler from it, starts the
/// writer and decides the interrupted runs. None with `backend = "memory"`.
///
/// `leader_epoch`: the lease a PostgreSQL server leads by (its commits are
/// fenced by it).
async fn recover(
    config: &Config,
    scheduler: &Scheduler,
    store_failed: CancellationToken,
    leader_epoch: Option<u64>,
) -> anyhow::Result<Option<Writer>> {
    let store_config = config.store.clone();
    let started = std::time::Instant::now();
    let opened = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let Some(mut store) = store::open(&store_config, leader_epoch)? else {
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
    let (mut config, mut source) = (config, source);
    let handle = loop {
        let handle = start(config, source.clone()).await?;
        tokio::select! {
            () = signals.wait_for_stop(&handle) => break handle,
            () = handle.store_failed() => {
                handle.abort().await;
                anyhow::bail!("the store failed a commit (see the log); exiting so that a restart recovers what was written");
            }
            () = handle.deposed() => {
                // Its runs are stopped and its scheduler is stale: all of
                // it goes, and a fresh server on the same addresses starts
                // as a standby (what a restart would do, without one).
                (config, source) = standby_again(handle).await?;
                info!(listen = %config.server.listen, "starting again as a standby");
            }
        }
    };
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

/// After `handle` lost the leader lease: stops all of it and loads the
/// config again for a new server bound to the same addresses (so port 0
/// keeps the port it got).
async fn standby_again(handle: ServerHandle) -> anyhow::Result<(Config, ConfigSource)> {
    let (addr, health, metrics) = (handle.addr(), handle.health_addr(), handle.metrics_addr());
    let source = ConfigSource {
        listen: Some(addr.to_string()),
        ..handle.source.clone()
    };
    handle.abort().await;
    let mut config = source
        .load()
        .context("the config, loaded again to serve as a standby")?;
    if let Some(health) = health {
        config.server.health_listen = health.to_string();
    }
    if let Some(metrics) = metrics {
        config.telemetry.metrics_listen = metrics.to_string();
    }
    Ok((config, source))
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
