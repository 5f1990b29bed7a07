//! `start`: one server, composed step by step — listen, the scheduler and
//! its credentials, metrics, health, the election (on PostgreSQL), the
//! router, then either recovery (alone) or following the election, and the
//! background tasks.

use std::{net::SocketAddr, sync::Arc};

use anyhow::Context;
use parking_lot::Mutex;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    background,
    follower::{leader_tls, Follower},
    handle::{HaHandle, ServerHandle},
    health::{serve_health, set_serving},
    recovery::recover,
    router,
};
use crate::{
    api::{
        forward::{ForwardLayer, ForwardSettings, LeaderTls, Route},
        gate::RecoveryGate,
    },
    auth::Keyring,
    config::{Config, ConfigSource, StoreBackend},
    ha::{self, Elector, PgLease, Timing},
    scheduler::Scheduler,
    store,
    telemetry::{self, metrics::Metrics},
};

/// Starts a server for `config` (loaded from `source`, used again on reload).
pub async fn start(config: Config, source: ConfigSource) -> anyhow::Result<ServerHandle> {
    check_exposure(&config)?;
    check_workspaces(&config).await?;
    let (listener, addr, tls) = listen(&config).await?;
    let keyring = Arc::new(Keyring::new(&config.auth));
    let scheduler = scheduler(&config, addr, &keyring);
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(Metrics::new(scheduler.clone()));
    let mut tasks = Vec::new();
    let metrics_addr = serve_metrics(&config, &metrics, &tls, &shutdown, &mut tasks).await?;
    let (health, health_service) = tonic_health::server::health_reporter();
    // NOT_SERVING (and RECOVERING answers) until the store is read.
    set_serving(&health, false).await;
    let gate = RecoveryGate::closed();
    let advertised = config
        .ha
        .advertised(addr, std::env::var("POD_IP").ok().as_deref());
    let election = election(&config, &advertised);
    let forward_tls = match (&tls, election.is_some()) {
        (Some(acceptor), true) => Some(Arc::new(LeaderTls::new(
            acceptor.generation(),
            leader_tls(&config, acceptor, &advertised)?,
        ))),
        _ => None,
    };
    let parts = router::Parts {
        listener,
        scheduler: scheduler.clone(),
        metrics: metrics.clone(),
        authenticator: keyring.shared(),
        tls: tls.clone(),
        // Only servers that can be standbys pay for the routing decision.
        forward: election
            .as_ref()
            .map(|e| forward(&config, e, &advertised, &forward_tls)),
        health: health_service.clone(),
        gate: gate.clone(),
        shutdown: shutdown.clone(),
    };
    let server = router::serve(&config, parts)?;
    let http_addr =
        super::http::serve(&config, addr, keyring.shared(), &tls, &shutdown, &mut tasks).await?;
    let sweeper = background::sweeper(scheduler.clone());
    let health_addr = health_listener(&config, health_service, &shutdown, &mut tasks).await?;
    let store_failed = CancellationToken::new();
    let writer = Arc::new(Mutex::new(None));
    let serving = Serving {
        config: &config,
        scheduler: &scheduler,
        metrics: &metrics,
        health: &health,
        gate: &gate,
        writer: &writer,
        store_failed: &store_failed,
        leader_tls: &forward_tls,
    };
    let ha = serving
        .begin(election, addr, &advertised, metrics_addr, http_addr)
        .await?;
    tasks.push(sweeper);
    start_background(
        &config,
        &keyring,
        &tls,
        forward_tls,
        &advertised,
        &mut tasks,
    )
    .await?;
    Ok(ServerHandle {
        addr,
        health_addr,
        tls,
        metrics_addr,
        http_addr,
        scheduler,
        source,
        health,
        shutdown,
        shutdown_grace: config.server.shutdown_grace,
        tasks,
        server,
        writer,
        store_failed,
        ha,
        keyring,
    })
}

