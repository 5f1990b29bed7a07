//! `[conversations]`: transcripts kept for continuations.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Default `[conversations] retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Default `[conversations] max_transcript_bytes` (1 MiB).
pub const DEFAULT_MAX_TRANSCRIPT_BYTES: usize = 1 << 20;
/// The smallest `[conversations] max_transcript_bytes` accepted.
pub const MIN_MAX_TRANSCRIPT_BYTES: usize = 4096;

/// `[conversations]` section.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConversationsConfig {
    /// How long a conversation's transcript is kept after its latest agent
    /// ended (so it can be continued and read). Default 24 h.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Bytes of text one transcript keeps; past it the oldest entries are
    /// elided (with a marker entry). Default 1 MiB, at least 4 KiB.
    pub max_transcript_bytes: usize,
}

impl Default for ConversationsConfig {
    fn default() -> Self {
        Self {
            retention: DEFAULT_RETENTION,
            max_transcript_bytes: DEFAULT_MAX_TRANSCRIPT_BYTES,
        }
    }
}

impl ConversationsConfig {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let min = MIN_MAX_TRANSCRIPT_BYTES;
        if self.max_transcript_bytes < min {
            return Err(invalid(
                "conversations.max_transcript_bytes",
                format!("must be ≥ {min} (got {})", self.max_transcript_bytes),
            ));
        }
        if self.retention.is_zero() {
            return Err(invalid("conversations.retention", "must be > 0"));
        }
        Ok(())
    }
}
