//! Layered configuration: built-in defaults → TOML file → `SUBAGENTD_*`
//! environment → command-line flags, then [`Config::validate`].
//!
//! Durations are strings with a unit (`"500ms"`, `"10s"`, `"30m"`, `"1h"`).

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use figment::{
    providers::{Env, Format, Serialized, Toml},
    Figment,
};
use serde::{Deserialize, Serialize};

/// Default `[server] listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default `[limits] max_background_agents`.
pub const DEFAULT_MAX_BACKGROUND_AGENTS: u32 = 5;
/// Default `[limits] default_concurrency`.
pub const DEFAULT_CONCURRENCY: u32 = 5;
/// Default `[limits] max_concurrent_per_parent`.
pub const DEFAULT_MAX_CONCURRENT_PER_PARENT: u32 = 3;
/// Default `[limits] max_depth`.
pub const DEFAULT_MAX_DEPTH: u32 = 3;
/// Default `[limits] max_prompt_bytes` (1 MiB).
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 1 << 20;
/// Default `[runs] default_timeout`.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default `[runs] finished_retention`.
pub const DEFAULT_FINISHED_RETENTION: Duration = Duration::from_secs(10 * 60);
/// Default `[runs] cancel_grace`: how long a worker may hold a stopped run's
/// capacity before confirming it ended.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);
/// Default `[server] keepalive_interval`: HTTP/2 PING to idle connections.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Default `[server] keepalive_timeout`: an unanswered PING closes the
/// connection (a silently dead worker is lost after interval + timeout).
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `[server] shutdown_grace`: how long running agents may finish
/// after SIGTERM before the rest are cancelled (shorter than Kubernetes'
/// default 30 s termination grace period).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(25);
/// Default `[watch] history`: events kept for `after_sequence` replay.
pub const DEFAULT_WATCH_HISTORY: usize = 16_384;
/// Default `[watch] subscriber_buffer`: events a subscriber may fall behind
/// before it is cut off.
pub const DEFAULT_WATCH_SUBSCRIBER_BUFFER: usize = 4_096;
/// Default `[telemetry] metrics_listen`.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";
/// Default `[telemetry] service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "subagentd";
/// Default `[telemetry] traces_sampler` (the OpenTelemetry default).
pub const DEFAULT_TRACES_SAMPLER: &str = "parentbased_always_on";
/// Samplers `[telemetry] traces_sampler` accepts (the standard
/// `OTEL_TRACES_SAMPLER` values this server implements).
pub const TRACES_SAMPLERS: &[&str] = &[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];
/// The standard OpenTelemetry variables and the `[telemetry]` keys they
/// set. They override the file; `SUBAGENTD_TELEMETRY__*` overrides them.
pub const OTEL_ENV: &[(&str, &str)] = &[
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint"),
    ("OTEL_SERVICE_NAME", "service_name"),
    ("OTEL_RESOURCE_ATTRIBUTES", "resource_attributes"),
    ("OTEL_TRACES_SAMPLER", "traces_sampler"),
    ("OTEL_TRACES_SAMPLER_ARG", "traces_sampler_arg"),
];

/// Name of the agent type configured when the config names none.
pub const DEFAULT_AGENT_TYPE: &str = "simulated";

/// Environment variable prefix; `__` separates a section from its key.
pub const ENV_PREFIX: &str = "SUBAGENTD_";

/// Sections that only `subagentd worker` reads ([`crate::worker::config`]
/// checks this list against its config type): the server leaves
/// `SUBAGENTD_WORKER__*` to it, so one environment can serve both.
pub const WORKER_ONLY_SECTIONS: &[&str] = &["worker"];

/// The top-level sections of the config type `T`, read from its
/// serialized default: the environment accepts exactly these, so a section
/// added to the type is accepted without a list to keep by hand.
pub fn sections_of<T: Serialize + Default>() -> Vec<String> {
    match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(map)) => map.into_iter().map(|(k, _)| k).collect(),
        // A config type is a struct of sections; anything else is a bug
        // that every config test would show at once.
        other => panic!("a config type serializes to a table, not {other:?}"),
    }
}

/// The `SUBAGENTD_<SECTION>__<KEY>` variables of the process environment
/// for a command that reads the sections `own`, after checking that none
/// names a section that neither it nor the other command (`others`) knows:
/// a variable the user set and no command reads is refused, naming it.
/// Variables without `__` (such as the CLI's `SUBAGENTD_ADDR`) are not
/// config and are left alone.
pub fn env_provider(own: &[String], others: &[&str]) -> Result<Env, ConfigError> {
    let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    check_env_sections(names, own, others)?;
    let own = own.to_vec();
    Ok(Env::prefixed(ENV_PREFIX)
        .filter(move |key| {
            env_section(key.as_str()).is_some_and(|s| own.iter().any(|o| o.eq_ignore_ascii_case(s)))
        })
        .split("__"))
}

/// The section a config variable (prefix already removed) names: the text
/// before its first `__`; None for a variable that is not config.
fn env_section(rest: &str) -> Option<&str> {
    rest.split_once("__").map(|(section, _)| section)
}

