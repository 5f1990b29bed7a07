//! The client subcommands' flags, and the request each one makes of them.
//!
//! Building a request is pure (`to_request`) so flag handling is tested
//! without a server; [`super::commands`] does the I/O.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::client::{TlsArgs, DEFAULT_ADDR};
use crate::pb;

/// Flags shared by every client subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// Server address, e.g. http://127.0.0.1:50051; "host:port" without a
    /// scheme means http.
    #[arg(long, env = "SUBAGENTD_ADDR", default_value = DEFAULT_ADDR, value_name = "URL")]
    pub addr: String,
    /// Machine-readable output: one JSON object per line (protobuf JSON field
    /// names, enums as names, RFC 3339 timestamps).
    #[arg(long)]
    pub json: bool,
    /// API key sent as `authorization: Bearer <key>`, for servers with
    /// `[auth] mode = "required"`.
    #[arg(
        long,
        env = "SUBAGENTD_TOKEN",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// Flags of `spawn` (SpawnRequest).
#[derive(clap::Args, Debug, Clone)]
pub struct SpawnArgs {
    /// Agent type: a configured `[agents.NAME]`. Required unless
    /// --continue-from is given (then: the continued agent's).
    #[arg(long, required_unless_present = "continue_from")]
    pub agent: Option<String>,
    /// Model as "provider/model", e.g. anthropic/claude-sonnet-4. Required
    /// unless --continue-from is given (then: the continued agent's).
    #[arg(long, required_unless_present = "continue_from")]
    pub model: Option<String>,
    /// Continue the conversation of this finished agent: the new agent is
    /// its next turn and its run sees the transcript so far. It inherits
    /// the agent type, model, parent, lead and labels unless given here.
    #[arg(long, value_name = "ID")]
    pub continue_from: Option<String>,
    /// With --continue-from: start a new conversation from a copy of the
    /// history up to that agent, which need not be the latest turn.
    #[arg(long, requires = "continue_from")]
    pub fork: bool,
    /// Instructions for the run. Without --prompt or --prompt-file the prompt
    /// is read from stdin.
    #[arg(long, conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the instructions from this file.
    #[arg(long, value_name = "PATH")]
    pub prompt_file: Option<PathBuf>,
    /// Free text for people.
    #[arg(long)]
    pub description: Option<String>,
    /// Parent agent id, for a child agent.
    #[arg(long)]
    pub parent_id: Option<String>,
    /// The frontend's own run id (root agents only; children inherit it).
    #[arg(long)]
    pub lead_id: Option<String>,
    /// Queue if needed and return at once instead of waiting until the agent
    /// is settled.
    #[arg(long)]
    pub background: bool,
    /// Label as KEY=VALUE; repeatable. A repeated key keeps the last value.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Run deadline from the start of the run, e.g. 30s or 10m. Default: the
    /// server's `[runs] default_timeout`.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<prost_types::Duration>,
    /// Deduplicates retries: a second spawn with the same key under the same
    /// parent (or lead) returns the first agent.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Do not cancel the agent when its parent ends.
    #[arg(long)]
    pub detached: bool,
    /// For an agent type with a workspace: the branch, tag or commit the
    /// run's worktree starts at, instead of the type's `base`.
    #[arg(long, value_name = "REF", conflicts_with = "continue_from")]
    pub workspace_base: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Where `spawn` takes its prompt from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PromptSource {
    Inline(String),
    File(PathBuf),
    Stdin,
}

impl SpawnArgs {
    pub(super) fn prompt_source(&self) -> PromptSource {
        match (&self.prompt, &self.prompt_file) {
            (Some(text), _) => PromptSource::Inline(text.clone()),
            (None, Some(path)) => PromptSource::File(path.clone()),
            (None, None) => PromptSource::Stdin,
        }
    }

