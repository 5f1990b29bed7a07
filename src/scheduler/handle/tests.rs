//! The handle's own paths: a failed commit, a worker run released once
//! durable, a runner panic, the deadline, the stale watch.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::config::RunnerKind;
use crate::scheduler::{
    run::{Run, Runner},
    *,
};
use futures_util::future::BoxFuture;

/// A runner whose run panics: the crash must end the agent and free its
/// slots like any other terminal path.
struct PanickingRunner;

impl Runner for PanickingRunner {
    fn run(&self, _run: Run) -> BoxFuture<'static, crate::runner::RunOutcome> {
        Box::pin(async { panic!("runner bug") })
    }
}

/// Counts the runs it is given; each finishes at once.
#[derive(Default)]
struct CountingRunner(std::sync::atomic::AtomicUsize);

impl Runner for CountingRunner {
    fn run(&self, _run: Run) -> BoxFuture<'static, crate::runner::RunOutcome> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok("ran".to_owned()) })
    }
}

/// A scheduler over `store`, with its writer started and attached.
fn durable_scheduler(
    runner: Arc<CountingRunner>,
    store: impl crate::store::Store + 'static,
) -> (Scheduler, crate::store::writer::Writer) {
    let s = scheduler_with(runner, "");
    let writer =
        crate::store::writer::Writer::start(Box::new(store), s.change_source(), |_| {}).unwrap();
    s.attach_durability(writer.durability());
    (s, writer)
}

/// Issue 13 §3: answers wait for the commit; a run starts only after
/// its admission is durable; a failed commit answers STORE_FAILED and
/// starts nothing, and what was written is all the store holds.
#[tokio::test(start_paused = true)]
async fn a_failed_commit_answers_store_failed_and_starts_nothing() {
    use crate::store::{
        memory::{FailingStore, MemoryStore},
        Store,
    };
    let runner = Arc::new(CountingRunner::default());
    let memory = MemoryStore::new();
    let failing = FailingStore::new(memory.clone(), usize::MAX);
    let (s, _writer) = durable_scheduler(runner.clone(), failing.clone());
    let first = s.spawn(spec()).await.expect("the first commit succeeds");
    let (done, _) = s
        .await_agents(
            &crate::scheduler::Scope::All,
            &[first.id],
            // No deadline: the writer commits on its own thread, which
            // the paused clock does not see, so it would auto-advance
            // past any timeout while the commit is still in flight.
            None,
            AwaitMode::All,
        )
        .await
        .unwrap();
    assert_eq!(done[0].status, AgentStatus::Done);
    assert_eq!(runner.0.load(std::sync::atomic::Ordering::SeqCst), 1);

    failing.fail_after(0);
    let err = s.spawn(spec()).await.unwrap_err();
    assert!(matches!(err, Error::StoreFailed), "{err:?}");
    let err = s
        .status(&crate::scheduler::Scope::All, &[first.id], "ids")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StoreFailed), "{err:?}");
    // Every task that could start the refused agent's run has run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        runner.0.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no run starts for a change that was not written"
    );
    let stored = memory.clone().load().unwrap().decode().unwrap();
    assert_eq!(stored.agents.len(), 1, "only the first agent was written");
    assert_eq!(stored.agents[0].view.id, first.id);
}

