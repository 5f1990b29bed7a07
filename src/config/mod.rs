//! Layered configuration: built-in defaults → TOML file → `SUBAGENTD_*`
//! environment → command-line flags, then [`Config::validate`].
//!
//! Durations are strings with a unit (`"500ms"`, `"10s"`, `"30m"`, `"1h"`).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use figment::{
    providers::{Env, Format, Serialized, Toml},
    Figment,
};
use serde::{Deserialize, Serialize};

pub mod agents;
pub mod auth;
pub mod conversations;
pub mod error;
pub mod ha;
pub mod limits;
pub mod mcp;
pub mod runs;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod watch;

use self::agents::default_agents;
pub use self::agents::{
    AgentTypeConfig, KeepBranch, PromptInput, RunnerKind, SteerInput, WorkspaceKind,
    DEFAULT_AGENT_TYPE, DEFAULT_BRANCH_PREFIX, DEFAULT_COMMIT_AUTHOR, DEFAULT_COMMIT_MESSAGE,
    DEFAULT_GRACE_TURNS, DEFAULT_KILL_GRACE, DEFAULT_MAX_RESULT_BYTES, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_WRAP_UP_MESSAGE, MAX_DESCRIPTION_BYTES,
};
pub use self::conversations::{
    ConversationsConfig, DEFAULT_MAX_TRANSCRIPT_BYTES, DEFAULT_RETENTION, MIN_MAX_TRANSCRIPT_BYTES,
};
pub use self::error::{invalid, ConfigError};
pub use self::ha::{HaConfig, DEFAULT_LEASE_TTL, MIN_LEASE_TTL};
pub use self::limits::{
    Limits, ModelRef, TenantLimits, DEFAULT_CONCURRENCY, DEFAULT_MAX_BACKGROUND_AGENTS,
    DEFAULT_MAX_CONCURRENT_PER_PARENT, DEFAULT_MAX_DEPTH, DEFAULT_MAX_PROMPT_BYTES,
    DEFAULT_MAX_WATCHERS_PER_TENANT,
};
pub use self::mcp::{
    HttpConfig, McpApprovals, McpConfig, DEFAULT_HTTP_LISTEN, DEFAULT_MCP_MAX_AWAIT,
    DEFAULT_MCP_MAX_RESULT_CHARS,
};
pub use self::runs::{
    RunsConfig, DEFAULT_CANCEL_GRACE, DEFAULT_FINISHED_RETENTION, DEFAULT_MAX_IDENTICAL_TOOL_CALLS,
    DEFAULT_MAX_TOOL_CALLS, DEFAULT_RUN_TIMEOUT, DEFAULT_STALE_TIMEOUT,
    DEFAULT_WORKER_REATTACH_GRACE,
};
pub use self::server::{
    ClientAuth, ServerConfig, ServerTls, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT,
    DEFAULT_LISTEN, DEFAULT_SHUTDOWN_GRACE,
};
pub use self::store::{
    redact_url, StoreBackend, StoreConfig, DEFAULT_STORE_PATH, DEFAULT_STORE_POOL_SIZE,
};
pub use self::telemetry::{
    LogFormat, TelemetryConfig, DEFAULT_METRICS_LISTEN, DEFAULT_SERVICE_NAME,
    DEFAULT_TRACES_SAMPLER, OTEL_ENV, TRACES_SAMPLERS,
};
pub use self::watch::{WatchConfig, DEFAULT_WATCH_HISTORY, DEFAULT_WATCH_SUBSCRIBER_BUFFER};

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
    pub auth: auth::AuthConfig,
    /// `[tenants.NAME]`: limits of one tenant on top of the global ones;
    /// reloadable. A tenant without an entry has none of its own.
    pub tenants: BTreeMap<String, TenantLimits>,
    /// `[conversations]`: transcripts kept for continuations; reloadable.
    pub conversations: ConversationsConfig,
    /// `[mcp]`: what the MCP lead tools offer, as GetServerInfo reports it.
    /// Read at start only.
    pub mcp: McpConfig,
    /// `[http]`: the listener of `/mcp`. Read at start only.
    pub http: HttpConfig,
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
            auth: auth::AuthConfig::default(),
            tenants: BTreeMap::new(),
            conversations: ConversationsConfig::default(),
            mcp: McpConfig::default(),
            http: HttpConfig::default(),
        }
    }
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

impl Config {
    /// Checks every rule; the error names the first broken key and its rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // Each section checks its own keys; the order is the one the checks
        // always ran in, so the first broken key reported stays the same.
        self.server.validate_listen()?;
        self.auth.validate()?;
        self.server.validate_tls_and_health()?;
        // Rules across sections.
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
        self.server.validate_http2_limits()?;
        for (name, tenant) in &self.tenants {
            tenant.validate(name)?;
        }
        self.limits.validate()?;
        self.conversations.validate()?;
        self.mcp.validate()?;
        self.http.validate(self.server.tls.enabled())?;
        self.runs.validate()?;
        self.watch.validate()?;
        for (name, agent) in &self.agents {
            agent.validate(name)?;
        }
        self.server.validate_keepalive()?;
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
    use std::time::Duration;

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
            ("mcp", "SUBAGENTD_MCP__APPROVALS", "lead", |c| {
                c.mcp.approvals == McpApprovals::Lead
            }),
            ("http", "SUBAGENTD_HTTP__LISTEN", "", |c| {
                c.http.listen.is_empty()
            }),
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
                assert!(
                    err.contains("limits, mcp, runs"),
                    "lists the sections: {err}"
                );
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

    #[test]
    fn an_agent_types_default_model_and_description_are_checked() {
        let key_of = |toml: &str| match ConfigSource::from_toml_str(toml) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{toml}: {other:?}"),
        };
        assert_eq!(
            key_of("[agents.a]\nrunner = \"simulated\"\ndefault_model = \"gpt\"\n"),
            "agents.a.default_model"
        );
        let long = "x".repeat(MAX_DESCRIPTION_BYTES + 1);
        assert_eq!(
            key_of(&format!(
                "[agents.a]\nrunner = \"simulated\"\ndescription = \"{long}\"\n"
            )),
            "agents.a.description"
        );
        let ok = ConfigSource::from_toml_str(&format!(
            "[agents.a]\nrunner = \"simulated\"\ndefault_model = \"acme/small\"\n\
             description = \"{}\"\n",
            "x".repeat(MAX_DESCRIPTION_BYTES)
        ))
        .unwrap();
        assert_eq!(ok.agents["a"].default_model.as_deref(), Some("acme/small"));
    }
}