    /// The SpawnRequest for these flags and an already resolved prompt.
    pub fn to_request(&self, prompt: String) -> pb::SpawnRequest {
        pb::SpawnRequest {
            agent: self.agent.clone().unwrap_or_default(),
            model: self.model.clone().unwrap_or_default(),
            prompt,
            description: self.description.clone().unwrap_or_default(),
            parent_id: self.parent_id.clone().unwrap_or_default(),
            lead_id: self.lead_id.clone().unwrap_or_default(),
            background: self.background,
            labels: self.labels.iter().cloned().collect::<HashMap<_, _>>(),
            timeout: self.timeout,
            idempotency_key: self.idempotency_key.clone().unwrap_or_default(),
            detached: self.detached,
            continue_from: self.continue_from.clone().unwrap_or_default(),
            fork: self.fork,
            workspace_base: self.workspace_base.clone().unwrap_or_default(),
        }
    }
}

/// A `--status` filter value; the names are the AgentStatus names in
/// kebab case.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// AGENT_STATUS_RUNNING
    Running,
    /// AGENT_STATUS_QUEUED
    Queued,
    /// AGENT_STATUS_AWAITING_APPROVAL
    AwaitingApproval,
    /// AGENT_STATUS_DONE
    Done,
    /// AGENT_STATUS_FAILED
    Failed,
    /// AGENT_STATUS_CANCELLED
    Cancelled,
}

impl From<StatusFilter> for pb::AgentStatus {
    fn from(filter: StatusFilter) -> Self {
        match filter {
            StatusFilter::Running => pb::AgentStatus::Running,
            StatusFilter::Queued => pb::AgentStatus::Queued,
            StatusFilter::AwaitingApproval => pb::AgentStatus::AwaitingApproval,
            StatusFilter::Done => pb::AgentStatus::Done,
            StatusFilter::Failed => pb::AgentStatus::Failed,
            StatusFilter::Cancelled => pb::AgentStatus::Cancelled,
        }
    }
}

/// Flags of `status` (StatusRequest).
#[derive(clap::Args, Debug, Clone)]
pub struct StatusArgs {
    /// Agent ids to read (at most 100), in this order. Not combinable with
    /// the filters.
    pub ids: Vec<String>,
    /// Only direct children of this agent.
    #[arg(long)]
    pub parent_id: Option<String>,
    /// Only agents of this tree.
    #[arg(long)]
    pub root_id: Option<String>,
    /// Only agents under this lead, at every depth.
    #[arg(long)]
    pub lead_id: Option<String>,
    /// Only agents in one of these states; repeatable or comma-separated.
    #[arg(
        long = "status",
        value_enum,
        value_delimiter = ',',
        value_name = "STATUS"
    )]
    pub statuses: Vec<StatusFilter>,
    /// Page size for filtered listings. Default (server): 100, at most 1000.
    #[arg(long)]
    pub page_size: Option<u32>,
    /// Token from a previous page (printed after a page that has more).
    #[arg(long)]
    pub page_token: Option<String>,
    /// Follow next-page tokens until the last page.
    #[arg(long)]
    pub all_pages: bool,
    /// Only agents of this tenant (an admin's credential sees every
    /// tenant's; any other sees only its own).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only the agents (turns) of this conversation.
    #[arg(long = "conversation", value_name = "ID")]
    pub conversation_id: Option<String>,
    /// Only settled agents that no inbox Await has collected yet.
    #[arg(long)]
    pub uncollected: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl StatusArgs {
    /// The StatusRequest for the first page these flags ask for.
    pub fn to_request(&self) -> pb::StatusRequest {
        pb::StatusRequest {
            ids: self.ids.clone(),
            parent_id: self.parent_id.clone().unwrap_or_default(),
            root_id: self.root_id.clone().unwrap_or_default(),
            lead_id: self.lead_id.clone().unwrap_or_default(),
            tenant: self.tenant.clone().unwrap_or_default(),
            conversation_id: self.conversation_id.clone().unwrap_or_default(),
            uncollected: self.uncollected,
            statuses: self
                .statuses
                .iter()
                .map(|s| pb::AgentStatus::from(*s) as i32)
                .collect(),
            page_size: self.page_size.unwrap_or_default(),
            page_token: self.page_token.clone().unwrap_or_default(),
        }
    }
}

