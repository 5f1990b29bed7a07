//! Run spans: `invoke_agent {agent}` (OpenTelemetry GenAI conventions),
//! built from what the scheduler recorded and handed to the same batch
//! processor as the RPC spans.
//!
//! Why not `tracing` spans held open for the run: a run outlives every task
//! and call that touches it, its span ids must be known when the agent is
//! admitted (the record shows its trace id, children point at it, the runner
//! gets a `traceparent`), and its times are the scheduler's own. So the
//! scheduler picks the ids, and this module writes the finished span with
//! exactly those ids and times ([`SpanData`] straight to the processor).

use std::{borrow::Cow, sync::Arc, time::Duration};

use opentelemetry::{
    trace::{Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceState},
    Context, InstrumentationScope, KeyValue,
};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    trace::{
        BatchSpanProcessor, Sampler, SamplingDecision, ShouldSample, Span, SpanData, SpanEvents,
        SpanLinks, SpanProcessor,
    },
    Resource,
};

use crate::scheduler::{
    trace::{EndedRun, SpanEventKind, SpanSink, TraceContext, TraceId},
    AgentStatus,
};

/// The OpenTelemetry span context of a domain [`TraceContext`].
pub fn otel_context(cx: &TraceContext, remote: bool) -> SpanContext {
    SpanContext::new(
        opentelemetry::trace::TraceId::from_bytes(cx.trace_id.get().to_be_bytes()),
        SpanId::from_bytes(cx.span_id.to_be_bytes()),
        if cx.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        },
        remote,
        TraceState::default(),
    )
}

/// The domain context of an OpenTelemetry span context (None if invalid).
pub fn domain_context(sc: &SpanContext) -> Option<TraceContext> {
    if !sc.is_valid() {
        return None;
    }
    Some(TraceContext {
        trace_id: TraceId::new(u128::from_be_bytes(sc.trace_id().to_bytes()))?,
        span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
        sampled: sc.is_sampled(),
    })
}

/// One batch processor shared by the tracer provider (RPC spans from
/// `tracing`) and [`RunSpans`] (run spans), so both leave through one
/// queue and one exporter and are flushed together on shutdown.
#[derive(Debug, Clone)]
pub struct SharedProcessor(pub Arc<BatchSpanProcessor>);

impl SpanProcessor for SharedProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.0.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    // The resource is given to the processor before it is shared.
    fn set_resource(&mut self, _resource: &Resource) {}
}

/// The [`SpanSink`] of the scheduler.
#[derive(Debug)]
pub struct RunSpans {
    processor: SharedProcessor,
    sampler: Sampler,
    scope: InstrumentationScope,
}

impl RunSpans {
    /// Run spans sampled by `sampler`, written to `processor`.
    pub fn new(processor: SharedProcessor, sampler: Sampler) -> Self {
        Self {
            processor,
            sampler,
            scope: InstrumentationScope::builder("subagentd")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        }
    }

