//! What a config that could not be loaded or broke a rule reports.

use std::fmt;

/// A config that could not be loaded or broke a rule. The message names the
/// key and the rule.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file, the environment or a value could not be parsed.
    #[error("{0}")]
    Load(String),
    /// A value broke a rule.
    #[error("invalid config: `{key}` {rule}")]
    Invalid {
        /// Dotted key, e.g. `limits.max_background_agents`.
        key: String,
        /// The rule, e.g. "must be ≥ 1 (got 0)".
        rule: String,
    },
}

/// A [`ConfigError::Invalid`] for `key`.
pub fn invalid(key: impl Into<String>, rule: impl fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        rule: rule.to_string(),
    }
}