/// Flags of `await` (AwaitRequest): agent ids, or one inbox (`--lead-id`
/// or `--parent-id`).
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["ids", "lead_id", "parent_id"])))]
pub struct AwaitArgs {
    /// Agents to wait for (1 to 100).
    pub ids: Vec<String>,
    /// Wait on this lead's inbox: its root agents that are live or settled
    /// and not yet collected; prints only the settled ones.
    #[arg(long)]
    pub lead_id: Option<String>,
    /// Wait on this agent's inbox: its direct children, as `--lead-id`.
    #[arg(long)]
    pub parent_id: Option<String>,
    /// Mark the finished agents printed as collected, so the next inbox
    /// `await --collect` prints the next ones.
    #[arg(long)]
    pub collect: bool,
    /// How long to wait, e.g. 30s. Default (server): 30s, at most 1h.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<prost_types::Duration>,
    /// Return once any agent is settled instead of all.
    #[arg(long)]
    pub any: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl AwaitArgs {
    /// The AwaitRequest for these flags.
    pub fn to_request(&self) -> pb::AwaitRequest {
        let mode = if self.any {
            pb::AwaitMode::Any
        } else {
            pb::AwaitMode::All
        };
        pb::AwaitRequest {
            ids: self.ids.clone(),
            timeout: self.timeout,
            mode: mode as i32,
            lead_id: self.lead_id.clone().unwrap_or_default(),
            parent_id: self.parent_id.clone().unwrap_or_default(),
            collect: self.collect,
        }
    }
}

/// Flags of `cancel` (CancelRequest). Exactly one of `--id` and `--lead-id`.
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["id", "lead_id"])))]
pub struct CancelArgs {
    /// Cancel this agent and its live descendants.
    #[arg(long)]
    pub id: Option<String>,
    /// Cancel every live agent under this lead.
    #[arg(long)]
    pub lead_id: Option<String>,
    /// Recorded as the cancellation's error message.
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl CancelArgs {
    /// The CancelRequest for these flags.
    pub fn to_request(&self) -> pb::CancelRequest {
        pb::CancelRequest {
            id: self.id.clone().unwrap_or_default(),
            lead_id: self.lead_id.clone().unwrap_or_default(),
            reason: self.reason.clone().unwrap_or_default(),
        }
    }
}

/// Arguments of `steer` (SteerRequest).
#[derive(clap::Args, Debug, Clone)]
pub struct SteerArgs {
    /// The agent to steer.
    pub id: String,
    /// The message for its run.
    pub message: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl SteerArgs {
    /// The SteerRequest for these arguments.
    pub fn to_request(&self) -> pb::SteerRequest {
        pb::SteerRequest {
            id: self.id.clone(),
            message: self.message.clone(),
        }
    }
}

/// Arguments of `approve` (ApproveRequest).
#[derive(clap::Args, Debug, Clone)]
pub struct ApproveArgs {
    /// The agent awaiting approval.
    pub id: String,
    /// Its pending approval's id (shown by `status` and `await`).
    pub approval_id: String,
    /// Deny instead of approve.
    #[arg(long)]
    pub deny: bool,
    /// A note passed to the run with the decision.
    #[arg(long)]
    pub note: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl ApproveArgs {
    /// The ApproveRequest for these arguments.
    pub fn to_request(&self) -> pb::ApproveRequest {
        let decision = if self.deny {
            pb::ApprovalDecision::Deny
        } else {
            pb::ApprovalDecision::Approve
        };
        pb::ApproveRequest {
            id: self.id.clone(),
            approval_id: self.approval_id.clone(),
            decision: decision as i32,
            note: self.note.clone().unwrap_or_default(),
        }
    }
}

/// Flags of `watch` (WatchAgentsRequest). Filters combine with AND; none
/// means all agents.
#[derive(clap::Args, Debug, Clone)]
pub struct WatchArgs {
    /// Only this agent; repeatable (at most 100).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,
    /// Only direct children of this agent.
    #[arg(long)]
    pub parent_id: Option<String>,
    /// Only agents of this tree.
    #[arg(long)]
    pub root_id: Option<String>,
    /// Only agents under this lead.
    #[arg(long)]
    pub lead_id: Option<String>,
    /// First replay retained events after this sequence number (0: no
    /// replay). Use the last sequence seen to resume without gaps.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub after_sequence: u64,
    /// Start with one SNAPSHOT event per matching agent.
    #[arg(long)]
    pub snapshot: bool,
    /// Also show progress: output chunks and tool calls as runs report them.
    #[arg(long)]
    pub progress: bool,
    /// Only agents of this tenant (as `status --tenant`).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only the agents (turns) of this conversation.
    #[arg(long = "conversation", value_name = "ID")]
    pub conversation_id: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl WatchArgs {
    /// The WatchAgentsRequest for these flags.
    pub fn to_request(&self) -> pb::WatchAgentsRequest {
        pb::WatchAgentsRequest {
            ids: self.ids.clone(),
            parent_id: self.parent_id.clone().unwrap_or_default(),
            root_id: self.root_id.clone().unwrap_or_default(),
            lead_id: self.lead_id.clone().unwrap_or_default(),
            after_sequence: self.after_sequence,
            include_snapshot: self.snapshot,
            include_progress: self.progress,
            tenant: self.tenant.clone().unwrap_or_default(),
            conversation_id: self.conversation_id.clone().unwrap_or_default(),
        }
    }
}

/// Arguments of `transcript` (GetTranscriptRequest).
#[derive(clap::Args, Debug, Clone)]
pub struct TranscriptArgs {
    /// An agent id: the history up to and including that agent's turn.
    /// With --conversation, a conversation id: all of it.
    pub id: String,
    /// ID is a conversation id (the id of the conversation's first agent)
    /// rather than an agent id.
    #[arg(long)]
    pub conversation: bool,
    /// Entries per request; every page is printed either way. Default
    /// (server): 100, at most 1000.
    #[arg(long, value_name = "N")]
    pub page_size: Option<u32>,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl TranscriptArgs {
    /// The GetTranscriptRequest for the first page.
    pub fn to_request(&self) -> pb::GetTranscriptRequest {
        let (agent_id, conversation_id) = if self.conversation {
            (String::new(), self.id.clone())
        } else {
            (self.id.clone(), String::new())
        };
        pb::GetTranscriptRequest {
            agent_id,
            conversation_id,
            page_size: self.page_size.unwrap_or_default(),
            page_token: String::new(),
        }
    }
}

/// Parses `KEY=VALUE`; the value may be empty or contain `=`, the key may not
/// be empty.
fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        Some(_) => Err(format!("label {s:?} has an empty key")),
        None => Err(format!("label {s:?} is not KEY=VALUE")),
    }
}

/// Parses a humantime duration ("500ms", "10s", "30m") into the protobuf type.
fn parse_duration(s: &str) -> Result<prost_types::Duration, String> {
    let duration = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    prost_types::Duration::try_from(duration).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{output, Cli, Command};

    fn parse(args: &[&str]) -> Command {
        let argv = std::iter::once("subagentd").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
            .command
    }

    fn parse_err(args: &[&str]) -> clap::error::ErrorKind {
        let argv = std::iter::once("subagentd").chain(args.iter().copied());
        Cli::try_parse_from(argv).unwrap_err().kind()
    }

    #[test]
    fn spawn_flags_fill_the_request() {
        let Command::Spawn(args) = parse(&[
            "spawn",
            "--agent",
            "coder",
            "--model",
            "anthropic/claude-sonnet-4",
            "--prompt",
            "fix it",
            "--description",
            "d",
            "--parent-id",
            "p",
            "--lead-id",
            "l",
            "--background",
            "--label",
            "team=infra",
            "--label",
            "expr=a=b",
            "--label",
            "team=core",
            "--timeout",
            "1m 500ms",
            "--idempotency-key",
            "k",
            "--detached",
        ]) else {
            panic!("expected spawn");
        };
        assert_eq!(args.prompt_source(), PromptSource::Inline("fix it".into()));
        let request = args.to_request("fix it".into());
        assert_eq!(
            request,
            pb::SpawnRequest {
                agent: "coder".into(),
                model: "anthropic/claude-sonnet-4".into(),
                prompt: "fix it".into(),
                description: "d".into(),
                parent_id: "p".into(),
                lead_id: "l".into(),
                background: true,
                labels: HashMap::from([
                    ("team".into(), "core".into()),
                    ("expr".into(), "a=b".into()),
                ]),
                timeout: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 500_000_000,
                }),
                idempotency_key: "k".into(),
                detached: true,
                continue_from: String::new(),
                fork: false,
                workspace_base: String::new(),
            }
        );
    }

