//! Workspaces (docs/workspaces.md): the `[agents.NAME]` workspace keys, and
//! each run of a workspace type in its own git worktree.

use subagentd::config::{ConfigError, ConfigSource, KeepBranch, WorkspaceKind};

fn invalid_key(toml: &str) -> (String, String) {
    match ConfigSource::from_toml_str(toml) {
        Err(ConfigError::Invalid { key, rule }) => (key, rule),
        other => panic!("expected an invalid-config error for\n{toml}\ngot {other:?}"),
    }
}

const CODER: &str = "[agents.coder]\nrunner = \"command\"\ncommand = [\"agent\"]\n";

#[test]
fn a_worktree_type_parses_with_its_values() {
    let config = ConfigSource::from_toml_str(&format!(
        "{CODER}workspace = \"worktree\"\nrepo = \"/src/app\"\nbase = \"main\"\n\
         branch_prefix = \"agents/\"\nkeep = \"always\"\nroot = \"/var/tmp/wt\"\n\
         commit_author = \"Bot <bot@example.com>\"\ncommit_message = \"{{id}}\"\n\
         max_workspace_bytes = 1000000\ncwd = \"sub/dir\"\n"
    ))
    .unwrap();
    let coder = &config.agents["coder"];
    assert_eq!(coder.workspace, WorkspaceKind::Worktree);
    assert_eq!(coder.keep, Some(KeepBranch::Always));
    assert_eq!(coder.base.as_deref(), Some("main"));
    assert_eq!(coder.max_workspace_bytes, Some(1_000_000));
}

#[test]
fn workspace_keys_are_refused_where_they_do_not_apply() {
    // A worktree needs its repository, and a command runner.
    let (key, rule) = invalid_key(&format!("{CODER}workspace = \"worktree\"\n"));
    assert_eq!(key, "agents.coder.repo", "{rule}");
    let (key, rule) =
        invalid_key("[agents.sim]\nrunner = \"simulated\"\nworkspace = \"worktree\"\n");
    assert_eq!(key, "agents.sim.workspace");
    assert!(rule.contains("runner = \"command\""), "{rule}");
    // The other keys only with workspace = "worktree", on any runner.
    for (name, line) in [
        ("repo", "repo = \"/src\""),
        ("base", "base = \"main\""),
        ("branch_prefix", "branch_prefix = \"x/\""),
        ("keep", "keep = \"never\""),
        ("root", "root = \"/tmp\""),
        ("commit_author", "commit_author = \"a\""),
        ("commit_message", "commit_message = \"m\""),
        ("max_workspace_bytes", "max_workspace_bytes = 5"),
    ] {
        for section in [CODER, "[agents.sim]\nrunner = \"simulated\"\n"] {
            let (key, rule) = invalid_key(&format!("{section}{line}\n"));
            assert!(key.ends_with(&format!(".{name}")), "{line}: {key}");
            assert!(rule.contains("workspace = \"worktree\""), "{rule}");
        }
    }
    // Values git would misread, and empty or absolute ones.
    let worktree = format!("{CODER}workspace = \"worktree\"\nrepo = \"/src\"\n");
    for (name, line) in [
        ("base", "base = \"--output=x\""),
        ("base", "base = \"a b\""),
        ("branch_prefix", "branch_prefix = \"-x\""),
        ("commit_message", "commit_message = \" \""),
        ("max_workspace_bytes", "max_workspace_bytes = 0"),
        ("cwd", "cwd = \"/abs\""),
    ] {
        let (key, rule) = invalid_key(&format!("{worktree}{line}\n"));
        assert_eq!(key, format!("agents.coder.{name}"), "{line}: {rule}");
    }
    match ConfigSource::from_toml_str(&format!("{worktree}keep = \"sometimes\"\n")) {
        Err(ConfigError::Load(_)) => {}
        other => panic!("an unknown keep is a load error, got {other:?}"),
    }
}

// ----- runs in their own worktrees -------------------------------------------

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::*;
use subagentd::pb::{self, AgentEventKind as Kind};

/// Runs git in `dir`; its trimmed output.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A repository with `f0.txt`, `f1.txt` and `.gitignore` (`*.log`) in one
/// commit on `main`, and a folder for scripts and worktrees beside it.
struct Repo {
    dir: tempfile::TempDir,
}