fn check_env_sections(
    names: impl Iterator<Item = String>,
    own: &[String],
    others: &[&str],
) -> Result<(), ConfigError> {
    let known = |section: &str| {
        own.iter().any(|s| s.eq_ignore_ascii_case(section))
            || others.iter().any(|s| s.eq_ignore_ascii_case(section))
    };
    for name in names {
        let Some(prefix) = name.get(..ENV_PREFIX.len()) else {
            continue;
        };
        if !prefix.eq_ignore_ascii_case(ENV_PREFIX) {
            continue;
        }
        match env_section(&name[ENV_PREFIX.len()..]) {
            Some(section) if !known(section) => {
                let mut sections: Vec<&str> = own.iter().map(String::as_str).collect();
                sections.extend(others);
                sections.sort_unstable();
                return Err(ConfigError::Load(format!(
                    "environment variable {name} names no config section: `{}` is not one of \
                     {} (SUBAGENTD_<SECTION>__<KEY>; unset it or fix its name)",
                    section.to_ascii_lowercase(),
                    sections.join(", ")
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The whole effective configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[server]`.
    pub server: ServerConfig,
    /// `[limits]`: admission limits; reloadable with SIGHUP.
    pub limits: Limits,
    /// `[runs]`: run deadlines and retention; reloadable.
    pub runs: RunsConfig,
    /// `[watch]`: WatchAgents buffers. Read at start only.
    pub watch: WatchConfig,
    /// `[agents.NAME]`: agent types. Without any, one type `simulated`.
    pub agents: BTreeMap<String, AgentTypeConfig>,
    /// `[telemetry]`: traces, metrics and logs. Read at start only.
    pub telemetry: TelemetryConfig,
    /// `[store]`: where durable state lives. Read at start only.
    pub store: StoreConfig,
    /// `[ha]`: leader election among servers on one PostgreSQL store.
    /// Read at start only.
    pub ha: HaConfig,
    /// `[auth]`: who may call; reloadable (keys also from `keys_dir`).
    pub auth: crate::auth::AuthConfig,
    /// `[tenants.NAME]`: limits of one tenant on top of the global ones;
    /// reloadable. A tenant without an entry has none of its own.
    pub tenants: BTreeMap<String, TenantLimits>,
    /// `[conversations]`: transcripts kept for continuations; reloadable.
    pub conversations: ConversationsConfig,
}

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
            retention: crate::scheduler::conversation::DEFAULT_RETENTION,
            max_transcript_bytes: crate::scheduler::conversation::DEFAULT_MAX_TRANSCRIPT_BYTES,
        }
    }
}

/// `[tenants.NAME]` section.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Live background agents of the tenant; beyond it its Spawns are
    /// refused (TENANT_LIMIT_REACHED). 0 (default) = only the global cap.
    pub max_background_agents: u32,
    /// Spawns per second the tenant may make on average (a token bucket);
    /// beyond it RATE_LIMITED with a RetryInfo. 0 (default) = unlimited.
    pub spawn_rate: f64,
    /// Spawns the tenant may make at once before the rate applies (the
    /// bucket's size). 0 (default) = one second's worth of `spawn_rate`,
    /// at least 1.
    pub spawn_burst: u32,
}

impl TenantLimits {
    /// The token bucket's size.
    pub fn burst(&self) -> f64 {
        if self.spawn_burst > 0 {
            f64::from(self.spawn_burst)
        } else {
            self.spawn_rate.ceil().max(1.0)
        }
    }
}

/// Default `[ha] lease_ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// The shortest `[ha] lease_ttl`: a shorter lease would be lost to one
/// slow database round trip.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);

/// `[ha]` section: how servers sharing one PostgreSQL store elect the one
/// that schedules (the leader) and reach it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    /// How long a leader's lease lasts unless renewed. Every election
    /// timer derives from it. Default 10 s, at least 1 s.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// `host:port` at which the other servers reach this one when it
    /// leads. Empty (default): `$POD_IP:<listen port>` when `POD_IP` is
    /// set, otherwise the listen address.
    pub advertise_address: String,
    /// With `[server.tls]`: the CA a standby verifies the leader's
    /// certificate with. Empty (default): `[server.tls] client_ca_file`,
    /// else the public web roots.
    pub tls_ca_file: String,
    /// With `[server.tls]`: the name the leader's certificate must carry.
    /// Empty (default): the first DNS name of this server's own
    /// certificate (replicas share one), else the advertised host.
    pub tls_server_name: String,
}

impl Default for HaConfig {
    fn default() -> Self {
        Self {
            lease_ttl: DEFAULT_LEASE_TTL,
            advertise_address: String::new(),
            tls_ca_file: String::new(),
            tls_server_name: String::new(),
        }
    }
}

impl HaConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_ttl < MIN_LEASE_TTL {
            return Err(invalid(
                "ha.lease_ttl",
                format!(
                    "must be ≥ 1s (got {})",
                    humantime::format_duration(self.lease_ttl)
                ),
            ));
        }
        if !self.advertise_address.is_empty() && !is_host_port(&self.advertise_address) {
            return Err(invalid(
                "ha.advertise_address",
                format!("must be host:port (got {:?})", self.advertise_address),
            ));
        }
        Ok(())
    }

    /// Where other servers reach this one: `advertise_address`, else
    /// `$POD_IP:<port of listen>` when `pod_ip` (the `POD_IP` variable) is
    /// set, else `listen` itself.
    pub fn advertised(&self, listen: SocketAddr, pod_ip: Option<&str>) -> String {
        if !self.advertise_address.is_empty() {
            return self.advertise_address.clone();
        }
        match pod_ip.map(str::trim).filter(|ip| !ip.is_empty()) {
            // An IPv6 pod address needs brackets before its port.
            Some(ip) if ip.contains(':') => format!("[{ip}]:{}", listen.port()),
            Some(ip) => format!("{ip}:{}", listen.port()),
            None => listen.to_string(),
        }
    }
}

/// `host:port` with a non-empty host (a name, an IPv4 address or a
/// bracketed IPv6 one) and a port number.
fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
        }
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// Which engine keeps durable state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// One redb file in `[store] path`: a restart or crash loses nothing
    /// acknowledged. The default.
    #[default]
    Embedded,
    /// A PostgreSQL database at `[store] url`.
    Postgres,
    /// Nothing is written: everything is lost when the process exits. For
    /// tests and benchmarks.
    Memory,
}

/// Default `[store] path`, relative to the working directory.
pub const DEFAULT_STORE_PATH: &str = "./subagentd-data";
/// Default `[store] pool_size`.
pub const DEFAULT_STORE_POOL_SIZE: u32 = 4;

/// `[store]` section.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `embedded` (default), `postgres` or `memory`.
    pub backend: StoreBackend,
    /// The embedded store's data directory. Default `./subagentd-data`.
    pub path: PathBuf,
    /// PostgreSQL connection URL, `postgres://user@host:port/db`. Put the
    /// password in `password_file` or in the environment
    /// (`SUBAGENTD_STORE__URL`), never in a config file others can read.
    pub url: String,
    /// File holding the PostgreSQL password (a trailing newline is trimmed);
    /// it overrides a password in `url`.
    pub password_file: Option<PathBuf>,
    /// PostgreSQL connections. Default 4, minimum 1.
    pub pool_size: u32,
    /// PEM file of the CA(s) that sign the PostgreSQL server's certificate,
    /// for `sslmode=verify-ca` / `verify-full` (an `sslrootcert` in `url`
    /// wins). Unset: the system's web PKI roots.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for PostgreSQL's `cert` authentication, with
    /// `tls_key_file` (`sslcert` in `url` wins).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (`sslkey` in `url` wins).
    pub tls_key_file: Option<PathBuf>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::default(),
            path: PathBuf::from(DEFAULT_STORE_PATH),
            url: String::new(),
            password_file: None,
            pool_size: DEFAULT_STORE_POOL_SIZE,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

// By hand, so a password in the URL never reaches a log line.
impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("backend", &self.backend)
            .field("path", &self.path)
            .field("url", &redact_url(&self.url))
            .field("password_file", &self.password_file)
            .field("pool_size", &self.pool_size)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// `url` fit for a log line, `--dump-config` or an error: a password in
/// the user info shows as `***` (also one holding a `/`), and so does a
/// `password` parameter, in the query or in a `key=value` connection
/// string; everything else (host, database, `sslmode`, …) stays readable.
pub fn redact_url(url: &str) -> String {
    fn param(p: &str) -> String {
        match p.split_once('=') {
            Some((k, _)) if k.trim().eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => p.to_owned(),
        }
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.split(' ').map(param).collect::<Vec<_>>().join(" ");
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, q)) => {
            let q: Vec<String> = q.split('&').map(param).collect();
            (rest, format!("?{}", q.join("&")))
        }
        None => (rest, String::new()),
    };
    let shown = match rest.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => format!("{scheme}://{rest}"),
        },
        None => format!("{scheme}://{rest}"),
    };
    format!("{shown}{query}")
}

