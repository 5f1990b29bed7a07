//! `subagentd worker`: runs agent types with the built-in runners
//! (`command`, `openai`, `simulated`) in a process of its own, as a worker
//! of a server over `WorkerService.Connect`.
//!
//! The runners are the server's, unchanged: each gets a [`RunReporter`]
//! whose reports go over the session instead of into the scheduler. The
//! worker keeps every run it holds — its numbered reports included — until
//! the server says the run's end is durable (`released`), so a session that
//! breaks (a failover of the scheduler, a network cut) loses nothing: the
//! next session's hello names the held runs, the server re-attaches them,
//! and the worker sends their reports again (the server applies each
//! number once). The server keeps the run guards (deadline, stale timeout,
//! circuit breakers) and ends a run by `cancel`, as for any worker.
//!
//! SIGTERM drains: the server is told to assign nothing more, held runs go
//! on for `[worker] drain_grace`, then what is left is stopped (the command
//! runner's SIGTERM, SIGKILL after `kill_grace`) and the session ends
//! without reporting those runs, so the server applies its worker-lost
//! rules to them (retry or WORKER_LOST).

pub mod config;

use std::{
    collections::HashMap, panic::AssertUnwindSafe, path::PathBuf, sync::Arc, time::Duration,
};

use anyhow::Context as _;
use futures_util::{future::BoxFuture, FutureExt as _};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::transport::Endpoint;
use tracing::{info, warn};

use crate::{
    config::{AgentTypeConfig, RunnerKind, WorkspaceKind},
    pb::{
        self, connect_request::Message as Up, connect_response::Message as Down, run_event::Event,
    },
    runner::{command::CODE_WORKSPACE_BASE_UNKNOWN, RemoteReports, Run, RunReporter, Runner},
    scheduler::{
        crashed,
        inbox::{steer_inbox, SteerSender},
        trace::TraceContext,
        ApprovalOutcome, Usage, Workspace, CODE_CANCELLED,
    },
    wire,
};
use config::WorkerConfig;

/// Failure code of a run the worker was assigned but cannot run (its type
/// is not in the worker's config, or the assignment does not parse).
pub const CODE_WORKER_CONFIG: &str = "WORKER_CONFIG";

/// First reconnect delay; doubled per failed attempt up to
/// [`MAX_RECONNECT_DELAY`], and back to this after a session was welcomed.
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(100);
/// Longest reconnect delay: a failover takes about a lease, and a worker
/// should be back within a few seconds of the new leader.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);
/// Largest message accepted from the server (an assignment carries the
/// prompt and buffered steers).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Flags of `subagentd worker`.
#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    /// The server's gRPC address: a URL (`http://subagentd:50051`) or
    /// `host:port`. Also `SUBAGENTD_ADDR` of the programs command runs
    /// start, so they can spawn children.
    #[arg(long)]
    pub server: String,
    /// Config file (TOML): `[worker]`, `[agents.NAME]`, `[telemetry]`.
    #[arg(long)]
    pub config: PathBuf,
    /// Print the effective config (TOML) and exit.
    #[arg(long)]
    pub dump_config: bool,
    /// API key with the `worker` role, sent as `authorization: Bearer
    /// <key>`, for servers with `[auth] mode = "required"`.
    #[arg(
        long,
        env = "SUBAGENTD_TOKEN",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: crate::client::TlsArgs,
}