/// Issue 13 §2: a worker's terminal report is answered with
/// `released` only once the store has it; until then the worker must
/// keep the run (a crash would lose the report).
#[tokio::test]
async fn a_worker_run_is_released_only_once_its_end_is_durable() {
    use crate::store::{memory::MemoryStore, Batch, Contents, Store, StoreError};

    /// Commits into memory, holding each commit while `held` is set.
    struct Held {
        inner: MemoryStore,
        held: Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
    }
    impl Store for Held {
        fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
            let (lock, cvar) = &*self.held;
            let mut held = lock.lock();
            while *held {
                cvar.wait(&mut held);
            }
            self.inner.commit(batch)
        }
        fn load(&mut self) -> Result<Contents, StoreError> {
            self.inner.load()
        }
        fn describe(&self) -> String {
            "held".into()
        }
    }

    let s = scheduler_with(
        Arc::new(CountingRunner::default()),
        "[agents.coder]\nrunner = \"worker\"\n",
    );
    let held = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
    let store = Held {
        inner: MemoryStore::new(),
        held: held.clone(),
    };
    let writer =
        crate::store::writer::Writer::start(Box::new(store), s.change_source(), |_| {}).unwrap();
    s.attach_durability(writer.durability());
    let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel();
    let worker = s.register_worker(
        WorkerInfo {
            tenant: DEFAULT_TENANT.into(),
            name: "w".into(),
            agents: vec!["coder".into()],
            capacity: 1,
            labels: Default::default(),
        },
        tx,
        &[],
    );
    let agent = s
        .spawn(SpawnSpec {
            agent: "coder".into(),
            ..spec()
        })
        .await
        .unwrap();
    let Some(WorkerCommand::Assign(_)) = commands.recv().await else {
        panic!("expected the assignment");
    };

    *held.0.lock() = true;
    assert!(s.worker_report(
        worker,
        agent.id,
        ReportNumber::default(),
        WorkerEvent::Done {
            result: "ok".into(),
            session: None,
        }
    ));
    // Proving that something does not happen takes a bound.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        commands.try_recv().is_err(),
        "nothing is released while the commit is held"
    );
    *held.0.lock() = false;
    held.1.notify_all();
    match commands.recv().await {
        Some(WorkerCommand::Released { agent_id, attempt }) => {
            assert_eq!((agent_id, attempt), (agent.id, 1));
        }
        other => panic!("expected released, got {other:?}"),
    }
}

fn scheduler_with(runner: Arc<dyn Runner>, toml: &str) -> Scheduler {
    let config = crate::config::ConfigSource::from_toml_str(toml).unwrap();
    Scheduler::new(&config, HashMap::from([(RunnerKind::Simulated, runner)]))
}

fn spec() -> SpawnSpec {
    SpawnSpec {
        agent: "simulated".into(),
        model: "acme/m".into(),
        prompt: "hi".into(),
        background: true,
        ..SpawnSpec::default()
    }
}

