//! A server on PostgreSQL as the election goes: a standby forwards to the
//! leader and is SERVING while the leader answers; once elected it
//! recovers and serves; when it stops leading it stops its runs.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use super::{
    health::{set_serving, SERVICE_NAME},
    recovery::recover,
};
use crate::{
    api::{
        forward::{LeaderTls, Route},
        gate::RecoveryGate,
    },
    config::Config,
    ha::{self, Role, Timing},
    scheduler::Scheduler,
    store::writer::Writer,
    telemetry::metrics::Metrics,
};

/// What a server on PostgreSQL does as the election goes: forward while a
/// standby, recover and serve once elected, stop its runs and exit when it
/// stops leading.
pub(super) struct Follower {
    pub(super) config: Config,
    pub(super) scheduler: Scheduler,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: tonic_health::server::HealthReporter,
    pub(super) gate: RecoveryGate,
    pub(super) writer: Arc<Mutex<Option<Writer>>>,
    pub(super) store_failed: CancellationToken,
    pub(super) deposed: CancellationToken,
    pub(super) route: watch::Sender<Route>,
    pub(super) timing: Timing,
    /// With `[server.tls]`: how to reach the leader.
    pub(super) leader_tls: Option<Arc<LeaderTls>>,
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
    pub(super) async fn run(
        self,
        mut role: watch::Receiver<Role>,
        leader: watch::Receiver<Option<String>>,
    ) {
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

/// How a standby reaches the leader over TLS: the leader's certificate
/// verified with `[ha] tls_ca_file` (else the client CA, else the web
/// roots) for `[ha] tls_server_name` (else this server's own certificate's
/// DNS name: replicas share one), presenting this server's certificate, so
/// that the leader knows a replica and trusts the callers it forwards.
pub(super) fn leader_tls(
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
