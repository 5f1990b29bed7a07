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