impl StoreConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        match self.backend {
            StoreBackend::Embedded if self.path.as_os_str().is_empty() => {
                Err(invalid("store.path", "must not be empty"))
            }
            StoreBackend::Postgres
                if !(self.url.starts_with("postgres://")
                    || self.url.starts_with("postgresql://")) =>
            {
                Err(invalid(
                    "store.url",
                    format!(
                        "must be a postgres:// URL when `store.backend` is \"postgres\" (got {:?})",
                        redact_url(&self.url)
                    ),
                ))
            }
            _ if self.pool_size < 1 => Err(invalid(
                "store.pool_size",
                format!("must be ≥ 1 (got {})", self.pool_size),
            )),
            // Half a client certificate, unless the URL has the other half
            // (`sslcert`/`sslkey`, which win over these keys).
            _ if self.tls_cert_file.is_some() != self.tls_key_file.is_some()
                && !(self.url.contains("sslcert") || self.url.contains("sslkey")) =>
            {
                Err(invalid(
                    if self.tls_cert_file.is_some() {
                        "store.tls_key_file"
                    } else {
                        "store.tls_cert_file"
                    },
                    "must be set together with the other: a client certificate needs its key",
                ))
            }
            _ => Ok(()),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event (colours on a terminal).
    #[default]
    Pretty,
    /// One JSON object per line, with trace and span ids.
    Json,
}

/// `[telemetry]` section. The first five keys mirror the standard
/// OpenTelemetry variables, which override them (see [`OTEL_ENV`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector address, e.g. `http://otel-collector:4317`
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`). Empty (default): no spans are
    /// exported and nothing else changes.
    pub otlp_endpoint: String,
    /// `service.name` of the exported spans (`OTEL_SERVICE_NAME`).
    pub service_name: String,
    /// More resource attributes, `key=value,key=value`
    /// (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource_attributes: String,
    /// Sampler (`OTEL_TRACES_SAMPLER`): one of [`TRACES_SAMPLERS`].
    pub traces_sampler: String,
    /// Sampler argument, the ratio for the `*traceidratio` samplers
    /// (`OTEL_TRACES_SAMPLER_ARG`); empty = 1.0. A number or a string.
    #[serde(deserialize_with = "string_or_number")]
    pub traces_sampler_arg: String,
    /// Address of the Prometheus endpoint (`GET /metrics`); empty = off.
    pub metrics_listen: String,
    /// A file holding the token `GET /metrics` must present as
    /// `authorization: Bearer <token>`; re-read on every change. Empty
    /// (default): no token asked for.
    pub metrics_token_file: String,
    /// Serve the metrics endpoint over TLS with `[server.tls]`'s
    /// certificate and client-certificate rules. Default false.
    pub metrics_tls: bool,
    /// `pretty` or `json`. The level comes from `RUST_LOG` (default info).
    pub log_format: LogFormat,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            resource_attributes: String::new(),
            traces_sampler: DEFAULT_TRACES_SAMPLER.to_owned(),
            traces_sampler_arg: String::new(),
            metrics_listen: DEFAULT_METRICS_LISTEN.to_owned(),
            metrics_token_file: String::new(),
            metrics_tls: false,
            log_format: LogFormat::Pretty,
        }
    }
}

/// A broken `[telemetry]` rule, naming the places the value may come from
/// (an operator may have set it through the standard variable).
fn telemetry_invalid(key: &str, rule: impl Into<String>) -> ConfigError {
    let rule = rule.into();
    let rule = match OTEL_ENV.iter().find(|(_, k)| *k == key) {
        Some((var, _)) => format!(
            "{rule} (set in the file, by {var}, or by SUBAGENTD_TELEMETRY__{})",
            key.to_ascii_uppercase()
        ),
        None => rule,
    };
    invalid(format!("telemetry.{key}"), rule)
}

/// A string, also written as a bare number (`0.25` as well as `"0.25"`).
fn string_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        S(String),
        F(f64),
        I(i64),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::S(s) => s,
        Raw::F(f) => f.to_string(),
        Raw::I(i) => i.to_string(),
    })
}

impl TelemetryConfig {
    /// The sampler ratio; valid after [`Config::validate`].
    pub fn sampler_ratio(&self) -> f64 {
        self.traces_sampler_arg.trim().parse().unwrap_or(1.0)
    }

    /// The resource attributes as pairs; valid after [`Config::validate`].
    pub fn resource_pairs(&self) -> Vec<(String, String)> {
        self.resource_attributes
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let e = self.otlp_endpoint.trim();
        if !(e.is_empty() || e.starts_with("http://") || e.starts_with("https://")) {
            return Err(telemetry_invalid(
                "otlp_endpoint",
                format!("must be an http:// or https:// URL (got {e:?})"),
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(telemetry_invalid("service_name", "must not be empty"));
        }
        for pair in self.resource_attributes.split(',') {
            if !pair.trim().is_empty()
                && pair
                    .split_once('=')
                    .is_none_or(|(k, _)| k.trim().is_empty())
            {
                return Err(telemetry_invalid(
                    "resource_attributes",
                    format!("must be key=value pairs separated by commas (got {pair:?})"),
                ));
            }
        }
        if !TRACES_SAMPLERS.contains(&self.traces_sampler.as_str()) {
            return Err(telemetry_invalid(
                "traces_sampler",
                format!(
                    "must be one of {} (got {:?})",
                    TRACES_SAMPLERS.join(", "),
                    self.traces_sampler
                ),
            ));
        }
        let arg = self.traces_sampler_arg.trim();
        if !arg.is_empty() && !arg.parse::<f64>().is_ok_and(|r| (0.0..=1.0).contains(&r)) {
            return Err(telemetry_invalid(
                "traces_sampler_arg",
                format!("must be a ratio between 0 and 1 (got {arg:?})"),
            ));
        }
        if !self.metrics_listen.is_empty() && self.metrics_listen.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "telemetry.metrics_listen",
                format!(
                    "must be an IP:port address, or empty for no endpoint (got {:?})",
                    self.metrics_listen
                ),
            ));
        }
        Ok(())
    }
}

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

    fn validate(&self) -> Result<(), ConfigError> {
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
    /// The message size limit in force (see `max_message_bytes`).
    pub fn message_limit(&self, limits: &Limits) -> usize {
        match self.max_message_bytes {
            0 => limits.max_prompt_bytes.saturating_add(64 * 1024),
            n => n,
        }
    }
}

/// `[limits]` section: every admission limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Live background agents (queued + running + awaiting approval) across
    /// the server; beyond it Spawn is rejected. Default 5, minimum 1.
    pub max_background_agents: u32,
    /// Running agents per bucket when neither the model nor its provider has
    /// an entry. Default 5; 0 = unlimited.
    pub default_concurrency: u32,
    /// Running agents per provider, shared by all its models; 0 = unlimited.
    pub provider_concurrency: BTreeMap<String, u32>,
    /// Running agents per "provider/model"; overrides the provider entry;
    /// 0 = unlimited.
    pub model_concurrency: BTreeMap<String, u32>,
    /// Running background children of one parent (agent or lead). Default 3;
    /// 0 = unlimited.
    pub max_concurrent_per_parent: u32,
    /// Deepest allowed agent (roots are depth 1). Default 3.
    pub max_depth: u32,
    /// Live agents in one tree, the root included. Default 0 = unlimited.
    pub max_live_descendants_per_root: u32,
    /// Largest accepted prompt in bytes. Default 1 MiB.
    pub max_prompt_bytes: usize,
    /// Open WatchAgents streams of one tenant (an admin's count in its
    /// own); one more is refused with WATCH_LIMIT_REACHED. Default 100;
    /// 0 = unlimited.
    pub max_watchers_per_tenant: u32,
}

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

/// `[watch]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// Events retained for `after_sequence` replay. Default 16384.
    pub history: usize,
    /// Events one subscriber may fall behind before it is cut off. Default 4096.
    pub subscriber_buffer: usize,
}

