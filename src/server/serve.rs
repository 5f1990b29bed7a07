//! `subagentd serve`: the process around a server — signals, the
//! restart as a standby after losing the lease, the telemetry flush.

use anyhow::Context;
use tracing::{error, info, warn};

use super::{handle::ServerHandle, start::start};
use crate::{
    cli::ServeArgs,
    config::{Config, ConfigSource},
    telemetry,
};

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