/// The API's listener, its bound address, and with `[server.tls]` the
/// acceptor its connections go through.
async fn listen(
    config: &Config,
) -> anyhow::Result<(TcpListener, SocketAddr, Option<Arc<crate::tls::Acceptor>>)> {
    let listener = TcpListener::bind(config.listen_addr())
        .await
        .with_context(|| format!("cannot listen on {}", config.server.listen))?;
    let addr = listener.local_addr()?;
    let tls = if config.server.tls.enabled() {
        Some(Arc::new(crate::tls::Acceptor::new(&config.server.tls)?))
    } else {
        None
    };
    Ok((listener, addr, tls))
}

/// The scheduler with the built-in runners (command runs call back at
/// `addr`), its span sink and the run credentials the keyring issues.
fn scheduler(config: &Config, addr: SocketAddr, keyring: &Keyring) -> Scheduler {
    let scheduler = Scheduler::new(
        config,
        crate::runner::builtin(
            Some(crate::runner::command::CommandRunner::local_api_url(addr)),
            Some(config.store.path.join("worktrees")),
        ),
    );
    scheduler.set_span_sink(telemetry::run_span_sink());
    scheduler.set_run_credentials(Arc::new(crate::auth::keyring::RunTokenIssuer(
        keyring.shared(),
    )));
    scheduler
}

