//! A running server and what an operator does with it: reload, stop
//! gracefully, abort after a store failure.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::health::set_serving;
use crate::{
    auth::Keyring,
    config::{Config, ConfigSource},
    ha::Elector,
    scheduler::{Core, Scheduler},
    store::writer::{CommitStats, Writer},
};

/// How long shutdown waits for connections to close after cancelling runs.
const CONNECTION_DRAIN: Duration = Duration::from_secs(5);

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    pub(super) addr: SocketAddr,
    /// `[server] health_listen`'s bound address.
    pub(super) health_addr: Option<SocketAddr>,
    pub(super) metrics_addr: Option<SocketAddr>,
    /// `[http] listen`'s bound address (`/mcp`).
    pub(super) http_addr: Option<SocketAddr>,
    pub(super) scheduler: Scheduler,
    pub(super) source: ConfigSource,
    pub(super) health: tonic_health::server::HealthReporter,
    pub(super) shutdown: CancellationToken,
    /// `[server] shutdown_grace`.
    pub(super) shutdown_grace: Duration,
    pub(super) tasks: Vec<JoinHandle<()>>,
    pub(super) server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The store's writer (None with `backend = "memory"`, and on a
    /// standby until it leads).
    pub(super) writer: Arc<Mutex<Option<Writer>>>,
    /// Cancelled when a commit failed: the server must stop.
    pub(super) store_failed: CancellationToken,
    /// With PostgreSQL: the election, and the task that follows it (forward
    /// while a standby; recover and serve once elected; step down).
    pub(super) ha: Option<HaHandle>,
    /// The keys calls are checked against; SIGHUP reconfigures it.
    pub(super) keyring: Arc<Keyring>,
    /// With `[server.tls]`: the certificate new connections get; SIGHUP
    /// and a change of its files reload it.
    pub(super) tls: Option<Arc<crate::tls::Acceptor>>,
}

#[derive(Debug)]
pub(super) struct HaHandle {
    pub(super) elector: Elector,
    pub(super) task: JoinHandle<()>,
    /// Cancelled when this server stopped leading: it must exit.
    pub(super) deposed: CancellationToken,
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

    /// The bound address of the `[http]` listener (`/mcp`), if it is on.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
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