    #[test]
    fn spawn_defaults_leave_optional_fields_empty() {
        let Command::Spawn(args) = parse(&["spawn", "--agent", "a", "--model", "p/m"]) else {
            panic!("expected spawn");
        };
        assert_eq!(args.prompt_source(), PromptSource::Stdin);
        assert_eq!(args.client.addr, DEFAULT_ADDR);
        assert!(!args.client.json);
        let request = args.to_request("x".into());
        assert_eq!(request.timeout, None);
        assert!(request.labels.is_empty());
        assert!(!request.background && !request.detached);
        assert!(request.parent_id.is_empty() && request.idempotency_key.is_empty());
    }

    #[test]
    fn spawn_rejects_conflicting_prompts_and_bad_values() {
        use clap::error::ErrorKind;
        let base = ["spawn", "--agent", "a", "--model", "p/m"];
        let with = |extra: &[&'static str]| -> Vec<&'static str> {
            base.iter().chain(extra).copied().collect()
        };
        assert_eq!(
            parse_err(&with(&["--prompt", "x", "--prompt-file", "f"])),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            parse_err(&with(&["--label", "novalue"])),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            parse_err(&with(&["--label", "=v"])),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            parse_err(&with(&["--timeout", "soon"])),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            parse_err(&["spawn", "--model", "p/m"]),
            ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn status_flags_fill_the_request() {
        let Command::Status(args) = parse(&[
            "status",
            "--parent-id",
            "p",
            "--root-id",
            "r",
            "--lead-id",
            "l",
            "--status",
            "running,awaiting-approval",
            "--status",
            "cancelled",
            "--page-size",
            "50",
            "--page-token",
            "t",
            "--all-pages",
            "--uncollected",
        ]) else {
            panic!("expected status");
        };
        assert!(args.all_pages);
        assert_eq!(
            args.to_request(),
            pb::StatusRequest {
                tenant: Default::default(),
                uncollected: true,
                ids: vec![],
                parent_id: "p".into(),
                root_id: "r".into(),
                lead_id: "l".into(),
                statuses: vec![
                    pb::AgentStatus::Running as i32,
                    pb::AgentStatus::AwaitingApproval as i32,
                    pb::AgentStatus::Cancelled as i32,
                ],
                page_size: 50,
                page_token: "t".into(),
                conversation_id: String::new(),
            }
        );
    }

    #[test]
    fn status_takes_ids_and_rejects_unknown_statuses() {
        let Command::Status(args) = parse(&["status", "a", "b"]) else {
            panic!("expected status");
        };
        let request = args.to_request();
        assert_eq!(request.ids, ["a", "b"]);
        assert!(request.statuses.is_empty());
        assert_eq!(request.page_size, 0);
        assert_eq!(
            parse_err(&["status", "--status", "sleeping"]),
            clap::error::ErrorKind::InvalidValue
        );
    }

    #[test]
    fn every_status_filter_maps_to_its_agent_status() {
        use clap::ValueEnum as _;
        for filter in StatusFilter::value_variants() {
            let name = filter.to_possible_value().unwrap().get_name().to_owned();
            let status = pb::AgentStatus::from(*filter);
            assert_eq!(
                status.as_str_name(),
                format!("AGENT_STATUS_{}", name.replace('-', "_").to_uppercase())
            );
            // The human output uses the same words as the filter.
            assert_eq!(output::status_word(status as i32), name);
        }
    }

    #[test]
    fn await_flags_fill_the_request() {
        let Command::Await(args) = parse(&["await", "a", "b", "--timeout", "500ms", "--any"])
        else {
            panic!("expected await");
        };
        assert_eq!(
            args.to_request(),
            pb::AwaitRequest {
                ids: vec!["a".into(), "b".into()],
                timeout: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 500_000_000,
                }),
                mode: pb::AwaitMode::Any as i32,
                ..Default::default()
            }
        );
        let Command::Await(args) = parse(&["await", "--lead-id", "l1", "--collect", "--any"])
        else {
            panic!("expected await");
        };
        assert_eq!(
            args.to_request(),
            pb::AwaitRequest {
                lead_id: "l1".into(),
                collect: true,
                mode: pb::AwaitMode::Any as i32,
                ..Default::default()
            }
        );
        for refused in [
            &["await"][..],
            &["await", "a", "--lead-id", "l1"],
            &["await", "--lead-id", "l1", "--parent-id", "p"],
        ] {
            assert!(
                Cli::try_parse_from(std::iter::once("subagentd").chain(refused.iter().copied()))
                    .is_err(),
                "{refused:?} parsed"
            );
        }
        let Command::Await(args) = parse(&["await", "a"]) else {
            panic!("expected await");
        };
        let request = args.to_request();
        assert_eq!(request.mode, pb::AwaitMode::All as i32);
        assert_eq!(request.timeout, None);
        assert_eq!(
            parse_err(&["await"]),
            clap::error::ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn cancel_needs_exactly_one_target() {
        let Command::Cancel(args) = parse(&["cancel", "--lead-id", "l", "--reason", "done"]) else {
            panic!("expected cancel");
        };
        assert_eq!(
            args.to_request(),
            pb::CancelRequest {
                id: String::new(),
                lead_id: "l".into(),
                reason: "done".into(),
            }
        );
        let Command::Cancel(args) = parse(&["cancel", "--id", "x"]) else {
            panic!("expected cancel");
        };
        assert_eq!(args.to_request().id, "x");
        assert_eq!(
            parse_err(&["cancel"]),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            parse_err(&["cancel", "--id", "x", "--lead-id", "l"]),
            clap::error::ErrorKind::ArgumentConflict
        );
    }

    #[test]
    fn steer_takes_id_and_message() {
        let Command::Steer(args) = parse(&["steer", "x", "look at tests too"]) else {
            panic!("expected steer");
        };
        assert_eq!(
            args.to_request(),
            pb::SteerRequest {
                id: "x".into(),
                message: "look at tests too".into(),
            }
        );
    }

    #[test]
    fn approve_defaults_to_approve_and_denies_with_a_note() {
        let Command::Approve(args) = parse(&["approve", "a", "b"]) else {
            panic!("expected approve");
        };
        assert_eq!(
            args.to_request(),
            pb::ApproveRequest {
                id: "a".into(),
                approval_id: "b".into(),
                decision: pb::ApprovalDecision::Approve as i32,
                note: String::new(),
            }
        );
        let Command::Approve(args) = parse(&["approve", "a", "b", "--deny", "--note", "no"]) else {
            panic!("expected approve");
        };
        assert_eq!(
            args.to_request().decision,
            pb::ApprovalDecision::Deny as i32
        );
        assert_eq!(args.to_request().note, "no");
    }

    #[test]
    fn watch_flags_fill_the_request() {
        let Command::Watch(args) = parse(&[
            "watch",
            "--id",
            "a",
            "--id",
            "b",
            "--parent-id",
            "p",
            "--root-id",
            "r",
            "--lead-id",
            "l",
            "--after-sequence",
            "42",
            "--snapshot",
            "--addr",
            "10.0.0.1:9",
        ]) else {
            panic!("expected watch");
        };
        assert_eq!(args.client.addr, "10.0.0.1:9");
        assert_eq!(
            args.to_request(),
            pb::WatchAgentsRequest {
                tenant: Default::default(),
                ids: vec!["a".into(), "b".into()],
                parent_id: "p".into(),
                root_id: "r".into(),
                lead_id: "l".into(),
                after_sequence: 42,
                include_snapshot: true,
                include_progress: false,
                conversation_id: String::new(),
            }
        );
    }

    #[test]
    fn parse_duration_accepts_humantime_units() {
        assert_eq!(
            parse_duration("30m").unwrap(),
            prost_types::Duration {
                seconds: 1800,
                nanos: 0,
            }
        );
        assert!(parse_duration("-1s").is_err());
    }
}
