//! Command line of `subagentd-bench`. Every flag's help states its default and
//! unit, so `--help` is the reference for how the numbers were produced.

use std::{fmt, net::SocketAddr, path::PathBuf, time::Duration};

/// Exit status, shown under `--help`: CI runs `run --duration 1s` as a smoke
/// test, so breakage (an error status, a server that does not start) must
/// fail it, while a slow shared machine must not.
const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  every request got the expected answer and every server started and stopped
     cleanly (missed performance targets do NOT change the exit status)
  1  some response carried an error status or an unexpected body, a watcher
     stream failed, or a server failed to start or exited uncleanly
  2  invalid command line";

/// `run --scenarios` default: everything but bg-spawn-postgres (which needs
/// a PostgreSQL server, see `--postgres-url`).
const DEFAULT_SCENARIOS: &str =
    "baseline,bg-spawn,bg-spawn-keyed,bg-spawn-embedded,fg-spawn,status,bg-spawn-watched,bg-spawn-lead-watched";

/// `subagentd-bench`: load generator and memory probe for subagentd.
#[derive(clap::Parser, Debug)]
#[command(
    name = "subagentd-bench",
    about = "Load generator for subagentd: compares it with a no-op gRPC server in the same run.",
    long_about = "Load generator for subagentd: compares it with a no-op gRPC server in the same \
                  run.\n\n\
                  Both servers run as child processes on 127.0.0.1 (the no-op one is this \
                  binary re-executed; subagentd is the `subagentd` binary next to this one, \
                  built by `cargo build --release --bins`), so their CPU time and peak RSS are \
                  read from /proc apart from the client's. Client and servers share the \
                  machine's cores: compare ratios measured in one run, not absolute numbers \
                  across runs.",
    after_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
}

/// A `subagentd-bench` subcommand.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Throughput and latency of each scenario at each concurrency, with
    /// ratios to the no-op baseline, server CPU per request, peak RSS and a
    /// verdict on the issue's targets.
    ///
    /// Scenarios:
    ///   baseline          Spawn against the no-op server (returns a prebuilt
    ///                     SpawnResponse): what gRPC itself costs here.
    ///   bg-spawn          background Spawn of `simulated`/`bench/m`, prompt
    ///                     `hi` (the run finishes at once); `[store] backend =
    ///                     "memory"`, as every scenario below unless it says
    ///                     otherwise.
    ///   bg-spawn-embedded bg-spawn against `backend = "embedded"` (a fresh
    ///                     data directory under the temp dir per server);
    ///                     reports store commits/s and changes per commit.
    ///   bg-spawn-postgres bg-spawn against `backend = "postgres"` (a fresh
    ///                     database `bench_<uuid>` per server, created on
    ///                     --postgres-url and dropped at the end); reports
    ///                     commits/s and changes per commit. Not in the
    ///                     default list; without --postgres-url it fails.
    ///   bg-spawn-forwarded
    ///                     bg-spawn-postgres sent to a standby (a second
    ///                     server on the same database), which forwards each
    ///                     call to the leader: the forwarding cost. Server
    ///                     CPU is both processes'. Not in the default list;
    ///                     needs --postgres-url.
    ///   bg-spawn-keyed    bg-spawn with `[auth] mode = "required"`, every
    ///                     call carrying an API key: what authenticating a
    ///                     call costs.
    ///   fg-spawn          foreground Spawn, same prompt: spawn + run + complete
    ///                     in one call.
    ///   status            Status by the id of one running agent spawned before
    ///                     the load.
    ///   bg-spawn-watched  bg-spawn while --watchers WatchAgents subscribers
    ///                     (opened before the load, on their own connections)
    ///                     receive every event; reports events/s received by
    ///                     all watchers and the largest lag.
    ///   bg-spawn-lead-watched
    ///                     bg-spawn round-robin under --lead-watchers leads,
    ///                     while one subscriber per lead watches its lead;
    ///                     each subscriber's DONE count is checked against
    ///                     what its lead spawned.
    ///
    /// Each scenario gets a fresh server process (so peak RSS is per
    /// scenario); the concurrencies run one after another against it.
    #[command(verbatim_doc_comment, after_help = EXIT_STATUS_HELP)]
    Run(RunArgs),
    /// RSS per retained finished agent: for each N, a fresh subagentd
    /// (retention 1h, wide limits), idle RSS, N background spawns of prompt
    /// `hi` (result `hi`), wait until all are DONE (Await), RSS again.
    ///
    /// Reports (RSS after − idle RSS) / N as bytes per agent.
    #[command(after_help = EXIT_STATUS_HELP)]
    Memory(MemoryArgs),
    /// What a workspace costs a run (`workspace = "worktree"`), on a fresh
    /// repository of --files files: `git worktree add` and the save at the
    /// end (commit, remove) timed alone, and Spawn-to-start latency of a
    /// `command` type with and without a workspace against one subagentd
    /// (runs one at a time, alternating).
    Workspace(WorkspaceArgs),
    /// A long run of background Spawns at a steady rate against each store
    /// (a fresh subagentd each, records kept --finished-retention and
    /// conversations --conversation-retention): per tenth of the run the
    /// Spawns/s reached, server CPU per Spawn, p50/p99 latency and server
    /// RSS; at the end, once the agents have finished, the server's metrics
    /// must show nothing live and as many agents finished as spawned.
    ///
    /// Exit status 1 on any error answer or when the counts do not settle.
    Soak(SoakArgs),
    /// Internal: the no-op baseline server `run` starts as a child process.
    #[command(hide = true)]
    NoopServer(NoopServerArgs),
}