/// `subagentd worker`: serve runs until SIGTERM/SIGINT, then drain.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let config = WorkerConfig::load(&args.config)?;
    if args.dump_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    let telemetry = crate::telemetry::init(&config.telemetry)?;
    let (url, tls) = args.tls.secure(server_url(&args.server))?;
    let mut endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| format!("--server {:?} is not a gRPC address", args.server))?;
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls)
            .context("--ca-file, --cert-file, --key-file")?;
    }
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // A server that stops answering (a frozen pod) ends the session
        // within ~20 s; the server pings the worker likewise.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let token = crate::client::bearer_header(args.token.as_deref())?;
    // The root locks are held until the worker exits.
    let (left, _root_locks) = prepare_workspaces(&config).await?;
    let worker = Worker::new(config, url, token, args.token.as_deref().map(Arc::from));
    worker.state.lock().unanswered = left;
    let stop = CancellationToken::new();
    let mut sessions = tokio::spawn(worker.clone().sessions(endpoint, stop.clone()));
    let mut signals = StopSignals::new()?;
    let signal = tokio::select! {
        signal = signals.next() => signal,
        ended = &mut sessions => return ended.context("the session task failed")?,
    };
    info!(signal, "stop signal received: draining");
    let reason = format!("signal {signal}");
    tokio::select! {
        () = worker.drain(&reason) => {}
        signal = signals.next() => {
            warn!(signal, "second signal: exiting now");
            std::process::exit(128 + signal);
        }
    }
    stop.cancel();
    // The session ended when the drain closed it; a server that does not
    // answer the close any more is not waited for.
    let _ = tokio::time::timeout(Duration::from_secs(2), sessions).await;
    if let Err(e) = tokio::task::spawn_blocking(move || telemetry.shutdown()).await {
        warn!(error = %e, "flushing telemetry failed");
    }
    Ok(())
}

/// Before the first session: each workspace type's `repo` must be a git
/// repository (else the worker does not start, naming the key); its `root`
/// is locked for this process (another worker on it would take this one's
/// live worktrees for a killed worker's); and the worktrees a killed worker
/// left under it are saved — a program still running in one stopped, its
/// changes committed to its branch, the worktree removed. Returns their
/// workspace reports, for the server, and the held locks.
async fn prepare_workspaces(
    config: &WorkerConfig,
) -> anyhow::Result<(Vec<pb::RunEvent>, Vec<std::fs::File>)> {
    use crate::runner::{
        command::sweep_worktrees,
        workspace::{check_repository, Spec, Workspaces},
    };
    let workspaces = Workspaces::new();
    let mut seen = std::collections::HashSet::new();
    let mut reports = Vec::new();
    let mut locks: HashMap<PathBuf, std::fs::File> = HashMap::new();
    for (name, agent_type) in &config.agents {
        // `root` is required here (the config says so), so every
        // workspace type has a spec.
        let Some(spec) = Spec::of(agent_type, None) else {
            continue;
        };
        check_repository(&spec.repo)
            .await
            .with_context(|| format!("agents.{name}.repo"))?;
        if !locks.contains_key(&spec.root) {
            let lock = lock_root(&spec.root).with_context(|| format!("agents.{name}.root"))?;
            locks.insert(spec.root.clone(), lock);
        }
        if !seen.insert((spec.repo.clone(), spec.root.clone())) {
            continue;
        }
        // This worker's runs died with it: every run's worktree left is
        // stale (a folder not named after an agent is not a run's).
        let saved = sweep_worktrees(&workspaces, &spec, agent_type.kill_grace(), |id| {
            id.parse::<uuid::Uuid>().is_ok().then(String::new)
        })
        .await
        .with_context(|| format!("saving the worktrees left under agents.{name}.root"))?;
        for swept in saved {
            // The server takes it only for the attempt that ran here (a run
            // it retried elsewhere has a workspace of its own).
            let Some(attempt) = swept.attempt else {
                warn!(agent_id = %swept.id, "a worktree without its record was saved, not reported");
                continue;
            };
            let workspace = wire::workers::workspace(&swept.saved.into());
            reports.push(wire::workers::run_event(&swept.id, 0, attempt, workspace));
        }
    }
    Ok((reports, locks.into_values().collect()))
}

/// Locks `root` for this worker process (an advisory lock on
/// `root/.subagentd-worker.lock`, released when the process exits however
/// it ends); refused while another process holds it.
fn lock_root(root: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let path = root.join(".subagentd-worker.lock");
    let file =
        std::fs::File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "{} is in use by another subagentd worker: give each worker a root of its own",
            root.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Answers to a hello that retrying cannot change: a hello the server's
/// config does not accept, a missing or unknown key, a key without the
/// worker role or without one of the agent types.
fn refuses_this_worker(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    )
}