    /// The span of an ended run (None if its span is not recorded).
    pub fn span_data(&self, run: EndedRun) -> Option<SpanData> {
        let trace = run.trace?;
        let a = &run.agent;
        let (provider, model) = a.model.split_once('/').unwrap_or(("", &a.model));
        let start = a.started_at.unwrap_or(a.created_at);
        let end = a.finished_at.unwrap_or(start);
        // Never started (cancelled or expired while queued): it waited
        // until the end.
        let queue_wait = a
            .started_at
            .unwrap_or(end)
            .duration_since(a.created_at)
            .unwrap_or_default();
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "invoke_agent"),
            KeyValue::new("gen_ai.agent.id", a.id.to_string()),
            KeyValue::new("gen_ai.agent.name", a.agent.to_string()),
            KeyValue::new("gen_ai.request.model", model.to_owned()),
            KeyValue::new("gen_ai.provider.name", provider.to_owned()),
            KeyValue::new("gen_ai.usage.input_tokens", saturate(a.usage.input_tokens)),
            KeyValue::new(
                "gen_ai.usage.output_tokens",
                saturate(a.usage.output_tokens),
            ),
            KeyValue::new("subagentd.tenant", a.tenant.to_string()),
            KeyValue::new("subagentd.depth", i64::from(a.depth)),
            KeyValue::new("subagentd.root_id", a.root_id.to_string()),
            KeyValue::new("subagentd.bucket", a.bucket.to_string()),
            KeyValue::new("subagentd.background", a.background),
            KeyValue::new("subagentd.queue_wait_ms", saturate(queue_wait.as_millis())),
            KeyValue::new("subagentd.status", a.status.name()),
            KeyValue::new("subagentd.attempt", i64::from(a.attempt)),
            KeyValue::new("subagentd.tool_calls", saturate(a.usage.tool_calls)),
        ];
        if let Some(parent) = a.parent_id {
            attributes.push(KeyValue::new("subagentd.parent_id", parent.to_string()));
        }
        if let Some(lead) = &a.lead_id {
            attributes.push(KeyValue::new("subagentd.lead_id", lead.to_string()));
        }
        if let Some(e) = &a.error {
            attributes.push(KeyValue::new("subagentd.error_code", e.code.to_string()));
        }
        let status = match (a.status, &a.error) {
            (AgentStatus::Failed, Some(e)) => Status::error(format!("{}: {}", e.code, e.message)),
            (AgentStatus::Failed, None) => Status::error("failed"),
            _ => Status::Unset,
        };
        let events = trace
            .span
            .events
            .iter()
            .map(|e| {
                let (name, attributes) = match &e.kind {
                    SpanEventKind::SteerDelivered { bytes } => (
                        "steer_delivered",
                        vec![KeyValue::new("subagentd.steer.bytes", saturate(*bytes))],
                    ),
                    SpanEventKind::ApprovalRequested { tool } => (
                        "approval_requested",
                        vec![KeyValue::new("gen_ai.tool.name", tool.to_string())],
                    ),
                    SpanEventKind::Cancelled { reason } => (
                        "cancelled",
                        vec![KeyValue::new("subagentd.cancel.reason", reason.to_string())],
                    ),
                    SpanEventKind::Retrying { attempt } => (
                        "retrying",
                        vec![KeyValue::new("subagentd.attempt", i64::from(*attempt))],
                    ),
                };
                opentelemetry::trace::Event::new(name, e.at, attributes, 0)
            })
            .collect();
        let links = trace
            .span
            .link
            .iter()
            .map(|rpc| {
                Link::new(
                    otel_context(rpc, false),
                    vec![KeyValue::new("subagentd.link", "spawn_rpc")],
                    0,
                )
            })
            .collect();
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        span_events.dropped_count = trace.span.dropped_events;
        let mut span_links = SpanLinks::default();
        span_links.links = links;
        Some(SpanData {
            span_context: otel_context(&trace.context, false),
            parent_span_id: trace.span.parent.map_or(SpanId::INVALID, |p| {
                SpanId::from_bytes(p.span_id.to_be_bytes())
            }),
            // A root's parent is the Spawn caller's span, in another process.
            parent_span_is_remote: trace.span.parent.is_some() && a.parent_id.is_none(),
            span_kind: SpanKind::Internal,
            name: Cow::Owned(format!("invoke_agent {}", a.agent)),
            start_time: start,
            end_time: end,
            attributes,
            dropped_attributes_count: 0,
            events: span_events,
            links: span_links,
            status,
            instrumentation_scope: self.scope.clone(),
        })
    }
}

fn saturate<T: TryInto<i64>>(v: T) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

impl SpanSink for RunSpans {
    fn sample(&self, parent: Option<&TraceContext>, trace_id: TraceId, _agent: &str) -> bool {
        let parent_cx =
            parent.map(|p| Context::new().with_remote_span_context(otel_context(p, true)));
        let decision = self.sampler.should_sample(
            parent_cx.as_ref(),
            opentelemetry::trace::TraceId::from_bytes(trace_id.get().to_be_bytes()),
            "invoke_agent",
            &SpanKind::Internal,
            &[],
            &[],
        );
        decision.decision == SamplingDecision::RecordAndSample
    }

