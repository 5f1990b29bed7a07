//! Forwarding: a standby relays every AgentService and WorkerService call
//! to the leader, at the HTTP/2 level.
//!
//! One generic service, not one per method: the request goes out as it
//! came in (path, metadata, message frames, deadline), and the leader's
//! answer comes back as it was sent (headers, messages, trailers with the
//! status and its details), so a client cannot tell a forwarded call from
//! a direct one. Health and reflection are always answered locally.
//!
//! A forwarded call never hangs on a leader that went away: the
//! connection's keepalive notices a dead or frozen peer, and a change of
//! leader ends the calls relayed to the old one. Either way the call ends
//! `UNAVAILABLE` (retryable); the standby does not retry it itself, since
//! it cannot know whether the leader acted on it.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body::Frame;
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{
    body::Body,
    transport::{Channel, Endpoint},
};
use tower::{Layer, Service, ServiceExt};

use crate::scheduler::Error;

use super::auth::{CallerSans, FORWARDED_SANS_HEADER};

/// The header a standby adds to what it forwards: a server receiving a
/// call that carries it never forwards it again (two standbys with stale
/// views of the leader would otherwise bounce it between them).
pub const FORWARDED_HEADER: &str = "subagentd-forwarded-by";

/// The paths a standby forwards; everything else is served locally.
const FORWARDED_PREFIXES: [&str; 2] = [
    "/subagents.v1.AgentService/",
    "/subagents.v1.WorkerService/",
];

/// Where this server sends AgentService and WorkerService calls.
#[derive(Debug, Clone)]
pub enum Route {
    /// This server leads: its own services answer.
    Local,
    /// Another server leads, at `address`; `gone` is cancelled when it
    /// stops being the leader this server forwards to.
    Forward {
        /// The leader's advertised `host:port`.
        address: String,
        /// Ends the calls relayed to this leader.
        gone: CancellationToken,
    },
    /// No leader known: calls are refused `UNAVAILABLE NO_LEADER`.
    NoLeader {
        /// Why, for the message.
        why: String,
    },
}

/// Connection settings of the channel to the leader.
#[derive(Debug, Clone)]
pub struct ForwardSettings {
    /// With `[server.tls]`: TLS to the leader, presenting this server's
    /// own certificate.
    pub tls: Option<Arc<LeaderTls>>,
    /// How long connecting to the leader may take.
    pub connect_timeout: Duration,
    /// HTTP/2 PING interval on the connection to the leader.
    pub keepalive_interval: Duration,
    /// How long an unanswered PING may take before the connection (and
    /// every call on it) is closed.
    pub keepalive_timeout: Duration,
}

/// The client TLS a standby presents to the leader, replaced when this
/// server's certificate files change (a rotated Secret): channels made
/// after that use the new one; calls on an older channel end on it.
#[derive(Debug)]
pub struct LeaderTls {
    /// The certificate generation it was built from, and the config.
    current: arc_swap::ArcSwap<(u64, tonic::transport::ClientTlsConfig)>,
}

impl LeaderTls {
    /// Built from certificate generation `generation`.
    pub fn new(generation: u64, config: tonic::transport::ClientTlsConfig) -> Self {
        Self {
            current: arc_swap::ArcSwap::from_pointee((generation, config)),
        }
    }

    /// The generation it was built from and the config.
    pub fn current(&self) -> Arc<(u64, tonic::transport::ClientTlsConfig)> {
        self.current.load_full()
    }

    /// Replaces the config with one built from `generation`.
    pub fn replace(&self, generation: u64, config: tonic::transport::ClientTlsConfig) {
        self.current.store(Arc::new((generation, config)));
    }
}

/// The layer (see the module docs).
#[derive(Debug, Clone)]
pub struct ForwardLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    route: watch::Receiver<Route>,
    /// This server's advertised address (the forwarded-by header).
    me: http::HeaderValue,
    settings: ForwardSettings,
    /// The channel to the current leader, by its address and the TLS
    /// generation it was made with.
    channel: Mutex<Option<(String, u64, Channel)>>,
}

impl ForwardLayer {
    /// Routes by `route`; `me` is this server's advertised address.
    pub fn new(route: watch::Receiver<Route>, me: &str, settings: ForwardSettings) -> Self {
        Self {
            shared: Arc::new(Shared {
                route,
                me: http::HeaderValue::from_str(me)
                    .unwrap_or_else(|_| http::HeaderValue::from_static("standby")),
                settings,
                channel: Mutex::new(None),
            }),
        }
    }
}