/// How to find and start the subagentd binary.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// The subagentd binary to measure. Default: `subagentd` in the same
    /// folder as this binary (cargo builds both with `cargo build --bins`).
    #[arg(long, value_name = "PATH")]
    pub server_bin: Option<PathBuf>,
    /// How long a server may take to answer its health check after start.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub startup_timeout: Duration,
}

/// Flags of `subagentd-bench run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Timed run per scenario and concurrency (e.g. `1s`, `5s`, `500ms`).
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Duration,
    /// Untimed load before each timed run (connections warm, allocator and
    /// caches settled). Its latencies are dropped, but its error statuses
    /// still count.
    #[arg(long, default_value = "250ms", value_parser = parse_duration, value_name = "DURATION")]
    pub warmup: Duration,
    /// Concurrent in-flight requests (closed loop: each one sends its next
    /// request when the previous answer arrives), comma-separated list.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,16,64",
        value_parser = parse_positive,
        value_name = "N,…"
    )]
    pub concurrency: Vec<usize>,
    /// HTTP/2 connections the load is spread over (requests round-robin
    /// over them by task).
    #[arg(long, default_value = "4", value_parser = parse_positive, value_name = "N")]
    pub connections: usize,
    /// WatchAgents subscribers in the bg-spawn-watched scenario.
    #[arg(long, default_value = "100", value_parser = parse_positive, value_name = "N")]
    pub watchers: usize,
    /// Leads (and WatchAgents subscribers, one per lead, each filtered to
    /// it) in the bg-spawn-lead-watched scenario.
    #[arg(long, default_value = "200", value_parser = parse_positive, value_name = "N")]
    pub lead_watchers: usize,
    /// HTTP/2 connections the watchers share (separate from the load's).
    #[arg(long, default_value = "4", value_parser = parse_positive, value_name = "N")]
    pub watcher_connections: usize,
    /// Scenarios to run, in this order, comma-separated. Ratios need
    /// `baseline`; the watched and store verdicts need `bg-spawn` too.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = DEFAULT_SCENARIOS,
        value_name = "NAME,…"
    )]
    pub scenarios: Vec<Scenario>,
    /// PostgreSQL server for bg-spawn-postgres and bg-spawn-forwarded, e.g.
    /// `postgres://subagentd@127.0.0.1:55432/postgres`: the bench connects
    /// to this database to `CREATE DATABASE bench_<uuid>` for each server
    /// process (so the user needs CREATEDB) and drops it when that server
    /// stops. No default: without it those scenarios are failures.
    #[arg(long, value_name = "URL")]
    pub postgres_url: Option<String>,
    /// Run the whole scenario list this many times, interleaved (baseline,
    /// bg-spawn, …, baseline, bg-spawn, …). Each ratio is taken against the
    /// baseline of its own round and the verdicts use the median over the
    /// rounds, so one noisy phase on a shared machine cannot decide a
    /// target.
    #[arg(long, default_value = "1", value_parser = parse_positive, value_name = "N")]
    pub rounds: usize,
    /// Print one JSON document on stdout instead of the table (progress
    /// still goes to stderr).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of `subagentd-bench memory`.
#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Numbers of agents to retain, one fresh server each, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100000,1000000",
        value_parser = parse_positive,
        value_name = "N,…"
    )]
    pub agents: Vec<usize>,
    /// Concurrent Spawn calls while filling the server.
    #[arg(long, default_value = "64", value_parser = parse_positive, value_name = "N")]
    pub concurrency: usize,
    /// HTTP/2 connections the spawns are spread over.
    #[arg(long, default_value = "4", value_parser = parse_positive, value_name = "N")]
    pub connections: usize,
    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of `subagentd-bench soak`.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// Background Spawns per store.
    #[arg(long, default_value = "1000000", value_parser = parse_positive, value_name = "N")]
    pub agents: usize,
    /// Spawns offered per second (0: each caller sends its next Spawn as
    /// soon as the previous one is answered).
    #[arg(long, default_value = "5000", value_name = "N")]
    pub rate: u64,
    /// Stores to soak, one fresh server each: `memory`, `embedded`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,embedded",
        value_name = "NAME,…"
    )]
    pub stores: Vec<String>,
    /// Concurrent Spawn callers (the most in flight at once).
    #[arg(long, default_value = "64", value_parser = parse_positive, value_name = "N")]
    pub concurrency: usize,
    /// HTTP/2 connections the callers are spread over.
    #[arg(long, default_value = "4", value_parser = parse_positive, value_name = "N")]
    pub connections: usize,
    /// The server's `[runs] finished_retention`.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub finished_retention: Duration,
    /// The server's `[conversations] retention`.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub conversation_retention: Duration,
    /// Print one JSON document on stdout instead of the tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of `subagentd-bench workspace`.