impl Repo {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("repo")).unwrap();
        let repo = dir.path().join("repo");
        git(&repo, &["init", "--quiet", "--initial-branch=main"]);
        std::fs::write(repo.join("f0.txt"), "zero\n").unwrap();
        std::fs::write(repo.join("f1.txt"), "one\n").unwrap();
        std::fs::write(repo.join(".gitignore"), "*.log\n").unwrap();
        git(&repo, &["add", "--all"]);
        git(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "--quiet",
                "-m",
                "first",
            ],
        );
        Self { dir }
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("worktrees")
    }

    /// An `sh` script beside the repository.
    fn script(&self, name: &str, body: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, body).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// A server with the command type `coder` running `script` in worktrees.
    async fn server(&self, script: &str, extra: &str) -> TestServer {
        TestServer::start(&format!(
            "[limits]\nmax_background_agents = 40\ndefault_concurrency = 0\nmax_concurrent_per_parent = 0\n\n\
             [agents.coder]\nrunner = \"command\"\ncommand = [\"sh\", {script:?}]\n\
             workspace = \"worktree\"\nrepo = {repo:?}\nroot = {root:?}\nkill_grace = \"200ms\"\n{extra}\n",
            repo = self.repo(),
            root = self.root(),
        ))
        .await
    }

    /// The worktrees git knows besides the repository itself.
    fn worktrees(&self) -> Vec<String> {
        git(&self.repo(), &["worktree", "list", "--porcelain"])
            .lines()
            .filter_map(|l| l.strip_prefix("worktree "))
            .filter(|p| Path::new(p) != self.repo().canonicalize().unwrap())
            .map(str::to_owned)
            .collect()
    }

    /// `git worktree list` shows exactly the worktrees of `live` runs.
    fn assert_live_worktrees(&self, live: &[&str]) {
        let mut want: Vec<String> = live
            .iter()
            .map(|id| {
                self.root()
                    .canonicalize()
                    .unwrap()
                    .join(id)
                    .display()
                    .to_string()
            })
            .collect();
        let mut have: Vec<String> = self
            .worktrees()
            .iter()
            .map(|p| Path::new(p).canonicalize().unwrap().display().to_string())
            .collect();
        want.sort();
        have.sort();
        assert_eq!(have, want, "git worktree list shows only the live runs");
    }

    /// Commits a change of `file` on a new branch `branch` off `main`,
    /// leaving `main` checked out; the new commit.
    fn commit_on_branch(&self, branch: &str, file: &str) -> String {
        let repo = self.repo();
        git(&repo, &["checkout", "--quiet", "-b", branch]);
        std::fs::write(repo.join(file), format!("{branch}\n")).unwrap();
        git(&repo, &["add", "--all"]);
        git(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "--quiet",
                "-m",
                branch,
            ],
        );
        git(&repo, &["checkout", "--quiet", "main"]);
        git(&repo, &["rev-parse", branch])
    }

    fn branches(&self) -> Vec<String> {
        git(
            &self.repo(),
            &["branch", "--list", "--format=%(refname:short)"],
        )
        .lines()
        .map(str::to_owned)
        .collect()
    }
}

/// The workspace on the RESULT entry of `id`'s turn in its transcript.
async fn transcript_workspace(client: &mut Client, id: &str) -> Option<pb::Workspace> {
    let page = client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: id.into(),
            ..Default::default()
        })
        .await
        .expect("the transcript")
        .into_inner();
    let result = page
        .entries
        .into_iter()
        .rfind(|e| e.kind == pb::TranscriptEntryKind::Result as i32 && e.agent_id == id)
        .expect("a RESULT entry");
    result.workspace
}

type Client = subagentd::pb::agent_service_client::AgentServiceClient<tonic::transport::Channel>;

/// The events of agent `id`, its output included, from its state now on.
async fn watch_agent(client: &mut Client, id: &str) -> tonic::Streaming<pb::WatchAgentsResponse> {
    watch(
        client,
        pb::WatchAgentsRequest {
            ids: vec![id.to_owned()],
            include_progress: true,
            include_snapshot: true,
            ..Default::default()
        },
    )
    .await
}

fn coder(prompt: &str, background: bool) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: "coder".into(),
        model: "acme/m".into(),
        prompt: prompt.into(),
        description: "fix the thing".into(),
        background,
        ..Default::default()
    }
}

/// The fake agent CLI: commits one change itself, leaves others (a
/// modification, a deletion, a new file and an ignored file) uncommitted,
/// and prints where it ran.
const EDITS: &str = r#"set -e
echo "edited by the agent" > f0.txt
git add f0.txt
git -c user.name=agent -c user.email=agent@example.com commit --quiet -m "the agent's own commit"
echo "more" >> f0.txt
rm f1.txt
echo "new" > new.txt
echo "scratch" > debug.log
echo "$SUBAGENTD_BRANCH|$SUBAGENTD_WORKSPACE|$(pwd)"
"#;

