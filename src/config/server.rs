//! `[server]`: the gRPC listener, its TLS, HTTP/2 limits and shutdown.

use std::{net::SocketAddr, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    error::{invalid, ConfigError},
    limits::Limits,
};

/// Default `[server] listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default `[server] keepalive_interval`: HTTP/2 PING to idle connections.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Default `[server] keepalive_timeout`: an unanswered PING closes the
/// connection (a silently dead worker is lost after interval + timeout).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `[server] shutdown_grace`: how long running agents may finish
/// after SIGTERM before the rest are cancelled (shorter than Kubernetes'
/// default 30 s termination grace period).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(25);

/// `[server]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the gRPC server binds (default `127.0.0.1:50051`). Read at start only.
    pub listen: String,
    /// HTTP/2 keepalive PING interval. Default 30 s. Read at start only.
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed
    /// (its worker sessions are then lost). Default 10 s. Read at start only.
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// After SIGTERM/SIGINT: how long running agents may finish before
    /// whatever is still live is cancelled. Default 25 s; "0s" cancels at
    /// once. Read at start only.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Concurrent HTTP/2 streams (calls) per connection. Default 256.
    pub max_concurrent_streams: u32,
    /// Largest header list of a call, in bytes (HTTP/2
    /// SETTINGS_MAX_HEADER_LIST_SIZE). Default 16 KiB.
    pub max_header_list_bytes: u32,
    /// Largest message a client may send, in bytes; a larger one is
    /// RESOURCE_EXHAUSTED. Default 0: `[limits] max_prompt_bytes` + 64 KiB.
    /// Answers are not bounded by it: a page of agents with long results
    /// may be larger than any request.
    pub max_message_bytes: usize,
    /// Streams a client may open and reset before the server processes
    /// them, per connection (the HTTP/2 rapid-reset attack,
    /// CVE-2023-44487); beyond it the connection is closed. Default 20.
    pub max_pending_reset_streams: usize,
    /// `[server.tls]`: TLS on the gRPC listener (off without `cert_file`).
    pub tls: ServerTls,
    /// A second, plaintext listener serving only `grpc.health.v1`, for
    /// probes that cannot speak TLS (Kubernetes' gRPC probe). Empty
    /// (default): none. Read at start only.
    pub health_listen: String,
}

/// `[server.tls] client_auth`: whether clients present certificates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A client may present one; a presented certificate must be valid.
    Optional,
    /// Every connection presents a valid client certificate.
    Required,
}

/// `[server.tls]` section. The files are PEM; they are re-read within
/// 10 s of a change and on SIGHUP, without dropping connections.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerTls {
    /// The server's certificate chain (leaf first). Empty: TLS off.
    pub cert_file: String,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
    /// The CAs client certificates must chain to (for `client_auth`).
    pub client_ca_file: String,
    /// `"none"` (default), `"optional"` or `"required"`.
    pub client_auth: ClientAuth,
}

impl ServerTls {
    /// Whether the listener speaks TLS.
    pub fn enabled(&self) -> bool {
        !self.cert_file.is_empty()
    }

    /// Checks every rule; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cert_file.is_empty() != self.key_file.is_empty() {
            let missing = if self.cert_file.is_empty() {
                "server.tls.cert_file"
            } else {
                "server.tls.key_file"
            };
            return Err(invalid(
                missing,
                "cert_file and key_file go together: set both, or neither for plaintext",
            ));
        }
        if self.client_auth != ClientAuth::None && self.client_ca_file.is_empty() {
            return Err(invalid(
                "server.tls.client_ca_file",
                "client_auth \"optional\" or \"required\" needs the CA file that client \
                 certificates chain to",
            ));
        }
        if !self.enabled()
            && (self.client_auth != ClientAuth::None || !self.client_ca_file.is_empty())
        {
            return Err(invalid(
                "server.tls.cert_file",
                "client certificates need TLS: set cert_file and key_file",
            ));
        }
        Ok(())
    }
}

impl ServerConfig {
    // Four parts, not one `validate`: [`super::Config::validate`] runs them
    // in its own order, interleaved with other sections', so that a config
    // with several broken keys names the same one first as it always did.

    /// `listen` is an address.
    pub fn validate_listen(&self) -> Result<(), ConfigError> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("server.listen", format!("must be an IP:port address ({e})")))?;
        Ok(())
    }

    /// `[server.tls]`, and `health_listen` is an address when set.
    pub fn validate_tls_and_health(&self) -> Result<(), ConfigError> {
        self.tls.validate()?;
        if !self.health_listen.is_empty() {
            self.health_listen.parse::<SocketAddr>().map_err(|e| {
                invalid(
                    "server.health_listen",
                    format!("must be an IP:port address ({e})"),
                )
            })?;
        }
        Ok(())
    }

    /// The HTTP/2 bounds are at least 1.
    pub fn validate_http2_limits(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            (
                "server.max_concurrent_streams",
                self.max_concurrent_streams as usize,
            ),
            (
                "server.max_header_list_bytes",
                self.max_header_list_bytes as usize,
            ),
            (
                "server.max_pending_reset_streams",
                self.max_pending_reset_streams,
            ),
        ] {
            if value < 1 {
                return Err(invalid(key, "must be ≥ 1 (got 0)"));
            }
        }
        Ok(())
    }

    /// The keepalive interval and timeout are not zero.
    pub fn validate_keepalive(&self) -> Result<(), ConfigError> {
        if self.keepalive_interval.is_zero() {
            return Err(invalid("server.keepalive_interval", "must be > 0"));
        }
        if self.keepalive_timeout.is_zero() {
            return Err(invalid("server.keepalive_timeout", "must be > 0"));
        }
        Ok(())
    }

    /// The message size limit in force (see `max_message_bytes`).
    pub fn message_limit(&self, limits: &Limits) -> usize {
        match self.max_message_bytes {
            0 => limits.max_prompt_bytes.saturating_add(64 * 1024),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.to_owned(),
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            max_concurrent_streams: 256,
            max_header_list_bytes: 16 * 1024,
            max_message_bytes: 0,
            max_pending_reset_streams: 20,
            tls: ServerTls::default(),
            health_listen: String::new(),
        }
    }
}