/// `host:port` → `http://host:port`; a URL stays as it is.
fn server_url(server: &str) -> String {
    if server.contains("://") {
        server.to_owned()
    } else {
        format!("http://{server}")
    }
}

/// The worker process: its config, runners and the runs it holds.
struct Worker {
    /// `authorization` header value of every session.
    token: Option<tonic::metadata::AsciiMetadataValue>,
    /// The worker's own key, passed on to its programs (`SUBAGENTD_TOKEN`)
    /// so they can spawn children: the worker then also holds `frontend`.
    program_token: Option<Arc<str>>,
    name: String,
    capacity: u32,
    labels: HashMap<String, String>,
    drain_grace: Duration,
    agents: HashMap<String, Arc<AgentTypeConfig>>,
    runners: HashMap<RunnerKind, Arc<dyn Runner>>,
    state: Mutex<State>,
    /// Woken whenever a held run is forgotten (a drain waits on it).
    forgotten: Notify,
    /// Every run's task, so a drain can wait for the stopped ones.
    tasks: TaskTracker,
}

#[derive(Default)]
struct State {
    /// Held runs by agent id: assigned and not yet released.
    runs: HashMap<String, Held>,
    /// The open session's outgoing stream, with the session's number.
    session: Option<(u64, mpsc::UnboundedSender<pb::ConnectRequest>)>,
    /// The server was (or is to be) told to assign nothing more.
    draining: bool,
    /// The drain is over: nothing more is reported, so the runs left are
    /// the server's to treat as lost.
    closing: bool,
    /// Workspace reports of runs the worker no longer holds (stopped runs,
    /// worktrees a killed worker left), unnumbered: kept until the server
    /// answers them (`released` with `workspace`), and sent again on each
    /// new session until then.
    unanswered: Vec<pb::RunEvent>,
}

/// A run the worker holds.
struct Held {
    attempt: u32,
    /// Every report sent, numbered from 1; sent again after a re-attach.
    events: Vec<pb::RunEvent>,
    /// Its terminal report was made.
    finished: bool,
    steer: SteerSender,
    cancel: CancellationToken,
    cancel_reason: String,
    /// The run waits for an approval decision.
    approval: Option<oneshot::Sender<ApprovalOutcome>>,
    /// The run's own session, sent with its terminal report.
    session: String,
    /// The runner said its failure is a retryable provider error.
    retryable: bool,
}