#[tokio::test]
async fn a_run_works_in_its_own_worktree_and_its_changes_stay_on_its_branch() {
    let repo = Repo::new();
    let script = repo.script("edit.sh", EDITS);
    let mut s = repo.server(&script, "").await;
    let agent = spawn(&mut s.client, coder("go", false)).await;
    assert_eq!(status(&agent), pb::AgentStatus::Done, "{agent:?}");
    let branch = format!("subagentd/{}", agent.id);
    let worktree = repo.root().join(&agent.id);
    assert_eq!(
        agent.result.trim(),
        format!("{branch}|{p}|{p}", p = worktree.display())
    );
    // The worktree is gone, the branch holds the agent's commit and one
    // with what it left uncommitted (not the ignored file).
    assert!(!worktree.exists());
    assert!(repo.worktrees().is_empty(), "{:?}", repo.worktrees());
    assert_eq!(
        git(
            &repo.repo(),
            &["log", "--format=%s", &format!("main..{branch}")]
        ),
        format!(
            "subagentd: work of agent {}\nthe agent's own commit",
            agent.id
        )
    );
    assert_eq!(
        git(&repo.repo(), &["log", "-1", "--format=%an|%b", &branch]),
        "subagentd|fix the thing"
    );
    assert_eq!(
        git(&repo.repo(), &["diff", "--name-status", "main", &branch]),
        "M\tf0.txt\nD\tf1.txt\nA\tnew.txt"
    );
    // The agent says so, in the Spawn's answer and in Status.
    let workspace = agent.workspace.clone().expect("a saved workspace");
    assert_eq!(
        workspace,
        pb::Workspace {
            branch: branch.clone(),
            kept: true,
            base_commit: git(&repo.repo(), &["rev-parse", "main"]),
            head_commit: git(&repo.repo(), &["rev-parse", &branch]),
            files_changed: 3,
            // f0.txt: two lines for one; f1.txt: one line gone; new.txt.
            insertions: 3,
            deletions: 2,
        }
    );
    assert_eq!(
        status_of(&mut s.client, &agent.id).await.workspace,
        Some(workspace.clone())
    );
    assert_eq!(
        transcript_workspace(&mut s.client, &agent.id).await,
        Some(workspace)
    );
    // The repository's own checkout was never touched.
    assert_eq!(
        std::fs::read_to_string(repo.repo().join("f0.txt")).unwrap(),
        "zero\n"
    );
    assert_eq!(git(&repo.repo(), &["status", "--porcelain"]), "");
}

#[tokio::test]
async fn a_run_that_changes_nothing_leaves_no_branch_and_keep_always_keeps_it() {
    let repo = Repo::new();
    let script = repo.script("noop.sh", "echo nothing to do\n");
    let mut s = repo.server(&script, "").await;
    let agent = spawn(&mut s.client, coder("go", false)).await;
    assert_eq!(status(&agent), pb::AgentStatus::Done);
    let workspace = agent.workspace.expect("a saved workspace");
    assert!(!workspace.kept);
    assert_eq!(workspace.head_commit, workspace.base_commit);
    assert_eq!(repo.branches(), ["main"]);
    assert!(repo.worktrees().is_empty());
    s.handle.shutdown().await.unwrap();

    let mut s = repo.server(&script, "keep = \"always\"").await;
    let agent = spawn(&mut s.client, coder("go", false)).await;
    assert!(repo.branches().contains(&format!("subagentd/{}", agent.id)));
    assert!(repo.worktrees().is_empty());
}

#[tokio::test]
async fn a_failed_run_keeps_its_work_too() {
    let repo = Repo::new();
    let script = repo.script("fail.sh", "echo half done > half.txt\nexit 3\n");
    let mut s = repo.server(&script, "").await;
    let agent = spawn(&mut s.client, coder("go", false)).await;
    assert_eq!(status(&agent), pb::AgentStatus::Failed);
    let branch = format!("subagentd/{}", agent.id);
    assert_eq!(
        git(&repo.repo(), &["show", &format!("{branch}:half.txt")]),
        "half done"
    );
    assert!(repo.worktrees().is_empty());
}

#[tokio::test]
async fn a_cancelled_run_is_saved_once_its_process_group_is_gone() {
    let repo = Repo::new();
    // Writes, says so, then runs until stopped (SIGTERM ends `sleep`).
    let script = repo.script(
        "long.sh",
        "echo draft > wip.txt\necho started\nexec sleep 60\n",
    );
    let mut s = repo.server(&script, "").await;
    let agent = spawn(&mut s.client, coder("go", true)).await;
    let mut events = watch_agent(&mut s.client, &agent.id).await;
    wait_for(&mut events, |ev| ev.output.contains("started")).await;
    repo.assert_live_worktrees(&[&agent.id]);
    cancel(&mut s.client, &agent.id).await;
    // The agent ends at once, without its workspace; the workspace follows
    // once the process group is gone and the work is committed.
    let cancelled = wait_for_event(&mut events, &agent.id, Kind::Cancelled).await;
    assert_eq!(cancelled.agent.unwrap().workspace, None);
    let saved = wait_for_event(&mut events, &agent.id, Kind::WorkspaceSaved).await;
    let saved = saved.agent.unwrap();
    assert_eq!(status(&saved), pb::AgentStatus::Cancelled);
    let workspace = saved.workspace.expect("the event carries the workspace");
    let branch = format!("subagentd/{}", agent.id);
    assert_eq!(
        (
            workspace.branch.as_str(),
            workspace.kept,
            workspace.files_changed
        ),
        (branch.as_str(), true, 1)
    );
    assert_eq!(
        status_of(&mut s.client, &agent.id).await.workspace,
        Some(workspace.clone())
    );
    // The turn's RESULT entry, written at the cancel, gets it too.
    assert_eq!(
        transcript_workspace(&mut s.client, &agent.id).await,
        Some(workspace)
    );
    assert_eq!(
        git(&repo.repo(), &["show", &format!("{branch}:wip.txt")]),
        "draft"
    );
    repo.assert_live_worktrees(&[]);
    assert!(!repo.root().join(&agent.id).exists());
}

