//! The server's background tasks: the retention sweeper, the keys
//! directory and TLS file polls, and the JWKS refresh.

use std::{sync::Arc, time::Duration};

use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::follower::leader_tls;
use crate::{api::forward::LeaderTls, auth::Keyring, config::Config, scheduler::Scheduler};

/// Forgets finished agents past retention, as often as the retention
/// asks.
pub(super) fn sweeper(scheduler: Scheduler) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(scheduler.sweep_interval()).await;
            scheduler.sweep();
        }
    })
}

/// Re-reads `[auth] keys_dir` every few seconds.
pub(super) fn poll_keys_dir(keyring: Arc<Keyring>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(crate::auth::keyring::KEYS_DIR_POLL).await;
            let keyring = keyring.clone();
            // File reads: off the runtime's worker threads.
            let _ = tokio::task::spawn_blocking(move || keyring.refresh()).await;
        }
    })
}

/// Loads `[auth.jwt]`'s keys before serving: a JWKS file that cannot be
/// read fails the start; an issuer briefly away is retried by
/// [`refresh_jwks`].
pub(super) async fn load_jwks_at_start(
    keyring: &Keyring,
    http: &reqwest::Client,
) -> anyhow::Result<()> {
    if let Some(verifier) = keyring.jwt() {
        match verifier.load(http).await {
            Ok(keys) => info!(keys, "JWKS loaded"),
            Err(e) if verifier.config().jwks_url.is_empty() => {
                anyhow::bail!("[auth.jwt] jwks_file: {e}")
            }
            // The issuer may be briefly away: the refresh task retries.
            Err(e) => warn!(error = %e, "JWKS not loaded yet; no JWT is accepted until it is"),
        }
    }
    Ok(())
}

/// Re-reads the TLS files every few seconds; a changed certificate is also
/// what a standby presents to the leader from then on.
pub(super) fn poll_tls_files(
    acceptor: Arc<crate::tls::Acceptor>,
    forward_tls: Option<Arc<LeaderTls>>,
    config: &Config,
    advertised: &str,
) -> JoinHandle<()> {
    let (config, advertised) = (Arc::new(config.clone()), Arc::new(advertised.to_owned()));
    tokio::spawn(async move {
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
    })
}

/// Keeps `[auth.jwt]`'s keys fresh: every `jwks_refresh` (every 10 s
/// while fetches fail), at once when a call names an unknown key id (at
/// most once a minute, see `JwtVerifier::request_early_fetch`), and at
/// once for a verifier a reload made.
pub(super) async fn refresh_jwks(keyring: Arc<Keyring>, http: reqwest::Client) {
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