impl Worker {
    fn new(
        config: WorkerConfig,
        api_url: String,
        token: Option<tonic::metadata::AsciiMetadataValue>,
        program_token: Option<Arc<str>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            token,
            program_token,
            name: config.name(),
            capacity: config.worker.capacity,
            labels: config.worker.labels.clone().into_iter().collect(),
            drain_grace: config.worker.drain_grace,
            agents: config
                .agents
                .into_iter()
                .map(|(name, agent)| (name, Arc::new(agent)))
                .collect(),
            runners: crate::runner::builtin(Some(api_url), None),
            state: Mutex::default(),
            forgotten: Notify::new(),
            tasks: TaskTracker::new(),
        })
    }

    /// Opens sessions until `stop`, reconnecting with backoff whenever one
    /// ends. Errs only when the server refuses the hello (the config does
    /// not match the server's: retrying cannot help).
    async fn sessions(
        self: Arc<Self>,
        endpoint: Endpoint,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        let mut delay = FIRST_RECONNECT_DELAY;
        for number in 1.. {
            let end = tokio::select! {
                end = self.session(number, &endpoint) => end,
                () = stop.cancelled() => break,
            };
            self.end_session(number);
            match end {
                SessionEnd::Refused(status) => {
                    anyhow::bail!(
                        "the server refused this worker: {} ({:?})",
                        status.message(),
                        status.code()
                    );
                }
                SessionEnd::Ended { welcomed, why } => {
                    if welcomed {
                        delay = FIRST_RECONNECT_DELAY;
                    }
                    warn!(%why, retry_in = ?delay, "worker session ended; reconnecting");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(jitter(delay)) => {}
                () = stop.cancelled() => break,
            }
            delay = (delay * 2).min(MAX_RECONNECT_DELAY);
        }
        Ok(())
    }

    /// One session: hello (naming the held runs), their reports again,
    /// then commands until the stream ends.
    async fn session(self: &Arc<Self>, number: u64, endpoint: &Endpoint) -> SessionEnd {
        let ended = |why: String| SessionEnd::Ended {
            welcomed: false,
            why,
        };
        let channel = match endpoint.connect().await {
            Ok(channel) => channel,
            Err(e) => return ended(format!("cannot connect: {e}")),
        };
        let mut client = pb::worker_service_client::WorkerServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::unbounded_channel();
        self.open_session(number, tx);
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        let mut stream = match client.connect(request).await {
            Ok(response) => response.into_inner(),
            Err(status) if refuses_this_worker(status.code()) => {
                return SessionEnd::Refused(status)
            }
            Err(status) => return ended(format!("{:?}: {}", status.code(), status.message())),
        };
        let mut welcomed = false;
        loop {
            match stream.message().await {
                Ok(Some(pb::ConnectResponse {
                    message: Some(message),
                })) => {
                    if let Down::Welcome(w) = &message {
                        welcomed = true;
                        info!(worker_id = %w.worker_id, name = %self.name, "connected to the server");
                    }
                    self.command(message);
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    return SessionEnd::Ended {
                        welcomed,
                        why: "the server closed the session".into(),
                    }
                }
                Err(status) if !welcomed && refuses_this_worker(status.code()) => {
                    return SessionEnd::Refused(status)
                }
                Err(status) => {
                    return SessionEnd::Ended {
                        welcomed,
                        why: format!("{:?}: {}", status.code(), status.message()),
                    }
                }
            }
        }
    }

    /// Makes `tx` the session's stream, starting with the hello, every held
    /// run's reports so far and, while draining, the drain: all under the
    /// state lock, so no new report slips in ahead of them.
    fn open_session(&self, number: u64, tx: mpsc::UnboundedSender<pb::ConnectRequest>) {
        let mut state = self.state.lock();
        let mut held: Vec<_> = state.runs.iter().collect();
        held.sort_by(|a, b| a.0.cmp(b.0));
        // A send fails only when the session already broke; the next one
        // sends all of it again.
        let _ = tx.send(wire::workers::hello(
            &self.name,
            self.agents.keys(),
            self.capacity,
            &self.labels,
            held.iter().map(|(id, run)| (*id, run.attempt)),
        ));
        for (_, run) in &held {
            for event in &run.events {
                let _ = tx.send(wire::workers::up(Up::Event(event.clone())));
            }
        }
        for event in &state.unanswered {
            let _ = tx.send(wire::workers::up(Up::Event(event.clone())));
        }
        if state.draining {
            let _ = tx.send(wire::workers::drain("draining"));
        }
        state.session = Some((number, tx));
    }

    /// Sends a workspace report of a run the worker does not hold (any
    /// more) on the open session, and keeps it until the server answers.
    fn send_unheld(&self, event: pb::RunEvent) {
        let mut state = self.state.lock();
        if let Some((_, tx)) = &state.session {
            let _ = tx.send(wire::workers::up(Up::Event(event.clone())));
        }
        state.unanswered.push(event);
    }

    /// Session `number` is over: reports wait for the next one.
    fn end_session(&self, number: u64) {
        let mut state = self.state.lock();
        if state.session.as_ref().is_some_and(|(n, _)| *n == number) {
            state.session = None;
        }
    }

    /// Acts on one message from the server.
    fn command(self: &Arc<Self>, message: Down) {
        match message {
            Down::Welcome(_) => {}
            Down::Assign(assignment) => self.assign(assignment),
            Down::Steer(steer) => {
                let state = self.state.lock();
                if let Some(run) = state.runs.get(&steer.agent_id) {
                    // Refused only when the run is ending: nothing to steer.
                    let _ = run.steer.send(steer.message);
                }
            }
            Down::Cancel(cancel) => {
                let mut state = self.state.lock();
                let Some(run) = state.runs.get_mut(&cancel.agent_id) else {
                    return;
                };
                if run.finished {
                    // Not live on the server any more (a re-attach it
                    // refused): nothing will release it.
                    state.runs.remove(&cancel.agent_id);
                    self.forgotten.notify_waiters();
                } else {
                    run.cancel_reason = cancel.reason;
                    run.cancel.cancel();
                }
            }
            Down::Approval(decision) => {
                let mut state = self.state.lock();
                if let Some(tx) = state
                    .runs
                    .get_mut(&decision.agent_id)
                    .and_then(|run| run.approval.take())
                {
                    let _ = tx.send(ApprovalOutcome {
                        approved: decision.approved,
                        note: decision.note,
                    });
                }
            }
            Down::Released(released) if released.workspace => {
                let mut state = self.state.lock();
                state
                    .unanswered
                    .retain(|e| (&e.agent_id, e.attempt) != (&released.agent_id, released.attempt));
            }
            Down::Released(released) => {
                let mut state = self.state.lock();
                let ours = state
                    .runs
                    .get(&released.agent_id)
                    .is_some_and(|run| run.attempt == released.attempt && run.finished);
                if ours {
                    state.runs.remove(&released.agent_id);
                    self.forgotten.notify_waiters();
                }
            }
        }
    }

    /// Starts the run of an assignment on its type's runner.
    fn assign(self: &Arc<Self>, assignment: pb::RunAssignment) {
        let Some(agent) = assignment.agent else {
            warn!("an assignment without an agent is ignored");
            return;
        };
        let (agent_id, attempt) = (agent.id.clone(), agent.attempt);
        let (steer, inbox) = steer_inbox();
        for message in assignment.steer_messages {
            let _ = steer.send(message);
        }
        let cancel = CancellationToken::new();
        let held = Held {
            attempt,
            events: Vec::new(),
            finished: false,
            steer,
            cancel: cancel.clone(),
            cancel_reason: String::new(),
            approval: None,
            session: String::new(),
            retryable: false,
        };
        if let Some(older) = self.state.lock().runs.insert(agent_id.clone(), held) {
            // A retry of a run whose earlier attempt this worker still
            // runs: that one's reports no longer apply.
            older.cancel.cancel();
        }
        let reports = Arc::new(Reports {
            worker: self.clone(),
            agent_id: agent_id.clone(),
            attempt,
        });
        let view = wire::agent_from_pb(&agent).and_then(|view| {
            let history = wire::history_from_assignment(
                view.conversation_id(),
                &assignment.transcript,
                assignment.session,
            )?;
            Ok((view, history.map(Arc::new)))
        });
        let agent_type = self.agents.get(&agent.agent);
        let ((view, history), agent_type) = match (view, agent_type) {
            (Ok(view), Some(agent_type)) => (view, agent_type.clone()),
            (Err(why), _) => {
                warn!(%agent_id, %why, "an assignment that does not parse fails");
                reports.fail(
                    CODE_WORKER_CONFIG,
                    format!("the worker cannot read the assignment: {why}"),
                );
                return;
            }
            (_, None) => {
                reports.fail(
                    CODE_WORKER_CONFIG,
                    format!(
                        "agent type {:?} is not in this worker's config",
                        agent.agent
                    ),
                );
                return;
            }
        };
        // The server cannot see this worker's config: a base for a type
        // without a workspace is refused here.
        let workspace_base = (!assignment.workspace_base.is_empty())
            .then(|| Arc::<str>::from(assignment.workspace_base.as_str()));
        if workspace_base.is_some() && agent_type.workspace == WorkspaceKind::None {
            reports.fail(
                CODE_WORKSPACE_BASE_UNKNOWN,
                format!(
                    "workspace_base is set, but agent type {:?} has no workspace on worker {:?}",
                    agent.agent, self.name
                ),
            );
            return;
        }
        let runner = self.runners[&agent_type.runner].clone();
        info!(%agent_id, attempt, agent = %view.agent, "run assigned");
        let run = Run {
            reporter: RunReporter::remote(view.id, reports.clone()),
            agent: view,
            prompt: assignment.prompt.into(),
            steer: inbox,
            cancel: cancel.clone(),
            agent_type,
            trace: TraceContext::from_traceparent(&assignment.traceparent),
            credential: self.program_token.clone(),
            history,
            workspace_base,
            continues_workspace: assignment
                .continues_workspace
                .as_ref()
                .map(|w| Arc::new(wire::workspace_from_pb(w))),
        };
        self.tasks.spawn(async move {
            let outcome = tokio::select! {
                biased;
                // Dropping the run future stops it, as in the server.
                () = cancel.cancelled() => None,
                out = AssertUnwindSafe(runner.run(run)).catch_unwind() => {
                    Some(out.unwrap_or_else(|panic| Err(crashed(&*panic))))
                }
            };
            match outcome {
                Some(Ok(result)) => {
                    reports.report_with_session(|session, _| wire::workers::done(result, session))
                }
                Some(Err(e)) => reports.fail(&e.code, e.message.to_string()),
                // Confirms the stop, so the server frees the slot at once
                // (it ignores the content).
                None => {
                    let reason = reports.cancel_reason();
                    reports.fail(CODE_CANCELLED, reason);
                }
            }
        });
    }

    /// SIGTERM: assign nothing more, let held runs finish (and be released)
    /// within the drain grace, then stop the rest and close the session.
    async fn drain(&self, reason: &str) {
        let held = {
            let mut state = self.state.lock();
            state.draining = true;
            if let Some((_, tx)) = &state.session {
                let _ = tx.send(wire::workers::drain(reason));
            }
            state.runs.len()
        };
        info!(runs = held, grace = ?self.drain_grace, "draining: no new runs; waiting for the held ones");
        let all_released = async {
            loop {
                let forgotten = self.forgotten.notified();
                if self.state.lock().runs.is_empty() {
                    return;
                }
                forgotten.await;
            }
        };
        if tokio::time::timeout(self.drain_grace, all_released)
            .await
            .is_err()
        {
            let mut state = self.state.lock();
            state.closing = true;
            for run in state.runs.values() {
                run.cancel.cancel();
            }
            warn!(
                runs = state.runs.len(),
                "drain grace over: stopping the runs still held; the server treats them as lost"
            );
        }
        self.tasks.close();
        self.tasks.wait().await;
        // Programs that ignore SIGTERM get SIGKILL after their kill_grace.
        futures_util::future::join_all(self.runners.values().map(|r| r.shutdown())).await;
        let mut state = self.state.lock();
        state.closing = true;
        // Closing the request stream ends the session.
        state.session = None;
        info!("drained");
    }
}

