//! Issue 13 end to end: the real binary on an embedded store, killed with
//! SIGKILL or stopped with SIGTERM, restarted on the same store. Everything
//! acknowledged is there; interrupted runs follow the recovery rules; a
//! watcher resumes without a gap.

mod common;

use std::time::Duration;

use common::{child::ChildServer, worker::RawWorker};
use nix::sys::signal::Signal;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// Where a test's server keeps its state; dropping it removes the state.
enum Store {
    Embedded(tempfile::TempDir),
    Postgres(common::postgres::Database),
}

impl Store {
    /// A fresh store of `backend` ("embedded" or "postgres"); None when
    /// PostgreSQL tests are not configured here (CI always configures them).
    async fn new(backend: &str) -> Option<Self> {
        match backend {
            "embedded" => Some(Self::Embedded(tempfile::tempdir().unwrap())),
            _ => common::postgres::Database::create()
                .await
                .map(Self::Postgres),
        }
    }

    /// The server's config: this store, and a bucket that runs one agent.
    fn config(&self) -> String {
        let store = match self {
            Self::Embedded(dir) => format!(
                "backend = \"embedded\"\npath = \"{}\"",
                dir.path().display()
            ),
            // The shortest lease: a restart after a SIGKILL waits for the
            // killed server's lease to expire.
            Self::Postgres(db) => format!(
                "backend = \"postgres\"\nurl = \"{}\"\n\n[ha]\nlease_ttl = \"1s\"",
                db.url
            ),
        };
        format!("[store]\n{store}\n\n[limits]\ndefault_concurrency = 1\n")
    }
}

fn spawn_req(prompt: &str, key: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        idempotency_key: key.to_owned(),
        ..common::bg("acme/m", prompt)
    }
}

