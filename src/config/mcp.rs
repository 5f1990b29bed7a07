//! `[mcp]`: what the MCP lead tools (`subagentd mcp`, `/mcp`) offer, and
//! `[http]`: the HTTP listener that serves `/mcp`.

use std::{net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// Default `[mcp] max_await`: under the 60 s tool timeout of Codex and of
/// hosts built on the TypeScript SDK, with room for the answer.
pub const DEFAULT_MCP_MAX_AWAIT: Duration = Duration::from_secs(50);
/// The longest `[mcp] max_await` accepted (an Await's own limit).
pub const MAX_MCP_MAX_AWAIT: Duration = Duration::from_secs(3600);
/// Default `[mcp] max_result_chars`.
pub const DEFAULT_MCP_MAX_RESULT_CHARS: usize = 8000;
/// The smallest `[mcp] max_result_chars` accepted.
pub const MIN_MCP_MAX_RESULT_CHARS: usize = 200;
/// Default `[http] listen`.
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:50080";

/// Who decides a pending approval met through the MCP tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpApprovals {
    /// A person: put to the user by MCP elicitation where the host supports
    /// it, else named with the `subagentd approve` command to run.
    #[default]
    Human,
    /// The lead model, with the `agent_approve` tool.
    Lead,
}

impl McpApprovals {
    /// The config word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Human => "human",
            Self::Lead => "lead",
        }
    }
}

/// `[mcp]` section.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// `"human"` (default) or `"lead"`.
    pub approvals: McpApprovals,
    /// The longest `agent_await` wait; longer `timeout_seconds` are clamped
    /// to it. Default 50 s, at most 1 h.
    #[serde(with = "humantime_serde")]
    pub max_await: Duration,
    /// Characters of a result `agent_await` and `agent_spawn` show before
    /// pointing to `agent_result`. Default 8,000, at least 200.
    pub max_result_chars: usize,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            approvals: McpApprovals::Human,
            max_await: DEFAULT_MCP_MAX_AWAIT,
            max_result_chars: DEFAULT_MCP_MAX_RESULT_CHARS,
        }
    }
}

impl McpConfig {
    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_await.is_zero() || self.max_await > MAX_MCP_MAX_AWAIT {
            return Err(invalid("mcp.max_await", "must be > 0 and at most 1h"));
        }
        if self.max_result_chars < MIN_MCP_MAX_RESULT_CHARS {
            return Err(invalid(
                "mcp.max_result_chars",
                format!(
                    "must be ≥ {MIN_MCP_MAX_RESULT_CHARS} (got {})",
                    self.max_result_chars
                ),
            ));
        }
        Ok(())
    }
}

/// `[http]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Where `/mcp` is served: `IP:port`, empty = off. Default
    /// `127.0.0.1:50080`.
    pub listen: String,
    /// Serve HTTPS with `[server.tls]`'s certificate.
    pub tls: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_HTTP_LISTEN.to_owned(),
            tls: false,
        }
    }
}

impl HttpConfig {
    /// The address to listen on; None when off.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen.parse().ok()
    }

    /// `listen` is an address or empty; `tls` needs `[server.tls]`
    /// (`server_tls` says whether it is configured).
    pub fn validate(&self, server_tls: bool) -> Result<(), ConfigError> {
        if !self.listen.is_empty() {
            self.listen.parse::<SocketAddr>().map_err(|e| {
                invalid(
                    "http.listen",
                    format!("must be an IP:port address or empty ({e})"),
                )
            })?;
        }
        if self.tls && !server_tls {
            return Err(invalid(
                "http.tls",
                "serves [server.tls]'s certificate: set server.tls.cert_file and key_file",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_each_rule_names_its_key() {
        McpConfig::default().validate().unwrap();
        HttpConfig::default().validate(false).unwrap();
        let key = |e: ConfigError| e.to_string();
        let zero = McpConfig {
            max_await: Duration::ZERO,
            ..McpConfig::default()
        };
        assert!(key(zero.validate().unwrap_err()).contains("mcp.max_await"));
        let small = McpConfig {
            max_result_chars: 10,
            ..McpConfig::default()
        };
        assert!(key(small.validate().unwrap_err()).contains("mcp.max_result_chars"));
        let bad = HttpConfig {
            listen: "nowhere".into(),
            tls: false,
        };
        assert!(key(bad.validate(false).unwrap_err()).contains("http.listen"));
        let tls = HttpConfig {
            tls: true,
            ..HttpConfig::default()
        };
        assert!(key(tls.validate(false).unwrap_err()).contains("http.tls"));
        tls.validate(true).unwrap();
        let off = HttpConfig {
            listen: String::new(),
            tls: false,
        };
        off.validate(false).unwrap();
        assert_eq!(off.listen_addr(), None);
    }
}
