//! Field checks the request parsers share: the limits a request's fields
//! are held to, and the collected violations of one request.

use std::time::Duration;

use uuid::Uuid;

use crate::scheduler::{AgentId, Error, FieldViolation};

/// Most ids one Status, Await or WatchAgents request may name.
pub const MAX_IDS: usize = 100;

/// Longest `lead_id` / `idempotency_key`, in bytes.
pub const MAX_KEY_BYTES: usize = crate::scheduler::core::MAX_KEY_BYTES;

/// Await timeout when none is given.
pub const DEFAULT_AWAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest Await timeout.
pub const MAX_AWAIT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Longest Spawn run timeout (7 days).
pub const MAX_RUN_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Status page size when none is given.
pub const DEFAULT_PAGE_SIZE: usize = 100;

/// Largest Status page size.
pub const MAX_PAGE_SIZE: usize = 1000;

/// Longest approval note accepted.
pub const MAX_NOTE_BYTES: usize = 64 * 1024;

/// Collects field violations while parsing one request.
#[derive(Default)]
pub(super) struct Violations(Vec<FieldViolation>);

impl Violations {
    pub(super) fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }

    pub(super) fn finish<T>(self, value: T) -> Result<T, Error> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(Error::Invalid(self.0))
        }
    }

    pub(super) fn id(&mut self, field: &str, raw: &str) -> Option<AgentId> {
        self.uuid(field, raw, "an agent id")
    }

    pub(super) fn uuid(&mut self, field: &str, raw: &str, what: &str) -> Option<Uuid> {
        match Uuid::parse_str(raw) {
            Ok(id) => Some(id),
            Err(_) => {
                self.add(
                    field,
                    format!("\"{}\" is not {what} (a UUID)", truncate(raw)),
                );
                None
            }
        }
    }

    pub(super) fn optional_id(&mut self, field: &str, raw: &str) -> Option<AgentId> {
        if raw.is_empty() {
            None
        } else {
            self.id(field, raw)
        }
    }

    /// `page_size`: the default for 0, at most [`MAX_PAGE_SIZE`].
    pub(super) fn page_size(&mut self, raw: u32) -> usize {
        match raw as usize {
            0 => DEFAULT_PAGE_SIZE,
            n if n > MAX_PAGE_SIZE => {
                self.add("page_size", format!("at most {MAX_PAGE_SIZE}"));
                0
            }
            n => n,
        }
    }

    /// `page_token`: empty for the first page, else a position `rpc`
    /// returned.
    pub(super) fn page_token<T: std::str::FromStr + Default>(&mut self, raw: &str, rpc: &str) -> T {
        if raw.is_empty() {
            return T::default();
        }
        raw.parse().unwrap_or_else(|_| {
            self.add("page_token", format!("is not a token returned by {rpc}"));
            T::default()
        })
    }

    pub(super) fn key(&mut self, field: &str, raw: &str) -> Option<String> {
        if raw.len() > MAX_KEY_BYTES {
            self.add(
                field,
                format!(
                    "is {} bytes; at most {MAX_KEY_BYTES} bytes allowed",
                    raw.len()
                ),
            );
            None
        } else if raw.is_empty() {
            None
        } else {
            Some(raw.to_owned())
        }
    }

    /// `SpawnRequest.workspace_base`: a ref name git reads as a ref, not
    /// an option or several arguments; not with a continuation, which
    /// starts at the continued agent's head. Whether the repository has it
    /// is the caller's to check.
    pub(super) fn workspace_base(&mut self, raw: &str, continuing: bool) -> Option<String> {
        let field = "workspace_base";
        let base = self.key(field, raw)?;
        if continuing {
            self.add(
                field,
                "cannot be set with continue_from: a continuation's worktree starts at the \
                 continued agent's head",
            );
            return None;
        }
        if base.starts_with('-') || base.chars().any(|c| c.is_whitespace() || c.is_control()) {
            self.add(
                field,
                format!(
                    "\"{}\" is not a branch, tag or commit (it must not start with '-' or hold \
                     whitespace)",
                    truncate(&base)
                ),
            );
            return None;
        }
        Some(base)
    }

    pub(super) fn ids(&mut self, field: &str, raw: &[String], required: bool) -> Vec<AgentId> {
        if required && raw.is_empty() {
            self.add(field, "at least one id is required");
        }
        if raw.len() > MAX_IDS {
            self.add(
                field,
                format!("{} ids given; at most {MAX_IDS} allowed", raw.len()),
            );
            return Vec::new();
        }
        raw.iter()
            .enumerate()
            .filter_map(|(i, s)| self.id(&format!("{field}[{i}]"), s))
            .collect()
    }

    /// A non-negative duration no longer than `max`.
    pub(super) fn duration(
        &mut self,
        field: &str,
        d: &prost_types::Duration,
        max: Duration,
    ) -> Option<Duration> {
        if d.seconds < 0 || d.nanos < 0 {
            self.add(field, "must not be negative");
            return None;
        }
        if d.nanos >= 1_000_000_000 {
            self.add(field, "nanos must be below 1 000 000 000");
            return None;
        }
        let value = Duration::new(d.seconds as u64, d.nanos as u32);
        if value > max {
            self.add(
                field,
                format!(
                    "{} is too long; at most {}",
                    humantime::format_duration(value),
                    humantime::format_duration(max)
                ),
            );
            return None;
        }
        Some(value)
    }
}

pub(super) fn truncate(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// None for the empty string (proto3's "not set").
pub(super) fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}
