//! The `subagentd` binary: `serve`, and client subcommands for people at a
//! terminal.

use std::process::ExitCode;

use clap::Parser;
use subagentd::cli::{client, Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Serve(args) => subagentd::server::serve(args)
            .await
            .map(|()| ExitCode::SUCCESS),
        command => client::run(command).await,
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}
