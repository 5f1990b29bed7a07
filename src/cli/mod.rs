//! The `subagentd` command line: `serve` runs the server, every other
//! subcommand is a thin gRPC client of a running server (see [`args`]).
//!
//! Parsing lives here and in [`args`] so that `main` only has to parse
//! [`Cli`] and dispatch: `serve` to the server, `worker` to [`crate::worker`], anything else to
//! [`args::run`].

pub mod args;
pub mod commands;
pub mod keys;
mod output;

use std::path::PathBuf;

/// Exit status documented in `--help`; kept next to the parser so the text
/// and the codes in [`args`] are read together.
const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  success
  1  the server returned an error, or it could not be reached
  2  `await` timed out before its condition held (clap also uses 2 for
     invalid command lines)";

/// Command line of the `subagentd` binary.
#[derive(clap::Parser, Debug)]
#[command(
    name = "subagentd",
    version,
    about = "Schedules, runs and supervises sub-agents over gRPC.",
    long_about = "Schedules, runs and supervises sub-agents over gRPC.\n\n\
                  `subagentd serve` runs the server; the other subcommands are clients \
                  of a running server at --addr (env SUBAGENTD_ADDR).",
    after_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A `subagentd` subcommand. Every variant but [`Command::Serve`] is a client
/// call handled by [`args::run`].
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Run agent types with the built-in runners as a worker of a server
    /// (WorkerService.Connect); SIGTERM drains.
    Worker(crate::worker::WorkerArgs),
    /// Serve the lead tools (agent_spawn, agent_await, …) over MCP on
    /// stdin/stdout, as a client of a running server: add it to an agent
    /// host's MCP servers. Logs go to stderr.
    Mcp(crate::mcp::stdio::McpArgs),
    /// Create an agent (Spawn). Prints the agent: at once for --background,
    /// once it is settled otherwise.
    ///
    /// The exit status is 0 whenever the server accepted the spawn, also if
    /// the agent then failed: read its status from the output.
    Spawn(args::SpawnArgs),
    /// List agents by id or by filter (Status).
    ///
    /// When more pages exist and --all-pages is not given, the token for the
    /// next page is printed last (with --json as `{"nextPageToken": "…"}`).
    Status(args::StatusArgs),
    /// Wait until agents are settled: terminal or awaiting approval (Await).
    /// Exits with status 2 if the timeout passed first.
    ///
    /// Prints the agents as they are now; with --json they are followed by
    /// `{"timedOut": true|false}`.
    #[command(after_help = EXIT_STATUS_HELP)]
    Await(args::AwaitArgs),
    /// Cancel an agent, or every live agent under a lead, with all live
    /// descendants (Cancel). Prints the agents that were cancelled.
    Cancel(args::CancelArgs),
    /// Send a message to an agent's run (Steer): delivered now if it is
    /// running, buffered in order otherwise.
    ///
    /// With --json prints `{"delivery": "STEER_DELIVERY_…", "agent": {…}}`.
    Steer(args::SteerArgs),
    /// Decide an agent's pending approval (Approve): approve, or --deny.
    /// The agent goes back to its queue ahead of newer agents and its run
    /// learns the decision when it runs again. Prints the agent.
    Approve(args::ApproveArgs),
    /// Stream lifecycle events (WatchAgents) until the server ends the stream
    /// or Ctrl-C; with --progress also output chunks and tool calls.
    ///
    /// Both end with status 0. With --json prints one
    /// `{"sequence": N, "kind": "AGENT_EVENT_KIND_…", "agent": {…}}` per
    /// event. If the stream breaks, the error says which --after-sequence
    /// resumes it without gaps.
    Watch(args::WatchArgs),
    /// Print a conversation's transcript (GetTranscript), oldest entry
    /// first: the history up to and including agent ID, or with
    /// --conversation all of conversation ID. Every page is fetched.
    ///
    /// Prints `conversation <id>`, then one line per entry,
    /// `turn <n>  <kind>  <agent id>  <text>`, kind one of prompt, steer,
    /// tool-call (text: the tool name), result (the output of a turn that
    /// ended done), failed or cancelled (of one that ended so), and elided
    /// (older entries were removed; turn and agent id are `-`). Each further
    /// line of a multi-line text follows indented by four spaces; a failed
    /// or cancelled turn's error follows as `    error: <code>: <message>`.
    ///
    /// With --json prints one `{"kind": "TRANSCRIPT_ENTRY_KIND_…",
    /// "agentId", "turn", "time", "text", "status", "error"}` per entry.
    Transcript(args::TranscriptArgs),
    /// Manage API keys (no server needed).
    #[command(subcommand)]
    Keys(keys::KeysCommand),
}

/// Flags of `subagentd serve`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// Config file (TOML). Without it the built-in defaults are used.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on, overriding `[server] listen`.
    #[arg(long)]
    pub listen: Option<String>,
    /// Print the effective config (TOML) and exit.
    #[arg(long)]
    pub dump_config: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_flags_parse() {
        let cli = Cli::try_parse_from([
            "subagentd",
            "serve",
            "--config",
            "/etc/subagentd.toml",
            "--listen",
            "0.0.0.0:1",
            "--dump-config",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("expected serve, got {:?}", cli.command);
        };
        assert_eq!(args.config, Some(PathBuf::from("/etc/subagentd.toml")));
        assert_eq!(args.listen.as_deref(), Some("0.0.0.0:1"));
        assert!(args.dump_config);
    }

    #[test]
    fn await_help_documents_the_timeout_exit_status() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("await")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("2  `await` timed out"), "{help}");
    }
}