/// How runs of an agent type execute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunnerKind {
    /// The built-in scripted runner (see README "The simulated runner").
    #[default]
    Simulated,
    /// Runs are executed by connected workers (WorkerService).
    Worker,
    /// Each run is a child process (`command`).
    Command,
    /// Each run is a chat completion on an OpenAI-compatible server.
    Openai,
}

/// How a command run receives its prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptInput {
    /// Written to standard input.
    #[default]
    Stdin,
    /// Substituted for `{prompt}` in the arguments.
    Arg,
}

/// Whether a command run accepts Steer messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SteerInput {
    /// Steer is refused with FAILED_PRECONDITION.
    #[default]
    None,
    /// Each message is written to standard input as one line.
    Stdin,
}

/// `[agents.NAME]` section. Keys other than `runner` belong to one runner
/// and are refused for the others.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTypeConfig {
    /// Which runner executes this type.
    pub runner: RunnerKind,
    /// Worker runner: how many times a run whose worker is lost is queued
    /// again (at the head of its bucket) before it fails with WORKER_LOST.
    /// Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_on_worker_lost: u32,
    /// In-process runners (`simulated`, `command`, `openai`): how many
    /// times a run interrupted by a server restart is queued again (at its
    /// original position) before it fails with SERVER_RESTARTED. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_on_restart: u32,
    /// Command runner: the program and its arguments; no shell.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Command runner: working directory (default: the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<std::path::PathBuf>,
    /// Command runner: extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Command runner: `stdin` (default) or `arg` (replaces `{prompt}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<PromptInput>,
    /// Command runner: `none` (default) or `stdin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steer: Option<SteerInput>,
    /// Command runner: how the program resumes its own session when the
    /// agent is continued, e.g. `["--resume", "{session}"]`: appended after
    /// the command's arguments, `{session}` replaced by the session id the
    /// previous turn's run wrote to `SUBAGENTD_SESSION_FILE`. Without it
    /// (or without a session) a continuation gets the transcript on
    /// standard input before its prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_args: Option<Vec<String>>,
    /// Command runner: SIGTERM to SIGKILL on cancel or deadline (default 5 s).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub kill_grace: Option<Duration>,
    /// Command runner: largest result kept from standard output (default
    /// 1 MiB); the rest is cut with a marker while the run goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_result_bytes: Option<usize>,
    /// Models to move to, in order, when a run fails with a retryable
    /// provider error (rate limit or quota, 5xx, overloaded, unknown
    /// model, missing credentials), each "provider/model".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// Runners with turns (openai, worker, simulated): turns a run may take
    /// before it is asked to wrap up; 0 (default) = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Turns a run may take after `max_turns` to wrap up (default 5); a run
    /// still going after them fails with `TURN_LIMIT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_turns: Option<u32>,
    /// The input of the first turn past `max_turns` (a steer for a
    /// worker); default [`DEFAULT_WRAP_UP_MESSAGE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrap_up_message: Option<String>,
    /// OpenAI runner: the API root, e.g. `http://127.0.0.1:11434/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// OpenAI runner: the environment variable holding the API key
    /// (optional for local servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// OpenAI runner: the system message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// OpenAI runner: `max_tokens` of each completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// OpenAI runner: sampling temperature, 0..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// OpenAI runner: `"provider/model"` → the server's model name
    /// (default: the part after the first `/`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_map: BTreeMap<String, String>,
    /// OpenAI runner: timeout of one HTTP request, streaming included
    /// (default 10 min).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub request_timeout: Option<Duration>,
    /// Whether agents of this type can be continued or forked (any
    /// runner): false for programs that cannot take a history. Default
    /// true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuable: Option<bool>,
}

/// Default `[agents.NAME] grace_turns`.
pub const DEFAULT_GRACE_TURNS: u32 = 5;
/// Default `[agents.NAME] wrap_up_message`.
pub const DEFAULT_WRAP_UP_MESSAGE: &str =
    "You have reached your turn limit. Stop starting new work: \
finish what you are doing, then give your final answer now, summarising what you did and what \
is left.";

/// Default `request_timeout` of openai runs.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Default `kill_grace` of command runs.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// Default `max_result_bytes` of command runs.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1 << 20;

impl AgentTypeConfig {
    /// A type run by `runner` with every other key at its default.
    pub fn of(runner: RunnerKind) -> Self {
        Self {
            runner,
            ..Self::default()
        }
    }

    /// How the prompt reaches a command run.
    pub fn prompt_input(&self) -> PromptInput {
        self.prompt.unwrap_or_default()
    }

    /// `max_turns` (0 = unlimited).
    pub fn max_turns(&self) -> u32 {
        self.max_turns.unwrap_or(0)
    }

    /// `grace_turns`.
    pub fn grace_turns(&self) -> u32 {
        self.grace_turns.unwrap_or(DEFAULT_GRACE_TURNS)
    }

    /// `wrap_up_message`.
    pub fn wrap_up_message(&self) -> &str {
        self.wrap_up_message
            .as_deref()
            .unwrap_or(DEFAULT_WRAP_UP_MESSAGE)
    }

    /// Whether agents of this type can be continued or forked.
    pub fn continuable(&self) -> bool {
        self.continuable.unwrap_or(true)
    }

    /// Whether runs of this type accept Steer messages.
    pub fn accepts_steer(&self) -> bool {
        self.runner != RunnerKind::Command || self.steer == Some(SteerInput::Stdin)
    }

    /// SIGTERM → SIGKILL delay of a command run.
    pub fn kill_grace(&self) -> Duration {
        self.kill_grace.unwrap_or(DEFAULT_KILL_GRACE)
    }

    /// Result cap of a command run.
    pub fn max_result_bytes(&self) -> usize {
        self.max_result_bytes.unwrap_or(DEFAULT_MAX_RESULT_BYTES)
    }

    /// Timeout of one request of an openai run.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT)
    }
}

