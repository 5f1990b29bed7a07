//! Traces, metrics and logs (`[telemetry]`).
//!
//! [`init`] installs the log subscriber and, when an OTLP endpoint is set,
//! the OpenTelemetry pipeline: one tracer provider whose batch processor
//! also receives the run spans ([`spans::RunSpans`]). Without an endpoint
//! nothing is exported and the request path is unchanged (the RPC spans
//! are DEBUG-level and never built). The returned guard flushes spans and
//! log lines when the server stops.

pub mod logs;
pub mod metrics;
pub mod spans;

use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use opentelemetry::{
    propagation::TextMapCompositePropagator, trace::TraceContextExt, trace::TracerProvider as _,
    KeyValue,
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    propagation::{BaggagePropagator, TraceContextPropagator},
    trace::{BatchSpanProcessor, Sampler, SdkTracerProvider, SpanProcessor as _},
    Resource,
};
use tracing::{Level, Metadata};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{filter::filter_fn, layer::SubscriberExt, EnvFilter, Layer};

use crate::{
    config::{LogFormat, TelemetryConfig},
    scheduler::trace::{SpanSink, TraceContext},
};

/// The run-span sink [`init`] built, for the scheduler (None: no exporter).
static RUN_SPANS: OnceLock<Arc<spans::RunSpans>> = OnceLock::new();

/// The scheduler's span sink, when [`init`] configured an exporter.
pub fn run_span_sink() -> Option<Arc<dyn SpanSink>> {
    RUN_SPANS.get().map(|s| Arc::clone(s) as Arc<dyn SpanSink>)
}

/// The context of the current `tracing` span (the RPC's server span inside
/// a handler), when spans are exported.
pub fn current_span_context() -> Option<TraceContext> {
    RUN_SPANS.get()?;
    let cx = tracing::Span::current().context();
    let span = cx.span();
    spans::domain_context(span.span_context())
}

/// Keeps the pipelines alive; flushes them when shut down or dropped.
#[must_use = "dropping the guard flushes and stops telemetry"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    _logs: tracing_appender::non_blocking::WorkerGuard,
}

impl std::fmt::Debug for TelemetryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryGuard")
            .field("exporting", &self.provider.is_some())
            .finish_non_exhaustive()
    }
}

impl TelemetryGuard {
    /// Exports what is still queued and stops the exporter.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                // The log pipeline may be gone already.
                eprintln!("subagentd: flushing spans at shutdown failed: {e}");
            }
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the OpenTelemetry layer sees: the RPC spans, and warnings and
/// errors (as span events of the RPC they happen in).
fn exported(meta: &Metadata<'_>) -> bool {
    if meta.is_span() {
        meta.target() == "subagentd::rpc"
    } else {
        *meta.level() <= Level::WARN
    }
}

/// The sampler `[telemetry] traces_sampler` names (validated in config).
fn sampler(config: &TelemetryConfig) -> Sampler {
    let ratio = config.sampler_ratio();
    match config.traces_sampler.as_str() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
        }
        _ => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
    }
}

fn provider(config: &TelemetryConfig) -> anyhow::Result<(SdkTracerProvider, spans::RunSpans)> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(config.otlp_endpoint.trim())
        .build()
        .context("cannot build the OTLP exporter ([telemetry] otlp_endpoint)")?;
    let resource = Resource::builder_empty()
        .with_service_name(config.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attributes(
            config
                .resource_pairs()
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v)),
        )
        .build();
    let mut processor = BatchSpanProcessor::builder(exporter).build();
    processor.set_resource(&resource);
    let shared = spans::SharedProcessor(Arc::new(processor));
    let sampler = sampler(config);
    let provider = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_sampler(sampler.clone())
        .with_span_processor(shared.clone())
        .build();
    Ok((provider, spans::RunSpans::new(shared, sampler)))
}

/// Log lines the writer thread's queue holds. The queue is allocated and
/// touched whole at start: tracing-appender's default (128,000 lines of 32
/// bytes) was 4 MiB of an idle server's RSS. A server logs a few lines per
/// second at `info`; 4,096 lines ride out a stalled stderr for minutes.
const LOG_QUEUE_LINES: usize = 4_096;

/// Installs logging and, with an endpoint, span export. Call once, inside
/// the Tokio runtime (the OTLP exporter's channel lives on it).
pub fn init(config: &TelemetryConfig) -> anyhow::Result<TelemetryGuard> {
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
    // Log lines go through a queue to a writer thread: a slow stderr (a
    // full pipe to the container runtime) never blocks a request thread.
    // When the queue is full, lines are dropped rather than waited for.
    let (writer, log_guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .lossy(true)
        .finish(std::io::stderr());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = match config.log_format {
        LogFormat::Pretty => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .event_format(logs::JsonFormat)
            .boxed(),
    }
    .with_filter(filter);
    let (provider, otel) = if config.otlp_endpoint.trim().is_empty() {
        (None, None)
    } else {
        let (provider, run_spans) = provider(config)?;
        // RPC spans carry the RPC conventions' attributes only: no source
        // location, thread or busy/idle timings (noise in a trace backend,
        // and work on every call).
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("subagentd"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(filter_fn(exported));
        let _ = RUN_SPANS.set(Arc::new(run_spans));
        (Some(provider), Some(layer))
    };
    let subscriber = tracing_subscriber::registry().with(fmt).with(otel);
    let dispatch = tracing::Dispatch::new(subscriber);
    logs::set_dispatch(dispatch.downgrade());
    tracing::dispatcher::set_global_default(dispatch)
        .context("a global tracing subscriber is already installed")?;
    Ok(TelemetryGuard {
        provider,
        _logs: log_guard,
    })
}
