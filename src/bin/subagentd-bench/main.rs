//! `subagentd-bench`: the load generator of issue 3 ("Benchmarks").
//!
//! It measures subagentd against the raw-gRPC limit *in the same run on the
//! same machine*: absolute numbers drift ±15 % run to run on shared machines,
//! ratios measured side by side hold. Every server it measures is a child
//! process (a no-op tonic server, which is this binary re-executed, and the
//! real `subagentd` binary), so the server's CPU time and peak RSS can be read
//! from `/proc` apart from the client's.
//!
//! - `run`: the throughput/latency scenarios, a table with ratios to the
//!   baseline, and a verdict on the targets this tool can check.
//! - `memory`: RSS per retained finished agent.
//! - `workspace`: what a git worktree costs a run.
//! - `soak`: a million background Spawns at a steady rate: CPU, latency and
//!   RSS per tenth, and no slot left held.
//!
//! Module map: [`cli`] (flags and the scenario names), [`servers`] (child
//! processes and the no-op server), [`load`] (the closed-loop driver,
//! histograms, watchers), [`scenarios`] (what each scenario sends and the
//! `run` sequence), [`report`] (result types, statistics, verdicts, table and
//! JSON), [`memory`] (the `memory` subcommand), [`procfs`] (CPU time and RSS
//! from `/proc`).
//!
//! Imports point one way, so no two modules import each other, directly or
//! through others: main → `scenarios`, `memory`, `workspace`, `soak` (the subcommands) → `report`
//! → `load` → `servers` → `procfs`, where a module may skip layers downward
//! (`scenarios` uses `servers` too), and `cli` is the leaf under all of them:
//! plain flag types and the [`cli::Scenario`] names, importing no other
//! module of the bench. The parts of `report` follow the same rule (see its
//! module doc).

mod cli;
mod load;
mod memory;
mod procfs;
mod report;
mod scenarios;
mod servers;
mod soak;
mod workspace;

use std::process::ExitCode;

use clap::Parser;

/// The same allocator as the `subagentd` binary, so the no-op baseline
/// server (this binary re-executed) differs from subagentd only in what its
/// handler does.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Run(args) => scenarios::run(args).await,
        Command::Memory(args) => memory::run(args).await,
        Command::Workspace(args) => workspace::run(args).await,
        Command::Soak(args) => soak::run(args).await,
        Command::NoopServer(args) => servers::noop::serve(args.listen)
            .await
            .map(|()| ExitCode::SUCCESS),
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}
