//! Workspaces: each run of a `workspace = "worktree"` agent type in its own
//! git worktree, on its own branch, its changes committed there when it ends.
//!
//! Git itself does the work (the `git` program, as a person would run it):
//! `worktree add` before the run, `add -A` and `commit` at its end, then
//! `worktree remove` and `prune`, and the branch kept or deleted. Git
//! refuses concurrent changes to one repository's administrative files
//! (`index.lock`, `worktrees/`), so this process runs one git command at a
//! time per repository ([`Workspaces`] holds a lock per repository) and
//! retries a command that lost a lock to another process.

use std::{
    collections::HashMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::process::Command;

use crate::scheduler::durable::ProcessGroup;

use crate::config::{
    AgentTypeConfig, KeepBranch, WorkspaceKind, DEFAULT_BRANCH_PREFIX, DEFAULT_COMMIT_AUTHOR,
    DEFAULT_COMMIT_MESSAGE,
};

/// Which branches outlive their run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Only a branch the run changed (its head is not its base).
    Changes,
    /// Every branch.
    Always,
    /// None: the work is discarded with the worktree.
    Never,
}

/// Where and how an agent type's runs get their worktrees (from its
/// `[agents.NAME]` workspace keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The repository the worktrees belong to.
    pub repo: PathBuf,
    /// The ref a first turn starts at.
    pub base: String,
    /// A run's branch is this prefix and its agent id.
    pub branch_prefix: String,
    pub keep: Keep,
    /// Worktrees are created in `root/<agent id>`.
    pub root: PathBuf,
    /// "Name <email>" of the commits made at a run's end.
    pub commit_author: String,
    /// The commit message; `{id}` and `{description}` are replaced.
    pub commit_message: String,
}

impl Spec {
    /// The workspace of agent type `cfg`; None for a type without one.
    /// Worktrees go to the type's `root`, else to `default_root` (the
    /// server's data directory's `worktrees`; a worker has none, and its
    /// config requires `root`).
    pub fn of(cfg: &AgentTypeConfig, default_root: Option<&Path>) -> Option<Spec> {
        if cfg.workspace != WorkspaceKind::Worktree {
            return None;
        }
        // Absolute: git runs in the repository (`-C`), where a relative
        // root would mean another folder than the program's.
        let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        Some(Spec {
            repo: absolute(cfg.repo.clone()?),
            base: cfg.base.clone().unwrap_or_else(|| "HEAD".to_owned()),
            branch_prefix: cfg
                .branch_prefix
                .clone()
                .unwrap_or_else(|| DEFAULT_BRANCH_PREFIX.to_owned()),
            keep: match cfg.keep.unwrap_or_default() {
                KeepBranch::Changes => Keep::Changes,
                KeepBranch::Always => Keep::Always,
                KeepBranch::Never => Keep::Never,
            },
            root: absolute(
                cfg.root
                    .clone()
                    .or_else(|| default_root.map(Path::to_path_buf))?,
            ),
            commit_author: cfg
                .commit_author
                .clone()
                .unwrap_or_else(|| DEFAULT_COMMIT_AUTHOR.to_owned()),
            commit_message: cfg
                .commit_message
                .clone()
                .unwrap_or_else(|| DEFAULT_COMMIT_MESSAGE.to_owned()),
        })
    }
}

/// Where a run's worktree starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// A new branch at this ref (the type's `base`, or Spawn's
    /// `workspace_base`).
    Ref(String),
    /// A continuation: the continued agent's branch, checked out at its
    /// head (the branch still exists and is at that commit).
    Branch { branch: String, head: String },
    /// A new branch at this commit (a fork, or a continuation whose
    /// branch is gone).
    Commit(String),
}

/// A run's live worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worktree {
    pub path: PathBuf,
    pub branch: String,
    /// The commit the worktree was created at.
    pub base_commit: String,
    /// Whether the run made its branch (a continuation's or a retried
    /// run's existed before, and is never deleted for an unchanged run).
    pub created_branch: bool,
}

/// A worktree [`Workspaces::list`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    /// The agent id its folder is named after.
    pub id: String,
    pub worktree: Worktree,
    /// Its record, when one was written.
    pub record: Option<RunRecord>,
}

