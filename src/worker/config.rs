//! The config file of `subagentd worker`: `[worker]` says who the worker
//! is, `[agents.NAME]` how it runs each agent type (exactly as in the
//! server's config), `[telemetry]` how it logs.

use std::{collections::BTreeMap, path::Path, time::Duration};

use figment::{
    providers::{Format, Serialized, Toml},
    Figment,
};
use serde::{Deserialize, Serialize};

use crate::config::{
    env_provider, invalid, sections_of, AgentTypeConfig, ConfigError, RunnerKind, TelemetryConfig,
    WorkspaceKind,
};

/// Default `[worker] drain_grace`.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(30);

/// The whole worker config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// `[worker]`.
    pub worker: WorkerSection,
    /// `[agents.NAME]`: the types this worker runs (at least one), with a
    /// built-in runner each (`command`, `openai` or `simulated`).
    pub agents: BTreeMap<String, AgentTypeConfig>,
    /// `[telemetry]`: the log format and level as for the server.
    pub telemetry: TelemetryConfig,
}

/// `[worker]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSection {
    /// Shown in the server's errors and logs. Empty (default): the host
    /// name and the process id.
    pub name: String,
    /// Runs held at once; at least 1. Default 1.
    pub capacity: u32,
    /// On SIGTERM: how long held runs may go on finishing before their
    /// programs are stopped. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub drain_grace: Duration,
    /// Free-form labels sent with the hello, for operators.
    pub labels: BTreeMap<String, String>,
}

impl Default for WorkerSection {
    fn default() -> Self {
        Self {
            name: String::new(),
            capacity: 1,
            drain_grace: DEFAULT_DRAIN_GRACE,
            labels: BTreeMap::new(),
        }
    }
}

impl WorkerConfig {
    /// Loads and validates: defaults → `file` → `SUBAGENTD_WORKER__*`,
    /// `SUBAGENTD_AGENTS__*` and `SUBAGENTD_TELEMETRY__*` variables.
    pub fn load(file: &Path) -> Result<Self, ConfigError> {
        if !file.exists() {
            return Err(ConfigError::Load(format!(
                "config file {} does not exist",
                file.display()
            )));
        }
        // The server's own sections are left to it (one environment may
        // serve both); a section neither command knows is refused.
        let server_sections = sections_of::<crate::config::Config>();
        let server_sections: Vec<&str> = server_sections.iter().map(String::as_str).collect();
        let env = env_provider(&sections_of::<Self>(), &server_sections)?;
        Self::extract(
            Figment::from(Serialized::defaults(Self::default()))
                .merge(Toml::file_exact(file))
                .merge(env),
        )
    }