impl AgentTypeConfig {
    pub(crate) fn validate_command(&self, name: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("agents.{name}.{k}");
        // Keys that belong to one runner are refused for the others.
        let owned = [
            (RunnerKind::Command, "command", !self.command.is_empty()),
            (RunnerKind::Command, "cwd", self.cwd.is_some()),
            (RunnerKind::Command, "env", !self.env.is_empty()),
            (RunnerKind::Command, "prompt", self.prompt.is_some()),
            (RunnerKind::Command, "steer", self.steer.is_some()),
            (RunnerKind::Command, "kill_grace", self.kill_grace.is_some()),
            (
                RunnerKind::Command,
                "continue_args",
                self.continue_args.is_some(),
            ),
            (
                RunnerKind::Command,
                "max_result_bytes",
                self.max_result_bytes.is_some(),
            ),
            (RunnerKind::Openai, "base_url", self.base_url.is_some()),
            (
                RunnerKind::Openai,
                "api_key_env",
                self.api_key_env.is_some(),
            ),
            (
                RunnerKind::Openai,
                "system_prompt",
                self.system_prompt.is_some(),
            ),
            (RunnerKind::Openai, "max_tokens", self.max_tokens.is_some()),
            (
                RunnerKind::Openai,
                "temperature",
                self.temperature.is_some(),
            ),
            (RunnerKind::Openai, "model_map", !self.model_map.is_empty()),
            (
                RunnerKind::Openai,
                "request_timeout",
                self.request_timeout.is_some(),
            ),
        ];
        if let Some((owner, k, _)) = owned
            .iter()
            .find(|(owner, _, set)| *set && *owner != self.runner)
        {
            let owner = match owner {
                RunnerKind::Command => "command",
                _ => "openai",
            };
            return Err(invalid(
                key(k),
                format!("applies only to runner = \"{owner}\""),
            ));
        }
        if self.runner == RunnerKind::Command {
            for (k, set) in [
                ("max_turns", self.max_turns.is_some()),
                ("grace_turns", self.grace_turns.is_some()),
                ("wrap_up_message", self.wrap_up_message.is_some()),
            ] {
                if set {
                    return Err(invalid(
                        key(k),
                        "applies only to runners with turns (openai, worker, simulated)",
                    ));
                }
            }
        }
        for (i, model) in self.fallback_models.iter().enumerate() {
            if crate::scheduler::ModelRef::parse(model).is_none() {
                return Err(invalid(
                    key(&format!("fallback_models[{i}]")),
                    format!(
                        "must be \"provider/model\" with both parts non-empty (got \"{model}\")"
                    ),
                ));
            }
        }
        if self.wrap_up_message.as_deref() == Some("") {
            return Err(invalid(key("wrap_up_message"), "must not be empty"));
        }
        if self.runner == RunnerKind::Openai {
            return self.validate_openai(name);
        }
        if self.runner != RunnerKind::Command {
            return Ok(());
        }
        if self.command.first().is_none_or(|p| p.is_empty()) {
            return Err(invalid(
                key("command"),
                "runner = \"command\" needs the program and its arguments, e.g. [\"my-agent\", \"--json\"]",
            ));
        }
        if self.prompt_input() == PromptInput::Arg
            && !self.command[1..].iter().any(|a| a.contains("{prompt}"))
        {
            return Err(invalid(
                key("prompt"),
                "prompt = \"arg\" needs a {prompt} placeholder in the command's arguments",
            ));
        }
        if self.max_result_bytes == Some(0) {
            return Err(invalid(key("max_result_bytes"), "must be ≥ 1"));
        }
        if let Some(args) = &self.continue_args {
            if !args.iter().any(|a| a.contains("{session}")) {
                return Err(invalid(
                    key("continue_args"),
                    "needs a {session} placeholder, e.g. [\"--resume\", \"{session}\"]",
                ));
            }
        }
        Ok(())
    }
}

impl AgentTypeConfig {
    fn validate_openai(&self, name: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("agents.{name}.{k}");
        let Some(base) = &self.base_url else {
            return Err(invalid(
                key("base_url"),
                "runner = \"openai\" needs the API root, e.g. \"http://127.0.0.1:11434/v1\"",
            ));
        };
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(invalid(
                key("base_url"),
                format!("must be an http:// or https:// URL (got \"{base}\")"),
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(invalid(key("max_tokens"), "must be ≥ 1"));
        }
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(invalid(
                    key("temperature"),
                    format!("must be 0..=2 (got {t})"),
                ));
            }
        }
        if self.request_timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid(key("request_timeout"), "must be > 0"));
        }
        Ok(())
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

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_background_agents: DEFAULT_MAX_BACKGROUND_AGENTS,
            default_concurrency: DEFAULT_CONCURRENCY,
            provider_concurrency: BTreeMap::new(),
            model_concurrency: BTreeMap::new(),
            max_concurrent_per_parent: DEFAULT_MAX_CONCURRENT_PER_PARENT,
            max_depth: DEFAULT_MAX_DEPTH,
            max_live_descendants_per_root: 0,
            max_prompt_bytes: DEFAULT_MAX_PROMPT_BYTES,
            max_watchers_per_tenant: DEFAULT_MAX_WATCHERS_PER_TENANT,
        }
    }
}

/// Default `[limits] max_watchers_per_tenant`.
pub const DEFAULT_MAX_WATCHERS_PER_TENANT: u32 = 100;

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

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            history: DEFAULT_WATCH_HISTORY,
            subscriber_buffer: DEFAULT_WATCH_SUBSCRIBER_BUFFER,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            limits: Limits::default(),
            runs: RunsConfig::default(),
            watch: WatchConfig::default(),
            agents: default_agents(),
            telemetry: TelemetryConfig::default(),
            store: StoreConfig::default(),
            ha: HaConfig::default(),
            auth: crate::auth::AuthConfig::default(),
            tenants: BTreeMap::new(),
            conversations: ConversationsConfig::default(),
        }
    }
}

fn default_agents() -> BTreeMap<String, AgentTypeConfig> {
    BTreeMap::from([(
        DEFAULT_AGENT_TYPE.to_owned(),
        AgentTypeConfig {
            runner: RunnerKind::Simulated,
            retry_on_worker_lost: 0,
            ..AgentTypeConfig::default()
        },
    )])
}

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

/// Where a config comes from; kept so SIGHUP can load it again the same way.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// TOML file, if any.
    pub file: Option<PathBuf>,
    /// `--listen` flag, overriding everything else.
    pub listen: Option<String>,
}

impl ConfigSource {
    /// Loads and validates: defaults → file → environment → flags.
    pub fn load(&self) -> Result<Config, ConfigError> {
        self.load_with_env(env_provider(
            &sections_of::<Config>(),
            WORKER_ONLY_SECTIONS,
        )?)
    }

    fn load_with_env(&self, env: Env) -> Result<Config, ConfigError> {
        let defaults = Config {
            agents: BTreeMap::new(),
            ..Config::default()
        };
        let mut figment = Figment::from(Serialized::defaults(defaults));
        if let Some(file) = &self.file {
            if !file.exists() {
                return Err(ConfigError::Load(format!(
                    "config file {} does not exist",
                    file.display()
                )));
            }
            figment = figment.merge(Toml::file_exact(file));
        }
        // The standard OpenTelemetry variables, between the file and
        // `SUBAGENTD_*` (read as plain strings: a ratio such as 0.5 is not
        // a number to parse here).
        let mut otel = Figment::new();
        for (var, key) in OTEL_ENV {
            // Empty means unset (the OpenTelemetry spec's rule), so an empty
            // templated variable does not override the file.
            if let Some(value) = std::env::var(var).ok().filter(|v| !v.trim().is_empty()) {
                otel = otel.merge(Serialized::default(&format!("telemetry.{key}"), value));
            }
        }
        figment = figment.merge(otel).merge(env);
        if let Some(listen) = &self.listen {
            figment = figment.merge(Serialized::default("server.listen", listen));
        }
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Load(format!("invalid config: {e}")))?;
        if config.agents.is_empty() {
            config.agents = default_agents();
        }
        config.validate()?;
        Ok(config)
    }

    /// Loads a config from TOML text alone (no environment); for tests and tools.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = Figment::from(Serialized::defaults(Config {
            agents: BTreeMap::new(),
            ..Config::default()
        }))
        .merge(Toml::string(text))
        .extract()
        .map_err(|e| ConfigError::Load(format!("invalid config: {e}")))?;
        if config.agents.is_empty() {
            config.agents = default_agents();
        }
        config.validate()?;
        Ok(config)
    }
}