#[tokio::test]
async fn a_run_past_its_deadline_and_a_cascade_cancelled_child_are_saved_too() {
    let repo = Repo::new();
    let script = repo.script(
        "long.sh",
        "echo \"$SUBAGENTD_AGENT_ID\" > wip.txt\necho started\nexec sleep 60\n",
    );
    let mut s = repo.server(&script, "").await;
    let mut events = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            include_progress: true,
            ..Default::default()
        },
    )
    .await;

    // The deadline: the run is stopped, then saved.
    let mut late = coder("go", true);
    late.timeout = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let late = spawn(&mut s.client, late).await;
    let saved = wait_for_event(&mut events, &late.id, Kind::WorkspaceSaved).await;
    let saved = saved.agent.unwrap();
    assert_eq!(saved.error.unwrap().code, "DEADLINE_EXCEEDED");
    let workspace = saved.workspace.expect("saved");
    assert_eq!((workspace.kept, workspace.files_changed), (true, 1));
    repo.assert_live_worktrees(&[]);

    // A cascade: cancelling the parent stops its child; both are saved.
    let parent = spawn(&mut s.client, coder("go", true)).await;
    let mut child = coder("go", true);
    child.parent_id = parent.id.clone();
    let child = spawn(&mut s.client, child).await;
    for id in [&parent.id, &child.id] {
        wait_for(&mut events, |ev| {
            ev.agent.as_ref().is_some_and(|a| &a.id == id) && ev.output.contains("started")
        })
        .await;
    }
    repo.assert_live_worktrees(&[&parent.id, &child.id]);
    cancel(&mut s.client, &parent.id).await;
    for id in [&parent.id, &child.id] {
        let saved = wait_for_event(&mut events, id, Kind::WorkspaceSaved).await;
        let agent = saved.agent.unwrap();
        assert_eq!(status(&agent), pb::AgentStatus::Cancelled);
        assert_eq!(
            git(
                &repo.repo(),
                &[
                    "show",
                    &format!("{}:wip.txt", agent.workspace.unwrap().branch)
                ]
            ),
            **id
        );
    }
    repo.assert_live_worktrees(&[]);
}

#[tokio::test]
async fn twenty_runs_at_once_on_one_repository_all_start_and_each_keeps_its_own_branch() {
    let repo = Repo::new();
    let script = repo.script(
        "mine.sh",
        "echo \"$SUBAGENTD_AGENT_ID\" > mine.txt\necho ok\n",
    );
    let s = repo.server(&script, "").await;
    let spawned = futures_util::future::join_all((0..20).map(|_| {
        let addr = s.handle.addr();
        async move {
            let mut client = connect(addr).await;
            spawn(&mut client, coder("go", false)).await
        }
    }))
    .await;
    for agent in &spawned {
        assert_eq!(status(agent), pb::AgentStatus::Done, "{agent:?}");
        let branch = format!("subagentd/{}", agent.id);
        assert_eq!(
            git(&repo.repo(), &["show", &format!("{branch}:mine.txt")]),
            agent.id
        );
    }
    assert_eq!(repo.branches().len(), 21);
    assert!(repo.worktrees().is_empty());
}

#[tokio::test]
async fn cwd_is_relative_to_the_worktree() {
    let repo = Repo::new();
    std::fs::create_dir(repo.repo().join("sub")).unwrap();
    std::fs::write(repo.repo().join("sub/keep.txt"), "k\n").unwrap();
    git(&repo.repo(), &["add", "--all"]);
    git(
        &repo.repo(),
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "--quiet",
            "-m",
            "sub",
        ],
    );
    let script = repo.script("pwd.sh", "pwd\n");
    let mut s = repo.server(&script, "cwd = \"sub\"").await;
    let agent = spawn(&mut s.client, coder("go", false)).await;
    assert_eq!(
        agent.result.trim(),
        repo.root()
            .join(&agent.id)
            .join("sub")
            .display()
            .to_string()
    );
}