enum SessionEnd {
    /// The server refused the hello.
    Refused(tonic::Status),
    /// The session broke or was closed; `welcomed` if it had started.
    Ended { welcomed: bool, why: String },
}

/// 50–100 % of `delay`, so workers that lost one server do not all come
/// back at the same instant.
fn jitter(delay: Duration) -> Duration {
    let fraction =
        0.5 + f64::from(uuid::Uuid::new_v4().as_u128() as u16) / f64::from(u16::MAX) / 2.0;
    delay.mul_f64(fraction)
}

/// One run's reports, sent over the worker's session (see
/// [`RemoteReports`]).
struct Reports {
    worker: Arc<Worker>,
    agent_id: String,
    attempt: u32,
}

impl Reports {
    /// Numbers, keeps and sends one report; false if the run is not held
    /// (released, replaced by a newer attempt), finished, or the worker is
    /// closing. `before` runs under the same lock, first.
    fn report_with(&self, event: Event, before: impl FnOnce(&mut Held)) -> bool {
        let mut state = self.worker.state.lock();
        let State {
            runs,
            session,
            closing,
            ..
        } = &mut *state;
        let Some(run) = runs.get_mut(&self.agent_id) else {
            return false;
        };
        if *closing || run.finished || run.attempt != self.attempt {
            return false;
        }
        before(run);
        run.finished = matches!(event, Event::Done(_) | Event::Failed(_));
        let event = wire::workers::run_event(
            &self.agent_id,
            run.events.len() as u64 + 1,
            self.attempt,
            event,
        );
        if let Some((_, tx)) = session {
            // Order: under the lock, so numbers go out as assigned.
            let _ = tx.send(wire::workers::up(Up::Event(event.clone())));
        }
        run.events.push(event);
        true
    }