#[tokio::test]
async fn a_runner_panic_fails_the_agent_and_releases_its_slots() {
    let s = scheduler_with(
        Arc::new(PanickingRunner),
        "[limits]\nmax_background_agents = 1\n",
    );
    let agent = s.spawn(spec()).await.unwrap();
    let (agents, timed_out) = s
        .await_agents(
            &crate::scheduler::Scope::All,
            &[agent.id],
            Some(Duration::from_secs(10)),
            AwaitMode::All,
        )
        .await
        .unwrap();
    assert!(!timed_out);
    assert_eq!(agents[0].status, AgentStatus::Failed);
    let error = agents[0].error.as_ref().unwrap();
    assert_eq!(&*error.code, CODE_RUNNER_CRASHED);
    assert!(error.message.contains("runner bug"), "{}", error.message);
    s.inspect(|c| assert_eq!(c.counters(), c.recount()));
    assert_eq!(s.inspect(|c| c.counters().live_background), 0);
    // The freed global slot admits the next agent.
    s.spawn(spec()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_run_deadline_fails_the_agent_with_deadline_exceeded() {
    let s = Scheduler::new(
        &crate::config::ConfigSource::from_toml_str("").unwrap(),
        crate::runner::builtin(None, None),
    );
    let agent = s
        .spawn(SpawnSpec {
            prompt: "sleep 3600000".into(),
            timeout: Some(Duration::from_secs(60)),
            ..spec()
        })
        .await
        .unwrap();
    // The paused clock jumps to the deadline as soon as everything idles.
    let (agents, _) = s
        .await_agents(
            &crate::scheduler::Scope::All,
            &[agent.id],
            None,
            AwaitMode::All,
        )
        .await
        .unwrap();
    assert_eq!(agents[0].status, AgentStatus::Failed);
    assert_eq!(
        &*agents[0].error.as_ref().unwrap().code,
        CODE_DEADLINE_EXCEEDED
    );
    assert_eq!(s.inspect(|c| c.counters().live_background), 0);
}

fn paused_scheduler(toml: &str) -> Scheduler {
    Scheduler::new(
        &crate::config::ConfigSource::from_toml_str(toml).unwrap(),
        crate::runner::builtin(None, None),
    )
}

async fn settle(s: &Scheduler, id: AgentId) -> AgentView {
    let (mut agents, timed_out) = s
        .await_agents(&crate::scheduler::Scope::All, &[id], None, AwaitMode::All)
        .await
        .unwrap();
    assert!(!timed_out);
    agents.pop().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_run_that_reports_nothing_for_the_stale_timeout_fails_stale() {
    let s = paused_scheduler("[runs]\nstale_timeout = \"10m\"\n");
    let started = tokio::time::Instant::now();
    let agent = s
        .spawn(SpawnSpec {
            prompt: "output one\nsleep 3600000".into(),
            ..spec()
        })
        .await
        .unwrap();
    // The paused clock jumps ahead whenever everything idles.
    let ended = settle(&s, agent.id).await;
    assert_eq!(ended.status, AgentStatus::Failed);
    let error = ended.error.as_ref().unwrap();
    assert_eq!(&*error.code, CODE_STALE);
    assert!(error.message.contains("stale_timeout"), "{}", error.message);
    assert_eq!(&*ended.result, "one", "what it output is kept");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(600) && waited < Duration::from_secs(601),
        "stale after {waited:?}"
    );
    assert_eq!(s.inspect(|c| c.counters().live_background), 0);
}

#[tokio::test(start_paused = true)]
async fn reports_keep_a_run_fresh_and_waiting_for_approval_is_not_stale() {
    let s = paused_scheduler("[runs]\nstale_timeout = \"10m\"\n");
    // Output every 9 minutes: never 10 without a report.
    let fresh = s
        .spawn(SpawnSpec {
            prompt: "sleep 540000\noutput a\nsleep 540000\noutput b\nsleep 540000\nusage 1 1\nsleep 540000".into(),
            timeout: Some(Duration::from_secs(7200)),
            ..spec()
        })
        .await
        .unwrap();
    let paused = s
        .spawn(SpawnSpec {
            prompt: "approve shell\noutput after".into(),
            timeout: Some(Duration::from_secs(7200)),
            ..spec()
        })
        .await
        .unwrap();
    assert_eq!(settle(&s, fresh.id).await.status, AgentStatus::Done);
    // 36 minutes later the approval is still pending, not stale.
    let waiting = s
        .status(&crate::scheduler::Scope::All, &[paused.id], "id")
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(waiting.status, AgentStatus::AwaitingApproval);
    let approval = waiting.approval.as_ref().unwrap().id;
    s.approve(
        &crate::scheduler::Scope::All,
        paused.id,
        approval,
        ApprovalOutcome {
            approved: true,
            note: String::new(),
        },
    )
    .await
    .unwrap();
    assert_eq!(settle(&s, paused.id).await.status, AgentStatus::Done);
}

#[tokio::test(start_paused = true)]
async fn a_stale_timeout_of_zero_is_off() {
    let s = paused_scheduler("[runs]\nstale_timeout = \"0s\"\n");
    let agent = s
        .spawn(SpawnSpec {
            prompt: "sleep 86400000".into(),
            timeout: Some(Duration::from_secs(2 * 86400)),
            ..spec()
        })
        .await
        .unwrap();
    let ended = settle(&s, agent.id).await;
    assert_eq!(ended.status, AgentStatus::Done, "{:?}", ended.error);
}

/// An inbox Await leaves no waiter behind, whether it times out, returns
/// on a settle, or its caller goes away; a settle wakes it without the
/// clock moving.
#[tokio::test(start_paused = true)]
async fn an_inbox_await_leaves_no_waiter_behind() {
    let s = paused_scheduler("");
    let lead = InboxOf::Lead("lead".into());
    let tenant = DEFAULT_TENANT;
    let waiters = |s: &Scheduler| s.inspect(|c| c.inbox_waiter_count());
    let long = s
        .spawn(SpawnSpec {
            lead_id: Some("lead".into()),
            prompt: "sleep 60000\noutput late".into(),
            ..spec()
        })
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let (agents, timed_out) = s
        .await_inbox(
            &Scope::All,
            tenant,
            &lead,
            Duration::from_secs(5),
            AwaitMode::Any,
            true,
        )
        .await
        .unwrap();
    assert!(timed_out && agents.is_empty());
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(waiters(&s), 0, "after a timeout");

    let dropped = s.await_inbox(
        &Scope::All,
        tenant,
        &lead,
        Duration::from_secs(30),
        AwaitMode::Any,
        true,
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), dropped).await;
    assert_eq!(waiters(&s), 0, "after the caller went away");

    // Woken by the settle 60 s in, not by its 1 h timeout.
    let (agents, timed_out) = s
        .await_inbox(
            &Scope::All,
            tenant,
            &lead,
            Duration::from_secs(3600),
            AwaitMode::Any,
            true,
        )
        .await
        .unwrap();
    assert!(!timed_out);
    assert_eq!(agents.iter().map(|a| a.id).collect::<Vec<_>>(), [long.id]);
    assert!(started.elapsed() < Duration::from_secs(120));
    assert_eq!(waiters(&s), 0, "after a wake");
}

/// A worker's workspace report is taken for the agent's current attempt
/// only: while the run is live from the worker holding it, once it ended
/// only once; and only when it looks like git's. An unnumbered one is
/// answered (taken or not), so the worker stops sending it.
#[tokio::test]
async fn a_worker_workspace_report_is_taken_only_for_the_current_attempt_and_once() {
    use crate::scheduler::Workspace;

    let s = scheduler_with(
        Arc::new(CountingRunner::default()),
        "[agents.coder]\nrunner = \"worker\"\n",
    );
    let register = |name: &str| {
        let (tx, commands) = tokio::sync::mpsc::unbounded_channel();
        let id = s.register_worker(
            WorkerInfo {
                tenant: DEFAULT_TENANT.into(),
                name: name.into(),
                agents: vec!["coder".into()],
                capacity: 1,
                labels: Default::default(),
            },
            tx,
            &[],
        );
        (id, commands)
    };
    let (holder, mut holder_commands) = register("holder");
    let agent = s
        .spawn(SpawnSpec {
            agent: "coder".into(),
            ..spec()
        })
        .await
        .unwrap();
    let Some(WorkerCommand::Assign(_)) = holder_commands.recv().await else {
        panic!("expected the assignment");
    };
    let (other, mut other_commands) = register("other");
    let workspace = |branch: &str| Workspace {
        branch: branch.into(),
        kept: true,
        base_commit: "a".repeat(40),
        head_commit: "b".repeat(40),
        files_changed: 1,
        insertions: 1,
        deletions: 0,
    };
    let report = |worker, attempt, w: Workspace| {
        s.worker_report(
            worker,
            agent.id,
            ReportNumber { seq: 0, attempt },
            WorkerEvent::Workspace(w),
        )
    };
    let shown = || s.inspect(|c| c.view(agent.id).unwrap().workspace);

    // Live: not from another worker, not for another attempt, not a
    // branch git would read as an option.
    assert!(!report(other, 1, workspace("subagentd/x")));
    assert!(!report(holder, 2, workspace("subagentd/x")));
    assert!(!report(holder, 0, workspace("subagentd/x")));
    assert!(!report(holder, 1, workspace("--orphan")));
    assert_eq!(shown(), None);
    assert!(report(holder, 1, workspace("subagentd/x")));
    assert_eq!(shown().as_deref(), Some(&workspace("subagentd/x")));
    // Each unnumbered report is answered.
    for (commands, worker) in [
        (&mut other_commands, "other"),
        (&mut holder_commands, "holder"),
    ] {
        loop {
            match commands.recv().await {
                Some(WorkerCommand::WorkspaceAnswered { agent_id, .. }) => {
                    assert_eq!(agent_id, agent.id, "{worker}");
                    break;
                }
                Some(_) => {}
                None => panic!("{worker}: no answer"),
            }
        }
    }

    // Ended: a repeat changes nothing, another workspace is refused.
    s.cancel(&crate::scheduler::Scope::All, agent.id, "test")
        .await
        .unwrap();
    assert!(report(holder, 1, workspace("subagentd/x")));
    assert!(!report(other, 1, workspace("subagentd/y")));
    assert_eq!(shown().as_deref(), Some(&workspace("subagentd/x")));
}