/// What a run's worktree left behind once it was saved and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    pub branch: String,
    /// Whether the branch still exists.
    pub kept: bool,
    pub base_commit: String,
    pub head_commit: String,
    pub files_changed: u32,
    pub insertions: u32,
    pub deletions: u32,
}

impl From<Saved> for crate::scheduler::Workspace {
    fn from(saved: Saved) -> Self {
        Self {
            branch: saved.branch,
            kept: saved.kept,
            base_commit: saved.base_commit,
            head_commit: saved.head_commit,
            files_changed: saved.files_changed,
            insertions: saved.insertions,
            deletions: saved.deletions,
        }
    }
}

/// What is recorded beside a run's worktree (`<root>/<agent id>.run`),
/// for whoever finds the worktree after a crash (the server's recovery, or
/// `subagentd worker` started again): where the worktree started (git does
/// not record it), whose attempt it is, and the program's process group, so
/// a program that outlived its server or worker is stopped before its work
/// is committed. Written when the worktree is created and again before the
/// program runs; removed with the worktree.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// The commit the worktree was created at.
    pub base_commit: String,
    /// The run's attempt (`Agent.attempt`).
    pub attempt: u32,
    /// The program's process group, once it was started.
    pub group: Option<RecordedGroup>,
}

/// A process group as [`RunRecord`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordedGroup {
    pub pgid: i32,
    /// The leader's start time (clock ticks since boot).
    pub start_ticks: u64,
    /// The boot it was started in (`/proc/sys/kernel/random/boot_id`): after
    /// a reboot the pgid may be another program's.
    pub boot_id: String,
}

impl RunRecord {
    fn path(worktree: &Path) -> PathBuf {
        worktree.with_extension("run")
    }

