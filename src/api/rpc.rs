//! One tower layer around every gRPC service: the RPC's server span (with
//! the caller's W3C trace context as its parent) and its count and latency
//! by method and status code. Handlers contain no telemetry code.
//!
//! A call ends when its response body ends, not when its headers are sent:
//! a unary success carries `grpc-status` in the trailers, a stream runs
//! until its last message, and a call the client abandons is counted when
//! the server drops its handler or its unfinished body: as
//! DEADLINE_EXCEEDED if its `grpc-timeout` had passed (the client's timer
//! and the server's race; see [`CallDeadline::has_passed`]), else as
//! CANCELLED. A call that ends DEADLINE_EXCEEDED is also logged.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{ready, Context, Poll},
    time::Instant,
};

use http_body::{Body, Frame};
use opentelemetry::propagation::Extractor;
use pin_project_lite::pin_project;
use tower::{Layer, Service};
use tracing::{field::Empty, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::api::deadline::CallDeadline;
use crate::telemetry::metrics::{ApiMetrics, RpcLabels, RpcSeries};

/// The layer (see the module docs).
#[derive(Debug, Clone)]
pub struct RpcLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    metrics: ApiMetrics,
    /// `/service/method` paths this server serves, as indexes into
    /// `methods`; others are labelled `unknown` so a client cannot grow
    /// the label set without bound.
    known: foldhash::HashMap<String, usize>,
    methods: Vec<Method>,
}

/// A method this server serves.
#[derive(Debug)]
struct Method {
    service: &'static str,
    method: &'static str,
    /// Its OK calls' series, found once: most calls end OK, and a family
    /// lookup hashes the labels under a lock each time.
    ok: OnceLock<RpcSeries>,
}

impl RpcLayer {
    /// A layer recording into `metrics`, naming the methods of `services`
    /// (decoded file descriptor sets) in its labels.
    pub fn new(metrics: ApiMetrics, descriptor_sets: &[&[u8]]) -> Self {
        let mut known = foldhash::HashMap::default();
        let mut methods = Vec::new();
        for bytes in descriptor_sets {
            let Ok(set) = <prost_types::FileDescriptorSet as prost::Message>::decode(*bytes) else {
                continue;
            };
            for file in &set.file {
                for service in &file.service {
                    for method in &service.method {
                        let path =
                            format!("/{}.{}/{}", file.package(), service.name(), method.name());
                        // Leaked once at startup: a fixed, small set of
                        // label values.
                        let service: &'static str = Box::leak(
                            format!("{}.{}", file.package(), service.name()).into_boxed_str(),
                        );
                        let method: &'static str =
                            Box::leak(method.name().to_owned().into_boxed_str());
                        known.insert(path, methods.len());
                        methods.push(Method {
                            service,
                            method,
                            ok: OnceLock::new(),
                        });
                    }
                }
            }
        }
        Self {
            shared: Arc::new(Shared {
                metrics,
                known,
                methods,
            }),
        }
    }
}

impl<S> Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`RpcLayer`] wraps around each gRPC service.
#[derive(Debug, Clone)]
pub struct RpcService<S> {
    inner: S,
    shared: Arc<Shared>,
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for RpcService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Body,
{
    type Response = http::Response<RpcBody<ResBody>>;
    type Error = S::Error;
    type Future = RpcFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        let path = req.uri().path();
        let known = self.shared.known.get(path).copied();
        let (service, method) = match known {
            Some(i) => (
                self.shared.methods[i].service,
                self.shared.methods[i].method,
            ),
            None => ("unknown", "unknown"),
        };
        // DEBUG: without an exporter (which enables it for itself) and with
        // the default RUST_LOG=info, the span is never built.
        let span = tracing::debug_span!(
            target: "subagentd::rpc",
            "rpc",
            otel.name = %path.trim_start_matches('/'),
            otel.kind = "server",
            otel.status_code = Empty,
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = method,
            rpc.grpc.status_code = Empty,
        );
        if !span.is_disabled() {
            let parent = opentelemetry::global::get_text_map_propagator(|p| {
                p.extract(&HeaderExtractor(req.headers()))
            });
            let _ = span.set_parent(parent);
        }
        // Read once for both layers: the deadline layer inside finds it in
        // the extensions, so both judge the call by the same instant.
        let deadline = CallDeadline::from_headers(req.headers());
        if let Some(d) = deadline {
            req.extensions_mut().insert(d);
        }
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        RpcFuture {
            inner: future,
            call: Some(Call {
                span,
                started: Instant::now(),
                deadline,
                service,
                method,
                known,
                shared: self.shared.clone(),
            }),
        }
    }
}