    fn export(&self, run: EndedRun) {
        if let Some(span) = self.span_data(run) {
            self.processor.on_end(span);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::SystemTime};

    use super::*;
    use crate::scheduler::{
        trace::{RunTrace, SpanRecord},
        AgentError, AgentView,
    };

    #[derive(Debug)]
    struct Discard;

    impl opentelemetry_sdk::trace::SpanExporter for Discard {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Ok(())
        }
    }

    fn sink(sampler: Sampler) -> RunSpans {
        let processor = BatchSpanProcessor::builder(Discard).build();
        RunSpans::new(SharedProcessor(Arc::new(processor)), sampler)
    }

    fn cx(sampled: bool) -> TraceContext {
        TraceContext {
            trace_id: TraceId::new(0xabc).unwrap(),
            span_id: 0x42,
            sampled,
        }
    }

    #[test]
    fn sampling_follows_the_configured_sampler_and_the_parent_s_flag() {
        let parent_based = sink(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let id = TraceId::new(7).unwrap();
        assert!(parent_based.sample(None, id, "a"));
        assert!(parent_based.sample(Some(&cx(true)), id, "a"));
        assert!(!parent_based.sample(Some(&cx(false)), id, "a"));
        let never = sink(Sampler::TraceIdRatioBased(0.0));
        assert!(!never.sample(None, id, "a"));
        let always = sink(Sampler::AlwaysOn);
        assert!(always.sample(Some(&cx(false)), id, "a"));
    }

    fn agent(status: AgentStatus) -> AgentView {
        let now = SystemTime::now();
        AgentView {
            tenant: "team-a".into(),
            id: uuid::Uuid::now_v7(),
            agent: "coder".into(),
            model: "acme/m1".into(),
            description: "".into(),
            parent_id: None,
            root_id: uuid::Uuid::now_v7(),
            lead_id: None,
            depth: 1,
            status,
            created_at: now,
            started_at: Some(now + Duration::from_millis(1500)),
            finished_at: Some(now + Duration::from_secs(3)),
            collected_at: None,
            workspace: None,
            result: "".into(),
            error: (status == AgentStatus::Failed).then(|| AgentError::new("EXIT_2", "bad")),
            approval: None,
            usage: Default::default(),
            total_usage: Default::default(),
            labels: Default::default(),
            background: true,
            detached: false,
            queue_reason: None,
            bucket: "acme/m1".into(),
            worker_id: None,
            attempt: 1,
            trace_id: TraceId::new(0xabc).unwrap(),
            continuation: None,
            attempts: None,
        }
    }

    #[test]
    fn a_run_span_has_the_scheduler_s_ids_times_and_status() {
        let s = sink(Sampler::AlwaysOn);
        let trace = RunTrace {
            context: cx(true),
            span: SpanRecord {
                parent: Some(TraceContext {
                    span_id: 0x41,
                    ..cx(true)
                }),
                ..SpanRecord::default()
            },
        };
        let a = agent(AgentStatus::Failed);
        let data = s
            .span_data(EndedRun {
                agent: a.clone(),
                trace: Some(trace),
            })
            .expect("recorded");
        assert_eq!(data.name, "invoke_agent coder");
        assert_eq!(
            data.span_context.span_id(),
            SpanId::from_bytes(0x42u64.to_be_bytes())
        );
        assert_eq!(
            data.parent_span_id,
            SpanId::from_bytes(0x41u64.to_be_bytes())
        );
        assert!(
            data.parent_span_is_remote,
            "a root's parent is the caller's"
        );
        assert_eq!(Some(data.start_time), a.started_at);
        assert_eq!(Some(data.end_time), a.finished_at);
        assert!(
            matches!(data.status, Status::Error { ref description } if description.contains("EXIT_2"))
        );
        let wait = data
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "subagentd.queue_wait_ms")
            .map(|kv| kv.value.clone());
        assert_eq!(wait, Some(opentelemetry::Value::I64(1500)));
        let unrecorded = s.span_data(EndedRun {
            agent: agent(AgentStatus::Done),
            trace: None,
        });
        assert!(unrecorded.is_none());
    }
}
