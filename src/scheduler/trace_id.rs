//! A run's trace identity (W3C trace and span ids), decided at admission
//! and kept on the record; a leaf, so the domain types can hold it and the
//! span seam (`trace`) can describe ended runs.

use std::{fmt, num::NonZeroU128};

/// A W3C trace id (never all zeroes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(NonZeroU128);

impl TraceId {
    /// The id, or None for the invalid all-zero id.
    pub fn new(value: u128) -> Option<Self> {
        NonZeroU128::new(value).map(Self)
    }

    /// The raw value.
    pub fn get(self) -> u128 {
        self.0.get()
    }

    /// The id as 32 lower-case hex digits (what `Agent.trace_id` and
    /// `traceparent` carry). Written by hand, not through `fmt`: it is made
    /// for every Spawn's answer and every run, and `{:032x}` costs ten
    /// times as much.
    pub fn to_hex(self) -> String {
        let mut out = String::with_capacity(32);
        push_hex(&mut out, self.get(), 32);
        out
    }

    /// A fresh random id.
    pub fn random() -> Self {
        loop {
            if let Some(id) = Self::new(uuid::Uuid::new_v4().as_u128()) {
                return id;
            }
        }
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Appends the low `digits` hex digits of `value`, most significant first.
fn push_hex(out: &mut String, value: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        out.push(char::from(HEX[((value >> (i * 4)) & 0xf) as usize]));
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One span's identity in a trace: what `traceparent` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace.
    pub trace_id: TraceId,
    /// The span (never zero).
    pub span_id: u64,
    /// Whether the trace is sampled (recorded and exported).
    pub sampled: bool,
}

impl TraceContext {
    /// Parses a W3C `traceparent` header value (version 00 layout; later
    /// versions are read by their first four fields, as the spec asks).
    pub fn from_traceparent(value: &str) -> Option<Self> {
        let value = value.trim();
        let mut parts = value.split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
        let lower = |s: &str| !s.bytes().any(|b| b.is_ascii_uppercase());
        if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) {
            return None;
        }
        if !hex(flags, 2) || !lower(trace) || !lower(span) || !lower(version) {
            return None;
        }
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let trace_id = TraceId::new(u128::from_str_radix(trace, 16).ok()?)?;
        let span_id = u64::from_str_radix(span, 16).ok().filter(|s| *s != 0)?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The W3C `traceparent` value naming this span as the parent
    /// (`00-<trace id>-<span id>-<flags>`; by hand, as [`TraceId::to_hex`]).
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, self.trace_id.get(), 32);
        out.push('-');
        push_hex(&mut out, self.span_id.into(), 16);
        out.push_str(if self.sampled { "-01" } else { "-00" });
        out
    }

    /// The first span of a new trace.
    pub fn new_root(sampled: bool) -> Self {
        Self {
            trace_id: TraceId::random(),
            span_id: random_span_id(),
            sampled,
        }
    }

    /// A new span in the same trace.
    pub fn child(&self, sampled: bool) -> Self {
        Self {
            trace_id: self.trace_id,
            span_id: random_span_id(),
            sampled,
        }
    }
}

/// A fresh random, non-zero span id.
pub fn random_span_id() -> u64 {
    loop {
        // The low half of a v4 UUID: 62 random bits plus fixed variant bits
        // in the high half, so take the whole value folded.
        let v = uuid::Uuid::new_v4().as_u128();
        let id = (v as u64) ^ ((v >> 64) as u64);
        if id != 0 {
            return id;
        }
    }
}

/// What the Spawn call brought: who called, and from which RPC span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpawnTrace {
    /// The caller's span (`traceparent` metadata): the parent of a root
    /// agent's run span.
    pub caller: Option<TraceContext>,
    /// The server span of the Spawn RPC itself: the run span links to it.
    pub rpc: Option<TraceContext>,
}