pub(crate) fn invalid(key: impl Into<String>, rule: impl fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        rule: rule.to_string(),
    }
}

impl Config {
    /// Checks every rule; the error names the first broken key and its rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("server.listen", format!("must be an IP:port address ({e})")))?;
        self.auth.validate()?;
        self.server.tls.validate()?;
        if !self.server.health_listen.is_empty() {
            self.server
                .health_listen
                .parse::<SocketAddr>()
                .map_err(|e| {
                    invalid(
                        "server.health_listen",
                        format!("must be an IP:port address ({e})"),
                    )
                })?;
        }
        if self.telemetry.metrics_tls && !self.server.tls.enabled() {
            return Err(invalid(
                "telemetry.metrics_tls",
                "serves [server.tls]'s certificate: set server.tls.cert_file and key_file",
            ));
        }
        if !self.auth.certs.is_empty() && self.server.tls.client_auth == ClientAuth::None {
            return Err(invalid(
                "auth.certs",
                "certificate principals need client certificates: set [server.tls] \
                 client_auth = \"optional\" or \"required\"",
            ));
        }
        for (key, value) in [
            (
                "server.max_concurrent_streams",
                self.server.max_concurrent_streams as usize,
            ),
            (
                "server.max_header_list_bytes",
                self.server.max_header_list_bytes as usize,
            ),
            (
                "server.max_pending_reset_streams",
                self.server.max_pending_reset_streams,
            ),
        ] {
            if value < 1 {
                return Err(invalid(key, "must be ≥ 1 (got 0)"));
            }
        }
        for (name, t) in &self.tenants {
            if !crate::auth::is_tenant_name(name) {
                return Err(invalid(
                    format!("tenants.{name}"),
                    format!(
                        "tenant names are 1 to {} ASCII letters, digits, '-', '_' or '.'",
                        crate::auth::MAX_TENANT_BYTES
                    ),
                ));
            }
            if !(t.spawn_rate.is_finite() && t.spawn_rate >= 0.0) {
                return Err(invalid(
                    format!("tenants.{name}.spawn_rate"),
                    format!("must be a number ≥ 0 (got {})", t.spawn_rate),
                ));
            }
        }
        let l = &self.limits;
        if l.max_background_agents < 1 {
            return Err(invalid(
                "limits.max_background_agents",
                format!("must be ≥ 1 (got {})", l.max_background_agents),
            ));
        }
        if l.max_depth < 1 {
            return Err(invalid(
                "limits.max_depth",
                format!("must be ≥ 1 (got {})", l.max_depth),
            ));
        }
        if l.max_prompt_bytes < 1 {
            return Err(invalid("limits.max_prompt_bytes", "must be ≥ 1 (got 0)"));
        }
        for provider in l.provider_concurrency.keys() {
            if provider.is_empty() || provider.contains('/') {
                return Err(invalid(
                    format!("limits.provider_concurrency.{provider}"),
                    "must name a provider (no '/')",
                ));
            }
        }
        for model in l.model_concurrency.keys() {
            if crate::scheduler::ModelRef::parse(model).is_none() {
                return Err(invalid(
                    format!("limits.model_concurrency.\"{model}\""),
                    "must name a model as \"provider/model\"",
                ));
            }
        }
        let min = crate::scheduler::conversation::MIN_MAX_TRANSCRIPT_BYTES;
        if self.conversations.max_transcript_bytes < min {
            return Err(invalid(
                "conversations.max_transcript_bytes",
                format!(
                    "must be ≥ {min} (got {})",
                    self.conversations.max_transcript_bytes
                ),
            ));
        }
        if self.conversations.retention.is_zero() {
            return Err(invalid("conversations.retention", "must be > 0"));
        }
        if self.runs.default_timeout.is_zero() {
            return Err(invalid("runs.default_timeout", "must be > 0"));
        }
        if self.watch.history < 1 {
            return Err(invalid("watch.history", "must be ≥ 1"));
        }
        if self.watch.subscriber_buffer < 1 {
            return Err(invalid("watch.subscriber_buffer", "must be ≥ 1"));
        }
        for (name, agent) in &self.agents {
            if name.is_empty() {
                return Err(invalid("agents", "agent type names must not be empty"));
            }
            if agent.retry_on_worker_lost > 0 && agent.runner != RunnerKind::Worker {
                return Err(invalid(
                    format!("agents.{name}.retry_on_worker_lost"),
                    "applies only to runner = \"worker\"",
                ));
            }
            if agent.retry_on_restart > 0 && agent.runner == RunnerKind::Worker {
                return Err(invalid(
                    format!("agents.{name}.retry_on_restart"),
                    "does not apply to runner = \"worker\" (worker runs re-attach; see \
                     retry_on_worker_lost)",
                ));
            }
            agent.validate_command(name)?;
        }
        if self.server.keepalive_interval.is_zero() {
            return Err(invalid("server.keepalive_interval", "must be > 0"));
        }
        if self.server.keepalive_timeout.is_zero() {
            return Err(invalid("server.keepalive_timeout", "must be > 0"));
        }
        self.telemetry.validate()?;
        self.store.validate()?;
        self.ha.validate()
    }

    /// The config as TOML, as `--dump-config` prints it (a password in
    /// `store.url` shows as `***`).
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        shown.store.url = redact_url(&shown.store.url);
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    /// The listen address; valid after [`Config::validate`].
    pub fn listen_addr(&self) -> SocketAddr {
        self.server.listen.parse().unwrap_or_else(|_| {
            DEFAULT_LISTEN
                .parse()
                .expect("default listen address parses")
        })
    }
}