    /// The record beside `worktree`, if one was written and reads.
    pub fn read(worktree: &Path) -> Option<Self> {
        let text = std::fs::read(Self::path(worktree)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn write(&self, worktree: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        // Whole or not at all: a crash mid-write must not leave half a record.
        let partial = worktree.with_extension("run.partial");
        std::fs::write(&partial, text)?;
        std::fs::rename(partial, Self::path(worktree))
    }

    fn remove(worktree: &Path) {
        let _ = std::fs::remove_file(Self::path(worktree));
    }

    /// Records `group` as the program running in `worktree`.
    pub fn record_group(worktree: &Path, group: ProcessGroup) -> std::io::Result<()> {
        let mut record = Self::read(worktree).unwrap_or_default();
        record.group = Some(RecordedGroup {
            pgid: group.pgid,
            start_ticks: group.start_ticks,
            boot_id: boot_id(),
        });
        record.write(worktree)
    }

    /// The recorded process group, if it was started in this boot.
    pub fn group_this_boot(&self) -> Option<ProcessGroup> {
        let g = self.group.as_ref().filter(|g| g.boot_id == boot_id())?;
        Some(ProcessGroup {
            pgid: g.pgid,
            start_ticks: g.start_ticks,
        })
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

/// A git command that failed, or a ref git does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    /// The ref names no commit (or would be read as an option).
    #[error("unknown ref {0:?}")]
    UnknownRef(String),
    /// `path` is not a git repository.
    #[error("{0} is not a git repository")]
    NotARepository(PathBuf),
    #[error("git {command} failed: {stderr}")]
    Git { command: String, stderr: String },
}

/// How many times a git command that lost a lock to another process runs
/// again, and the first wait (doubled each time).
const LOCK_RETRIES: u32 = 6;
const LOCK_BACKOFF: Duration = Duration::from_millis(20);

/// The git commands of every workspace of this process, one at a time per
/// repository.
#[derive(Debug, Default)]
pub struct Workspaces {
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl Workspaces {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock_of(&self, repo: &Path) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(repo.to_path_buf()).or_default().clone()
    }

    /// The commit `reference` names in `repo`; refused without running git
    /// when git would read it as an option.
    pub async fn resolve(&self, repo: &Path, reference: &str) -> Result<String, WorkspaceError> {
        if reference.is_empty() || reference.starts_with('-') {
            return Err(WorkspaceError::UnknownRef(reference.to_owned()));
        }
        let spec = format!("{reference}^{{commit}}");
        match git(
            repo,
            [
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &spec,
            ],
        )
        .await
        {
            Ok(commit) => Ok(commit),
            // `--verify --quiet` says "no such commit" by failing silently;
            // anything it says is another failure (no repository, no git).
            Err(WorkspaceError::Git { stderr, .. }) if stderr.is_empty() => {
                Err(WorkspaceError::UnknownRef(reference.to_owned()))
            }
            Err(e) => Err(e),
        }
    }

    /// Creates agent `id`'s worktree at `start`, for its attempt `attempt`.
    pub async fn create(
        &self,
        spec: &Spec,
        id: &str,
        attempt: u32,
        start: &Start,
    ) -> Result<Worktree, WorkspaceError> {
        let lock = self.lock_of(&spec.repo);
        let _serial = lock.lock().await;
        let path = spec.root.join(id);
        tokio::fs::create_dir_all(&spec.root)
            .await
            .map_err(|e| io_error("mkdir", &spec.root, e))?;
        // A worktree left by an earlier attempt of this agent (a crash, a
        // retried run): its work goes to its branch first.
        if path.exists() {
            commit_all(spec, &path, id, "").await?;
            remove_worktree(&spec.repo, &path).await?;
            RunRecord::remove(&path);
        }
        let own_branch = format!("{}{id}", spec.branch_prefix);
        // Where the worktree goes, after the fallbacks: a branch that
        // exists (a retried run's own, a continuation's), else a new branch
        // at a commit the repository has, else at `base`.
        let existing = |branch: &str| {
            let reference = format!("refs/heads/{branch}");
            let repo = spec.repo.clone();
            async move {
                git(&repo, ["rev-parse", "--verify", "--quiet", &reference])
                    .await
                    .ok()
            }
        };
        let on_branch = match start {
            Start::Ref(_) => existing(&own_branch)
                .await
                .map(|head| (own_branch.clone(), head)),
            Start::Branch { branch, .. } => {
                existing(branch).await.map(|head| (branch.clone(), head))
            }
            Start::Commit(_) => None,
        };
        let (branch, base_commit, created_branch) = match on_branch {
            Some((branch, head)) => {
                let args: [&OsStr; 4] = [
                    "worktree".as_ref(),
                    "add".as_ref(),
                    path.as_os_str(),
                    branch.as_ref(),
                ];
                git(&spec.repo, args).await?;
                (branch, head, false)
            }
            None => {
                let commit = match start {
                    Start::Ref(reference) => self.resolve(&spec.repo, reference).await?,
                    // A continued agent's head, if the repository still has it.
                    Start::Branch { head, .. } | Start::Commit(head) => {
                        match self.resolve(&spec.repo, head).await {
                            Ok(commit) => commit,
                            Err(_) => self.resolve(&spec.repo, &spec.base).await?,
                        }
                    }
                };
                let args: [&OsStr; 6] = [
                    "worktree".as_ref(),
                    "add".as_ref(),
                    "-b".as_ref(),
                    own_branch.as_ref(),
                    path.as_os_str(),
                    commit.as_ref(),
                ];
                git(&spec.repo, args).await?;
                (own_branch, commit, true)
            }
        };
        let record = RunRecord {
            base_commit: base_commit.clone(),
            attempt,
            group: None,
        };
        if let Err(e) = record.write(&path) {
            remove_worktree(&spec.repo, &path).await?;
            return Err(io_error("write", &RunRecord::path(&path), e));
        }
        Ok(Worktree {
            path,
            branch,
            base_commit,
            created_branch,
        })
    }

    /// Commits everything the run left uncommitted in `worktree` (modified,
    /// deleted and untracked files; not ignored ones), removes the
    /// worktree and keeps or deletes its branch per `spec.keep`.
    pub async fn save(
        &self,
        spec: &Spec,
        worktree: &Worktree,
        id: &str,
        description: &str,
    ) -> Result<Saved, WorkspaceError> {
        let lock = self.lock_of(&spec.repo);
        let _serial = lock.lock().await;
        let wt = worktree.path.as_path();
        commit_all(spec, wt, id, description).await?;
        let head_commit = git(wt, ["rev-parse", "HEAD"]).await?;
        let (files_changed, insertions, deletions) = diff_stats(
            &git(
                wt,
                ["diff", "--numstat", &worktree.base_commit, &head_commit],
            )
            .await?,
        );
        remove_worktree(&spec.repo, wt).await?;
        RunRecord::remove(wt);
        let kept = match spec.keep {
            Keep::Always => true,
            Keep::Never => false,
            Keep::Changes => head_commit != worktree.base_commit || !worktree.created_branch,
        };
        if !kept {
            git(
                &spec.repo,
                ["branch", "--delete", "--force", &worktree.branch],
            )
            .await?;
        }
        Ok(Saved {
            branch: worktree.branch.clone(),
            kept,
            base_commit: worktree.base_commit.clone(),
            head_commit,
            files_changed,
            insertions,
            deletions,
        })
    }

    /// The worktrees under `spec.root` git knows, by agent id (the
    /// folder's name), with their branches and records: what a restart
    /// finds left.
    pub async fn list(&self, spec: &Spec) -> Result<Vec<Left>, WorkspaceError> {
        let lock = self.lock_of(&spec.repo);
        let _serial = lock.lock().await;
        let listing = git(&spec.repo, ["worktree", "list", "--porcelain"]).await?;
        let root = canonical(&spec.root);
        let mut found = Vec::new();
        for entry in listing.split("\n\n") {
            let mut path = None;
            let mut branch = None;
            for line in entry.lines() {
                if let Some(p) = line.strip_prefix("worktree ") {
                    path = Some(PathBuf::from(p));
                } else if let Some(b) = line.strip_prefix("branch refs/heads/") {
                    branch = Some(b.to_owned());
                }
            }
            let (Some(path), Some(branch)) = (path, branch) else {
                continue;
            };
            if canonical(path.parent().unwrap_or(&path)) != root {
                continue;
            }
            let Some(id) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            // Where the run started is in its record; without one (a crash
            // between `worktree add` and the record), the point its branch
            // left `base` stands in for it.
            let record = RunRecord::read(&path);
            let base_commit = match &record {
                Some(r) => r.base_commit.clone(),
                None => match git(&spec.repo, ["merge-base", &spec.base, &branch]).await {
                    Ok(base) => base,
                    Err(_) => git(&spec.repo, ["rev-parse", &branch]).await?,
                },
            };
            found.push(Left {
                id: id.to_owned(),
                worktree: Worktree {
                    path: path.clone(),
                    branch,
                    base_commit,
                    // Deleted under `keep = "changes"` only when it has
                    // nothing beyond its start: nothing is lost then.
                    created_branch: true,
                },
                record,
            });
        }
        Ok(found)
    }
}

/// Commits everything uncommitted in worktree `wt` (modified, deleted and
/// untracked files; not ignored ones) as `spec.commit_author`.
async fn commit_all(
    spec: &Spec,
    wt: &Path,
    id: &str,
    description: &str,
) -> Result<(), WorkspaceError> {
    git(wt, ["add", "--all"]).await?;
    if git_succeeds(wt, ["diff", "--cached", "--quiet"]).await? {
        return Ok(());
    }
    let message = spec
        .commit_message
        .replace("{id}", id)
        .replace("{description}", description);
    let (name, email) = author_parts(&spec.commit_author);
    let name_cfg = format!("user.name={name}");
    let email_cfg = format!("user.email={email}");
    // Hooks are the repository's checks for people; a run's work is kept
    // whatever they would say.
    git(
        wt,
        [
            "-c",
            &name_cfg,
            "-c",
            &email_cfg,
            "commit",
            "--quiet",
            "--no-verify",
            "--no-gpg-sign",
            "-m",
            &message,
        ],
    )
    .await?;
    Ok(())
}

/// Removes a worktree (with whatever git ignores in it) and prunes git's
/// record of it; a folder git no longer knows is removed all the same.
async fn remove_worktree(repo: &Path, path: &Path) -> Result<(), WorkspaceError> {
    let removed = git(
        repo,
        [
            "worktree".as_ref(),
            "remove".as_ref(),
            "--force".as_ref(),
            "--force".as_ref(),
            path.as_os_str(),
        ],
    )
    .await;
    if removed.is_err() && path.exists() {
        tokio::fs::remove_dir_all(path)
            .await
            .map_err(|e| io_error("rm -r", path, e))?;
    }
    git(repo, ["worktree", "prune"]).await?;
    Ok(())
}

/// Spawn's `workspace_base` for an in-process agent type: the repository
/// must have a commit by that name, or the Spawn is refused before anything
/// is created (INVALID_ARGUMENT naming the field). A type without a
/// workspace is the scheduler's to refuse, a worker type the worker's.
pub async fn check_base(
    agent_type: &AgentTypeConfig,
    base: &str,
) -> Result<(), crate::scheduler::Error> {
    let Some(repo) = agent_type.repo.as_deref() else {
        return Ok(());
    };
    if agent_type.workspace != WorkspaceKind::Worktree {
        return Ok(());
    }
    match Workspaces::new().resolve(repo, base).await {
        Ok(_) => Ok(()),
        Err(WorkspaceError::UnknownRef(_)) => Err(crate::scheduler::Error::invalid(
            "workspace_base",
            format!("{base:?} names no branch, tag or commit of the agent type's repository"),
        )),
        // Not the caller's doing (git failed to run, the repository moved):
        // admitted, and the run's start reports what is wrong.
        Err(e) => {
            tracing::warn!(error = %e, "checking a Spawn's workspace_base failed; admitting it");
            Ok(())
        }
    }
}

/// Checks that `repo` is a git repository (the server refuses to start
/// otherwise, naming the key).
pub async fn check_repository(repo: &Path) -> Result<(), WorkspaceError> {
    match git(repo, ["rev-parse", "--git-dir"]).await {
        Ok(_) => Ok(()),
        Err(_) => Err(WorkspaceError::NotARepository(repo.to_path_buf())),
    }
}

/// "Name <email>" → (name, email); a bare name gets a local address.
fn author_parts(author: &str) -> (String, String) {
    match author.split_once('<') {
        Some((name, rest)) => (
            name.trim().to_owned(),
            rest.trim_end().trim_end_matches('>').trim().to_owned(),
        ),
        None => (author.trim().to_owned(), "subagentd@localhost".to_owned()),
    }
}

/// Files changed, insertions and deletions from `git diff --numstat`
/// (binary files count as changed, with no lines).
fn diff_stats(numstat: &str) -> (u32, u32, u32) {
    let mut totals = (0u32, 0u32, 0u32);
    for line in numstat.lines().filter(|l| !l.is_empty()) {
        let mut fields = line.split('\t');
        let added = fields
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        let removed = fields
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        totals.0 += 1;
        totals.1 = totals.1.saturating_add(added);
        totals.2 = totals.2.saturating_add(removed);
    }
    totals
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> WorkspaceError {
    WorkspaceError::Git {
        command: format!("{what} {}", path.display()),
        stderr: e.to_string(),
    }
}

/// Runs git in `dir`; its trimmed standard output, or its error. A command
/// that lost a lock to another git process runs again after a short wait.
async fn git<I, S>(dir: &Path, args: I) -> Result<String, WorkspaceError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let mut wait = LOCK_BACKOFF;
    for attempt in 0.. {
        let output = git_command(dir, &args)
            .output()
            .await
            .map_err(|e| WorkspaceError::Git {
                command: describe(&args),
                stderr: e.to_string(),
            })?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned());
        }
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        if attempt < LOCK_RETRIES && stderr.contains(".lock") {
            tokio::time::sleep(wait).await;
            wait *= 2;
            continue;
        }
        return Err(WorkspaceError::Git {
            command: describe(&args),
            stderr,
        });
    }
    unreachable!("the loop returns")
}

/// Whether git exits 0 (for the commands that answer with their status).
async fn git_succeeds<I, S>(dir: &Path, args: I) -> Result<bool, WorkspaceError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    // Its output is read (and dropped), not left to a closed pipe: a
    // command that prints would fail writing to it.
    let output = git_command(dir, &args)
        .output()
        .await
        .map_err(|e| WorkspaceError::Git {
            command: describe(&args),
            stderr: e.to_string(),
        })?;
    Ok(output.status.success())
}