#[tokio::test]
async fn a_repo_that_is_no_git_repository_stops_the_server_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let config = subagentd::config::ConfigSource::from_toml_str(&format!(
        "[agents.coder]\nrunner = \"command\"\ncommand = [\"true\"]\nworkspace = \"worktree\"\nrepo = {:?}\n",
        dir.path()
    ))
    .unwrap();
    let mut config = config;
    config.server.listen = "127.0.0.1:0".into();
    config.telemetry.metrics_listen = "127.0.0.1:0".into();
    config.http.listen = "127.0.0.1:0".into();
    config.store.backend = subagentd::config::StoreBackend::Memory;
    let Err(err) = subagentd::server::start(config, ConfigSource::default()).await else {
        panic!("the server started with a repo that is no git repository");
    };
    let message = format!("{err:#}");
    assert!(message.contains("agents.coder.repo"), "{message}");
    assert!(message.contains("not a git repository"), "{message}");
}

#[tokio::test]
async fn a_conversation_builds_one_branch_and_a_fork_starts_its_own() {
    let repo = Repo::new();
    // Each turn adds a file named after itself and lists the turn files it sees.
    let script = repo.script(
        "turn.sh",
        "cat > /dev/null\necho \"$SUBAGENTD_AGENT_ID\" > \"turn-$SUBAGENTD_AGENT_ID.txt\"\nls turn-*.txt | wc -l\n",
    );
    let mut s = repo.server(&script, "").await;
    let first = spawn(&mut s.client, coder("one", false)).await;
    let one = first.workspace.clone().expect("saved");
    assert_eq!(first.result.trim(), "1");

    let mut next = coder("two", false);
    next.agent = String::new();
    next.model = String::new();
    next.continue_from = first.id.clone();
    let second = spawn(&mut s.client, next.clone()).await;
    assert_eq!(status(&second), pb::AgentStatus::Done, "{second:?}");
    assert_eq!(
        second.result.trim(),
        "2",
        "the continuation sees the first turn's work"
    );
    let two = second.workspace.clone().expect("saved");
    assert_eq!(two.branch, one.branch, "one conversation, one branch");
    assert_eq!(two.base_commit, one.head_commit);
    assert_eq!(two.files_changed, 1);
    assert_eq!(
        git(&repo.repo(), &["rev-parse", &one.branch]),
        two.head_commit
    );

    next.fork = true;
    let fork = spawn(&mut s.client, next).await;
    assert_eq!(
        fork.result.trim(),
        "2",
        "the fork sees the first turn's work only"
    );
    let forked = fork.workspace.clone().expect("saved");
    assert_eq!(forked.branch, format!("subagentd/{}", fork.id));
    assert_eq!(forked.base_commit, one.head_commit);
    assert!(repo.worktrees().is_empty());
    // The conversation's branch still ends at the second turn.
    assert_eq!(
        git(&repo.repo(), &["rev-parse", &one.branch]),
        two.head_commit
    );
}

#[tokio::test]
async fn a_worktree_a_crash_left_is_saved_at_the_restart() {
    use common::child::ChildServer;

    let repo = Repo::new();
    let script = repo.script(
        "long.sh",
        "echo draft > wip.txt\necho started\nexec sleep 60\n",
    );
    let toml = format!(
        "[store]\npath = {data:?}\n\n[agents.coder]\nrunner = \"command\"\ncommand = [\"sh\", {script:?}]\n\
         workspace = \"worktree\"\nrepo = {repo:?}\nroot = {root:?}\nkill_grace = \"200ms\"\n",
        data = repo.dir.path().join("data"),
        repo = repo.repo(),
        root = repo.root(),
    );
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let agent = spawn(&mut client, coder("go", true)).await;
    let mut events = watch_agent(&mut client, &agent.id).await;
    wait_for(&mut events, |ev| ev.output.contains("started")).await;
    repo.assert_live_worktrees(&[&agent.id]);
    server.signal(nix::sys::signal::Signal::SIGKILL);
    server.exit_status().await;
    assert!(
        repo.root().join(&agent.id).exists(),
        "the crash left the worktree"
    );

    // The restart stops the orphaned program, fails the run, and saves its
    // worktree before it serves.
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let after = status_of(&mut client, &agent.id).await;
    assert_eq!(status(&after), pb::AgentStatus::Failed, "{after:?}");
    let workspace = after.workspace.expect("the recovery saved the worktree");
    let branch = format!("subagentd/{}", agent.id);
    assert_eq!(
        (workspace.branch.as_str(), workspace.kept),
        (branch.as_str(), true)
    );
    assert_eq!(workspace.files_changed, 1);
    assert_eq!(
        git(&repo.repo(), &["show", &format!("{branch}:wip.txt")]),
        "draft"
    );
    assert!(repo.worktrees().is_empty());
    assert!(!repo.root().join(&agent.id).exists());
    server.stop().await;
}

