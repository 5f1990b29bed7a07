//! `log_format = "json"`: one JSON object per line, fields at the top
//! level, with the trace and span ids of the current span so a log line
//! leads to its trace.

use std::{fmt, sync::OnceLock};

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::{
    dispatcher::WeakDispatch,
    field::{Field, Visit},
    Event, Subscriber,
};
use tracing_subscriber::{
    fmt::{format::Writer, FmtContext, FormatEvent, FormatFields},
    registry::LookupSpan,
};

/// The dispatcher whose spans carry OpenTelemetry contexts. A formatter runs
/// inside the dispatcher, where `tracing` hands nested lookups a no-op
/// dispatcher, so it is kept here when the subscriber is installed.
static DISPATCH: OnceLock<WeakDispatch> = OnceLock::new();

/// Remembers the installed dispatcher (see [`DISPATCH`]).
pub fn set_dispatch(dispatch: WeakDispatch) {
    let _ = DISPATCH.set(dispatch);
}

/// The JSON line format.
#[derive(Debug, Default)]
pub struct JsonFormat;

struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::String(
                humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            ),
        );
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_owned()));
        event.record(&mut Fields(&mut line));
        // An event that names its trace (an agent's lifecycle line) keeps
        // it; others get the ids of the span they happened in.
        if !line.contains_key("trace_id") {
            if let Some((trace_id, span_id)) = current_ids(ctx) {
                line.insert("trace_id".into(), Value::String(trace_id));
                line.insert("span_id".into(), Value::String(span_id));
            }
        }
        if let Some(span) = ctx.lookup_current() {
            line.insert("span".into(), Value::String(span.name().to_owned()));
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// The OpenTelemetry trace and span id of the innermost current span.
fn current_ids<S, N>(ctx: &FmtContext<'_, S, N>) -> Option<(String, String)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let id = ctx.current_span().id()?.clone();
    let dispatch = DISPATCH.get()?.upgrade()?;
    let cx = tracing_opentelemetry::get_otel_context(&id, &dispatch)?;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::{fmt::MakeWriter, layer::SubscriberExt};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn json_lines_carry_fields_and_the_current_span_s_trace_ids() {
        let provider = SdkTracerProvider::builder().build();
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(buffer.clone())
                    .event_format(JsonFormat),
            )
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let dispatch = tracing::Dispatch::new(subscriber);
        set_dispatch(dispatch.downgrade());
        let (trace_id, span_id) = tracing::dispatcher::with_default(&dispatch, || {
            let span = tracing::info_span!("rpc");
            let _entered = span.enter();
            tracing::warn!(agent_id = "a-1", count = 3, "inside");
            let cx = span.context();
            let sc = cx.span().span_context().clone();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(line["message"], "inside");
        assert_eq!(line["agent_id"], "a-1", "fields at the top level");
        assert_eq!(line["count"], 3);
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["span"], "rpc");
        assert_eq!(line["trace_id"], trace_id.as_str());
        assert_eq!(line["span_id"], span_id.as_str());
        assert_eq!(trace_id.len(), 32);
    }
}
