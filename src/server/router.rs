//! The gRPC listener: the tower layers every call passes (RPC span and
//! counts, deadline, authentication, a standby's forwarding) around the
//! services (health, reflection, AgentService, WorkerService), served on
//! the bound listener with or without TLS.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures_util::StreamExt as _;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tonic::{
    service::interceptor::InterceptedService,
    transport::{
        server::{Connected, TcpIncoming},
        Server,
    },
};

use crate::{
    api::{
        auth::AuthLayer, deadline::DeadlineLayer, ending::EndOnShutdown, forward::ForwardLayer,
        gate::RecoveryGate, rpc::RpcLayer, service::AgentServiceImpl,
        watch_route::AgentServiceRouter, workers::WorkerServiceImpl,
    },
    auth::SharedAuthenticator,
    config::Config,
    pb::{self, worker_service_server::WorkerServiceServer},
    scheduler::Scheduler,
    telemetry::metrics::Metrics,
};

/// What the router is made of, beyond the config.
pub(super) struct Parts<H> {
    pub(super) listener: TcpListener,
    pub(super) scheduler: Scheduler,
    pub(super) metrics: Arc<Metrics>,
    pub(super) authenticator: SharedAuthenticator,
    pub(super) tls: Option<Arc<crate::tls::Acceptor>>,
    /// A standby's forwarding (servers that can be standbys only).
    pub(super) forward: Option<ForwardLayer>,
    pub(super) health: tonic_health::pb::health_server::HealthServer<H>,
    pub(super) gate: RecoveryGate,
    pub(super) shutdown: CancellationToken,
}

/// Serves the API on `parts.listener` until `parts.shutdown`.
pub(super) fn serve<H: tonic_health::pb::health_server::Health>(
    config: &Config,
    parts: Parts<H>,
) -> anyhow::Result<JoinHandle<Result<(), tonic::transport::Error>>> {
    let Parts {
        listener,
        scheduler,
        metrics,
        authenticator,
        tls,
        forward,
        health,
        gate,
        shutdown,
    } = parts;
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    let service = AgentServiceImpl::new(scheduler.clone(), shutdown.clone())
        .with_metrics(metrics.api())
        .with_mcp(config.mcp);
    let rpc_layer = rpc_layer(&metrics);
    let workers = WorkerServiceImpl::new(scheduler, shutdown.clone());
    let abuse = &config.server;
    let message_limit = config.server.message_limit(&config.limits);
    let router = Server::builder()
        // Keepalive is how a silently dead worker is noticed: an
        // unanswered PING closes the connection, which ends its
        // session and fails (or retries) its runs.
        .http2_keepalive_interval(Some(config.server.keepalive_interval))
        .http2_keepalive_timeout(Some(config.server.keepalive_timeout))
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
        .layer(AuthLayer::new(authenticator, tls.clone()))
        // A standby relays AgentService and WorkerService calls to
        // the leader; counted and deadline-checked here as well.
        .layer(tower::util::option_layer(forward))
        // Health.Watch streams end at shutdown (after the
        // NOT_SERVING update) instead of holding the exit back.
        .add_service(EndOnShutdown::new(
            health,
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
            WorkerServiceServer::new(workers).max_decoding_message_size(message_limit.max(4 << 20)),
            gate,
        ));
    Ok(match &tls {
        Some(acceptor) => tokio::spawn(
            router.serve_with_incoming_shutdown(
                crate::tls::incoming(listener, acceptor.clone(), shutdown.clone())
                    .map(|conn| conn.map(CopiedWrites)),
                shutdown.cancelled_owned(),
            ),
        ),
        None => tokio::spawn(
            router.serve_with_incoming_shutdown(
                // Without TCP_NODELAY small responses wait for the peer's
                // delayed ACK (Nagle): ~40 ms per call at low concurrency.
                TcpIncoming::from(listener)
                    .with_nodelay(Some(true))
                    .map(|conn| conn.map(CopiedWrites)),
                shutdown.cancelled_owned(),
            ),
        ),
    })
}

/// One server span and the RPC counts per call, over every service's
/// descriptors (so each call is named by its method).
fn rpc_layer(metrics: &Metrics) -> RpcLayer {
    RpcLayer::new(
        metrics.api(),
        &[
            pb::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ],
    )
}

type Reflection<S> = tonic_reflection::server::v1::ServerReflectionServer<S>;
type ReflectionAlpha<S> = tonic_reflection::server::v1alpha::ServerReflectionServer<S>;

/// Server reflection, v1 and v1alpha, over the API's and health's
/// descriptors.
fn reflection() -> anyhow::Result<(
    Reflection<impl tonic_reflection::server::v1::ServerReflection>,
    ReflectionAlpha<impl tonic_reflection::server::v1alpha::ServerReflection>,
)> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok((v1, v1alpha))
}

/// A connection that tells h2 it takes no vectored writes, so h2 copies
/// small DATA frames into its write buffer.
///
/// Why: h2 copies a DATA frame's payload into that buffer only below a
/// threshold (256 bytes with vectored I/O, 1 KiB without); a larger one is
/// kept aside and must be written before any frame after it. A background
/// Spawn's answer has been ~280 bytes since it lists its attempts, so every
/// answer went out in two writes, its trailers alone in the second, and no
/// two answers shared one (BENCHMARKS.md, issue 36). Copying up to 1 KiB
/// costs far less than a write. Larger frames are still written from
/// their own buffer, in a write of their own.
struct CopiedWrites<T>(T);

impl<T: Connected> Connected for CopiedWrites<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CopiedWrites<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CopiedWrites<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}
