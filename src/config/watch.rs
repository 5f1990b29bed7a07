//! `[watch]`: WatchAgents buffers.

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Default `[watch] history`: events kept for `after_sequence` replay.
pub const DEFAULT_WATCH_HISTORY: usize = 16_384;
/// Default `[watch] subscriber_buffer`: events a subscriber may fall behind
/// before it is cut off.
pub const DEFAULT_WATCH_SUBSCRIBER_BUFFER: usize = 4_096;

/// `[watch]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// Events retained for `after_sequence` replay. Default 16384.
    pub history: usize,
    /// Events one subscriber may fall behind before it is cut off. Default 4096.
    pub subscriber_buffer: usize,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            history: DEFAULT_WATCH_HISTORY,
            subscriber_buffer: DEFAULT_WATCH_SUBSCRIBER_BUFFER,
        }
    }
}

impl WatchConfig {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.history < 1 {
            return Err(invalid("watch.history", "must be ≥ 1"));
        }
        if self.subscriber_buffer < 1 {
            return Err(invalid("watch.subscriber_buffer", "must be ≥ 1"));
        }
        Ok(())
    }
}
