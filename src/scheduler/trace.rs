//! Where runs sit in distributed traces, in domain terms.
//!
//! The scheduler decides each run's trace identity when the agent is
//! admitted (so the record can show its trace id at once and children can
//! point at it), collects the few events an operator wants on the run's
//! span, and hands the finished run to a [`SpanSink`]. It knows nothing of
//! OpenTelemetry: `crate::telemetry` implements the sink and turns these
//! values into exported spans.

use std::{fmt, sync::Arc, time::SystemTime};

pub use super::trace_id::{random_span_id, SpawnTrace, TraceContext, TraceId};
use super::types::AgentView;

/// Something worth a mark on a run's span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanEventKind {
    /// A steer message reached the running run.
    SteerDelivered {
        /// Length of the message in bytes (not its text: steer messages can
        /// carry user data, and spans travel to shared backends).
        bytes: usize,
    },
    /// The run asked for a tool-call approval.
    ApprovalRequested {
        /// The tool.
        tool: Arc<str>,
    },
    /// The run was cancelled.
    Cancelled {
        /// Why.
        reason: Arc<str>,
    },
    /// The run's worker was lost and the run was queued again.
    Retrying {
        /// The attempt that will run next.
        attempt: u32,
    },
}

/// A timestamped [`SpanEventKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanEvent {
    /// When it happened.
    pub at: SystemTime,
    /// What happened.
    pub kind: SpanEventKind,
}

/// Most events kept per run; more are counted as dropped (a client that
/// steers in a loop must not grow a record without bound).
pub const MAX_SPAN_EVENTS: usize = 64;

/// The recorded part of a run's span, kept on its record only while a
/// [`SpanSink`] records spans (boxed there: without a sink no run needs it).
/// The run's own context is on the record itself, always.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpanRecord {
    /// The span this run's span is a child of: the parent agent's run span,
    /// or the Spawn caller's span for a root.
    pub parent: Option<TraceContext>,
    /// The Spawn RPC's server span.
    pub link: Option<TraceContext>,
    /// Events for the span, in order.
    pub events: Vec<SpanEvent>,
    /// Events beyond [`MAX_SPAN_EVENTS`].
    pub dropped_events: u32,
}

impl SpanRecord {
    /// Adds an event (or counts it as dropped past the cap).
    pub fn push(&mut self, at: SystemTime, kind: SpanEventKind) {
        if self.events.len() < MAX_SPAN_EVENTS {
            self.events.push(SpanEvent { at, kind });
        } else {
            self.dropped_events += 1;
        }
    }
}

/// The span of an ended run, as the sink exports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTrace {
    /// The run's own span.
    pub context: TraceContext,
    /// Parent, link and events.
    pub span: SpanRecord,
}

/// A run that reached its terminal state, for the sink.
#[derive(Debug, Clone)]
pub struct EndedRun {
    /// The agent as it ended.
    pub agent: AgentView,
    /// Its span, when recorded and sampled (events moved out of the
    /// record).
    pub trace: Option<RunTrace>,
}

/// Where the spans of runs go (implemented by `crate::telemetry`).
pub trait SpanSink: Send + Sync + fmt::Debug {
    /// Whether a new run span in `trace_id` under `parent` is sampled.
    /// Called under the scheduler's lock: must be quick and must not block.
    fn sample(&self, parent: Option<&TraceContext>, trace_id: TraceId, agent: &str) -> bool;

    /// Exports an ended run whose span is recorded and sampled (`trace` is
    /// Some). Called outside the lock.
    fn export(&self, run: EndedRun);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_written_hex_matches_fmt() {
        for (trace, span) in [
            (1u128, 1u64),
            (u128::MAX, u64::MAX),
            (
                0x00f0_0000_0000_0000_0000_0000_0000_0abc,
                0x00f0_67aa_0ba9_02b7,
            ),
            (crate::scheduler::trace_id::TraceId::random().get(), 42),
        ] {
            let trace_id = crate::scheduler::trace_id::TraceId::new(trace).unwrap();
            assert_eq!(trace_id.to_hex(), format!("{trace:032x}"));
            assert_eq!(trace_id.to_string(), format!("{trace:032x}"));
            for sampled in [true, false] {
                let cx = TraceContext {
                    trace_id,
                    span_id: span,
                    sampled,
                };
                assert_eq!(
                    cx.traceparent(),
                    format!("00-{trace:032x}-{span:016x}-{:02x}", u8::from(sampled))
                );
            }
        }
    }

    #[test]
    fn traceparent_round_trips_and_rejects_malformed_values() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = TraceContext::from_traceparent(tp).unwrap();
        assert_eq!(cx.trace_id.get(), 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(cx.span_id, 0x00f067aa0ba902b7);
        assert!(cx.sampled);
        assert_eq!(cx.traceparent(), tp);
        let unsampled = TraceContext::from_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        )
        .unwrap();
        assert!(!unsampled.sampled);
        // A later version may append fields.
        assert!(TraceContext::from_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        )
        .is_some());
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(TraceContext::from_traceparent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn child_spans_keep_the_trace_and_get_new_ids() {
        let parent = TraceContext {
            trace_id: TraceId::random(),
            span_id: random_span_id(),
            sampled: true,
        };
        let a = parent.child(true);
        let b = parent.child(false);
        assert_eq!(a.trace_id, parent.trace_id);
        assert_ne!(a.span_id, parent.span_id);
        assert_ne!(a.span_id, b.span_id);
        assert!(!b.sampled);
    }

    #[test]
    fn span_events_are_capped() {
        let mut span = SpanRecord::default();
        for _ in 0..MAX_SPAN_EVENTS + 3 {
            span.push(
                SystemTime::now(),
                SpanEventKind::SteerDelivered { bytes: 1 },
            );
        }
        assert_eq!(span.events.len(), MAX_SPAN_EVENTS);
        assert_eq!(span.dropped_events, 3);
    }
}