impl Shared {
    /// The channel to `address`, made lazily once per leader and again
    /// when this server's certificate changed.
    fn channel(&self, address: &str) -> Result<Channel, String> {
        let s = &self.settings;
        let tls = s.tls.as_ref().map(|t| t.current());
        let generation = tls.as_ref().map_or(0, |t| t.0);
        let mut cached = self.channel.lock();
        if let Some((known, made_with, channel)) = &*cached {
            if known == address && *made_with == generation {
                return Ok(channel.clone());
            }
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| format!("the leader's address {address:?} is not a URI: {e}"))?;
        if let Some(tls) = &tls {
            endpoint = endpoint
                .tls_config(tls.1.clone())
                .map_err(|e| format!("TLS to the leader at {address}: {e}"))?;
        }
        let channel = endpoint
            .connect_timeout(s.connect_timeout)
            .http2_keep_alive_interval(s.keepalive_interval)
            .keep_alive_timeout(s.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true)
            .connect_lazy();
        *cached = Some((address.to_owned(), generation, channel.clone()));
        Ok(channel)
    }
}

impl<S> Layer<S> for ForwardLayer {
    type Service = ForwardService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ForwardService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Replaces whatever [`FORWARDED_SANS_HEADER`] a caller sent with the SANs
/// of its own verified certificate, when that is its credential (a
/// bearer credential travels in its own header).
fn pass_on_certificate(req: &mut http::Request<Body>) {
    req.headers_mut().remove(FORWARDED_SANS_HEADER);
    if req.headers().contains_key(http::header::AUTHORIZATION) {
        return;
    }
    let sans = req.extensions().get::<CallerSans>().map(|c| c.0.join(" "));
    if let Some(value) = sans.and_then(|s| http::HeaderValue::from_str(&s).ok()) {
        req.headers_mut().insert(FORWARDED_SANS_HEADER, value);
    }
}

/// The service [`ForwardLayer`] wraps around the server's routes.
#[derive(Debug, Clone)]
pub struct ForwardService<S> {
    inner: S,
    shared: Arc<Shared>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, ResBody> Service<http::Request<Body>> for ForwardService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        let path = req.uri().path();
        let route = if FORWARDED_PREFIXES.iter().any(|p| path.starts_with(p)) {
            self.shared.route.borrow().clone()
        } else {
            Route::Local
        };
        match route {
            Route::Local => {
                let fut = self.inner.call(req);
                Box::pin(async move { Ok(fut.await?.map(Body::new)) })
            }
            Route::NoLeader { why } => Box::pin(async move { Ok(refuse(why)) }),
            Route::Forward { .. } if req.headers().contains_key(FORWARDED_HEADER) => {
                let why = "the server this call was forwarded to is not the leader either".into();
                Box::pin(async move { Ok(refuse(why)) })
            }
            Route::Forward { address, gone } => {
                let channel = match self.shared.channel(&address) {
                    Ok(channel) => channel,
                    Err(why) => return Box::pin(async move { Ok(refuse(why)) }),
                };
                req.headers_mut()
                    .insert(FORWARDED_HEADER, self.shared.me.clone());
                pass_on_certificate(&mut req);
                Box::pin(async move {
                    let sent = tokio::select! {
                        sent = channel.oneshot(req) => sent,
                        () = gone.clone().cancelled_owned() => {
                            return Ok(refuse(format!("the route to the leader at {address} ended (a new leader, or this server is stopping)")));
                        }
                    };
                    Ok(match sent {
                        // A trailers-only response (how an error without
                        // messages is answered): its status is in the
                        // headers and nothing follows. Relayed with a body
                        // that is empty from the start, so the headers go
                        // out with END_STREAM as the leader sent them; an
                        // empty DATA frame after them is not a valid gRPC
                        // response to grpc-core clients.
                        Ok(response) if response.headers().contains_key("grpc-status") => {
                            response.map(|_| Body::empty())
                        }
                        Ok(response) => response.map(|body| {
                            Body::new(Relay {
                                inner: body,
                                gone: Some(Box::pin(gone.cancelled_owned())),
                                address,
                                ended: false,
                            })
                        }),
                        Err(e) => refuse(format!("the leader at {address} is unreachable: {e}")),
                    })
                })
            }
        }
    }
}

/// `UNAVAILABLE NO_LEADER`, as a complete gRPC response.
fn refuse(why: String) -> http::Response<Body> {
    tonic::Status::from(Error::NoLeader { why }).into_http()
}

/// The leader's response body, relayed; a connection lost mid-call (or a
/// change of leader) ends it with `UNAVAILABLE` trailers instead of a
/// reset stream, which clients would report as INTERNAL or CANCELLED.
struct Relay {
    inner: Body,
    gone: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    address: String,
    ended: bool,
}

impl Relay {
    fn unavailable(&mut self, why: String) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        self.ended = true;
        let status = tonic::Status::unavailable(why);
        let mut trailers = http::HeaderMap::new();
        match status.add_header(&mut trailers) {
            Ok(()) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(gone) = self.gone.as_mut() {
            if gone.as_mut().poll(cx).is_ready() {
                self.gone = None;
                let why = format!(
                    "the route to the leader at {} ended mid-call (a new leader, or this server is stopping); retry",
                    self.address
                );
                return self.unavailable(why);
            }
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                let why = format!("lost the leader at {} mid-call: {e}", self.address);
                self.unavailable(why)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if frame.is_trailers() {
                    self.ended = true;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }
}
