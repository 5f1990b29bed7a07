//! Health: what the server reports SERVING, and the plaintext health
//! listener for probes that cannot do TLS.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::transport::{server::TcpIncoming, Server};
use tracing::error;

use crate::{
    api::{ending::EndOnShutdown, workers::WorkerServiceImpl},
    pb::worker_service_server::WorkerServiceServer,
};

/// Health-service name of the API.
pub const SERVICE_NAME: &str = "subagents.v1.AgentService";

/// `[server] health_listen`: `grpc.health.v1` alone, in plaintext (it
/// tells nothing but SERVING or not), for probes that cannot do TLS.
pub(super) async fn serve_health<H: tonic_health::pb::health_server::Health>(
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

pub(super) async fn set_serving(health: &tonic_health::server::HealthReporter, serving: bool) {
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