#[derive(clap::Args, Debug, Clone)]
pub struct WorkspaceArgs {
    /// Files in the repository the worktrees are made of.
    #[arg(long, default_value = "10000", value_parser = parse_positive, value_name = "N")]
    pub files: usize,
    /// Runs measured, one at a time (per type for Spawn to start).
    #[arg(long, default_value = "10", value_parser = parse_positive, value_name = "N")]
    pub runs: usize,
    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of the hidden `noop-server` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub struct NoopServerArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
}

/// One benchmark scenario. It lives with the flags that parse it (`run
/// --scenarios`), so that `cli` is a leaf every other module may import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Spawn against the no-op server: the cost of gRPC itself.
    Baseline,
    /// Background Spawn of an agent that finishes at once.
    BgSpawn,
    /// BgSpawn against the embedded store.
    BgSpawnEmbedded,
    /// BgSpawn against the PostgreSQL store (needs `--postgres-url`).
    BgSpawnPostgres,
    /// Foreground Spawn: spawn, run and complete in one call.
    FgSpawn,
    /// Status by the id of one running agent.
    Status,
    /// Background Spawn while WatchAgents subscribers receive every event.
    BgSpawnWatched,
    /// Background Spawn round-robin under `--lead-watchers` leads while one
    /// WatchAgents subscriber per lead watches its own lead.
    BgSpawnLeadWatched,
    /// BgSpawnPostgres sent to a standby, which forwards every call to the
    /// leader on the same database (needs `--postgres-url`).
    BgSpawnForwarded,
    /// BgSpawn with authentication required, every call carrying an API
    /// key: what authenticating a call costs.
    BgSpawnKeyed,
}

impl Scenario {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Baseline => "baseline",
            Scenario::BgSpawn => "bg-spawn",
            Scenario::BgSpawnEmbedded => "bg-spawn-embedded",
            Scenario::BgSpawnPostgres => "bg-spawn-postgres",
            Scenario::FgSpawn => "fg-spawn",
            Scenario::Status => "status",
            Scenario::BgSpawnWatched => "bg-spawn-watched",
            Scenario::BgSpawnLeadWatched => "bg-spawn-lead-watched",
            Scenario::BgSpawnForwarded => "bg-spawn-forwarded",
            Scenario::BgSpawnKeyed => "bg-spawn-keyed",
        }
    }

    /// True for the scenarios that measure a durable store (their rows
    /// carry commit counts and ratios to bg-spawn, which keeps nothing).
    pub fn has_store(self) -> bool {
        matches!(
            self,
            Scenario::BgSpawnEmbedded | Scenario::BgSpawnPostgres | Scenario::BgSpawnForwarded
        )
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(d)
}

fn parse_positive(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
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
    fn run_defaults_match_the_issue() {
        let cli = Cli::try_parse_from(["subagentd-bench", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(args.duration, Duration::from_secs(5));
        assert_eq!(args.concurrency, vec![1, 16, 64]);
        assert_eq!(args.watchers, 100);
        assert_eq!(
            args.scenarios,
            vec![
                Scenario::Baseline,
                Scenario::BgSpawn,
                Scenario::BgSpawnKeyed,
                Scenario::BgSpawnEmbedded,
                Scenario::FgSpawn,
                Scenario::Status,
                Scenario::BgSpawnWatched,
                Scenario::BgSpawnLeadWatched,
            ]
        );
        assert_eq!(args.lead_watchers, 200);
        assert_eq!(args.postgres_url, None);
    }

    #[test]
    fn postgres_is_opt_in_with_its_url() {
        let cli = Cli::try_parse_from([
            "subagentd-bench",
            "run",
            "--scenarios",
            "bg-spawn,bg-spawn-embedded,bg-spawn-postgres",
            "--postgres-url",
            "postgres://subagentd@127.0.0.1:55432/postgres",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(
            args.scenarios,
            vec![
                Scenario::BgSpawn,
                Scenario::BgSpawnEmbedded,
                Scenario::BgSpawnPostgres
            ]
        );
        assert_eq!(
            args.postgres_url.as_deref(),
            Some("postgres://subagentd@127.0.0.1:55432/postgres")
        );
    }
}