    fn report(&self, event: Event) {
        self.report_with(event, |_| {});
    }

    /// A terminal report, with the session the run reported and whether
    /// it said its failure is retryable.
    fn report_with_session(&self, event: impl FnOnce(String, bool) -> Event) {
        let (session, retryable) = {
            let state = self.worker.state.lock();
            state
                .runs
                .get(&self.agent_id)
                .map(|run| (run.session.clone(), run.retryable))
                .unwrap_or_default()
        };
        self.report(event(session, retryable));
    }

    fn fail(&self, code: &str, message: String) {
        self.report_with_session(|session, retryable| {
            wire::workers::failed(code, message, session, retryable)
        });
    }

    fn cancel_reason(&self) -> String {
        let state = self.worker.state.lock();
        state
            .runs
            .get(&self.agent_id)
            .map(|run| run.cancel_reason.clone())
            .unwrap_or_default()
    }
}

impl RemoteReports for Reports {
    fn output(&self, chunk: &str) {
        self.report(wire::workers::output(chunk));
    }

    fn tool_call(&self, name: &str, input_digest: &str) {
        self.report(wire::workers::tool_call(name, input_digest));
    }

    fn turn_started(&self) {
        self.report(wire::workers::turn_started());
    }

    fn retryable_failure(&self) {
        let mut state = self.worker.state.lock();
        if let Some(run) = state.runs.get_mut(&self.agent_id) {
            if run.attempt == self.attempt {
                run.retryable = true;
            }
        }
    }

