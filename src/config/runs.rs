//! `[runs]`: run deadlines, guards and retention.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Default `[runs] default_timeout`.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default `[runs] finished_retention`.
pub const DEFAULT_FINISHED_RETENTION: Duration = Duration::from_secs(10 * 60);
/// Default `[runs] cancel_grace`: how long a worker may hold a stopped run's
/// capacity before confirming it ended.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);

/// `[runs]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunsConfig {
    /// Run deadline when a Spawn sets no `timeout`. Default 30 min.
    #[serde(with = "humantime_serde")]
    pub default_timeout: Duration,
    /// How long finished agents stay readable. Default 10 min.
    #[serde(with = "humantime_serde")]
    pub finished_retention: Duration,
    /// How long a worker may keep a stopped (cancelled, timed-out) run's
    /// capacity before confirming the run ended. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub cancel_grace: Duration,
    /// Circuit breaker: tool calls one run may make; one more cancels it
    /// with CIRCUIT_BREAKER. Default 4000; 0 = off.
    pub max_tool_calls: u64,
    /// Circuit breaker: consecutive tool calls with the same name and input
    /// digest one run may make. Default 20; 0 = off.
    pub max_identical_tool_calls: u32,
    /// A running run that reports nothing (output, tool call, usage,
    /// approval request) for this long fails with STALE. Default 45 min;
    /// "0s" = off.
    #[serde(with = "humantime_serde")]
    pub stale_timeout: Duration,
    /// After a restart on a durable store: how long a worker run stays held
    /// for its worker to re-attach before the worker-lost rules apply.
    /// Default 60 s, counted from the moment the server serves again.
    #[serde(with = "humantime_serde")]
    pub worker_reattach_grace: Duration,
}

/// Default `[runs] worker_reattach_grace`.
pub const DEFAULT_WORKER_REATTACH_GRACE: Duration = Duration::from_secs(60);

/// Default `[runs] max_tool_calls`.
pub const DEFAULT_MAX_TOOL_CALLS: u64 = 4000;
/// Default `[runs] max_identical_tool_calls`.
pub const DEFAULT_MAX_IDENTICAL_TOOL_CALLS: u32 = 20;
/// Default `[runs] stale_timeout`.
pub const DEFAULT_STALE_TIMEOUT: Duration = Duration::from_secs(45 * 60);

impl Default for RunsConfig {
    fn default() -> Self {
        Self {
            default_timeout: DEFAULT_RUN_TIMEOUT,
            finished_retention: DEFAULT_FINISHED_RETENTION,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            max_tool_calls: DEFAULT_MAX_TOOL_CALLS,
            max_identical_tool_calls: DEFAULT_MAX_IDENTICAL_TOOL_CALLS,
            stale_timeout: DEFAULT_STALE_TIMEOUT,
            worker_reattach_grace: DEFAULT_WORKER_REATTACH_GRACE,
        }
    }
}

impl RunsConfig {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.default_timeout.is_zero() {
            return Err(invalid("runs.default_timeout", "must be > 0"));
        }
        Ok(())
    }
}