/// Reads a config file path for error messages.
pub fn describe(path: Option<&Path>) -> String {
    path.map_or_else(
        || "built-in defaults".to_owned(),
        |p| p.display().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_values() {
        let c = ConfigSource::from_toml_str("").unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:50051");
        assert_eq!(c.limits.max_background_agents, 5);
        assert_eq!(c.limits.default_concurrency, 5);
        assert_eq!(c.limits.max_concurrent_per_parent, 3);
        assert_eq!(c.limits.max_depth, 3);
        assert_eq!(c.limits.max_live_descendants_per_root, 0);
        assert_eq!(c.limits.max_prompt_bytes, 1 << 20);
        assert_eq!(c.runs.default_timeout, Duration::from_secs(1800));
        assert_eq!(c.runs.finished_retention, Duration::from_secs(600));
        assert_eq!(c.agents.keys().collect::<Vec<_>>(), vec!["simulated"]);
    }

    #[test]
    fn durations_take_units() {
        let c = ConfigSource::from_toml_str(
            "[runs]\ndefault_timeout = \"500ms\"\nfinished_retention = \"1h\"\n",
        )
        .unwrap();
        assert_eq!(c.runs.default_timeout, Duration::from_millis(500));
        assert_eq!(c.runs.finished_retention, Duration::from_secs(3600));
    }

    #[test]
    fn ha_defaults_to_a_ten_second_lease_and_no_advertised_address() {
        let c = ConfigSource::from_toml_str("").unwrap();
        assert_eq!(c.ha.lease_ttl, Duration::from_secs(10));
        assert_eq!(c.ha.advertise_address, "");
        let c = ConfigSource::from_toml_str(
            "[ha]\nlease_ttl = \"3s\"\nadvertise_address = \"subagentd-0.subagentd:50051\"\n",
        )
        .unwrap();
        assert_eq!(c.ha.lease_ttl, Duration::from_secs(3));
        assert_eq!(c.ha.advertise_address, "subagentd-0.subagentd:50051");
    }

    #[test]
    fn a_lease_shorter_than_a_second_is_refused() {
        let err = ConfigSource::from_toml_str("[ha]\nlease_ttl = \"900ms\"\n").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("ha.lease_ttl") && msg.contains("≥ 1s") && msg.contains("900ms"),
            "{msg}"
        );
        ConfigSource::from_toml_str("[ha]\nlease_ttl = \"1s\"\n").unwrap();
    }

    #[test]
    fn an_advertise_address_must_be_host_and_port() {
        for bad in [
            "subagentd",
            "subagentd:",
            ":50051",
            "host:0",
            "host:99999",
            "a b:1",
            "[::1:5",
        ] {
            let toml = format!("[ha]\nadvertise_address = {bad:?}\n");
            let err = ConfigSource::from_toml_str(&toml).unwrap_err();
            assert!(
                err.to_string().contains("ha.advertise_address"),
                "{bad}: {err}"
            );
        }
        for good in [
            "10.0.0.7:50051",
            "subagentd-1.subagentd.ns.svc:8443",
            "[fd00::7]:50051",
        ] {
            let toml = format!("[ha]\nadvertise_address = {good:?}\n");
            ConfigSource::from_toml_str(&toml).unwrap();
        }
    }

    #[test]
    fn the_advertised_address_falls_back_to_the_pod_ip_then_the_listen_address() {
        let listen: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        let mut ha = HaConfig::default();
        assert_eq!(ha.advertised(listen, Some("10.1.2.3")), "10.1.2.3:50051");
        assert_eq!(ha.advertised(listen, Some("fd00::3")), "[fd00::3]:50051");
        assert_eq!(ha.advertised(listen, Some("")), "0.0.0.0:50051");
        assert_eq!(ha.advertised(listen, None), "0.0.0.0:50051");
        ha.advertise_address = "lead.example:7000".into();
        assert_eq!(ha.advertised(listen, Some("10.1.2.3")), "lead.example:7000");
    }

    #[test]
    fn invalid_value_names_key_and_rule() {
        let err = ConfigSource::from_toml_str("[limits]\nmax_background_agents = 0\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("max_background_agents"), "{msg}");
        assert!(msg.contains("≥ 1"), "{msg}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = ConfigSource::from_toml_str("[limits]\nmax_bg = 3\n").unwrap_err();
        assert!(err.to_string().contains("max_bg"), "{err}");
    }

    #[test]
    fn configured_agents_replace_the_default_type() {
        let c = ConfigSource::from_toml_str("[agents.coder]\nrunner = \"simulated\"\n").unwrap();
        assert_eq!(c.agents.keys().collect::<Vec<_>>(), vec!["coder"]);
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the error type
    fn environment_overrides_file_and_flags_override_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[limits]\nmax_background_agents = 7\n[server]\nlisten = \"127.0.0.1:1\"\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("SUBAGENTD_LIMITS__MAX_BACKGROUND_AGENTS", "10");
            jail.set_env("SUBAGENTD_ADDR", "http://ignored");
            let source = ConfigSource {
                file: Some(path.clone()),
                listen: Some("127.0.0.1:2".into()),
            };
            let c = source.load().map_err(|e| e.to_string())?;
            assert_eq!(c.limits.max_background_agents, 10);
            assert_eq!(c.server.listen, "127.0.0.1:2");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the error type
    fn otel_variables_override_the_file_and_subagentd_variables_override_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[telemetry]\notlp_endpoint = \"http://file:4317\"\nservice_name = \"from-file\"\n\
             traces_sampler_arg = 0.25\nlog_format = \"json\"\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            let source = ConfigSource {
                file: Some(path.clone()),
                listen: None,
            };
            let c = source.load().map_err(|e| e.to_string())?;
            assert_eq!(c.telemetry.otlp_endpoint, "http://file:4317");
            assert_eq!(
                c.telemetry.traces_sampler_arg, "0.25",
                "a bare number is read"
            );
            assert_eq!(c.telemetry.log_format, LogFormat::Json);
            assert_eq!(c.telemetry.metrics_listen, DEFAULT_METRICS_LISTEN);
            // Empty means unset, as the OpenTelemetry spec says.
            jail.set_env("OTEL_SERVICE_NAME", "");
            jail.set_env("OTEL_TRACES_SAMPLER", " ");
            let c = source.load().map_err(|e| e.to_string())?;
            assert_eq!(c.telemetry.service_name, "from-file");
            assert_eq!(c.telemetry.traces_sampler, DEFAULT_TRACES_SAMPLER);
            jail.set_env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317");
            jail.set_env("OTEL_SERVICE_NAME", "from-env");
            jail.set_env("OTEL_RESOURCE_ATTRIBUTES", "a=1,b=two");
            jail.set_env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio");
            jail.set_env("OTEL_TRACES_SAMPLER_ARG", "0.5");
            jail.set_env("SUBAGENTD_TELEMETRY__SERVICE_NAME", "from-subagentd-env");
            let c = source.load().map_err(|e| e.to_string())?;
            assert_eq!(c.telemetry.otlp_endpoint, "http://env:4317");
            assert_eq!(c.telemetry.service_name, "from-subagentd-env");
            assert_eq!(
                c.telemetry.resource_pairs(),
                vec![("a".into(), "1".into()), ("b".into(), "two".into())]
            );
            assert_eq!(c.telemetry.traces_sampler, "parentbased_traceidratio");
            assert!((c.telemetry.sampler_ratio() - 0.5).abs() < 1e-12);
            jail.set_env("OTEL_TRACES_SAMPLER", "sometimes");
            let err = source.load().expect_err("unknown sampler").to_string();
            assert!(err.contains("telemetry.traces_sampler"), "{err}");
            assert!(
                err.contains("OTEL_TRACES_SAMPLER"),
                "names the variable too: {err}"
            );
            Ok(())
        });
    }

    #[test]
    fn bad_telemetry_values_name_their_key() {
        for (toml, key) in [
            (
                "otlp_endpoint = \"collector:4317\"",
                "telemetry.otlp_endpoint",
            ),
            (
                "traces_sampler_arg = \"1.5\"",
                "telemetry.traces_sampler_arg",
            ),
            (
                "resource_attributes = \"novalue\"",
                "telemetry.resource_attributes",
            ),
            (
                "metrics_listen = \"everywhere\"",
                "telemetry.metrics_listen",
            ),
            ("service_name = \" \"", "telemetry.service_name"),
        ] {
            let err = ConfigSource::from_toml_str(&format!("[telemetry]\n{toml}\n"))
                .expect_err(toml)
                .to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
        let off = ConfigSource::from_toml_str("[telemetry]\nmetrics_listen = \"\"\n").unwrap();
        assert!(off.telemetry.metrics_listen.is_empty());
    }

    #[test]
    fn the_store_section_defaults_to_the_embedded_store_and_checks_its_keys() {
        let c = ConfigSource::from_toml_str("").unwrap();
        assert_eq!(c.store.backend, StoreBackend::Embedded);
        assert_eq!(c.store.path, PathBuf::from("./subagentd-data"));
        assert_eq!(c.store.pool_size, 4);
        let memory = ConfigSource::from_toml_str("[store]\nbackend = \"memory\"\n").unwrap();
        assert_eq!(memory.store.backend, StoreBackend::Memory);
        for (toml, key) in [
            ("backend = \"postgres\"", "store.url"),
            ("backend = \"postgres\"\nurl = \"mysql://x\"", "store.url"),
            ("path = \"\"", "store.path"),
            ("pool_size = 0", "store.pool_size"),
            ("backend = \"sqlite\"", "backend"),
        ] {
            let err = ConfigSource::from_toml_str(&format!("[store]\n{toml}\n"))
                .expect_err(toml)
                .to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn a_password_in_the_store_url_never_shows_in_a_dump_or_a_debug_line() {
        let c = ConfigSource::from_toml_str(
            "[store]\nbackend = \"postgres\"\nurl = \"postgres://sa:s3cret@db:5432/sa\"\n",
        )
        .unwrap();
        for shown in [c.to_toml(), format!("{c:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("postgres://sa:***@db:5432/sa"), "{shown}");
        }
        assert_eq!(redact_url("postgres://sa@db/x"), "postgres://sa@db/x");
        assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
        assert_eq!(
            redact_url("postgres://u:hun/ter2@h:1/db"),
            "postgres://u:***@h:1/db"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=x"),
            "postgres://u@h/db?sslmode=require&password=***"
        );
        assert_eq!(redact_url("host=h password=x"), "host=h password=***");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the error type
    fn the_environment_sets_the_store_url() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("SUBAGENTD_STORE__URL", "postgres://sa:pw@db/sa");
            jail.set_env("SUBAGENTD_STORE__BACKEND", "postgres");
            let c = ConfigSource::default().load().unwrap();
            assert_eq!(c.store.url, "postgres://sa:pw@db/sa");
            assert_eq!(c.store.backend, StoreBackend::Postgres);
            Ok(())
        });
    }

    /// One variable per section of [`Config`]: a section the type gains
    /// without a case here fails the test, as a section the environment
    /// layer ignored would.
    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the error type
    fn every_section_is_set_through_the_environment() {
        type Check = fn(&Config) -> bool;
        let cases: &[(&str, &str, &str, Check)] = &[
            ("server", "SUBAGENTD_SERVER__SHUTDOWN_GRACE", "7s", |c| {
                c.server.shutdown_grace == Duration::from_secs(7)
            }),
            ("limits", "SUBAGENTD_LIMITS__MAX_DEPTH", "9", |c| {
                c.limits.max_depth == 9
            }),
            ("runs", "SUBAGENTD_RUNS__DEFAULT_TIMEOUT", "3m", |c| {
                c.runs.default_timeout == Duration::from_secs(180)
            }),
            ("watch", "SUBAGENTD_WATCH__HISTORY", "777", |c| {
                c.watch.history == 777
            }),
            (
                "agents",
                "SUBAGENTD_AGENTS__FROM_ENV__RUNNER",
                "simulated",
                |c| c.agents.contains_key("from_env"),
            ),
            (
                "telemetry",
                "SUBAGENTD_TELEMETRY__SERVICE_NAME",
                "env-svc",
                |c| c.telemetry.service_name == "env-svc",
            ),
            ("store", "SUBAGENTD_STORE__POOL_SIZE", "6", |c| {
                c.store.pool_size == 6
            }),
            ("ha", "SUBAGENTD_HA__LEASE_TTL", "4s", |c| {
                c.ha.lease_ttl == Duration::from_secs(4)
            }),
            ("auth", "SUBAGENTD_AUTH__KEYS_DIR", "/etc/env-keys", |c| {
                c.auth.keys_dir == "/etc/env-keys"
            }),
            (
                "tenants",
                "SUBAGENTD_TENANTS__ACME__MAX_BACKGROUND_AGENTS",
                "2",
                |c| c.tenants.get("acme").map(|t| t.max_background_agents) == Some(2),
            ),
            (
                "conversations",
                "SUBAGENTD_CONVERSATIONS__RETENTION",
                "2h",
                |c| c.conversations.retention == Duration::from_secs(7200),
            ),
        ];
        let mut covered: Vec<&str> = cases.iter().map(|c| c.0).collect();
        covered.sort_unstable();
        let mut sections = sections_of::<Config>();
        sections.sort_unstable();
        assert_eq!(covered, sections, "one case per section of Config");
        figment::Jail::expect_with(|jail| {
            for (section, var, value, _) in cases {
                // Each on its own first: no other variable hides a miss.
                jail.clear_env();
                jail.set_env(var, value);
                let c = ConfigSource::default().load().map_err(|e| e.to_string())?;
                let check = cases.iter().find(|c| c.0 == *section).unwrap().3;
                assert!(check(&c), "{var}={value} was ignored");
            }
            jail.clear_env();
            for (_, var, value, _) in cases {
                jail.set_env(var, value);
            }
            // `--dump-config` prints what `load` returns.
            let c = ConfigSource::default().load().map_err(|e| e.to_string())?;
            for (_, var, value, check) in cases {
                assert!(check(&c), "{var}={value} was ignored among the others");
            }
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the error type
    fn a_variable_naming_no_section_is_refused_and_the_workers_are_left_alone() {
        figment::Jail::expect_with(|jail| {
            // Not config (no `__`), or a section only the worker reads.
            jail.set_env("SUBAGENTD_ADDR", "http://127.0.0.1:1");
            jail.set_env("SUBAGENTD_TOKEN", "sk-x");
            jail.set_env("SUBAGENTD_WORKER__CAPACITY", "4");
            ConfigSource::default().load().map_err(|e| e.to_string())?;
            for typo in ["SUBAGENTD_LIMIT__MAX_DEPTH", "subagentd_hq__lease_ttl"] {
                jail.set_env(typo, "1");
                let err = ConfigSource::default().load().expect_err(typo).to_string();
                assert!(err.contains(typo), "names the variable: {err}");
                assert!(err.contains("limits, runs"), "lists the sections: {err}");
                jail.clear_env();
            }
            Ok(())
        });
    }

    #[test]
    fn check_env_sections_passes_known_and_foreign_sections_and_refuses_the_rest() {
        let own = vec!["limits".to_owned()];
        let check = |names: &[&str]| {
            check_env_sections(names.iter().map(|n| (*n).to_owned()), &own, &["worker"])
        };
        assert!(check(&["SUBAGENTD_LIMITS__MAX_DEPTH", "SUBAGENTD_Worker__CAPACITY"]).is_ok());
        assert!(check(&["SUBAGENTD_ADDR", "PATH", "OTHER_X__Y", "SUBAGENTD"]).is_ok());
        let err = check(&["SUBAGENTD___X"]).unwrap_err().to_string();
        assert!(err.contains("SUBAGENTD___X"), "{err}");
        let err = check(&["SUBAGENTD_HA__LEASE_TTL"]).unwrap_err().to_string();
        assert!(err.contains("`ha` is not one of limits, worker"), "{err}");
    }

    #[test]
    fn dump_round_trips() {
        let c =
            ConfigSource::from_toml_str("[limits.provider_concurrency]\nanthropic = 2\n").unwrap();
        let again = ConfigSource::from_toml_str(&c.to_toml()).unwrap();
        assert_eq!(c, again);
    }
}
