//! The baseline process: `subagentd-bench noop-server`, the library's
//! no-op AgentService ([`subagentd::server::baseline`]) until a signal.

use std::net::SocketAddr;

/// `subagentd-bench noop-server --listen ADDR`: serves until SIGTERM or
/// SIGINT, then exits 0 (the parent treats any other exit as a failure).
pub async fn serve(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    subagentd::server::baseline::serve_noop(listener, shutdown_signal()).await?;
    Ok(())
}

#[cfg(unix)]
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