#[tokio::test]
async fn a_worktree_past_max_workspace_bytes_fails_its_run_with_workspace_full() {
    let repo = Repo::new();
    let script = repo.script(
        "grow.sh",
        "head -c 2000000 /dev/zero > big.bin\necho grown\nexec sleep 60\n",
    );
    let mut s = repo.server(&script, "max_workspace_bytes = 1000000").await;
    let agent = spawn(&mut s.client, coder("go", false)).await;
    assert_eq!(status(&agent), pb::AgentStatus::Failed, "{agent:?}");
    let error = agent.error.clone().expect("an error");
    assert_eq!(error.code, "WORKSPACE_FULL", "{error:?}");
    assert!(
        error.message.contains("max_workspace_bytes = 1000000"),
        "{error:?}"
    );
    // Cleaned up like any other ending: the work is on its branch.
    let workspace = agent.workspace.expect("saved before the run ended");
    assert_eq!(workspace.files_changed, 1);
    assert!(repo.worktrees().is_empty());
}

#[tokio::test]
async fn workspace_base_starts_the_worktree_there_and_one_the_repository_lacks_is_refused() {
    let repo = Repo::new();
    let feature = repo.commit_on_branch("feature", "feature.txt");
    git(&repo.repo(), &["tag", "v1", "main"]);
    let script = repo.script("ls.sh", "ls\n");
    let mut s = repo
        .server(&script, "\n[agents.plain]\nrunner = \"simulated\"\n")
        .await;
    // A branch, a tag and a commit: the worktree starts there.
    for (base, commit) in [
        ("feature", feature.clone()),
        ("v1", git(&repo.repo(), &["rev-parse", "main"])),
        (feature.as_str(), feature.clone()),
    ] {
        let mut req = coder("go", false);
        req.workspace_base = base.into();
        let agent = spawn(&mut s.client, req).await;
        assert_eq!(status(&agent), pb::AgentStatus::Done, "{agent:?}");
        assert_eq!(agent.workspace.unwrap().base_commit, commit, "{base}");
        assert_eq!(
            agent.result.contains("feature.txt"),
            commit == feature,
            "{base}: {}",
            agent.result
        );
    }
    let branches = repo.branches();

    // Refused before anything is created: no agent, branch or worktree.
    let refused = |base: &str, agent: &str, continue_from: &str| {
        let mut req = coder("go", true);
        req.workspace_base = base.into();
        req.agent = agent.into();
        req.continue_from = continue_from.into();
        req
    };
    let done = spawn(&mut s.client, coder("first", false)).await;
    for (req, says) in [
        (
            refused("nope", "coder", ""),
            "names no branch, tag or commit",
        ),
        (refused("--orphan", "coder", ""), "must not start with '-'"),
        (refused("a b", "coder", ""), "whitespace"),
        (refused("main", "plain", ""), "has no workspace"),
        (refused("main", "", &done.id), "continue_from"),
    ] {
        let err = s.client.spawn(req.clone()).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{req:?}: {err:?}");
        assert_eq!(violated_fields(&err), ["workspace_base"], "{err:?}");
        assert!(err.message().contains(says), "{says}: {}", err.message());
    }
    let listed = list_all(&mut s.client, pb::StatusRequest::default()).await;
    assert_eq!(listed.len(), 4, "no agent was created: {listed:?}");
    assert_eq!(repo.branches(), branches);
    repo.assert_live_worktrees(&[]);
}

#[tokio::test]
async fn a_workspace_base_gone_by_the_time_the_run_starts_fails_it_with_workspace_base_unknown() {
    let repo = Repo::new();
    repo.commit_on_branch("short-lived", "x.txt");
    // The first run holds the model's only slot until stopped.
    let script = repo.script(
        "first.sh",
        "if [ \"$1\" = hold ]; then echo holding; exec sleep 60; fi\necho ran\n",
    );
    let mut s = TestServer::start(&format!(
        "[limits]\nmax_background_agents = 40\nmax_concurrent_per_parent = 0\n\
         [limits.model_concurrency]\n\"acme/m\" = 1\n\n\
         [agents.coder]\nrunner = \"command\"\ncommand = [\"sh\", {script:?}, \"{{prompt}}\"]\n\
         prompt = \"arg\"\nworkspace = \"worktree\"\nrepo = {repo:?}\nroot = {root:?}\nkill_grace = \"200ms\"\n",
        repo = repo.repo(),
        root = repo.root(),
    ))
    .await;
    let holder = spawn(&mut s.client, coder("hold", true)).await;
    let mut events = watch_agent(&mut s.client, &holder.id).await;
    wait_for(&mut events, |ev| ev.output.contains("holding")).await;
    let mut req = coder("go", true);
    req.workspace_base = "short-lived".into();
    // Admitted while the branch exists, queued behind the holder ...
    let queued = spawn(&mut s.client, req).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    repo.assert_live_worktrees(&[&holder.id]);
    // ... its base is deleted, then it starts: it fails, nothing is left.
    git(&repo.repo(), &["branch", "--quiet", "-D", "short-lived"]);
    cancel(&mut s.client, &holder.id).await;
    let failed = await_all(&mut s.client, &[&queued.id]).await.remove(0);
    assert_eq!(status(&failed), pb::AgentStatus::Failed, "{failed:?}");
    let error = failed.error.expect("an error");
    assert_eq!(error.code, "WORKSPACE_BASE_UNKNOWN", "{error:?}");
    assert!(error.message.contains("short-lived"), "{error:?}");
    assert_eq!(failed.workspace, None);
    wait_for_event(&mut events, &holder.id, Kind::WorkspaceSaved).await;
    repo.assert_live_worktrees(&[]);
    assert!(!repo
        .branches()
        .contains(&format!("subagentd/{}", failed.id)));
}