async fn await_one(client: &mut AgentServiceClient<Channel>, id: &str) -> pb::Agent {
    let answer = client
        .r#await(pb::AwaitRequest {
            ids: vec![id.to_owned()],
            timeout: Some(prost_types::Duration {
                seconds: 20,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("Await")
        .into_inner();
    assert!(
        !answer.timed_out,
        "{id} did not settle: {:?}",
        answer.agents
    );
    answer.agents.into_iter().next().unwrap()
}

#[tokio::test]
async fn a_sigkill_loses_nothing_acknowledged_embedded() {
    sigkill_loses_nothing_acknowledged("embedded").await;
}

#[tokio::test]
async fn a_sigkill_loses_nothing_acknowledged_postgres() {
    sigkill_loses_nothing_acknowledged("postgres").await;
}

/// A SIGKILL loses nothing acknowledged, and a watch resumes without a gap.
async fn sigkill_loses_nothing_acknowledged(backend: &str) {
    let Some(store) = Store::new(backend).await else {
        return;
    };
    let toml = store.config();
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let mut watch = client
        .watch_agents(pb::WatchAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();

    // The bucket holds one: `running` runs, `queued` waits behind it.
    let running = common::spawn(&mut client, spawn_req("sleep 600000", "k-running")).await;
    let queued = common::spawn(
        &mut client,
        spawn_req("wait_steer\noutput steered after the restart", "k-queued"),
    )
    .await;
    assert_eq!(common::status(&queued), pb::AgentStatus::Queued);
    let steered = client
        .steer(pb::SteerRequest {
            id: queued.id.clone(),
            message: "go on".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(steered.delivery, pb::SteerDelivery::Buffered as i32);
    // The watcher saw STARTED (running) and QUEUED (queued): nothing else
    // was published, and a watcher only sees what is durable.
    let mut last_seen = 0;
    for _ in 0..2 {
        let event = watch.next().await.unwrap().unwrap();
        assert!(event.sequence > last_seen);
        last_seen = event.sequence;
    }

    server.signal(Signal::SIGKILL);
    let _ = server.exit_status().await;

    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    // The interrupted in-process run failed, saying why.
    let failed = await_one(&mut client, &running.id).await;
    assert_eq!(common::status(&failed), pb::AgentStatus::Failed);
    let error = failed.error.unwrap();
    assert_eq!(error.code, "SERVER_RESTARTED");
    assert!(
        error.message.contains("interrupted by a server restart"),
        "{}",
        error.message
    );
    // The queued agent kept its place and its buffered steer: it ran.
    let done = await_one(&mut client, &queued.id).await;
    assert_eq!(common::status(&done), pb::AgentStatus::Done);
    assert_eq!(done.result, "steer: go on\nsteered after the restart");
    // Each key still returns its first agent.
    let again = common::spawn(&mut client, spawn_req("sleep 1", "k-queued")).await;
    assert_eq!(again.id, queued.id);
    // A watch resumed after the last event seen continues without a gap:
    // the next events are the recovery's decisions, in order, none twice.
    let mut resumed = client
        .watch_agents(pb::WatchAgentsRequest {
            after_sequence: last_seen,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut previous = last_seen;
    let mut failed_seen = false;
    while !failed_seen {
        let event = tokio::time::timeout(Duration::from_secs(10), resumed.next())
            .await
            .expect("an event")
            .unwrap()
            .unwrap();
        assert!(
            event.sequence > previous,
            "{} after {previous}",
            event.sequence
        );
        assert_ne!(
            event.kind,
            pb::AgentEventKind::Snapshot as i32,
            "replayed, not a snapshot"
        );
        previous = event.sequence;
        let agent = event.agent.unwrap();
        failed_seen = agent.id == running.id && event.kind == pb::AgentEventKind::Failed as i32;
    }
    assert_eq!(server.stop().await.code(), Some(0));
}

#[tokio::test]
async fn sigterm_keeps_queued_agents_queued_embedded() {
    sigterm_keeps_queued_agents_queued("embedded").await;
}

#[tokio::test]
async fn sigterm_keeps_queued_agents_queued_postgres() {
    sigterm_keeps_queued_agents_queued("postgres").await;
}

/// SIGTERM leaves live agents in the store; the next start re-queues the
/// interrupted run (retry_on_restart) ahead of the queued one.
async fn sigterm_keeps_queued_agents_queued(backend: &str) {
    let Some(store) = Store::new(backend).await else {
        return;
    };
    let toml = format!(
        "{}[agents.simulated]\nrunner = \"simulated\"\nretry_on_restart = 1\n\n[server]\nshutdown_grace = \"0s\"\n",
        store.config()
    );
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let running = common::spawn(&mut client, spawn_req("sleep 600000", "a")).await;
    let queued = common::spawn(&mut client, spawn_req("output later", "b")).await;
    assert_eq!(common::status(&queued), pb::AgentStatus::Queued);
    assert_eq!(server.stop().await.code(), Some(0));

    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    // retry_on_restart = 1: the interrupted run is queued again at its
    // original place (ahead of the other), as attempt 2.
    let retried = common::status_of(&mut client, &running.id).await;
    assert_eq!(common::status(&retried), pb::AgentStatus::Running);
    assert_eq!(retried.attempt, 2);
    let later = common::status_of(&mut client, &queued.id).await;
    assert_eq!(
        common::status(&later),
        pb::AgentStatus::Queued,
        "not cancelled by SIGTERM"
    );
    common::cancel(&mut client, &running.id).await;
    assert_eq!(await_one(&mut client, &queued.id).await.result, "later");
    assert_eq!(server.stop().await.code(), Some(0));
}

#[tokio::test]
async fn a_second_server_on_the_same_store_refuses_to_start_embedded() {
    let store = Store::new("embedded").await.unwrap();
    let toml = store.config();
    let first = ChildServer::start(&toml, &[]).await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_subagentd"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(file.path())
        .env("SUBAGENTD_TELEMETRY__METRICS_LISTEN", "")
        .env("SUBAGENTD_HTTP__LISTEN", "")
        .output()
        .unwrap();
    // Never two schedulers over one file: the second server exits at start
    // with a message naming the store. (On PostgreSQL a second server is a
    // standby instead: tests/ha.rs.)
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Store::Embedded(dir) = &store else {
        unreachable!()
    };
    let path = dir.path().join("subagentd.redb");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(
        stderr.contains("in use by another subagentd process"),
        "{stderr}"
    );
    assert_eq!(first.stop().await.code(), Some(0));
}

/// A config over `store` with the worker type `coder`, no bucket limit,
/// and `extra` TOML after it.
fn coder_config(store: &Store, extra: &str) -> String {
    format!(
        "{}[agents.coder]\nrunner = \"worker\"\n{extra}",
        store
            .config()
            .replace("default_concurrency = 1", "default_concurrency = 0")
    )
}

/// A background agent of type `coder`.
async fn spawn_coder(client: &mut AgentServiceClient<Channel>, prompt: &str) -> pb::Agent {
    let request = pb::SpawnRequest {
        agent: "coder".into(),
        ..common::bg("acme/m", prompt)
    };
    common::spawn(client, request).await
}

/// Issue 13 §4: a worker run survives a server crash. The worker that
/// still holds it re-attaches with the same attempt (no new assignment),
/// gets steer commands again and finishes it; a run it names that the
/// server does not have live gets a cancel. A run nobody re-attaches
/// follows the worker-lost rules once the grace passes.
#[tokio::test]
async fn a_worker_run_re_attaches_after_a_crash_and_an_orphan_is_lost_after_the_grace() {
    let Some(store) = Store::new("embedded").await else {
        return;
    };
    let toml = coder_config(&store, "\n[runs]\nworker_reattach_grace = \"2s\"\n");
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let mut worker = RawWorker::connect(&server, vec![]).await;
    let kept = spawn_coder(&mut client, "keep me").await;
    let orphan = spawn_coder(&mut client, "nobody comes back for me").await;
    for a in worker.assignments(2).await {
        assert_eq!(a.agent.unwrap().attempt, 1);
    }
    server.signal(Signal::SIGKILL);
    let _ = server.exit_status().await;
    drop(worker);

    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    // Before its worker is back, the held run takes a steer (kept for the
    // re-attach) but not an approval decision (nothing could receive it).
    client
        .steer(pb::SteerRequest {
            id: kept.id.clone(),
            message: "while you were away".into(),
        })
        .await
        .unwrap();
    let stranger = uuid::Uuid::now_v7().to_string();
    let mut worker = RawWorker::connect(
        &server,
        vec![
            pb::HeldRun {
                agent_id: kept.id.clone(),
                attempt: 1,
            },
            pb::HeldRun {
                agent_id: stranger.clone(),
                attempt: 1,
            },
        ],
    )
    .await;
    // The waiting steer goes to the re-attached run, the unknown run is
    // cancelled; no new assignment.
    let pb::connect_response::Message::Steer(waited) = worker.next().await else {
        panic!("the steer sent during the grace comes first");
    };
    assert_eq!(
        (waited.agent_id.as_str(), waited.message.as_str()),
        (kept.id.as_str(), "while you were away")
    );
    let pb::connect_response::Message::Cancel(cancel) = worker.next().await else {
        panic!("then the unknown run is cancelled, with no new assignment");
    };
    assert_eq!(cancel.agent_id, stranger);
    let held = common::status_of(&mut client, &kept.id).await;
    assert_eq!(common::status(&held), pb::AgentStatus::Running);
    assert_eq!(held.attempt, 1, "the same attempt, not a retry");
    // Commands flow to the re-attached run again.
    client
        .steer(pb::SteerRequest {
            id: kept.id.clone(),
            message: "still there?".into(),
        })
        .await
        .unwrap();
    let pb::connect_response::Message::Steer(steer) = worker.next().await else {
        panic!("expected the steer");
    };
    assert_eq!(steer.message, "still there?");
    worker.done(&kept.id, "finished across a restart");
    let done = await_one(&mut client, &kept.id).await;
    assert_eq!(common::status(&done), pb::AgentStatus::Done);
    assert_eq!(done.result, "finished across a restart");
    // The other run's worker never named it: lost after the grace.
    let lost = await_one(&mut client, &orphan.id).await;
    assert_eq!(common::status(&lost), pb::AgentStatus::Failed);
    assert_eq!(lost.error.unwrap().code, "WORKER_LOST");
    assert_eq!(server.stop().await.code(), Some(0));
}

#[tokio::test]
async fn a_released_worker_run_stays_ended_after_a_crash_embedded() {
    released_worker_run_stays_ended("embedded").await;
}

#[tokio::test]
async fn a_released_worker_run_stays_ended_after_a_crash_postgres() {
    released_worker_run_stays_ended("postgres").await;
}

/// Issue 13 §2 ("a worker's report was accepted"): the server answers a
/// terminal event with `released` only once it is durable, so a worker
/// that forgets the run then loses nothing to a crash; a worker that
/// crashed the server before its `released` still holds the run, names
/// it, and its repeated `done` finishes it after the re-attach.
async fn released_worker_run_stays_ended(backend: &str) {
    let Some(store) = Store::new(backend).await else {
        return;
    };
    let toml = coder_config(&store, "");
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let mut worker = RawWorker::connect(&server, vec![]).await;
    let released = spawn_coder(&mut client, "finish before the crash").await;
    let unreleased = spawn_coder(&mut client, "finish after the crash").await;
    worker.assignments(2).await;
    worker.done(&released.id, "kept");
    let pb::connect_response::Message::Released(r) = worker.next().await else {
        panic!("expected released");
    };
    assert_eq!((r.agent_id.as_str(), r.attempt), (released.id.as_str(), 1));
    // The other run reports usage (stored: Status shows it, and a read
    // waits until what it shows is durable).
    use pb::run_event::Event;
    let usage = |n| {
        Event::Usage(pb::TokenUsage {
            input_tokens: n,
            output_tokens: 0,
        })
    };
    worker.send(&unreleased.id, 1, usage(10));
    loop {
        let seen = common::status_of(&mut client, &unreleased.id).await;
        if seen.usage.is_some_and(|u| u.input_tokens == 10) {
            break;
        }
        tokio::task::yield_now().await;
    }
    server.signal(Signal::SIGKILL);
    let _ = server.exit_status().await;
    drop(worker);

    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let ended = common::status_of(&mut client, &released.id).await;
    assert_eq!(common::status(&ended), pb::AgentStatus::Done, "{ended:?}");
    assert_eq!(ended.result, "kept");
    // The other run's worker still holds it and, after the re-attach,
    // sends every report of the run again: the stored one (number 1) is
    // not applied twice; the rest are, as if lost in the crash.
    let mut worker = RawWorker::connect(
        &server,
        vec![pb::HeldRun {
            agent_id: unreleased.id.clone(),
            attempt: 1,
        }],
    )
    .await;
    worker.send(&unreleased.id, 1, usage(10));
    worker.send(&unreleased.id, 2, usage(5));
    worker.send(
        &unreleased.id,
        3,
        Event::Done(pb::RunDone {
            result: "sent again".into(),
            ..Default::default()
        }),
    );
    let pb::connect_response::Message::Released(r) = worker.next().await else {
        panic!("expected released");
    };
    assert_eq!(r.agent_id, unreleased.id);
    let done = await_one(&mut client, &unreleased.id).await;
    assert_eq!(common::status(&done), pb::AgentStatus::Done);
    assert_eq!(done.result, "sent again");
    assert_eq!(
        done.usage.unwrap().input_tokens,
        15,
        "each report counted once"
    );
    assert_eq!(server.stop().await.code(), Some(0));
}

/// Whether `pid` is gone or a zombie nobody reaped (dead either way).
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat[stat.rfind(')').unwrap() + 1..]
            .trim_start()
            .starts_with('Z'),
    }
}

/// Issue 13 §4: a command run's process group outlives a SIGKILL of the
/// server; the next start stops it (SIGTERM, ignored here, then SIGKILL
/// after `kill_grace`) before it serves, and the run fails
/// SERVER_RESTARTED.
#[tokio::test]
async fn a_program_that_outlived_a_sigkill_is_stopped_at_recovery() {
    let Some(store) = Store::new("embedded").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; echo ready; while true; do sleep 1; done",
        pidfile.display()
    );
    let toml = format!(
        "{}[agents.prog]\nrunner = \"command\"\ncommand = [\"sh\", \"-c\", {script:?}]\nkill_grace = \"300ms\"\n",
        store.config()
    );
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let mut watch = client
        .watch_agents(pb::WatchAgentsRequest {
            include_progress: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let agent = common::spawn(
        &mut client,
        pb::SpawnRequest {
            agent: "prog".into(),
            ..common::bg("acme/m", "run")
        },
    )
    .await;
    // "ready" is printed after the pid file is written.
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the program's output")
            .unwrap()
            .unwrap();
        if event.kind == pb::AgentEventKind::Output as i32 {
            break;
        }
    }
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    server.signal(Signal::SIGKILL);
    let _ = server.exit_status().await;
    assert!(!dead(pid), "the program outlives the server");

    let server = ChildServer::start(&toml, &[]).await;
    assert!(dead(pid), "recovery stopped the program before serving");
    let mut client = server.client().await;
    let failed = common::status_of(&mut client, &agent.id).await;
    assert_eq!(common::status(&failed), pb::AgentStatus::Failed);
    assert_eq!(failed.error.unwrap().code, "SERVER_RESTARTED");
    assert_eq!(server.stop().await.code(), Some(0));
}

#[tokio::test]
async fn a_transcript_survives_a_sigkill_and_the_conversation_goes_on_embedded() {
    transcript_survives_a_sigkill("embedded").await;
}

#[tokio::test]
async fn a_transcript_survives_a_sigkill_and_the_conversation_goes_on_postgres() {
    transcript_survives_a_sigkill("postgres").await;
}

/// (kind, agent id, turn, text) of every entry of `id`'s whole conversation.
async fn conversation_entries(
    client: &mut AgentServiceClient<Channel>,
    id: &str,
) -> Vec<(i32, String, u32, String)> {
    client
        .get_transcript(pb::GetTranscriptRequest {
            conversation_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .expect("GetTranscript")
        .into_inner()
        .entries
        .into_iter()
        .map(|e| (e.kind, e.agent_id, e.turn, e.text))
        .collect()
}

/// Ended turns are durable when acknowledged: after a SIGKILL the
/// transcript reads the same, an older turn is still not the latest, and
/// the next turn sees every earlier one. A turn live at the crash keeps
/// its prompt and the steer it was sent, and ends as recovery decides.
async fn transcript_survives_a_sigkill(backend: &str) {
    let Some(store) = Store::new(backend).await else {
        return;
    };
    let toml = store.config();
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let first = common::spawn(&mut client, common::fg("acme/m", "tool grep\noutput one")).await;
    assert_eq!(common::status(&first), pb::AgentStatus::Done);
    let second = common::spawn(
        &mut client,
        pb::SpawnRequest {
            continue_from: first.id.clone(),
            prompt: "wait_steer\noutput two".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    client
        .steer(pb::SteerRequest {
            id: second.id.clone(),
            message: "go on".into(),
        })
        .await
        .expect("Steer");
    assert_eq!(
        common::status(&await_one(&mut client, &second.id).await),
        pb::AgentStatus::Done
    );
    // A third turn is live at the crash.
    let third = common::spawn(
        &mut client,
        pb::SpawnRequest {
            continue_from: second.id.clone(),
            prompt: "sleep 600000".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    // A steer to the live turn is acknowledged: it outlives the crash.
    client
        .steer(pb::SteerRequest {
            id: third.id.clone(),
            message: "hold on".into(),
        })
        .await
        .expect("Steer");
    let before = conversation_entries(&mut client, &first.id).await;
    assert_eq!(before.len(), 8, "{before:?}");

    server.signal(Signal::SIGKILL);
    let _ = server.exit_status().await;
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;

    let interrupted = await_one(&mut client, &third.id).await;
    assert_eq!(common::status(&interrupted), pb::AgentStatus::Failed);
    let after = conversation_entries(&mut client, &first.id).await;
    assert_eq!(
        after[..before.len()],
        before[..],
        "every entry acknowledged before the crash is there, in order"
    );
    assert_eq!(after.len(), before.len() + 1, "{after:?}");
    let (kind, agent, turn, _) = &after[before.len()];
    assert_eq!(
        (*kind, agent.as_str(), *turn),
        (pb::TranscriptEntryKind::Result as i32, third.id.as_str(), 3),
        "the interrupted turn's result"
    );

    let not_latest = client
        .spawn(pb::SpawnRequest {
            continue_from: second.id.clone(),
            prompt: "again".into(),
            ..Default::default()
        })
        .await
        .expect_err("not the latest turn");
    assert_eq!(not_latest.code(), tonic::Code::FailedPrecondition);
    let fourth = common::spawn(
        &mut client,
        pb::SpawnRequest {
            continue_from: third.id.clone(),
            prompt: "history".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        (fourth.turn, fourth.conversation_id.as_str()),
        (4, first.id.as_str())
    );
    let lines: Vec<&str> = fourth.result.lines().collect();
    assert_eq!(
        lines[..6],
        [
            "turn 1 prompt: tool grep\\noutput one",
            "turn 1 tool: grep",
            "turn 1 result: one",
            "turn 2 prompt: wait_steer\\noutput two",
            "turn 2 steer: go on",
            "turn 2 result: steer: go on\\ntwo",
        ],
        "{lines:?}"
    );
    assert_eq!(lines[6], "turn 3 prompt: sleep 600000");
    assert_eq!(lines[7], "turn 3 steer: hold on");
    assert!(lines[8].starts_with("turn 3 failed: "), "{lines:?}");
    assert_eq!(server.stop().await.code(), Some(0));
}

#[tokio::test]
async fn a_collect_survives_a_sigkill_embedded() {
    collect_survives_a_sigkill("embedded").await;
}

#[tokio::test]
async fn a_collect_survives_a_sigkill_postgres() {
    collect_survives_a_sigkill("postgres").await;
}

/// An inbox Await with `collect` is durable when it answers: after a
/// SIGKILL the collected agent still shows its `collected_time`, and the
/// lead's inbox returns only what was not collected before the crash.
async fn collect_survives_a_sigkill(backend: &str) {
    let Some(store) = Store::new(backend).await else {
        return;
    };
    let toml = store.config();
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;
    let under_lead = |prompt: &str| pb::SpawnRequest {
        lead_id: "inbox-lead".into(),
        ..common::bg("acme/m", prompt)
    };
    let first = common::spawn(&mut client, under_lead("output one")).await;
    await_one(&mut client, &first.id).await;
    let inbox = |collect: bool| pb::AwaitRequest {
        lead_id: "inbox-lead".into(),
        mode: pb::AwaitMode::Any as i32,
        collect,
        timeout: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        ..Default::default()
    };
    let collected = client
        .r#await(inbox(true))
        .await
        .expect("Await")
        .into_inner();
    assert_eq!(collected.agents.len(), 1, "{collected:?}");
    assert!(collected.agents[0].collected_time.is_some());
    // Settled before the crash, never collected.
    let second = common::spawn(&mut client, under_lead("output two")).await;
    await_one(&mut client, &second.id).await;

    server.signal(Signal::SIGKILL);
    let _ = server.exit_status().await;
    let server = ChildServer::start(&toml, &[]).await;
    let mut client = server.client().await;

    let first_after = await_one(&mut client, &first.id).await;
    assert_eq!(
        first_after.collected_time, collected.agents[0].collected_time,
        "the collect outlived the crash"
    );
    let next = client
        .r#await(inbox(true))
        .await
        .expect("Await")
        .into_inner();
    let ids: Vec<_> = next.agents.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, [second.id.as_str()], "only the uncollected one");
    let again = client
        .r#await(inbox(true))
        .await
        .expect("Await")
        .into_inner();
    assert!(again.timed_out && again.agents.is_empty(), "{again:?}");
}