    /// Loads a config from TOML text alone (no environment).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::extract(
            Figment::from(Serialized::defaults(Self::default())).merge(Toml::string(text)),
        )
    }

    fn extract(figment: Figment) -> Result<Self, ConfigError> {
        let config: Self = figment
            .extract()
            .map_err(|e| ConfigError::Load(format!("invalid config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every rule; the error names the first broken key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.worker.capacity < 1 {
            return Err(invalid("worker.capacity", "must be ≥ 1 (got 0)"));
        }
        if self.agents.is_empty() {
            return Err(invalid(
                "agents",
                "must declare at least one agent type the worker runs",
            ));
        }
        for (name, agent) in &self.agents {
            if name.is_empty() {
                return Err(invalid("agents", "agent type names must not be empty"));
            }
            let key = |k: &str| format!("agents.{name}.{k}");
            if agent.runner == RunnerKind::Worker {
                return Err(invalid(
                    key("runner"),
                    "must be a built-in runner (command, openai or simulated): the worker \
                     runs this type itself",
                ));
            }
            // Retries are the scheduler's decision.
            if agent.retry_on_worker_lost > 0 {
                return Err(invalid(
                    key("retry_on_worker_lost"),
                    "belongs in the server's config",
                ));
            }
            if agent.retry_on_restart > 0 {
                return Err(invalid(
                    key("retry_on_restart"),
                    "belongs in the server's config",
                ));
            }
            // The model is the server's decision too; the description is
            // for the server's clients.
            for (k, set) in [
                ("default_model", agent.default_model.is_some()),
                ("description", agent.description.is_some()),
            ] {
                if set {
                    return Err(invalid(key(k), "belongs in the server's config"));
                }
            }
            agent.validate_command(name)?;
            if agent.workspace == WorkspaceKind::Worktree && agent.root.is_none() {
                return Err(invalid(
                    key("root"),
                    "is required with workspace = \"worktree\": a worker has no data directory \
                     to put worktrees in",
                ));
            }
        }
        self.telemetry.validate()
    }

    /// The name sent in the hello.
    pub fn name(&self) -> String {
        if !self.worker.name.is_empty() {
            return self.worker.name.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        format!(
            "{}-{}",
            if host.is_empty() { "worker" } else { &host },
            std::process::id()
        )
    }

    /// The config as TOML, as `--dump-config` prints it.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_only_sections_are_those_the_server_lacks() {
        let server = sections_of::<crate::config::Config>();
        let only: Vec<String> = sections_of::<WorkerConfig>()
            .into_iter()
            .filter(|s| !server.contains(s))
            .collect();
        assert_eq!(only, crate::config::WORKER_ONLY_SECTIONS);
    }

    /// One variable per section of [`WorkerConfig`]; the server's sections
    /// are left to it, and a section neither knows is refused.
    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API fixes the error type
    fn every_section_is_set_through_the_environment() {
        let mut sections = sections_of::<WorkerConfig>();
        sections.sort_unstable();
        assert_eq!(
            sections,
            ["agents", "telemetry", "worker"],
            "a case for each below"
        );
        figment::Jail::expect_with(|jail| {
            jail.create_file("w.toml", "[agents.a]\nrunner = \"simulated\"\n")?;
            let file = jail.directory().join("w.toml");
            jail.set_env("SUBAGENTD_WORKER__CAPACITY", "3");
            jail.set_env("SUBAGENTD_AGENTS__B__RUNNER", "simulated");
            jail.set_env("SUBAGENTD_TELEMETRY__LOG_FORMAT", "json");
            // The server's: not the worker's business, not an error either.
            jail.set_env("SUBAGENTD_HA__LEASE_TTL", "4s");
            jail.set_env("SUBAGENTD_STORE__BACKEND", "memory");
            let c = WorkerConfig::load(&file).map_err(|e| e.to_string())?;
            assert_eq!(c.worker.capacity, 3);
            assert_eq!(c.agents.keys().collect::<Vec<_>>(), ["a", "b"]);
            assert_eq!(c.telemetry.log_format, crate::config::LogFormat::Json);
            jail.set_env("SUBAGENTD_WORKERS__CAPACITY", "3");
            let err = WorkerConfig::load(&file).expect_err("unknown").to_string();
            assert!(err.contains("SUBAGENTD_WORKERS__CAPACITY"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn a_minimal_file_gets_the_documented_defaults() {
        let c = WorkerConfig::from_toml_str("[agents.coder]\nrunner = \"simulated\"\n").unwrap();
        assert_eq!(c.worker.capacity, 1);
        assert_eq!(c.worker.drain_grace, DEFAULT_DRAIN_GRACE);
        assert!(c.name().ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn keys_are_checked_with_the_servers_rules() {
        let err = |text: &str| WorkerConfig::from_toml_str(text).unwrap_err().to_string();
        assert!(
            err("[worker]\ncapacity = 0\n[agents.a]\nrunner = \"simulated\"\n")
                .contains("worker.capacity")
        );
        assert!(err("[worker]\n").contains("at least one agent type"));
        assert!(err("[agents.a]\nrunner = \"worker\"\n").contains("agents.a.runner"));
        assert!(err("[agents.a]\nrunner = \"command\"\n").contains("agents.a.command"));
        assert!(
            err("[agents.a]\nrunner = \"simulated\"\nretry_on_worker_lost = 1\n")
                .contains("server's config")
        );
        assert!(
            err("[agents.a]\nrunner = \"simulated\"\nbase_url = \"http://x\"\n")
                .contains("agents.a.base_url")
        );
        assert!(err("[worker]\nbogus = 1\n[agents.a]\nrunner = \"simulated\"\n").contains("bogus"));
        assert!(err("[agents.a]\n").contains("runner"));
        // A worker has no data directory: a workspace type names its root.
        assert!(err(
            "[agents.a]\nrunner = \"command\"\ncommand = [\"true\"]\nworkspace = \"worktree\"\n\
             repo = \"/r\"\n"
        )
        .contains("agents.a.root"));
        for key in ["default_model = \"acme/m\"", "description = \"d\""] {
            let text = err(&format!("[agents.a]\nrunner = \"simulated\"\n{key}\n"));
            assert!(text.contains("server's config"), "{key}: {text}");
        }
        let c = WorkerConfig::from_toml_str(
            "[worker]\nname = \"w1\"\ncapacity = 4\ndrain_grace = \"2s\"\n\
             [agents.a]\nrunner = \"command\"\ncommand = [\"cat\"]\n",
        )
        .unwrap();
        assert_eq!((c.name().as_str(), c.worker.capacity), ("w1", 4));
        assert_eq!(c.worker.drain_grace, Duration::from_secs(2));
    }
}