/// `subagentd worker` with the workspace type `coder` running `script`.
mod on_a_worker {
    use super::*;
    use common::child::{ChildServer, ChildWorker};

    const SERVER: &str = "[limits]\nmax_background_agents = 40\ndefault_concurrency = 0\n\
                          max_concurrent_per_parent = 0\n\n[agents.coder]\nrunner = \"worker\"\n\n\
                          [agents.plain]\nrunner = \"worker\"\n";

    fn worker_toml(repo: &Repo, script: &str) -> String {
        format!(
            "[worker]\nname = \"w1\"\ncapacity = 4\n\n[agents.coder]\nrunner = \"command\"\n\
             command = [\"sh\", {script:?}]\nworkspace = \"worktree\"\nrepo = {repo:?}\n\
             root = {root:?}\nkill_grace = \"200ms\"\n\n\
             [agents.plain]\nrunner = \"command\"\ncommand = [\"true\"]\n",
            repo = repo.repo(),
            root = repo.root(),
        )
    }

    #[tokio::test]
    async fn a_worker_runs_each_run_in_a_worktree_on_its_host_and_reports_the_workspace() {
        let repo = Repo::new();
        let feature = repo.commit_on_branch("feature", "feature.txt");
        // EDITS, unless the prompt asks it to wait.
        let script = repo.script(
            "work.sh",
            &format!(
                "read -r prompt\nif [ \"$prompt\" = wait ]; then echo draft > wip.txt; echo started; \
                 exec sleep 60; fi\n{EDITS}ls\n"
            ),
        );
        let server = ChildServer::start(SERVER, &[]).await;
        let _worker = ChildWorker::start(&server.addr, &worker_toml(&repo, &script)).await;
        let mut client = server.client().await;

        // Ends by itself: committed before its terminal event.
        let done = spawn(&mut client, coder("go", false)).await;
        assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
        let workspace = done.workspace.clone().expect("the worker reported it");
        let branch = format!("subagentd/{}", done.id);
        assert_eq!(
            (
                workspace.branch.as_str(),
                workspace.kept,
                workspace.files_changed,
                workspace.insertions,
                workspace.deletions
            ),
            (branch.as_str(), true, 3, 3, 2)
        );
        assert_eq!(
            workspace.head_commit,
            git(&repo.repo(), &["rev-parse", &branch])
        );
        repo.assert_live_worktrees(&[]);

        // Spawn's workspace_base; one the worker's repository lacks fails
        // the run (the server cannot check it).
        let mut req = coder("go", false);
        req.workspace_base = "feature".into();
        let based = spawn(&mut client, req).await;
        assert_eq!(based.workspace.clone().unwrap().base_commit, feature);
        assert!(based.result.contains("feature.txt"), "{}", based.result);
        let mut req = coder("go", false);
        req.workspace_base = "nope".into();
        let unknown = spawn(&mut client, req).await;
        assert_eq!(status(&unknown), pb::AgentStatus::Failed);
        assert_eq!(unknown.error.unwrap().code, "WORKSPACE_BASE_UNKNOWN");
        assert_eq!(unknown.workspace, None);
        // A type without a workspace on the worker: refused there too.
        let mut req = coder("go", false);
        req.agent = "plain".into();
        req.workspace_base = "main".into();
        let plain = spawn(&mut client, req).await;
        let error = plain.error.expect("failed");
        assert_eq!(error.code, "WORKSPACE_BASE_UNKNOWN");
        assert!(error.message.contains("has no workspace"), "{error:?}");

        // A continuation goes on on the continued agent's branch.
        let mut next = coder("go", false);
        next.agent = String::new();
        next.model = String::new();
        next.continue_from = done.id.clone();
        let second = spawn(&mut client, next).await;
        let second_ws = second.workspace.expect("saved");
        assert_eq!(second_ws.branch, branch);
        assert_eq!(second_ws.base_commit, workspace.head_commit);

        // Stopped by the server: ends at once, the workspace follows.
        let waiting = spawn(&mut client, coder("wait", true)).await;
        let mut events = watch_agent(&mut client, &waiting.id).await;
        wait_for(&mut events, |ev| ev.output.contains("started")).await;
        repo.assert_live_worktrees(&[&waiting.id]);
        cancel(&mut client, &waiting.id).await;
        let cancelled = wait_for_event(&mut events, &waiting.id, Kind::Cancelled).await;
        assert_eq!(cancelled.agent.unwrap().workspace, None);
        let saved = wait_for_event(&mut events, &waiting.id, Kind::WorkspaceSaved).await;
        let saved = saved
            .agent
            .unwrap()
            .workspace
            .expect("the event carries it");
        assert_eq!((saved.kept, saved.files_changed), (true, 1));
        assert_eq!(
            git(
                &repo.repo(),
                &["show", &format!("subagentd/{}:wip.txt", waiting.id)]
            ),
            "draft"
        );
        assert_eq!(
            transcript_workspace(&mut client, &waiting.id).await,
            Some(saved)
        );
        repo.assert_live_worktrees(&[]);
    }

