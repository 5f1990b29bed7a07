//! `[agents.NAME]`: agent types, their runners and the runner's keys.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    error::{invalid, ConfigError},
    limits::ModelRef,
};

/// Name of the agent type configured when the config names none.
pub const DEFAULT_AGENT_TYPE: &str = "simulated";

/// How runs of an agent type execute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunnerKind {
    /// The built-in scripted runner (see docs/concepts.md, "The simulated runner").
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

/// Whether a command run gets a checkout of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceKind {
    /// Runs share the type's `cwd`.
    #[default]
    None,
    /// Each run in its own git worktree, on its own branch.
    Worktree,
}

impl WorkspaceKind {
    fn is_none(&self) -> bool {
        *self == WorkspaceKind::None
    }
}

/// Which workspace branches outlive their run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepBranch {
    /// Those the run changed.
    #[default]
    Changes,
    Always,
    Never,
}

/// The author of the commits a workspace's run ends with.
pub const DEFAULT_COMMIT_AUTHOR: &str = "subagentd <subagentd@localhost>";
/// Their message.
pub const DEFAULT_COMMIT_MESSAGE: &str = "subagentd: work of agent {id}\n\n{description}";
/// The prefix of a workspace run's branch.
pub const DEFAULT_BRANCH_PREFIX: &str = "subagentd/";

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
    /// Command runner: `"worktree"` gives each run its own git worktree of
    /// `repo` on its own branch, committed and removed when the run ends
    /// (docs/workspaces.md); `"none"` (default) runs in `cwd`.
    #[serde(default, skip_serializing_if = "WorkspaceKind::is_none")]
    pub workspace: WorkspaceKind,
    /// Workspace: the git repository the worktrees belong to (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<std::path::PathBuf>,
    /// Workspace: the ref a first turn starts at (default "HEAD").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Workspace: a run's branch is this prefix and its agent id (default
    /// "subagentd/").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_prefix: Option<String>,
    /// Workspace: which branches outlive their run: `changes` (default:
    /// those the run changed), `always`, `never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<KeepBranch>,
    /// Workspace: where the worktrees are created (default: `worktrees`
    /// in the store's data directory; required for `subagentd worker`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<std::path::PathBuf>,
    /// Workspace: "Name <email>" of the commits made when a run ends
    /// (default [`DEFAULT_COMMIT_AUTHOR`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_author: Option<String>,
    /// Workspace: the message of those commits; `{id}` and
    /// `{description}` are replaced (default [`DEFAULT_COMMIT_MESSAGE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_message: Option<String>,
    /// Workspace: a run whose worktree (outside `.git`) grows past this
    /// fails with `WORKSPACE_FULL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_workspace_bytes: Option<u64>,
    /// The model a Spawn of this type gets when it names none
    /// ("provider/model"). Without one, a Spawn must name its model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// What the type is for, in a sentence or two for a lead model that
    /// picks a type (at most 1 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
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

/// Longest `[agents.NAME] description`, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

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
    /// Checks type `name`; errors name the key.
    pub fn validate(&self, name: &str) -> Result<(), ConfigError> {
        if name.is_empty() {
            return Err(invalid("agents", "agent type names must not be empty"));
        }
        if self.retry_on_worker_lost > 0 && self.runner != RunnerKind::Worker {
            return Err(invalid(
                format!("agents.{name}.retry_on_worker_lost"),
                "applies only to runner = \"worker\"",
            ));
        }
        if let Some(model) = &self.default_model {
            if ModelRef::parse(model).is_none() {
                return Err(invalid(
                    format!("agents.{name}.default_model"),
                    format!(
                        "must be \"provider/model\" with both parts non-empty (got \"{model}\")"
                    ),
                ));
            }
        }
        if let Some(description) = &self.description {
            if description.len() > MAX_DESCRIPTION_BYTES {
                return Err(invalid(
                    format!("agents.{name}.description"),
                    format!(
                        "is {} bytes; at most {MAX_DESCRIPTION_BYTES} allowed",
                        description.len()
                    ),
                ));
            }
        }
        if self.retry_on_restart > 0 && self.runner == RunnerKind::Worker {
            return Err(invalid(
                format!("agents.{name}.retry_on_restart"),
                "does not apply to runner = \"worker\" (worker runs re-attach; see \
                 retry_on_worker_lost)",
            ));
        }
        self.validate_command(name)
    }

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
            (
                RunnerKind::Command,
                "workspace",
                self.workspace != WorkspaceKind::None,
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
        self.validate_workspace(name)?;
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
            if ModelRef::parse(model).is_none() {
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

    /// The workspace keys: only with `workspace = "worktree"`, which needs
    /// `repo`. (Whether `repo` is a git repository is checked when the
    /// server or worker starts.)
    fn validate_workspace(&self, name: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("agents.{name}.{k}");
        let keys = [
            ("repo", self.repo.is_some()),
            ("base", self.base.is_some()),
            ("branch_prefix", self.branch_prefix.is_some()),
            ("keep", self.keep.is_some()),
            ("root", self.root.is_some()),
            ("commit_author", self.commit_author.is_some()),
            ("commit_message", self.commit_message.is_some()),
            ("max_workspace_bytes", self.max_workspace_bytes.is_some()),
        ];
        if self.workspace == WorkspaceKind::None {
            return match keys.iter().find(|(_, set)| *set) {
                Some((k, _)) => Err(invalid(key(k), "applies only to workspace = \"worktree\"")),
                None => Ok(()),
            };
        }
        if self.repo.as_ref().is_none_or(|r| r.as_os_str().is_empty()) {
            return Err(invalid(
                key("repo"),
                "workspace = \"worktree\" needs the git repository the worktrees belong to",
            ));
        }
        if self.cwd.as_ref().is_some_and(|c| c.is_absolute()) {
            return Err(invalid(
                key("cwd"),
                "with a workspace, cwd is relative to the run's worktree",
            ));
        }
        for (k, value) in [
            ("base", &self.base),
            ("branch_prefix", &self.branch_prefix),
            ("commit_author", &self.commit_author),
            ("commit_message", &self.commit_message),
        ] {
            if let Some(v) = value {
                if v.trim().is_empty() {
                    return Err(invalid(key(k), "must not be empty"));
                }
                if matches!(k, "base" | "branch_prefix")
                    && (v.starts_with('-') || v.contains(char::is_whitespace))
                {
                    return Err(invalid(
                        key(k),
                        format!("must not start with '-' or hold whitespace (got \"{v}\")"),
                    ));
                }
            }
        }
        if self.max_workspace_bytes == Some(0) {
            return Err(invalid(key("max_workspace_bytes"), "must be ≥ 1"));
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

pub(super) fn default_agents() -> BTreeMap<String, AgentTypeConfig> {
    BTreeMap::from([(
        DEFAULT_AGENT_TYPE.to_owned(),
        AgentTypeConfig {
            runner: RunnerKind::Simulated,
            retry_on_worker_lost: 0,
            ..AgentTypeConfig::default()
        },
    )])
}