fn git_command(dir: &Path, args: &[std::ffi::OsString]) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args(args)
        // Never a prompt, a pager or the user's global identity in
        // the way of a run.
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PAGER", "cat")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

fn describe(args: &[std::ffi::OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository with one commit of `files` files, in a temporary folder.
    fn repo(files: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .arg("-C")
                .arg(dir.path())
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "git {args:?}: {out:?}");
        };
        run(&["init", "--quiet", "--initial-branch=main"]);
        for n in 0..files {
            std::fs::write(dir.path().join(format!("f{n}.txt")), format!("line {n}\n")).unwrap();
        }
        std::fs::write(dir.path().join(".gitignore"), "*.log\n").unwrap();
        run(&["add", "--all"]);
        run(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "--quiet",
            "-m",
            "first",
        ]);
        dir
    }

    fn spec(repo: &Path, root: &Path, keep: Keep) -> Spec {
        Spec {
            repo: repo.to_path_buf(),
            base: "HEAD".into(),
            branch_prefix: "subagentd/".into(),
            keep,
            root: root.to_path_buf(),
            commit_author: "subagentd <subagentd@localhost>".into(),
            commit_message: "subagentd {id}: {description}".into(),
        }
    }

    async fn branches(repo: &Path) -> String {
        git(repo, ["branch", "--list", "--format=%(refname:short)"])
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_run_s_changes_are_committed_to_its_branch_and_the_worktree_removed() {
        let repo = repo(3);
        let root = tempfile::tempdir().unwrap();
        let spec = spec(repo.path(), root.path(), Keep::Changes);
        let ws = Workspaces::new();
        let wt = ws
            .create(&spec, "a1", 1, &Start::Ref("HEAD".into()))
            .await
            .unwrap();
        assert_eq!(wt.branch, "subagentd/a1");
        assert!(wt.path.join("f0.txt").exists());
        // Modified, deleted, untracked, and ignored (lost).
        std::fs::write(wt.path.join("f0.txt"), "changed\nand more\n").unwrap();
        std::fs::remove_file(wt.path.join("f1.txt")).unwrap();
        std::fs::write(wt.path.join("new.txt"), "new\n").unwrap();
        std::fs::write(wt.path.join("debug.log"), "ignored\n").unwrap();
        let saved = ws.save(&spec, &wt, "a1", "fix it").await.unwrap();
        assert!(saved.kept);
        assert_ne!(saved.head_commit, saved.base_commit);
        assert_eq!(
            (saved.files_changed, saved.insertions, saved.deletions),
            (3, 3, 2)
        );
        assert!(!wt.path.exists());
        assert!(branches(repo.path()).await.contains("subagentd/a1"));
        let message = git(
            repo.path(),
            ["log", "-1", "--format=%an|%s", "subagentd/a1"],
        )
        .await
        .unwrap();
        assert_eq!(message, "subagentd|subagentd a1: fix it");
        let listed = git(repo.path(), ["worktree", "list", "--porcelain"])
            .await
            .unwrap();
        assert!(
            !listed
                .lines()
                .any(|l| l.starts_with("worktree ") && l.ends_with("/a1")),
            "{listed}"
        );
    }

    #[tokio::test]
    async fn a_branch_without_changes_is_deleted_under_keep_changes() {
        let repo = repo(1);
        let root = tempfile::tempdir().unwrap();
        let ws = Workspaces::new();
        for (keep, kept) in [
            (Keep::Changes, false),
            (Keep::Always, true),
            (Keep::Never, false),
        ] {
            let spec = spec(repo.path(), root.path(), keep);
            let id = format!("{keep:?}");
            let wt = ws
                .create(&spec, &id, 1, &Start::Ref("main".into()))
                .await
                .unwrap();
            let saved = ws.save(&spec, &wt, &id, "").await.unwrap();
            assert_eq!(saved.kept, kept, "{keep:?}");
            assert_eq!(saved.files_changed, 0);
            assert_eq!(
                branches(repo.path())
                    .await
                    .contains(&format!("subagentd/{id}")),
                kept
            );
        }
    }

    #[tokio::test]
    async fn unknown_refs_and_options_are_refused_before_anything_is_created() {
        let repo = repo(1);
        let root = tempfile::tempdir().unwrap();
        let spec = spec(repo.path(), root.path(), Keep::Changes);
        let ws = Workspaces::new();
        for bad in ["no-such-branch", "--output=/tmp/x", "-b", ""] {
            let err = ws
                .create(&spec, "x", 1, &Start::Ref(bad.into()))
                .await
                .unwrap_err();
            assert_eq!(err, WorkspaceError::UnknownRef(bad.into()));
        }
        assert!(!root.path().join("x").exists());
        assert_eq!(branches(repo.path()).await, "main");
        assert!(ws.resolve(repo.path(), "main").await.is_ok());
    }

    #[tokio::test]
    async fn a_continuation_builds_on_the_branch_and_a_fork_starts_its_own() {
        let repo = repo(1);
        let root = tempfile::tempdir().unwrap();
        let spec = spec(repo.path(), root.path(), Keep::Changes);
        let ws = Workspaces::new();
        let first = ws
            .create(&spec, "t1", 1, &Start::Ref("HEAD".into()))
            .await
            .unwrap();
        std::fs::write(first.path.join("one.txt"), "1\n").unwrap();
        let one = ws.save(&spec, &first, "t1", "").await.unwrap();

        let start = Start::Branch {
            branch: one.branch.clone(),
            head: one.head_commit.clone(),
        };
        let second = ws.create(&spec, "t2", 1, &start).await.unwrap();
        assert_eq!(second.branch, "subagentd/t1");
        assert!(second.path.join("one.txt").exists());
        std::fs::write(second.path.join("two.txt"), "2\n").unwrap();
        let two = ws.save(&spec, &second, "t2", "").await.unwrap();
        assert_eq!(two.base_commit, one.head_commit);
        assert_eq!(two.files_changed, 1);

        let fork = ws
            .create(&spec, "f1", 1, &Start::Commit(one.head_commit.clone()))
            .await
            .unwrap();
        assert_eq!(fork.branch, "subagentd/f1");
        assert!(fork.path.join("one.txt").exists());
        assert!(!fork.path.join("two.txt").exists());
        ws.save(&spec, &fork, "f1", "").await.unwrap();
    }

    #[tokio::test]
    async fn twenty_worktrees_at_once_on_one_repository_all_start() {
        let repo = repo(20);
        let root = tempfile::tempdir().unwrap();
        let spec = spec(repo.path(), root.path(), Keep::Changes);
        let ws = Arc::new(Workspaces::new());
        let created = futures_util::future::join_all((0..20).map(|n| {
            let (ws, spec) = (ws.clone(), spec.clone());
            async move {
                let id = format!("p{n}");
                let wt = ws.create(&spec, &id, 1, &Start::Ref("HEAD".into())).await?;
                std::fs::write(wt.path.join(format!("f{n}.txt")), "mine\n").unwrap();
                ws.save(&spec, &wt, &id, "").await
            }
        }))
        .await;
        for saved in created {
            let saved = saved.unwrap();
            assert!(saved.kept);
            assert_eq!(saved.files_changed, 1);
        }
        assert!(ws.list(&spec).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_retried_run_goes_on_from_what_its_earlier_attempt_left() {
        let repo = repo(1);
        let root = tempfile::tempdir().unwrap();
        let spec = spec(repo.path(), root.path(), Keep::Changes);
        let ws = Workspaces::new();
        // The first attempt writes and is never saved (the server died).
        let first = ws
            .create(&spec, "r1", 1, &Start::Ref("HEAD".into()))
            .await
            .unwrap();
        std::fs::write(first.path.join("attempt1.txt"), "1\n").unwrap();
        let again = ws
            .create(&spec, "r1", 1, &Start::Ref("HEAD".into()))
            .await
            .unwrap();
        assert_eq!(again.branch, "subagentd/r1");
        assert!(again.path.join("attempt1.txt").exists());
        assert_ne!(
            again.base_commit, first.base_commit,
            "it starts after the rescued work"
        );
        let saved = ws.save(&spec, &again, "r1", "").await.unwrap();
        // From the second attempt's start: nothing more changed.
        assert_eq!(saved.files_changed, 0);
        assert!(ws.list(&spec).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_continuation_falls_back_to_the_head_then_to_base_and_never_deletes_its_branch() {
        let repo = repo(1);
        let root = tempfile::tempdir().unwrap();
        let spec = spec(repo.path(), root.path(), Keep::Changes);
        let ws = Workspaces::new();
        let first = ws
            .create(&spec, "c1", 1, &Start::Ref("HEAD".into()))
            .await
            .unwrap();
        std::fs::write(first.path.join("one.txt"), "1\n").unwrap();
        let one = ws.save(&spec, &first, "c1", "").await.unwrap();
        // A continuation that changes nothing keeps the conversation's branch.
        let on = Start::Branch {
            branch: one.branch.clone(),
            head: one.head_commit.clone(),
        };
        let second = ws.create(&spec, "c2", 1, &on).await.unwrap();
        assert!(!second.created_branch);
        let two = ws.save(&spec, &second, "c2", "").await.unwrap();
        assert!(two.kept);
        assert!(branches(repo.path()).await.contains("subagentd/c1"));
        // The branch deleted: a new branch at the head commit.
        git(repo.path(), ["branch", "-D", "subagentd/c1"])
            .await
            .unwrap();
        let third = ws.create(&spec, "c3", 1, &on).await.unwrap();
        assert_eq!(
            (third.branch.as_str(), third.base_commit.as_str()),
            ("subagentd/c3", one.head_commit.as_str())
        );
        assert!(third.path.join("one.txt").exists());
        ws.save(&spec, &third, "c3", "").await.unwrap();
        // A head the repository does not have: a new branch at base.
        let gone = Start::Commit("0123456789012345678901234567890123456789".into());
        let fourth = ws.create(&spec, "c4", 1, &gone).await.unwrap();
        assert!(!fourth.path.join("one.txt").exists());
        assert_eq!(
            fourth.base_commit,
            ws.resolve(repo.path(), "main").await.unwrap()
        );
        ws.save(&spec, &fourth, "c4", "").await.unwrap();
    }

    #[tokio::test]
    async fn list_finds_the_worktrees_left_under_the_root() {
        let repo = repo(1);
        let root = tempfile::tempdir().unwrap();
        let spec = spec(repo.path(), root.path(), Keep::Changes);
        let ws = Workspaces::new();
        let wt = ws
            .create(&spec, "left", 1, &Start::Ref("HEAD".into()))
            .await
            .unwrap();
        RunRecord::record_group(
            &wt.path,
            ProcessGroup {
                pgid: 4242,
                start_ticks: 7,
            },
        )
        .unwrap();
        let found = ws.list(&spec).await.unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].id, "left");
        assert_eq!(found[0].worktree, wt);
        // Its record: where it started, whose attempt, and the group of
        // this boot (a reboot's pgid could be anyone's).
        let record = found[0].record.clone().expect("a record");
        assert_eq!(
            (record.base_commit.as_str(), record.attempt),
            (wt.base_commit.as_str(), 1)
        );
        assert_eq!(
            record.group_this_boot(),
            Some(ProcessGroup {
                pgid: 4242,
                start_ticks: 7
            })
        );
        let mut other_boot = record;
        other_boot.group.as_mut().unwrap().boot_id = "another boot".into();
        assert_eq!(other_boot.group_this_boot(), None);
        // Saved: the record goes with the worktree.
        ws.save(&spec, &wt, "left", "").await.unwrap();
        assert_eq!(RunRecord::read(&wt.path), None);
        assert!(ws.list(&spec).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_folder_that_is_no_repository_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            check_repository(dir.path()).await,
            Err(WorkspaceError::NotARepository(dir.path().to_path_buf()))
        );
        let repo = repo(1);
        assert_eq!(check_repository(repo.path()).await, Ok(()));
    }

    #[test]
    fn authors_and_diff_stats_parse() {
        assert_eq!(
            author_parts("Ada <ada@example.com>"),
            ("Ada".into(), "ada@example.com".into())
        );
        assert_eq!(
            author_parts("bot"),
            ("bot".into(), "subagentd@localhost".into())
        );
        assert_eq!(diff_stats("1\t2\ta\n-\t-\tbin\n3\t0\tb\n"), (3, 4, 2));
        assert_eq!(diff_stats(""), (0, 0, 0));
    }
}