/// `[telemetry] metrics_listen`, when set: its bound address.
async fn serve_metrics(
    config: &Config,
    metrics: &Arc<Metrics>,
    tls: &Option<Arc<crate::tls::Acceptor>>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Option<SocketAddr>> {
    if config.telemetry.metrics_listen.is_empty() {
        return Ok(None);
    }
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
    Ok(Some(bound))
}

/// `[server] health_listen`, when set: its bound address.
async fn health_listener<H: tonic_health::pb::health_server::Health>(
    config: &Config,
    health: tonic_health::pb::health_server::HealthServer<H>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<Option<SocketAddr>> {
    match config.server.health_listen.as_str() {
        "" => Ok(None),
        listen => {
            let (bound, task) = serve_health(listen, health, shutdown.clone()).await?;
            tasks.push(task);
            Ok(Some(bound))
        }
    }
}

/// With PostgreSQL, servers elect a leader and the others forward to it:
/// the route calls take (no leader yet) and the elector.
struct Election {
    route: watch::Sender<Route>,
    routes: watch::Receiver<Route>,
    elector: Elector,
}

fn election(config: &Config, advertised: &str) -> Option<Election> {
    if config.store.backend != StoreBackend::Postgres {
        return None;
    }
    let (route, routes) = watch::channel(Route::NoLeader {
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
    let elector = Elector::start(Arc::new(lease), ha::holder_name(advertised), timing);
    Some(Election {
        route,
        routes,
        elector,
    })
}

/// A standby's forwarding to the leader the election names.
fn forward(
    config: &Config,
    election: &Election,
    advertised: &str,
    tls: &Option<Arc<LeaderTls>>,
) -> ForwardLayer {
    ForwardLayer::new(
        election.routes.clone(),
        advertised,
        ForwardSettings {
            tls: tls.clone(),
            connect_timeout: config.ha.lease_ttl / 5,
            keepalive_interval: config.server.keepalive_interval,
            keepalive_timeout: config.server.keepalive_timeout,
        },
    )
}

/// What serving needs, alone or once elected.
struct Serving<'a> {
    config: &'a Config,
    scheduler: &'a Scheduler,
    metrics: &'a Arc<Metrics>,
    health: &'a tonic_health::server::HealthReporter,
    gate: &'a RecoveryGate,
    writer: &'a Arc<Mutex<Option<store::writer::Writer>>>,
    store_failed: &'a CancellationToken,
    leader_tls: &'a Option<Arc<LeaderTls>>,
}

impl Serving<'_> {
    /// Serves at once without an election (after recovery); with one,
    /// follows it as a standby.
    async fn begin(
        &self,
        election: Option<Election>,
        addr: SocketAddr,
        advertised: &str,
        metrics_addr: Option<SocketAddr>,
        http_addr: Option<SocketAddr>,
    ) -> anyhow::Result<Option<HaHandle>> {
        let metrics = metrics_addr.map(tracing::field::display);
        let http = http_addr.map(tracing::field::display);
        match election {
            Some(election) => {
                let ha = self.follow(election);
                info!(
                    %addr,
                    advertise = advertised,
                    metrics,
                    http,
                    "subagentd listening as a standby; electing a leader"
                );
                Ok(Some(ha))
            }
            None => {
                self.lead_alone().await?;
                info!(%addr, metrics, http, "subagentd listening");
                Ok(None)
            }
        }
    }

    /// Without an election: recover the store and serve.
    async fn lead_alone(&self) -> anyhow::Result<()> {
        let recovered =
            recover(self.config, self.scheduler, self.store_failed.clone(), None).await?;
        if let Some(recovered) = &recovered {
            self.metrics.set_commit_stats(recovered.stats());
        }
        *self.writer.lock() = recovered;
        self.metrics.set_leader(true);
        self.gate.open();
        set_serving(self.health, true).await;
        Ok(())
    }

    /// With an election: a standby until elected (the `Follower` task).
    fn follow(&self, election: Election) -> HaHandle {
        let Election { route, elector, .. } = election;
        let deposed = CancellationToken::new();
        let task = tokio::spawn(
            Follower {
                config: self.config.clone(),
                scheduler: self.scheduler.clone(),
                metrics: self.metrics.clone(),
                health: self.health.clone(),
                gate: self.gate.clone(),
                writer: self.writer.clone(),
                store_failed: self.store_failed.clone(),
                deposed: deposed.clone(),
                route,
                timing: Timing {
                    ttl: self.config.ha.lease_ttl,
                },
                leader_tls: self.leader_tls.clone(),
            }
            .run(elector.role(), elector.leader()),
        );
        HaHandle {
            elector,
            task,
            deposed,
        }
    }
}

/// The keys directory poll, the JWKS (loaded now, then refreshed) and the
/// TLS file poll.
async fn start_background(
    config: &Config,
    keyring: &Arc<Keyring>,
    tls: &Option<Arc<crate::tls::Acceptor>>,
    forward_tls: Option<Arc<LeaderTls>>,
    advertised: &str,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<()> {
    if !config.auth.keys_dir.is_empty() {
        tasks.push(background::poll_keys_dir(keyring.clone()));
    }
    let http = reqwest::Client::new();
    background::load_jwks_at_start(keyring, &http).await?;
    tasks.push(tokio::spawn(background::refresh_jwks(
        keyring.clone(),
        http,
    )));
    if let Some(acceptor) = tls {
        tasks.push(background::poll_tls_files(
            acceptor.clone(),
            forward_tls,
            config,
            advertised,
        ));
    }
    Ok(())
}

/// Secure by default: without authentication, only loopback listeners,
/// unless `[auth] allow_unauthenticated` says otherwise (then a warning at
/// every start).
/// Every workspace type's `repo` is a git repository: a server that could
/// not give its runs their worktrees refuses to start, naming the key.
pub(crate) async fn check_workspaces(config: &Config) -> anyhow::Result<()> {
    for (name, agent_type) in &config.agents {
        if let Some(repo) = agent_type.repo.as_deref() {
            if agent_type.workspace == crate::config::WorkspaceKind::Worktree {
                crate::runner::workspace::check_repository(repo)
                    .await
                    .map_err(|e| anyhow::anyhow!("agents.{name}.repo: {e}"))?;
            }
        }
    }
    Ok(())
}

fn check_exposure(config: &Config) -> anyhow::Result<()> {
    let auth = &config.auth;
    if auth.mode != crate::auth::AuthMode::None {
        return Ok(());
    }
    let open = std::iter::once(config.listen_addr())
        .chain(config.http.listen_addr())
        .find(|a| !a.ip().is_loopback());
    let Some(listen) = open else {
        return Ok(());
    };
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
