//! The `subagentd` binary: `serve`, `worker`, and client subcommands for people at a
//! terminal.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc instead of glibc malloc: the server allocates and frees many
/// small objects across threads (records, events, runs), where glibc spent
/// ~10 % of server CPU in malloc/free and consolidation (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
use subagentd::cli::{commands, Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Serve(args) => subagentd::server::serve(args)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Worker(args) => subagentd::worker::run(args)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Mcp(args) => subagentd::mcp::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::Keys(command) => subagentd::cli::keys::run(command).map(|()| ExitCode::SUCCESS),
        command => commands::run(command).await,
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}