/// What is known of a call until it ends.
struct Call {
    span: Span,
    started: Instant,
    deadline: Option<CallDeadline>,
    service: &'static str,
    method: &'static str,
    /// The method's index in [`Shared::methods`], if this server serves it.
    known: Option<usize>,
    shared: Arc<Shared>,
}

impl Call {
    /// Ends a call the server dropped before it answered in full: the
    /// client went away, at its deadline or before.
    fn abandoned(self) {
        let code = if self.deadline.is_some_and(|d| d.has_passed()) {
            tonic::Code::DeadlineExceeded
        } else {
            tonic::Code::Cancelled
        };
        self.end(code);
    }

    fn end(self, code: tonic::Code) {
        let name = code_name(code);
        if code == tonic::Code::DeadlineExceeded {
            if let Some(d) = self.deadline {
                tracing::info!(
                    target: "subagentd::rpc",
                    service = self.service,
                    method = self.method,
                    code = name,
                    timeout_ms = d.timeout.as_millis() as u64,
                    "call ended: its deadline passed"
                );
            }
        }
        self.span.record("rpc.grpc.status_code", code as i32);
        if is_server_error(code) {
            self.span.record("otel.status_code", "ERROR");
        }
        let labels = RpcLabels {
            service: self.service,
            method: self.method,
            code: name,
        };
        let elapsed = self.started.elapsed();
        match self.known.map(|i| &self.shared.methods[i]) {
            Some(m) if code == tonic::Code::Ok => {
                m.ok.get_or_init(|| self.shared.metrics.rpc_series(&labels))
                    .observe(elapsed)
            }
            _ => self.shared.metrics.rpc(&labels, elapsed),
        }
    }
}

/// The codes the OpenTelemetry RPC conventions count as a server error.
fn is_server_error(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unknown | DeadlineExceeded | Unimplemented | Internal | Unavailable | DataLoss
    )
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Parsed once: a lookup by `&str` parses the name first, and every call
/// looks twice (headers, trailers).
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

fn grpc_status(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let value = headers.get(GRPC_STATUS)?.to_str().ok()?;
    Some(tonic::Code::from(value.parse::<i32>().ok()?))
}

pin_project! {
    /// The response future of [`RpcService`].
    pub struct RpcFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }

    impl<F> PinnedDrop for RpcFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before the handler answered: the client cancelled the
            // call or its deadline passed (it reset the stream).
            if let Some(call) = this.project().call.take() {
                call.abandoned();
            }
        }
    }
}

impl<F, ResBody, E> Future for RpcFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    ResBody: Body,
{
    type Output = Result<http::Response<RpcBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let polled = match this.call.as_ref() {
            Some(call) => {
                let _entered = call.span.enter();
                ready!(this.inner.poll(cx))
            }
            None => ready!(this.inner.poll(cx)),
        };
        let call = this.call.take();
        Poll::Ready(match polled {
            Ok(response) => {
                // Trailers-only response (an error status at once): the call
                // is over; otherwise it ends with the body.
                let call = match (grpc_status(response.headers()), call) {
                    (Some(code), Some(call)) => {
                        call.end(code);
                        None
                    }
                    (_, call) => call,
                };
                Ok(response.map(|inner| RpcBody { inner, call }))
            }
            Err(e) => {
                if let Some(call) = call {
                    call.end(tonic::Code::Internal);
                }
                Err(e)
            }
        })
    }
}

pin_project! {
    /// A response body that ends its call's span and metrics when it ends.
    pub struct RpcBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }

    impl<B> PinnedDrop for RpcBody<B> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before its trailers: the client went away.
            if let Some(call) = this.project().call.take() {
                call.abandoned();
            }
        }
    }
}

impl<B: Body> Body for RpcBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(trailers) = f.trailers_ref() {
                    if let Some(call) = this.call.take() {
                        call.end(grpc_status(trailers).unwrap_or(tonic::Code::Unknown));
                    }
                }
            }
            Some(Err(_)) => {
                if let Some(call) = this.call.take() {
                    call.end(tonic::Code::Internal);
                }
            }
            None => {
                if let Some(call) = this.call.take() {
                    call.end(tonic::Code::Unknown);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
