//! `subagentd-bench workspace`: what a workspace (issue 35) costs a run.
//!
//! On a fresh git repository of `--files` files (one commit):
//!
//! - **create / save**: the worktree engine alone, in this process, as the
//!   command runner calls it: `Workspaces::create` (`git worktree add` on a
//!   new branch) and `Workspaces::save` after one file changed (`add
//!   --all`, `commit`, `diff --numstat`, `worktree remove`, `prune`), one
//!   run at a time.
//! - **Spawn to start**: a real subagentd (memory store) with two `command`
//!   types running the same program, which prints the wall clock it
//!   started at: `plain` (no workspace) and `coder` (`workspace =
//!   "worktree"` on that repository). Per run: the wall clock before the
//!   background Spawn is sent, subtracted from the program's. Runs one at a
//!   time, alternating the two types, so both see the same machine.
//!
//! Client, server and program share the host's clock (`CLOCK_REALTIME`).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context};
use subagentd::{
    config::AgentTypeConfig,
    pb::{self, agent_service_client::AgentServiceClient},
    runner::workspace::{Spec, Start, Workspaces},
};

use crate::{
    cli::WorkspaceArgs,
    servers::{self, BenchStore, ServerKind, ServerProcess},
};

/// Runs every measurement and prints the table (or JSON).
pub async fn run(args: WorkspaceArgs) -> anyhow::Result<ExitCode> {
    if cfg!(debug_assertions) {
        eprintln!(
            "note: this is a debug build: git's times are still meaningful, the server's are not"
        );
    }
    let dir = TempDir::new()?;
    let repo = dir.path().join("repo");
    eprintln!("[workspace] a repository of {} files", args.files);
    let started = Instant::now();
    make_repository(&repo, args.files)?;
    let repo_ms = ms(started.elapsed());

    eprintln!("[workspace] create / save, {} runs", args.runs);
    let (create, save) = engine_times(&repo, &dir.path().join("engine"), args.runs).await?;

    eprintln!("[workspace] Spawn to start, {} runs per type", args.runs);
    let (plain, coder) = spawn_to_start(&args, &repo, &dir.path().join("worktrees")).await?;

    let report = serde_json::json!({
        "files": args.files,
        "runs": args.runs,
        "repository_setup_ms": repo_ms,
        "create_ms": Stats::of(create),
        "save_ms": Stats::of(save),
        "spawn_to_start_ms": {
            "no_workspace": Stats::of(plain),
            "worktree": Stats::of(coder),
        },
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "repository: {} files, one commit ({repo_ms:.0} ms to make)",
            args.files
        );
        println!(
            "{:<36} {:>10} {:>10} {:>10}",
            "ms, per run", "median", "p90", "max"
        );
        for (name, key) in [
            ("worktree create (git worktree add)", "/create_ms"),
            ("worktree save (commit, remove)", "/save_ms"),
            (
                "Spawn to start, no workspace",
                "/spawn_to_start_ms/no_workspace",
            ),
            ("Spawn to start, worktree", "/spawn_to_start_ms/worktree"),
        ] {
            let s = &report.pointer(key).expect("in the report");
            println!(
                "{name:<36} {:>10.1} {:>10.1} {:>10.1}",
                s["median"].as_f64().unwrap_or(f64::NAN),
                s["p90"].as_f64().unwrap_or(f64::NAN),
                s["max"].as_f64().unwrap_or(f64::NAN),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `files` files of ~100 bytes in folders of 100, committed on `main`.
fn make_repository(repo: &Path, files: usize) -> anyhow::Result<()> {
    for n in 0..files {
        let folder = repo.join(format!("d{:04}", n / 100));
        if n % 100 == 0 {
            std::fs::create_dir_all(&folder)?;
        }
        std::fs::write(
            folder.join(format!("f{n}.txt")),
            format!("file {n}: {}\n", "x".repeat(90)),
        )?;
    }
    git(repo, &["init", "--quiet", "--initial-branch=main"])?;
    git(repo, &["add", "--all"])?;
    git(
        repo,
        &[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@localhost",
            "commit",
            "--quiet",
            "-m",
            "files",
        ],
    )?;
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The worktree type both measurements use.
fn worktree_type(repo: &Path, root: &Path, command: &str) -> String {
    format!(
        "runner = \"command\"\ncommand = [\"sh\", \"-c\", {command:?}]\nworkspace = \"worktree\"\n\
         repo = {repo:?}\nroot = {root:?}\nkeep = \"never\"\n"
    )
}

/// Times of `Workspaces::create` and `Workspaces::save`, in ms, per run.
async fn engine_times(
    repo: &Path,
    root: &Path,
    runs: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let toml = worktree_type(repo, root, "true");
    let agent_type: AgentTypeConfig = toml::from_str(&toml).context("the worktree type")?;
    let spec = Spec::of(&agent_type, None).context("a worktree spec")?;
    let workspaces = Workspaces::new();
    let (mut create, mut save) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let id = uuid::Uuid::now_v7().to_string();
        let started = Instant::now();
        let worktree = workspaces
            .create(&spec, &id, 1, &Start::Ref("HEAD".into()))
            .await?;
        create.push(ms(started.elapsed()));
        std::fs::write(worktree.path.join("d0000/f0.txt"), "changed\n")?;
        let started = Instant::now();
        workspaces.save(&spec, &worktree, &id, "bench").await?;
        save.push(ms(started.elapsed()));
    }
    Ok((create, save))
}

/// Spawn-to-start latencies in ms, per run, of `plain` and `coder`.
async fn spawn_to_start(
    args: &WorkspaceArgs,
    repo: &Path,
    root: &Path,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    // The program's first act: print the wall clock in nanoseconds.
    let print_clock = "date +%s%N";
    let config = format!(
        "[limits]\nmax_background_agents = 1000\ndefault_concurrency = 0\n\n\
         [agents.plain]\nrunner = \"command\"\ncommand = [\"sh\", \"-c\", {print_clock:?}]\n\n\
         [agents.coder]\n{}",
        worktree_type(repo, root, print_clock)
    );
    let kind = ServerKind::Subagentd {
        bin: servers::subagentd_bin(args.server.server_bin.as_deref())?,
        config_toml: config.into(),
        store: BenchStore::Memory,
    };
    let server = ServerProcess::start(&kind, args.server.startup_timeout).await?;
    let measured = async {
        let channel = servers::connect(server.addr(), 1).await?.remove(0);
        let mut client = AgentServiceClient::new(channel);
        let (mut plain, mut coder) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            plain.push(one_start(&mut client, "plain").await?);
            coder.push(one_start(&mut client, "coder").await?);
        }
        anyhow::Ok((plain, coder))
    }
    .await;
    server.stop().await?;
    measured
}

/// One background Spawn of `agent`: ms from before the call to the
/// program's start, as the program printed it.
async fn one_start(
    client: &mut AgentServiceClient<tonic::transport::Channel>,
    agent: &str,
) -> anyhow::Result<f64> {
    let before = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let spawned = client
        .spawn(pb::SpawnRequest {
            agent: agent.into(),
            model: "bench/m".into(),
            prompt: "go".into(),
            background: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .agent
        .context("a Spawn answer without its agent")?;
    let settled = client
        .r#await(pb::AwaitRequest {
            ids: vec![spawned.id],
            timeout: Some(prost_types::Duration {
                seconds: 120,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await?
        .into_inner()
        .agents
        .pop()
        .context("an Await answer without the agent")?;
    if settled.status != pb::AgentStatus::Done as i32 {
        bail!("the {agent} run did not finish: {settled:?}");
    }
    let started_ns: u128 = settled
        .result
        .trim()
        .parse()
        .with_context(|| format!("the program printed {:?}", settled.result))?;
    Ok((started_ns.saturating_sub(before.as_nanos())) as f64 / 1e6)
}

/// A fresh folder under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<Self> {
        let path =
            std::env::temp_dir().join(format!("subagentd-bench-{}-workspace", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median, 90th percentile and maximum of a sample.
#[derive(serde::Serialize)]
struct Stats {
    median: f64,
    p90: f64,
    max: f64,
}

impl Stats {
    fn of(mut sample: Vec<f64>) -> Self {
        sample.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((sample.len() as f64 - 1.0) * q).round() as usize;
            sample.get(i).copied().unwrap_or(f64::NAN)
        };
        Self {
            median: at(0.5),
            p90: at(0.9),
            max: sample.last().copied().unwrap_or(f64::NAN),
        }
    }
}