    fn session(&self, session: &str) {
        let mut state = self.worker.state.lock();
        if let Some(run) = state.runs.get_mut(&self.agent_id) {
            if run.attempt == self.attempt {
                session.clone_into(&mut run.session);
            }
        }
    }

    fn usage(&self, usage: Usage) {
        if let Some(event) = wire::workers::usage(usage) {
            self.report(event);
        }
    }

    fn workspace(&self, workspace: &Workspace) {
        let event = wire::workers::workspace(workspace);
        // A held run's, numbered like its other reports (sent again after a
        // re-attach); a stopped run's, after its end: unnumbered.
        if !self.report_with(event.clone(), |_| {}) {
            self.worker.send_unheld(wire::workers::run_event(
                &self.agent_id,
                0,
                self.attempt,
                event,
            ));
        }
    }

    fn request_approval(
        &self,
        tool_name: &str,
        detail: &str,
    ) -> BoxFuture<'static, ApprovalOutcome> {
        let (tx, rx) = oneshot::channel();
        let request = wire::workers::approval_request(tool_name, detail);
        self.report_with(request, |run| run.approval = Some(tx));
        Box::pin(async move {
            match rx.await {
                Ok(outcome) => outcome,
                // The run is being stopped; its future is dropped.
                Err(_) => std::future::pending().await,
            }
        })
    }
}

/// SIGTERM and SIGINT.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM (15) or SIGINT (2).
    async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.term.recv() => 15,
            _ = self.int.recv() => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_address_becomes_a_url() {
        assert_eq!(server_url("10.0.0.1:50051"), "http://10.0.0.1:50051");
        assert_eq!(server_url("https://sa:443"), "https://sa:443");
    }

    #[test]
    fn jitter_stays_within_half_to_all_of_the_delay() {
        for _ in 0..100 {
            let d = jitter(Duration::from_secs(2));
            assert!(
                (Duration::from_secs(1)..=Duration::from_secs(2)).contains(&d),
                "{d:?}"
            );
        }
    }
}
