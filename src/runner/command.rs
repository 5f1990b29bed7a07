//! The `command` runner: each run is a child process (an agent CLI).
//!
//! The program runs in its own process group, with the prompt on standard
//! input (or in place of `{prompt}` in its arguments) and the agent's place
//! in the tree in `SUBAGENTD_*` variables. Standard output is the result,
//! streamed line by line as output and capped; the tail of standard error
//! explains a failure. However the run ends — exit, cancel, deadline,
//! server shutdown — the whole group gets SIGTERM and, after the type's
//! `kill_grace`, SIGKILL, so no grandchild outlives its run.
//!
//! A type with `workspace = "worktree"` runs each program in its own git
//! worktree ([`super::workspace`]): created before the program starts, and
//! saved (committed, removed, the branch kept or not) once the program's
//! group is gone — before the run reports its end when it ends by itself,
//! and by a task of its own when the run is stopped (cancel, deadline),
//! which server shutdown waits for.

use std::{
    collections::{HashMap, VecDeque},
    io::{Read, Write},
    net::SocketAddr,
    os::fd::{AsRawFd, RawFd},
    path::PathBuf,
    process::Stdio,
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;

use futures_util::future::BoxFuture;
use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::workspace::{RunRecord, Saved, Spec, Start, WorkspaceError, Workspaces, Worktree};
use super::{Run, RunOutcome, Runner};
use crate::config::{AgentTypeConfig, PromptInput, SteerInput};
use crate::scheduler::{
    conversation::{EntryKind, History},
    durable::ProcessGroup,
    AgentError,
};

/// Bytes of standard error kept for the failure message.
pub const STDERR_TAIL_BYTES: usize = 64 * 1024;

/// Error code of a program that could not be started.
pub const CODE_SPAWN_FAILED: &str = "SPAWN_FAILED";
/// Error code of a run whose worktree could not be created.
pub const CODE_WORKSPACE_FAILED: &str = "WORKSPACE_FAILED";
/// Error code of a run whose Spawn's `workspace_base` names no commit of
/// the repository (checked by a worker, which the server cannot see into,
/// or a ref deleted while the agent was queued).
pub const CODE_WORKSPACE_BASE_UNKNOWN: &str = "WORKSPACE_BASE_UNKNOWN";
/// Error code of a run whose worktree grew past `max_workspace_bytes`.
pub const CODE_WORKSPACE_FULL: &str = "WORKSPACE_FULL";
/// How often a run's worktree is measured against `max_workspace_bytes`.
const WORKSPACE_SIZE_CHECK: Duration = Duration::from_secs(2);

/// The bytes of the files in a worktree, outside its `.git` (a file there
/// that points at the repository). Symbolic links count as themselves.
fn worktree_bytes(root: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if dir == root && entry.file_name() == ".git" {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                dirs.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct CommandRunner {
    /// `SUBAGENTD_ADDR` for the programs, so they can call the API.
    api_addr: Option<String>,
    /// Process groups not yet known to be gone, so shutdown can finish
    /// stopping them (the server must not exit inside a grace period).
    groups: Groups,
    /// The git commands of every run's worktree.
    workspaces: Arc<Workspaces>,
    /// Where worktrees go when a type sets no `root`.
    worktree_root: Option<PathBuf>,
    /// Worktrees of stopped runs still being saved; shutdown waits for them.
    saving: TaskTracker,
}

/// Live process groups: pgid → its grace, and when it gets SIGKILL once
/// stopping began.
type Groups = Arc<Mutex<HashMap<i32, GroupState>>>;

#[derive(Debug, Clone, Copy)]
struct GroupState {
    grace: Duration,
    kill_at: Option<tokio::time::Instant>,
}

impl CommandRunner {
    /// A runner whose programs reach the API at `api_url`
    /// (`SUBAGENTD_ADDR`; unset when `None`).
    pub fn new(api_url: Option<String>) -> Self {
        Self {
            api_addr: api_url,
            groups: Groups::default(),
            workspaces: Arc::new(Workspaces::new()),
            worktree_root: None,
            saving: TaskTracker::new(),
        }
    }

    /// Worktrees of types that set no `root` go to `root` (the server's
    /// data directory's `worktrees`).
    pub fn with_worktree_root(mut self, root: Option<PathBuf>) -> Self {
        self.worktree_root = root;
        self
    }

    /// The URL programs of a server bound to `addr` reach it at (an
    /// unspecified IP becomes loopback).
    pub fn local_api_url(mut addr: SocketAddr) -> String {
        if addr.ip().is_unspecified() {
            addr.set_ip(if addr.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        format!("http://{addr}")
    }

    /// At server shutdown, after every run was cancelled: waits until each
    /// program's process group is gone, sending SIGKILL to those still
    /// there when their `kill_grace` runs out.
    async fn stop_all_groups(groups: Groups) {
        loop {
            let now = tokio::time::Instant::now();
            let pending = {
                let mut live = groups.lock();
                live.retain(|&pgid, state| {
                    if group_gone(pgid) {
                        return false;
                    }
                    let kill_at = *state.kill_at.get_or_insert_with(|| {
                        signal_group(pgid, Signal::SIGTERM);
                        now + state.grace
                    });
                    if now >= kill_at {
                        signal_group(pgid, Signal::SIGKILL);
                        return false;
                    }
                    true
                });
                !live.is_empty()
            };
            if !pending {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Runner for CommandRunner {
    fn run(&self, run: Run) -> BoxFuture<'static, RunOutcome> {
        // A worktree type with nowhere to put worktrees (a `subagentd
        // worker`, which has no data directory, without `root`) must not
        // run in the shared checkout instead.
        if run.agent_type.workspace == crate::config::WorkspaceKind::Worktree
            && run.agent_type.root.is_none()
            && self.worktree_root.is_none()
        {
            return Box::pin(async {
                Err(AgentError::new(
                    CODE_WORKSPACE_FAILED,
                    "workspace = \"worktree\" needs `root` here (a worker has no data directory)",
                ))
            });
        }
        let workspace =
            Spec::of(&run.agent_type, self.worktree_root.as_deref()).map(|spec| WorkspaceCtx {
                workspaces: self.workspaces.clone(),
                spec,
                saving: self.saving.clone(),
            });
        Box::pin(run_command(
            self.api_addr.clone(),
            self.groups.clone(),
            workspace,
            run,
        ))
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let (groups, saving) = (self.groups.clone(), self.saving.clone());
        Box::pin(async move {
            Self::stop_all_groups(groups).await;
            saving.close();
            saving.wait().await;
        })
    }
}

async fn run_command(
    api_addr: Option<String>,
    groups: Groups,
    workspace: Option<WorkspaceCtx>,
    mut run: Run,
) -> RunOutcome {
    let cfg = run.agent_type.clone();
    let continuing = Continuing::of(&cfg, &run);
    // Removed however the run ends: read once the program exited.
    let session_file = SessionFile::new(&run);
    // Saved however the run ends (dropped on cancel or deadline: by a task
    // of its own) once the program's group is gone.
    let mut workspace = match workspace {
        Some(ctx) => Some(RunWorkspace::create(ctx, &run).await?),
        None => None,
    };
    // However this future ends from here on (finished, or dropped on cancel
    // or deadline), the group is stopped.
    let (mut child, mut group) = start(
        &cfg,
        api_addr.as_deref(),
        &run,
        &continuing,
        &session_file,
        workspace.as_ref().map(|w| &w.worktree),
        groups,
    )
    .await?;
    if let Some(workspace) = &mut workspace {
        workspace.pgid = group.pgid;
    }

    // Standard input: a writer task, so a program that does not read its
    // input never stalls the reading of its output.
    let stdin_tx = child.stdin.take().map(|stdin| {
        let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(write_stdin(stdin, rx));
        tx
    });
    let mut steer_tx = None;
    if let Some(tx) = stdin_tx {
        if let Continuing::Transcript(history) = &continuing {
            let _ = tx.send(transcript_text(history).into_bytes());
        }
        if cfg.prompt_input() == PromptInput::Stdin {
            if matches!(continuing, Continuing::Transcript(_)) {
                let _ = tx.send(NEW_PROMPT_MARKER.as_bytes().to_vec());
            }
            let mut prompt = run.prompt.as_bytes().to_vec();
            if cfg.steer == Some(SteerInput::Stdin) && !prompt.ends_with(b"\n") {
                // Steer lines follow the prompt: end it with a newline.
                prompt.push(b'\n');
            }
            let _ = tx.send(prompt);
        }
        if cfg.steer == Some(SteerInput::Stdin) {
            steer_tx = Some(tx);
        }
        // Otherwise `tx` drops here and the program sees end of input.
    }

    let stderr = child
        .stderr
        .take()
        .map(|e| tokio::spawn(stderr_tail(e, STDERR_TAIL_BYTES)));
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut output = CappedOutput::new(cfg.max_result_bytes());
    let mut line = Vec::new();
    let mut stdout_open = true;
    let mut exit = None;
    // Output past the cap is not reported, but it is still activity: say so
    // at most once a second so the run is not taken for stale.
    let mut last_alive = tokio::time::Instant::now();
    // `max_workspace_bytes`: the worktree's size, checked every few seconds.
    let size_limit = workspace.as_ref().and(cfg.max_workspace_bytes);
    let mut size_checks = tokio::time::interval(WORKSPACE_SIZE_CHECK);
    let mut full = None;
    while stdout_open || exit.is_none() {
        tokio::select! {
            // Not cancel-safe on its own: when another branch wins, the bytes
            // read so far stay in `line` and the next read continues them.
            read = stdout.read_until(b'\n', &mut line), if stdout_open => match read {
                Ok(0) | Err(_) => {
                    stdout_open = false;
                    // A last line without a newline.
                    if !line.is_empty() {
                        if let Some(chunk) = output.push(&String::from_utf8_lossy(&line)) {
                            run.reporter.output(&chunk);
                        }
                        line.clear();
                    }
                }
                Ok(_) => {
                    match output.push(&String::from_utf8_lossy(&line)) {
                        Some(chunk) => run.reporter.output(&chunk),
                        None if last_alive.elapsed() >= Duration::from_secs(1) => {
                            run.reporter.still_working();
                            last_alive = tokio::time::Instant::now();
                        }
                        None => {}
                    }
                    line.clear();
                }
            },
            message = run.steer.recv(), if steer_tx.is_some() => match message {
                Some(message) => {
                    let mut bytes = message.into_bytes();
                    bytes.push(b'\n');
                    if let Some(tx) = &steer_tx {
                        let _ = tx.send(bytes);
                    }
                }
                None => steer_tx = None,
            },
            status = child.wait(), if exit.is_none() => {
                exit = Some(status);
                // The program is done; anything it left running in its
                // group is stopped, which also lets its output end.
                group.stop();
            },
            _ = size_checks.tick(), if size_limit.is_some() => {
                let (Some(limit), Some(ws)) = (size_limit, &workspace) else { continue };
                let path = ws.worktree.path.clone();
                let size = tokio::task::spawn_blocking(move || worktree_bytes(&path))
                    .await
                    .unwrap_or(0);
                if size > limit {
                    full = Some((size, limit));
                    group.stop();
                    break;
                }
            },
        }
    }
    drop(steer_tx);
    if let Some((size, limit)) = full {
        // Reaped, so the group can be seen gone; then saved like any other
        // ending.
        let _ = child.wait().await;
        if let Some(workspace) = workspace.take() {
            workspace.save().await;
        }
        return Err(AgentError::new(
            CODE_WORKSPACE_FULL,
            format!("the worktree grew to {size} bytes, past max_workspace_bytes = {limit}"),
        ));
    }
    if let Some(session) = session_file.read() {
        run.reporter.session(&session);
    }
    let stderr = match stderr {
        Some(task) => task.await.unwrap_or_default(),
        None => String::new(),
    };
    // The run's work is committed before the run reports its end.
    if let Some(workspace) = workspace.take() {
        workspace.save().await;
    }
    let status = match exit.expect("the loop ends after the exit") {
        Ok(status) => status,
        Err(e) => {
            return Err(AgentError::new(
                "RUN_FAILED",
                format!("waiting for the program failed: {e}"),
            ))
        }
    };
    outcome(status, output.into_result(), stderr)
}

/// What a run of a workspace type needs to create and save its worktree.
struct WorkspaceCtx {
    workspaces: Arc<Workspaces>,
    spec: Spec,
    saving: TaskTracker,
}

/// A run's worktree. [`RunWorkspace::save`] saves it at the run's own end;
/// dropped unsaved (the run was stopped), it is saved by a task of its own
/// once the run's process group is gone.
struct RunWorkspace {
    ctx: WorkspaceCtx,
    /// Reports the saved workspace, also after the run was dropped.
    reporter: super::RunReporter,
    worktree: Worktree,
    id: String,
    description: String,
    /// The program's process group, once started.
    pgid: Option<i32>,
    saved: bool,
}

impl RunWorkspace {
    async fn create(ctx: WorkspaceCtx, run: &Run) -> Result<Self, AgentError> {
        let id = run.agent.id.to_string();
        // A conversation builds one branch: a continuation goes on on the
        // continued agent's branch, a fork starts its own at that agent's
        // head (both fall back to the head commit, then to `base`, when the
        // branch or commit is gone).
        let fork = run
            .agent
            .continuation
            .as_ref()
            .is_some_and(|c| c.conversation_id == run.agent.id);
        let start = match (&run.continues_workspace, &run.workspace_base) {
            // A branch of this type's own (a worker reported it: never
            // another, such as the repository's `main`).
            (Some(w), _) if w.kept && !fork && w.branch.starts_with(&ctx.spec.branch_prefix) => {
                Start::Branch {
                    branch: w.branch.clone(),
                    head: w.head_commit.clone(),
                }
            }
            (Some(w), _) => Start::Commit(w.head_commit.clone()),
            (None, Some(base)) => Start::Ref(base.to_string()),
            (None, None) => Start::Ref(ctx.spec.base.clone()),
        };
        let worktree = ctx
            .workspaces
            .create(&ctx.spec, &id, run.agent.attempt, &start)
            .await
            .map_err(|e| match (e, &run.workspace_base) {
                (WorkspaceError::UnknownRef(_), Some(base)) => AgentError::new(
                    CODE_WORKSPACE_BASE_UNKNOWN,
                    format!(
                        "workspace_base {base:?} names no commit in {}",
                        ctx.spec.repo.display()
                    ),
                ),
                (e, _) => AgentError::new(
                    CODE_WORKSPACE_FAILED,
                    format!("creating the run's worktree failed: {e}"),
                ),
            })?;
        Ok(Self {
            ctx,
            reporter: run.reporter.clone(),
            worktree,
            id,
            description: run.agent.description.to_string(),
            pgid: None,
            saved: false,
        })
    }

    /// Saves the worktree at the run's own end, before the run reports it.
    /// The save is a task of its own: a run stopped meanwhile (its future
    /// dropped) does not cut a commit short.
    async fn save(mut self) {
        if let Some(saving) = self.start_saving() {
            let _ = saving.await;
        }
    }

    /// Starts saving the worktree (once) in a tracked task, which shutdown
    /// waits for. None without a runtime: the process is exiting, and a
    /// restart's recovery saves what is left.
    fn start_saving(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        if std::mem::replace(&mut self.saved, true) {
            return None;
        }
        tokio::runtime::Handle::try_current().ok()?;
        let saving = save_when_gone(
            self.ctx.workspaces.clone(),
            self.ctx.spec.clone(),
            self.worktree.clone(),
            std::mem::take(&mut self.id),
            std::mem::take(&mut self.description),
            self.pgid,
            self.reporter.clone(),
        );
        Some(self.ctx.saving.spawn(saving))
    }
}

impl Drop for RunWorkspace {
    fn drop(&mut self) {
        self.start_saving();
    }
}

/// Saves a run's worktree once its process group is gone (its stop —
/// SIGTERM, SIGKILL after the grace — is under way), so no program still
/// writes to it.
async fn save_when_gone(
    workspaces: Arc<Workspaces>,
    spec: Spec,
    worktree: Worktree,
    id: String,
    description: String,
    pgid: Option<i32>,
    reporter: super::RunReporter,
) {
    // A zombie still counts for `killpg`: gone means no live member.
    if let Some(pgid) = pgid {
        while group_has_live_member(pgid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    match workspaces.save(&spec, &worktree, &id, &description).await {
        Ok(saved) => {
            info!(
                agent_id = %id,
                branch = %saved.branch,
                kept = saved.kept,
                head = %saved.head_commit,
                files_changed = saved.files_changed,
                insertions = saved.insertions,
                deletions = saved.deletions,
                "workspace saved"
            );
            reporter.workspace(saved.into()).await;
        }
        Err(e) => {
            warn!(agent_id = %id, worktree = %worktree.path.display(), error = %e, "saving the workspace failed");
        }
    }
}

/// The environment variables of the server's `[store]` settings.
const STORE_ENV_PREFIX: &[u8] = b"SUBAGENTD_STORE__";

/// Starts the program so that it runs only once its process group is
/// recorded with the run and durable: a restart after a crash of the
/// server then knows every program that may have outlived it. Returns the
/// child and the guard that stops its group (armed before the program can
/// run, so a cancel at any point stops it).
///
/// The child, between fork and exec, writes its pid to one pipe and waits
/// for a byte on another. The server records the group (its pid and start
/// time, which exec keeps), waits until that is durable, then sends the
/// byte and the child execs the program. A child whose server went away
/// (it was re-parented) gives up without running anything, as does one
/// whose gate pipe closes; one the server gives up on gets the group's
/// SIGTERM (its handlers are reset first). The spawn call returns only
/// after exec, so it runs on a blocking thread meanwhile.
#[allow(unsafe_code)]
async fn start(
    cfg: &AgentTypeConfig,
    api_addr: Option<&str>,
    run: &Run,
    continuing: &Continuing,
    session_file: &SessionFile,
    worktree: Option<&Worktree>,
    groups: Groups,
) -> Result<(Child, GroupGuard), AgentError> {
    let mut cmd = command(cfg, api_addr, run, continuing, session_file, worktree);
    let (mut pid_rx, pid_tx) = std::io::pipe().map_err(|e| spawn_failed(cfg, &e))?;
    let (gate_rx, mut gate_tx) = std::io::pipe().map_err(|e| spawn_failed(cfg, &e))?;
    let child_ends = (pid_tx.as_raw_fd(), gate_rx.as_raw_fd());
    let parent_ends = (pid_rx.as_raw_fd(), gate_tx.as_raw_fd());
    let server = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: the hook runs in the child between fork and exec and only
    // makes async-signal-safe calls (signal, close, getpid, getppid, write,
    // poll, read) on descriptors the parent keeps open until `spawn`
    // returns; it does not allocate. Both pipes are close-on-exec, so the
    // program gets neither.
    unsafe {
        cmd.pre_exec(move || exec_gate(child_ends, parent_ends, server));
    }
    let spawning = tokio::task::spawn_blocking(move || {
        let child = cmd.spawn();
        drop((pid_tx, gate_rx));
        child
    });
    // Ends with an error, not a pid, when the spawn fails before the
    // child's hook runs (the parent's write end closes with it). The guard
    // is armed on the blocking thread, as soon as the pid is known: if this
    // future is dropped first, the guard drops with the task's unread
    // output, and its SIGTERM ends the waiting child.
    let grace = cfg.kill_grace();
    let armed = tokio::task::spawn_blocking({
        let groups = groups.clone();
        move || {
            let mut pid = [0; 4];
            pid_rx.read_exact(&mut pid).map(|()| {
                let pgid = i32::from_ne_bytes(pid);
                (pgid, GroupGuard::new(Some(pgid), grace, groups))
            })
        }
    })
    .await;
    let mut guard = None;
    if let Ok(Ok((pgid, armed))) = armed {
        // The child leads its own group (set before the hook runs). From
        // here on, however this future ends, the group is stopped.
        guard = Some(armed);
        // Its start time cannot be unreadable while it waits for us; if it
        // were, it would run unrecorded (as every program did before).
        let recorded = match start_ticks(pgid) {
            Some(start_ticks) => {
                let group = ProcessGroup { pgid, start_ticks };
                // Beside its worktree too, for whoever finds the worktree
                // after a crash (a worker records nowhere else).
                if let Some(worktree) = worktree {
                    if let Err(e) = RunRecord::record_group(&worktree.path, group) {
                        return Err(AgentError::new(
                            CODE_WORKSPACE_FAILED,
                            format!(
                                "not started: recording the program's process group failed: {e}"
                            ),
                        ));
                    }
                }
                run.reporter.process_group(group).await.is_ok()
            }
            None => true,
        };
        if !recorded {
            // The store failed (the server is stopping): the program never
            // runs; the guard's SIGTERM ends the waiting child.
            return Err(AgentError::new(
                CODE_SPAWN_FAILED,
                "not started: the store failed before the program's process group was recorded",
            ));
        }
        // A child that is gone already (killed) cannot read it: no matter.
        let _ = gate_tx.write_all(&[1]);
    }
    drop(gate_tx);
    match spawning.await {
        Ok(Ok(child)) => {
            let guard = guard.unwrap_or_else(|| {
                let pgid = child.id().and_then(|id| i32::try_from(id).ok());
                GroupGuard::new(pgid, grace, groups)
            });
            Ok((child, guard))
        }
        Ok(Err(e)) => {
            // The exec failed and `spawn` reaped the child: its pid may be
            // another process's by now, so nothing is signalled.
            if let Some(guard) = guard.as_mut() {
                guard.disarm();
            }
            Err(spawn_failed(cfg, &e))
        }
        Err(e) => Err(AgentError::new(
            CODE_SPAWN_FAILED,
            format!("starting the program failed: {e}"),
        )),
    }
}

/// The child's side of [`start`]'s handshake, between fork and exec.
/// The first pair are its ends of the pipes (pid writer, gate reader), the
/// second the parent's ends it inherited, `server` the parent's pid.
#[allow(unsafe_code)]
fn exec_gate(
    (pid_fd, gate_fd): (RawFd, RawFd),
    (pid_rx_fd, gate_tx_fd): (RawFd, RawFd),
    server: libc::pid_t,
) -> std::io::Result<()> {
    // No allocation here, so error codes rather than messages.
    let cancelled = || Err(std::io::Error::from_raw_os_error(libc::ECANCELED));
    let interrupted = || std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
    // SAFETY: async-signal-safe calls on descriptors valid in the child
    // (see `start`), into buffers on this stack.
    unsafe {
        // The server's handlers (which only exec would reset) must not
        // swallow the SIGTERM that stops a child the server gave up on.
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        // Without the parent's end of the gate open here, a parent that
        // closes its own reads as end of file.
        libc::close(gate_tx_fd);
        libc::close(pid_rx_fd);
        let pid = libc::getpid().to_ne_bytes();
        if libc::write(pid_fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
        let mut byte = 0u8;
        loop {
            let mut ready = libc::pollfd {
                fd: gate_fd,
                events: libc::POLLIN,
                revents: 0,
            };
            match libc::poll(&mut ready, 1, 100) {
                -1 if interrupted() => {}
                -1 => return Err(std::io::Error::last_os_error()),
                // Siblings forked meanwhile may hold the gate's write end
                // too, so a dead server is not always end of file: a child
                // re-parented away from it gives up.
                0 if libc::getppid() != server => return cancelled(),
                0 => {}
                _ => match libc::read(gate_fd, (&raw mut byte).cast(), 1) {
                    1 => return Ok(()),
                    -1 if interrupted() => {}
                    _ => return cancelled(),
                },
            }
        }
    }
}

fn spawn_failed(cfg: &AgentTypeConfig, e: &std::io::Error) -> AgentError {
    let place = match &cfg.cwd {
        Some(cwd) if !cwd.is_dir() => format!(" (cwd {cwd:?} is not a directory)"),
        _ => String::new(),
    };
    AgentError::new(
        CODE_SPAWN_FAILED,
        format!("cannot start {:?}: {e}{place}", cfg.command[0]),
    )
}

/// The program's command line, environment and standard streams.
fn command(
    cfg: &AgentTypeConfig,
    api_addr: Option<&str>,
    run: &Run,
    continuing: &Continuing,
    session_file: &SessionFile,
    worktree: Option<&Worktree>,
) -> Command {
    let program = &cfg.command[0];
    let mut cmd = Command::new(program);
    for arg in &cfg.command[1..] {
        if cfg.prompt_input() == PromptInput::Arg {
            cmd.arg(arg.replace("{prompt}", &run.prompt));
        } else {
            cmd.arg(arg);
        }
    }
    if let Continuing::Resume(session) = continuing {
        for arg in cfg.continue_args.iter().flatten() {
            cmd.arg(arg.replace("{session}", session));
        }
    }
    match worktree {
        // `cwd` is relative to the worktree.
        Some(worktree) => {
            cmd.current_dir(
                worktree
                    .path
                    .join(cfg.cwd.as_deref().unwrap_or("".as_ref())),
            )
            .env("SUBAGENTD_WORKSPACE", &worktree.path)
            .env("SUBAGENTD_BRANCH", &worktree.branch);
        }
        None => {
            if let Some(cwd) = &cfg.cwd {
                cmd.current_dir(cwd);
            }
        }
    }
    // The server's own store settings stay with the server: a PostgreSQL
    // URL given as SUBAGENTD_STORE__URL may carry the database password.
    // The rest of the environment is inherited, as documented (a type's
    // `env` may still set any of these on purpose).
    // Any case: the config layer reads its variables case-insensitively.
    for (name, _) in std::env::vars_os() {
        let name_bytes = name.as_encoded_bytes();
        if name_bytes.len() >= STORE_ENV_PREFIX.len()
            && name_bytes[..STORE_ENV_PREFIX.len()].eq_ignore_ascii_case(STORE_ENV_PREFIX)
        {
            cmd.env_remove(name);
        }
    }
    let agent = &run.agent;
    cmd.envs(&cfg.env)
        .env("SUBAGENTD_AGENT_ID", agent.id.to_string())
        .env(
            "SUBAGENTD_PARENT_ID",
            agent.parent_id.map(|p| p.to_string()).unwrap_or_default(),
        )
        .env("SUBAGENTD_ROOT_ID", agent.root_id.to_string())
        .env("SUBAGENTD_DEPTH", agent.depth.to_string())
        .env("SUBAGENTD_AGENT", &*agent.agent)
        .env("SUBAGENTD_MODEL", &*agent.model);
    match api_addr {
        Some(addr) => cmd.env("SUBAGENTD_ADDR", addr),
        None => cmd.env_remove("SUBAGENTD_ADDR"),
    };
    match run.traceparent() {
        Some(traceparent) => cmd.env("TRACEPARENT", traceparent),
        None => cmd.env_remove("TRACEPARENT"),
    };
    // The run's own credential; without one the inherited environment
    // (and the type's `env`) stand.
    if let Some(token) = &run.credential {
        cmd.env("SUBAGENTD_TOKEN", &**token);
    }
    cmd.env("SUBAGENTD_SESSION_FILE", &session_file.path);
    let needs_stdin = cfg.prompt_input() == PromptInput::Stdin
        || cfg.steer == Some(SteerInput::Stdin)
        || matches!(continuing, Continuing::Transcript(_));
    cmd.stdin(if needs_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    // Its own process group, so a cancel reaches everything it started.
    .process_group(0)
    .kill_on_drop(false);
    cmd
}

/// How a continued run takes its conversation so far.
enum Continuing {
    /// The first turn of a conversation: nothing to take.
    No,
    /// The type's `continue_args`, with the session id the previous turn's
    /// run wrote.
    Resume(Arc<str>),
    /// The transcript on standard input, before the prompt.
    Transcript(Arc<History>),
}

impl Continuing {
    fn of(cfg: &AgentTypeConfig, run: &Run) -> Self {
        let Some(history) = &run.history else {
            return Self::No;
        };
        match (&cfg.continue_args, &history.session) {
            (Some(_), Some(session)) => Self::Resume(session.clone()),
            _ => Self::Transcript(history.clone()),
        }
    }
}

/// Separates the transcript from the new prompt on standard input.
const NEW_PROMPT_MARKER: &str = "--- new prompt ---\n";

/// A continuation's transcript as a program reads it on standard input
/// (docs/runners.md, "Continuations by runner"): a header, then per entry
/// a `--- turn N <kind> ---` line and its text; [`NEW_PROMPT_MARKER`] and
/// the prompt follow.
fn transcript_text(history: &History) -> String {
    let mut out = String::from("This conversation so far (subagentd transcript, oldest first):\n");
    if history.elided.any() {
        out.push_str(&format!(
            "--- {} earlier entries ({} bytes) elided ---\n",
            history.elided.entries, history.elided.bytes
        ));
    }
    for (_, turn, entry) in &history.entries {
        let kind = match &entry.kind {
            EntryKind::Prompt => "prompt".to_owned(),
            EntryKind::Steer => "steer".to_owned(),
            EntryKind::ToolCall => "tool call".to_owned(),
            EntryKind::Result { error: None, .. } => "result".to_owned(),
            EntryKind::Result {
                status,
                error: Some(e),
                ..
            } => format!(
                "result, {}: {}: {}",
                format!("{status:?}").to_lowercase(),
                e.code,
                e.message
            ),
        };
        out.push_str(&format!("--- turn {turn} {kind} ---\n"));
        out.push_str(&entry.text);
        if !entry.text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// `SUBAGENTD_SESSION_FILE`: where the program may write its own session
/// id, read once it exits; removed when the run ends.
struct SessionFile {
    path: std::path::PathBuf,
}

impl SessionFile {
    fn new(run: &Run) -> Self {
        let name = format!(
            "subagentd-session-{}-{}",
            run.agent.id,
            uuid::Uuid::new_v4().simple()
        );
        Self {
            path: std::env::temp_dir().join(name),
        }
    }

    /// The session id the program wrote, surrounding whitespace trimmed;
    /// None when it wrote none.
    fn read(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let session = text.trim();
        (!session.is_empty()).then(|| session.to_owned())
    }
}

impl Drop for SessionFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Exit 0 → the result; otherwise FAILED `EXIT_<n>` or `SIGNAL_<n>`, with
/// the end of standard error as the message.
fn outcome(status: std::process::ExitStatus, result: String, stderr: String) -> RunOutcome {
    use std::os::unix::process::ExitStatusExt;
    if status.success() {
        return Ok(result);
    }
    let explain = |what: String| {
        let stderr = stderr.trim_end();
        if stderr.is_empty() {
            what
        } else {
            stderr.to_owned()
        }
    };
    match (status.code(), status.signal()) {
        (Some(code), _) => Err(AgentError::new(
            &format!("EXIT_{code}"),
            explain(format!("the program exited with status {code}")),
        )),
        (None, Some(signal)) => Err(AgentError::new(
            &format!("SIGNAL_{signal}"),
            explain(format!("the program was killed by signal {signal}")),
        )),
        (None, None) => Err(AgentError::new("RUN_FAILED", explain(format!("{status}")))),
    }
}

async fn write_stdin(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    while let Some(bytes) = rx.recv().await {
        if let Err(e) = stdin.write_all(&bytes).await {
            // The program closed its input: later steer messages are lost,
            // which is all a closed pipe can mean.
            debug!(error = %e, "command stdin closed");
            return;
        }
        let _ = stdin.flush().await;
    }
}

/// The last `keep` bytes of a stream, as text.
async fn stderr_tail(mut stderr: tokio::process::ChildStderr, keep: usize) -> String {
    let mut tail: VecDeque<u8> = VecDeque::with_capacity(keep.min(8192));
    let mut buf = vec![0u8; 8192];
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend(&buf[..n]);
                let excess = tail.len().saturating_sub(keep);
                tail.drain(..excess);
            }
        }
    }
    String::from_utf8_lossy(tail.make_contiguous()).into_owned()
}

/// Standard output up to a cap; past it, one marker and nothing more.
struct CappedOutput {
    text: String,
    cap: usize,
    truncated: bool,
}

impl CappedOutput {
    fn new(cap: usize) -> Self {
        Self {
            text: String::new(),
            cap,
            truncated: false,
        }
    }

    /// Adds a line; returns what to report as output (None once past the
    /// cap).
    fn push(&mut self, line: &str) -> Option<String> {
        if self.truncated {
            return None;
        }
        let room = self.cap - self.text.len();
        if line.len() <= room {
            self.text.push_str(line);
            return Some(line.to_owned());
        }
        let mut cut = room;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        let marker = format!(
            "\n[output truncated: more than {} bytes; see [agents.NAME] max_result_bytes]\n",
            self.cap
        );
        let chunk = format!("{}{marker}", &line[..cut]);
        self.text.push_str(&chunk);
        self.truncated = true;
        Some(chunk)
    }

    fn into_result(self) -> String {
        self.text
    }
}

/// Stops a run's process group: SIGTERM, then SIGKILL after the grace, in
/// a task of its own so neither a finishing run nor a dropped one waits.
struct GroupGuard {
    pgid: Option<i32>,
    grace: Duration,
    groups: Groups,
}

impl GroupGuard {
    fn new(pgid: Option<i32>, grace: Duration, groups: Groups) -> Self {
        if let Some(pgid) = pgid {
            groups.lock().insert(
                pgid,
                GroupState {
                    grace,
                    kill_at: None,
                },
            );
        }
        Self {
            pgid,
            grace,
            groups,
        }
    }

    /// Forgets the group without signalling it (it is gone, reaped).
    fn disarm(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            self.groups.lock().remove(&pgid);
        }
    }

    fn stop(&mut self) {
        let Some(pgid) = self.pgid.take() else {
            return;
        };
        signal_group(pgid, Signal::SIGTERM);
        let grace = self.grace;
        if let Some(state) = self.groups.lock().get_mut(&pgid) {
            state.kill_at = Some(tokio::time::Instant::now() + grace);
        }
        let groups = self.groups.clone();
        let kill_later = async move {
            tokio::time::sleep(grace).await;
            signal_group(pgid, Signal::SIGKILL);
            groups.lock().remove(&pgid);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(kill_later);
            }
            // No runtime (process exit): no grace either.
            Err(_) => signal_group(pgid, Signal::SIGKILL),
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The start time of process `pid` (`/proc/PID/stat` field 22, in clock
/// ticks since boot); None if it is gone.
fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (the command) is in parentheses and may hold anything: the
    // fields after it start after the last ')'; starttime is the 20th.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Worktrees a crash left under `spec.root` (of the server, or of a worker
/// host): each one whose agent `settled` says will not run again (it
/// returns the agent's description for the commit message) is saved — a
/// program still running in it is stopped first (SIGTERM, SIGKILL after
/// `grace`), then its changes are committed to its branch and the worktree
/// is removed and pruned. Returns the saved ones, with the attempt their
/// record names (None without a record).
pub async fn sweep_worktrees(
    workspaces: &Workspaces,
    spec: &Spec,
    grace: Duration,
    settled: impl Fn(&str) -> Option<String>,
) -> Result<Vec<SweptWorktree>, WorkspaceError> {
    let mut swept = Vec::new();
    for left in workspaces.list(spec).await? {
        let Some(description) = settled(&left.id) else {
            continue;
        };
        let id = left.id;
        if let Some(group) = left.record.as_ref().and_then(|r| r.group_this_boot()) {
            if stop_orphaned_group(group, grace).await {
                info!(agent_id = %id, pgid = group.pgid, "stopped a program that outlived its run");
            }
        }
        match workspaces
            .save(spec, &left.worktree, &id, &description)
            .await
        {
            Ok(saved) => {
                info!(agent_id = %id, branch = %saved.branch, kept = saved.kept, "saved a worktree a crash left");
                swept.push(SweptWorktree {
                    attempt: left.record.map(|r| r.attempt),
                    id,
                    saved,
                });
            }
            Err(e) => {
                warn!(agent_id = %id, worktree = %left.worktree.path.display(), error = %e, "saving a worktree a crash left failed");
            }
        }
    }
    Ok(swept)
}

/// A worktree [`sweep_worktrees`] saved.
#[derive(Debug)]
pub struct SweptWorktree {
    /// The agent id.
    pub id: String,
    /// The attempt its record names; None without a record.
    pub attempt: Option<u32>,
    pub saved: Saved,
}

/// At recovery: stops a command run's process group that outlived a crash
/// of the server — SIGTERM, then SIGKILL once `grace` passes — unless it is
/// gone or its pid now belongs to another process. Returns whether it was
/// still there.
pub async fn stop_orphaned_group(group: ProcessGroup, grace: Duration) -> bool {
    if group_gone(group.pgid) {
        return false;
    }
    // The leader still runs: it must be the same process (a pid can be
    // reused once its group is gone). A leader that exited leaves its pid
    // reserved while the group lives, so a group without a leader is ours.
    if let Some(ticks) = start_ticks(group.pgid) {
        if ticks != group.start_ticks {
            return false;
        }
    }
    signal_group(group.pgid, Signal::SIGTERM);
    let kill_at = tokio::time::Instant::now() + grace;
    while !group_gone(group.pgid) {
        if tokio::time::Instant::now() >= kill_at {
            signal_group(group.pgid, Signal::SIGKILL);
            // SIGKILL takes effect when a process next runs, which on a
            // busy machine is not at once: the run's fate is decided only
            // once every process of the group is dead (gone, or a zombie
            // its new parent has not reaped yet), within a bound for one
            // the kernel cannot kill (uninterruptible I/O).
            let bound = tokio::time::Instant::now() + Duration::from_secs(5);
            while group_has_live_member(group.pgid) && tokio::time::Instant::now() < bound {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            break;
        }
        // Polling a process we cannot wait for (it is not our child).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Whether any process of group `pgid` is alive (not a zombie): a scan of
/// `/proc`, for the rare stop of a group that is not our child.
fn group_has_live_member(pgid: i32) -> bool {
    if group_gone(pgid) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // After the command's ')': state, ppid, pgrp, …
        let Some(at) = stat.rfind(')') else {
            return false;
        };
        let mut fields = stat[at + 1..].split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
        pgrp == Some(pgid) && state != Some("Z")
    })
}

/// Whether no process of the group is left.
fn group_gone(pgid: i32) -> bool {
    killpg(Pid::from_raw(pgid), None) == Err(nix::errno::Errno::ESRCH)
}

fn signal_group(pgid: i32, signal: Signal) {
    match killpg(Pid::from_raw(pgid), signal) {
        // Everyone in the group already exited.
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => warn!(pgid, %signal, error = %e, "cannot signal a command's process group"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_of_a_process_is_read_from_proc() {
        let me = i32::try_from(std::process::id()).unwrap();
        let ticks = start_ticks(me).expect("this process has a start time");
        assert_eq!(start_ticks(me), Some(ticks), "stable");
        assert_eq!(start_ticks(i32::MAX), None);
    }

    #[test]
    fn a_group_is_live_while_a_member_runs_and_not_once_all_are_dead() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = i32::try_from(child.id()).unwrap();
        assert!(group_has_live_member(pgid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!group_has_live_member(pgid));
    }

    #[test]
    fn output_is_capped_once_with_a_marker() {
        let mut out = CappedOutput::new(10);
        assert_eq!(out.push("hello\n").as_deref(), Some("hello\n"));
        let cut = out.push("wörld!!!\n").expect("the cut chunk");
        assert!(cut.starts_with("wör"), "{cut}");
        assert!(
            cut.contains("[output truncated: more than 10 bytes"),
            "{cut}"
        );
        assert_eq!(out.push("more\n"), None);
        let result = out.into_result();
        assert!(result.starts_with("hello\nwör"), "{result}");
    }

    #[test]
    fn an_unspecified_listen_address_becomes_loopback_for_programs() {
        let url = |a: &str| CommandRunner::local_api_url(a.parse().unwrap());
        assert_eq!(url("0.0.0.0:50051"), "http://127.0.0.1:50051");
        assert_eq!(url("10.1.2.3:7"), "http://10.1.2.3:7");
    }

    /// Issue 13 §4: a program runs only once its process group is durable,
    /// so no crash of the server can leave a program running that recovery
    /// does not know of. The store checks, at the commit that records the
    /// group, that the program has not run yet.
    #[tokio::test]
    async fn a_program_runs_only_once_its_process_group_is_durable() {
        use std::collections::HashMap;

        use crate::{
            config::{ConfigSource, RunnerKind},
            scheduler::{AwaitMode, Scheduler, SpawnSpec},
            store::{memory::MemoryStore, writer::Writer, Batch, Contents, Store, StoreError},
        };

        /// Commits into memory; at a commit that records a process group,
        /// gives the program time to show it ran (it would within
        /// milliseconds) and counts whether it did.
        struct Watching {
            inner: MemoryStore,
            marker: std::path::PathBuf,
            /// (groups recorded, of those: the program had already run)
            seen: Arc<Mutex<(usize, usize)>>,
        }
        impl Store for Watching {
            fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
                if !batch.process_groups().is_empty() {
                    // Proving that something does not happen takes a bound.
                    std::thread::sleep(Duration::from_millis(300));
                    let mut seen = self.seen.lock();
                    seen.0 += 1;
                    seen.1 += usize::from(self.marker.exists());
                }
                self.inner.commit(batch)
            }
            fn load(&mut self) -> Result<Contents, StoreError> {
                self.inner.load()
            }
            fn describe(&self) -> String {
                "watching".into()
            }
        }

        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let toml = format!(
            "[agents.touch]\nrunner = \"command\"\ncommand = [\"sh\", \"-c\", \"touch '{}'; echo ran\"]\n",
            marker.display()
        );
        let config = ConfigSource::from_toml_str(&toml).unwrap();
        let runner: Arc<dyn Runner> = Arc::new(CommandRunner::new(None));
        let s = Scheduler::new(&config, HashMap::from([(RunnerKind::Command, runner)]));
        let seen = Arc::new(Mutex::new((0, 0)));
        let store = Watching {
            inner: MemoryStore::new(),
            marker: marker.clone(),
            seen: seen.clone(),
        };
        let writer = Writer::start(Box::new(store), s.change_source(), |_| {}).unwrap();
        s.attach_durability(writer.durability());

        let agent = s
            .spawn(SpawnSpec {
                agent: "touch".into(),
                model: "acme/m".into(),
                prompt: "go".into(),
                background: true,
                ..SpawnSpec::default()
            })
            .await
            .unwrap();
        let (done, _) = s
            .await_agents(
                &crate::scheduler::Scope::All,
                &[agent.id],
                Some(Duration::from_secs(30)),
                AwaitMode::All,
            )
            .await
            .unwrap();
        assert_eq!(done[0].result.as_ref(), "ran\n", "{:?}", done[0]);
        assert!(marker.exists(), "the program ran in the end");
        assert_eq!(
            *seen.lock(),
            (1, 0),
            "one commit recorded the group, before the program ran"
        );
    }
}