    #[tokio::test]
    async fn a_killed_worker_s_worktrees_are_saved_when_it_starts_again() {
        let repo = Repo::new();
        let script = repo.script(
            "long.sh",
            "echo draft > wip.txt\necho \"pid=$$\"\nexec sleep 60\n",
        );
        let server = ChildServer::start(SERVER, &[]).await;
        let worker = ChildWorker::start(&server.addr, &worker_toml(&repo, &script)).await;
        let mut client = server.client().await;
        let agent = spawn(&mut client, coder("go", true)).await;
        let mut events = watch_agent(&mut client, &agent.id).await;
        let started = wait_for(&mut events, |ev| ev.output.contains("pid=")).await;
        let pid: i32 = started
            .output
            .trim()
            .trim_start_matches("pid=")
            .parse()
            .unwrap();
        repo.assert_live_worktrees(&[&agent.id]);
        // A second worker on the same root would take this one's live
        // worktrees for a killed worker's: it does not start.
        let second = ChildWorker::start_unconnected(&server.addr, &worker_toml(&repo, &script));
        assert!(!second.exit_status().await.success());
        repo.assert_live_worktrees(&[&agent.id]);
        worker.signal(nix::sys::signal::Signal::SIGKILL);
        worker.exit_status().await;
        // The server loses the worker and fails the run; the program
        // outlived its worker, in its worktree.
        let lost = wait_for_event(&mut events, &agent.id, Kind::Failed).await;
        assert_eq!(lost.agent.unwrap().error.unwrap().code, "WORKER_LOST");
        assert!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok());
        repo.assert_live_worktrees(&[&agent.id]);

        // Started again with the same root: the program is stopped, the
        // work committed to the branch, the worktree removed, and the
        // server told.
        let _worker = ChildWorker::start(&server.addr, &worker_toml(&repo, &script)).await;
        let saved = wait_for_event(&mut events, &agent.id, Kind::WorkspaceSaved).await;
        let workspace = saved
            .agent
            .unwrap()
            .workspace
            .expect("the event carries it");
        let branch = format!("subagentd/{}", agent.id);
        assert_eq!(
            (workspace.branch.as_str(), workspace.kept),
            (branch.as_str(), true)
        );
        assert_eq!(
            git(&repo.repo(), &["show", &format!("{branch}:wip.txt")]),
            "draft"
        );
        assert_eq!(
            status_of(&mut client, &agent.id).await.workspace,
            Some(workspace)
        );
        repo.assert_live_worktrees(&[]);
        assert!(!repo.root().join(&agent.id).exists());
        assert!(!repo.root().join(format!("{}.run", agent.id)).exists());
        // Gone, or a zombie nobody reaped yet.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty()
                || stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, r)| r.starts_with('Z')),
            "the orphaned program was stopped: {stat}"
        );
    }

    #[test]
    fn a_worker_whose_repo_is_no_git_repository_does_not_start() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("w.toml");
        std::fs::write(
            &config,
            format!(
                "[agents.coder]\nrunner = \"command\"\ncommand = [\"true\"]\n\
                 workspace = \"worktree\"\nrepo = {repo:?}\nroot = {root:?}\n",
                repo = dir.path(),
                root = dir.path().join("wt"),
            ),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_subagentd"))
            .args(["worker", "--server", "127.0.0.1:1", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("agents.coder.repo"), "{stderr}");
        assert!(stderr.contains("not a git repository"), "{stderr}");

        // Without `root` the config itself is refused.
        std::fs::write(
            &config,
            format!(
                "[agents.coder]\nrunner = \"command\"\ncommand = [\"true\"]\n\
                 workspace = \"worktree\"\nrepo = {repo:?}\n",
                repo = dir.path(),
            ),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_subagentd"))
            .args(["worker", "--server", "127.0.0.1:1", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("agents.coder.root"), "{stderr}");
    }
}
