//! Issue 14 end to end: several real servers on one PostgreSQL database.
//! One leads; the others forward every call to it; a killed, frozen or
//! stopped leader is replaced by a standby.

mod common;

use std::time::{Duration, Instant};

use common::{
    child::{ChildServer, ChildWorker},
    postgres::Database,
    worker::{RawWorker, STEERED_COMMAND_TYPE},
};
use nix::sys::signal::Signal;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::Code;

/// Servers on `db` with the simulated agent type, lease `ttl`.
fn config(db: &Database, ttl: &str) -> String {
    format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{}\"\n\n[ha]\nlease_ttl = \"{ttl}\"\n\n\
         [limits]\ndefault_concurrency = 0\nmax_background_agents = 100\n\n[server]\nshutdown_grace = \"0s\"\n\n\
         [agents.simulated]\nrunner = \"simulated\"\n",
        db.url
    )
}

/// `subagentd_leader` as the server's metrics endpoint says.
async fn leader_gauge(server: &ChildServer) -> f64 {
    let body = reqwest::get(format!("http://{}/metrics", server.metrics))
        .await
        .expect("scrape answers")
        .text()
        .await
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("subagentd_leader "))
        .unwrap_or_else(|| panic!("no subagentd_leader in {body}"))
        .parse()
        .unwrap()
}

fn keyed(prompt: &str, key: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        idempotency_key: key.to_owned(),
        ..common::bg("acme/m", prompt)
    }
}

/// Waits for the log line saying this server leads and serves.
async fn serving_as_leader(server: &mut ChildServer) -> serde_json::Value {
    server
        .log_line(|v| v["message"] == "leading: serving")
        .await
}

/// A server that leads (started first, up once it serves), then one that
/// is its standby.
async fn leader_then_standby(toml: &str) -> (ChildServer, ChildServer) {
    let mut leader = ChildServer::start(toml, &[]).await;
    serving_as_leader(&mut leader).await;
    let standby = ChildServer::start(toml, &[]).await;
    (leader, standby)
}

/// A relayed error reads as the leader's: code, message, ErrorInfo and
/// field violations.
fn same_error(relayed: &tonic::Status, direct: &tonic::Status) {
    assert_eq!(
        (relayed.code(), relayed.message()),
        (direct.code(), direct.message())
    );
    assert_eq!(common::error_info(relayed), common::error_info(direct));
    use tonic_types::StatusExt;
    let fields = |s: &tonic::Status| {
        s.get_details_bad_request().map(|b| {
            b.field_violations
                .into_iter()
                .map(|v| (v.field, v.description))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(fields(relayed), fields(direct));
}

#[tokio::test]
async fn one_server_leads_and_a_standby_forwards_every_call_unchanged() {
    let Some(db) = Database::create().await else {
        return;
    };
    let toml = config(&db, "2s");
    let (leader, standby) = leader_then_standby(&toml).await;
    assert_eq!(leader_gauge(&leader).await, 1.0);
    assert_eq!(leader_gauge(&standby).await, 0.0);

    let mut via_standby = standby.client().await;
    let mut direct = leader.client().await;
    // A watch opened through the standby sees what the leader does.
    let mut events = common::watch(&mut via_standby, pb::WatchAgentsRequest::default()).await;
    let spawned = common::spawn(&mut via_standby, keyed("output forwarded", "k1")).await;
    let seen = common::status_of(&mut direct, &spawned.id).await;
    assert_eq!(seen.id, spawned.id, "the leader has the standby's spawn");
    let done = common::await_all(&mut via_standby, &[&spawned.id]).await;
    assert_eq!(common::status(&done[0]), pb::AgentStatus::Done);
    assert_eq!(done[0].result, "forwarded");
    common::wait_for(&mut events, |e| {
        e.agent
            .as_ref()
            .is_some_and(|a| a.id == spawned.id && common::status(a) == pb::AgentStatus::Done)
    })
    .await;
    // The idempotency key answers its first agent, through either server.
    let again = common::spawn(&mut direct, keyed("output other", "k1")).await;
    assert_eq!(again.id, spawned.id);

    // Errors come back with their code and details, as the leader's own
    // (clients/python/tests/test_standby_e2e.py checks the same with
    // grpc-core, which refuses what tonic's client tolerates).
    let unknown = pb::StatusRequest {
        ids: vec![uuid::Uuid::new_v4().to_string()],
        ..Default::default()
    };
    let missing = via_standby.status(unknown.clone()).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(common::error_info(&missing).0, "AGENT_NOT_FOUND");
    same_error(&missing, &direct.status(unknown).await.unwrap_err());
    let invalid = via_standby
        .spawn(pb::SpawnRequest::default())
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(!common::violated_fields(&invalid).is_empty(), "{invalid:?}");
    same_error(
        &invalid,
        &direct.spawn(pb::SpawnRequest::default()).await.unwrap_err(),
    );

    // A standby that stops ends the streams it relays (UNAVAILABLE, so
    // the client retries elsewhere) instead of holding its exit on them.
    assert_eq!(standby.stop().await.code(), Some(0));
    let ended = loop {
        match events.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the relayed watch ended OK"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    assert!(ended.message().contains("route to the leader"), "{ended:?}");
    assert_eq!(leader.stop().await.code(), Some(0));
}

/// Errors after messages and errors with quota details come through a
/// standby as the leader sends them: a watch the leader cuts off for
/// lagging (messages, then RESOURCE_EXHAUSTED with its resume hint), read
/// through the standby and directly, and the global cap's refusal.
#[tokio::test]
async fn a_leaders_error_after_messages_and_its_quota_details_read_the_same_through_a_standby() {
    let Some(db) = Database::create().await else {
        return;
    };
    let toml = config(&db, "2s")
        .replace("max_background_agents = 100", "max_background_agents = 2")
        .replace("[server]", "[watch]\nsubscriber_buffer = 8\n\n[server]");
    let (leader, standby) = leader_then_standby(&toml).await;
    // Slow watchers: small windows, not read during the flood.
    let small_window = |addr: String| async move {
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .initial_stream_window_size(Some(65_535))
            .connect()
            .await
            .unwrap();
        AgentServiceClient::new(channel)
    };
    let mut watchers = Vec::new();
    for server in [&standby, &leader] {
        let mut client = small_window(server.addr.clone()).await;
        watchers.push(common::watch(&mut client, pb::WatchAgentsRequest::default()).await);
    }
    // Foreground agents (not under the global cap) whose DONE events carry
    // 100 KiB each: far more than the windows of both hops hold.
    let mut direct = leader.client().await;
    let big = format!("output {}", "x".repeat(100 << 10));
    for _ in 0..100 {
        common::spawn(&mut direct, common::fg("acme/m", &big)).await;
    }
    let mut cuts = Vec::new();
    for mut watcher in watchers {
        let mut received = 0;
        let cut = loop {
            match watcher.message().await {
                Ok(Some(_)) => received += 1,
                Ok(None) => panic!("the lagging watch ended OK after {received} events"),
                Err(cut) => break cut,
            }
        };
        assert!(
            received > 0 && received < 200,
            "{received} events, then {cut:?}"
        );
        cuts.push(cut);
    }
    let (relayed, from_leader) = (&cuts[0], &cuts[1]);
    assert_eq!(relayed.code(), Code::ResourceExhausted, "{relayed:?}");
    assert!(relayed.message().contains("after_sequence"), "{relayed:?}");
    assert_eq!(
        common::error_info(relayed).0,
        common::error_info(from_leader).0
    );

    // The global cap: two live background agents, the third refused with
    // ErrorInfo and QuotaFailure, the same through the standby.
    for prompt in ["sleep 600000", "sleep 600000"] {
        common::spawn(&mut direct, common::bg("acme/m", prompt)).await;
    }
    let mut via_standby = standby.client().await;
    let third = || common::bg("acme/m", "output refused");
    let relayed = via_standby.spawn(third()).await.unwrap_err();
    let from_leader = direct.spawn(third()).await.unwrap_err();
    assert_eq!(relayed.code(), Code::ResourceExhausted);
    assert_eq!(common::error_info(&relayed).0, "GLOBAL_LIMIT_REACHED");
    same_error(&relayed, &from_leader);
    use tonic_types::StatusExt;
    let quota = |s: &tonic::Status| {
        s.get_details_quota_failure()
            .expect("QuotaFailure")
            .violations
            .into_iter()
            .map(|v| (v.subject, v.description))
            .collect::<Vec<_>>()
    };
    assert_eq!(quota(&relayed), quota(&from_leader));
    assert_eq!(standby.stop().await.code(), Some(0));
    assert_eq!(leader.stop().await.code(), Some(0));
}

#[tokio::test]
async fn a_server_that_cannot_reach_the_database_stays_up_and_answers_no_leader() {
    // Nothing listens on port 1: the database is down.
    let toml = "[store]\nbackend = \"postgres\"\nurl = \"postgres://subagentd@127.0.0.1:1/none?connect_timeout=1\"\n\n[ha]\nlease_ttl = \"1s\"\n";
    let mut server = ChildServer::start_unready(toml, &[]).await;
    server
        .log_line(|v| v["message"] == "cannot reach the lease; retrying")
        .await;
    let mut client = AgentServiceClient::new(server.channel().await);
    for _ in 0..2 {
        let refused = client.spawn(keyed("output x", "k")).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        assert_eq!(common::error_info(&refused).0, "NO_LEADER");
        let refused = client
            .status(pb::StatusRequest {
                ids: vec![uuid::Uuid::new_v4().to_string()],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(common::error_info(&refused).0, "NO_LEADER");
        // Still trying: another failed attempt is logged.
        server
            .log_line(|v| v["message"] == "cannot reach the lease; retrying")
            .await;
    }
    assert_eq!(leader_gauge(&server).await, 0.0);
    assert_eq!(server.stop().await.code(), Some(0));
}

/// Keyed spawns through `client`, one after another, each retried with the
/// same key while the service answers UNAVAILABLE (an election, a recovery,
/// a forwarded call whose leader went away), as a client would. Sends
/// (key, agent id) for every acknowledged call.
async fn keyed_load(
    mut client: AgentServiceClient<tonic::transport::Channel>,
    count: usize,
    acks: tokio::sync::mpsc::UnboundedSender<(String, String)>,
) {
    for i in 0..count {
        let key = format!("k{i}");
        let mut backoff = Duration::from_millis(10);
        loop {
            // A call that hangs would fail here, not hang the test.
            let answer = tokio::time::timeout(
                Duration::from_secs(10),
                client.spawn(keyed("sleep 600000", &key)),
            )
            .await
            .unwrap_or_else(|_| panic!("spawn {key} hung"));
            match answer {
                Ok(agent) => {
                    let id = agent.into_inner().agent.unwrap().id;
                    acks.send((key, id)).unwrap();
                    break;
                }
                Err(status) if status.code() == Code::Unavailable => {
                    // The client's retry backoff, not a wait for state.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(status) => panic!("spawn {key}: {status:?}"),
            }
        }
    }
}

/// (sequence, agent id) of every event a watch delivers until it ends; a
/// forwarded watch whose leader is killed ends UNAVAILABLE.
async fn watched_until_it_ends(
    mut stream: tonic::Streaming<pb::WatchAgentsResponse>,
) -> Vec<(u64, String)> {
    let mut seen = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(event)) => seen.push((event.sequence, event.agent.unwrap().id)),
            Ok(None) => panic!("a watch ended OK while its server was killed"),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                return seen;
            }
        }
    }
}

#[tokio::test]
async fn a_killed_leader_is_replaced_and_nothing_acknowledged_is_lost() {
    let Some(db) = Database::create().await else {
        return;
    };
    let toml = config(&db, "1s");
    let (first, mut second) = leader_then_standby(&toml).await;
    let mut via_second = second.client().await;
    // A watcher and a client with idempotency keys, both through the
    // standby, the client spawning throughout the kill.
    let watch = tokio::spawn(watched_until_it_ends(
        common::watch(&mut via_second, pb::WatchAgentsRequest::default()).await,
    ));
    const SPAWNS: usize = 60;
    let (acks_tx, mut acks_rx) = tokio::sync::mpsc::unbounded_channel();
    let load = tokio::spawn(keyed_load(via_second.clone(), SPAWNS, acks_tx));
    let mut acknowledged = Vec::new();
    while acknowledged.len() < 20 {
        acknowledged.push(acks_rx.recv().await.unwrap());
    }
    first.signal(Signal::SIGKILL);
    let killed = Instant::now();
    serving_as_leader(&mut second).await;
    let took = killed.elapsed();
    // lease_ttl + 5 s is the target with default settings; with a 1 s
    // lease the take-over is well within it.
    assert!(took < Duration::from_secs(6), "took {took:?}");
    while let Some(ack) = acks_rx.recv().await {
        acknowledged.push(ack);
    }
    load.await.unwrap();
    assert_eq!(acknowledged.len(), SPAWNS);

    let mut client = second.client().await;
    for (key, id) in &acknowledged {
        let agent = common::status_of(&mut client, id).await;
        assert_eq!(&agent.id, id);
        let again = common::spawn(&mut client, keyed("output new", key)).await;
        assert_eq!(&again.id, id, "key {key} returns its first agent");
    }

    // The watch resumes where it stopped: the new leader replays every
    // event after the last one seen, numbered on without a gap (nothing
    // here publishes progress events, so lifecycle events are consecutive),
    // and between them the two streams show every acknowledged agent.
    let before = watch.await.unwrap();
    let last_seen = before.last().map_or(0, |(seq, _)| *seq);
    assert!(
        before.windows(2).all(|w| w[1].0 == w[0].0 + 1),
        "{before:?}"
    );
    let mut resumed = common::watch(
        &mut client,
        pb::WatchAgentsRequest {
            after_sequence: last_seen,
            ..Default::default()
        },
    )
    .await;
    let mut unseen: std::collections::HashSet<&str> =
        acknowledged.iter().map(|(_, id)| id.as_str()).collect();
    for (_, id) in &before {
        unseen.remove(id.as_str());
    }
    let mut previous = last_seen;
    while !unseen.is_empty() {
        let event = common::wait_for(&mut resumed, |_| true).await;
        assert_eq!(event.sequence, previous + 1, "no gap, none twice");
        assert_ne!(event.kind, pb::AgentEventKind::Snapshot as i32, "replayed");
        previous = event.sequence;
        unseen.remove(event.agent.unwrap().id.as_str());
    }
    assert_eq!(leader_gauge(&second).await, 1.0);
    assert_eq!(second.stop().await.code(), Some(0));
}

#[tokio::test]
async fn sigterm_hands_the_lease_over_at_once_not_at_its_expiry() {
    let Some(db) = Database::create().await else {
        return;
    };
    // The default lease: a standby that waited for expiry would take 10 s,
    // one that polled up to 3.3 s.
    let toml = config(&db, "10s");
    let (first, mut second) = leader_then_standby(&toml).await;
    let mut via_second = second.client().await;
    let queued = common::spawn(&mut via_second, keyed("output after handover", "h")).await;
    let stopped = Instant::now();
    assert_eq!(first.stop().await.code(), Some(0));
    let elected = second
        .log_line(|v| v["message"] == "elected: this server leads")
        .await;
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(elected["epoch"].as_u64().unwrap() >= 2, "{elected}");
    serving_as_leader(&mut second).await;
    let mut client = second.client().await;
    let done = common::await_all(&mut client, &[&queued.id]).await;
    assert_eq!(common::status(&done[0]), pb::AgentStatus::Done);
    assert_eq!(second.stop().await.code(), Some(0));
}

/// Stops the leader of two servers with `[server] shutdown_grace = "5s"`
/// by SIGTERM, a worker run in flight or none; returns how long until the
/// standby was elected, and the standby.
async fn handover_with_grace(db: &Database, worker_run: bool) -> (Duration, ChildServer) {
    let toml = format!(
        "{}\n[agents.coder]\nrunner = \"worker\"\n",
        config(db, "10s").replace("shutdown_grace = \"0s\"", "shutdown_grace = \"5s\"")
    );
    let (first, mut second) = leader_then_standby(&toml).await;
    // The worker is connected through the standby (as behind a Service),
    // so the leader's exit does not wait on its connection.
    let mut worker = RawWorker::connect(&second, vec![]).await;
    let run = if worker_run {
        let mut client = second.client().await;
        let run = common::spawn(
            &mut client,
            pb::SpawnRequest {
                agent: "coder".into(),
                ..keyed("held across the handover", "g")
            },
        )
        .await;
        worker.assignments(1).await;
        Some(run)
    } else {
        None
    };
    let stopped = Instant::now();
    first.signal(Signal::SIGTERM);
    second
        .log_line(|v| v["message"] == "elected: this server leads")
        .await;
    let took = stopped.elapsed();
    assert_eq!(first.exit_status().await.code(), Some(0));
    serving_as_leader(&mut second).await;
    if let Some(run) = run {
        // Held for its worker to re-attach, not failed or retried.
        let mut client = second.client().await;
        let held = common::status_of(&mut client, &run.id).await;
        assert_eq!(
            (common::status(&held), held.attempt),
            (pb::AgentStatus::Running, 1)
        );
    }
    drop(worker);
    (took, second)
}

#[tokio::test]
async fn sigterm_with_only_a_worker_run_in_flight_hands_over_without_the_grace() {
    let Some(db) = Database::create().await else {
        return;
    };
    let (took, second) = handover_with_grace(&db, true).await;
    // The grace is 5 s: a leader that waited for the worker run's end
    // would hand over after it.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(second.stop().await.code(), Some(0));
}

#[tokio::test]
async fn sigterm_with_no_run_at_all_hands_over_without_the_grace() {
    let Some(db) = Database::create().await else {
        return;
    };
    let (took, second) = handover_with_grace(&db, false).await;
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(second.stop().await.code(), Some(0));
}

/// A command type whose program holds an exclusive lock on `dir/lock` for
/// its whole life and logs `start` to `dir/log` — or `overlap` when another
/// run of it still holds the lock — then prints `started`.
fn locking_program_type(dir: &std::path::Path) -> String {
    let script = "exec 9>>\"$DIR/lock\"; \
                  if ! flock -n 9; then echo overlap >> \"$DIR/log\"; flock 9; fi; \
                  echo start >> \"$DIR/log\"; echo started; exec sleep 600";
    format!(
        "[agents.prog]\nrunner = \"command\"\ncommand = [\"sh\", \"-c\", {script:?}]\n\
         env = {{ DIR = {:?} }}\nretry_on_restart = 1\nkill_grace = \"1s\"\n",
        dir.display().to_string()
    )
}

#[tokio::test]
async fn a_frozen_leader_that_wakes_after_it_was_replaced_steps_down_and_becomes_a_standby() {
    let Some(db) = Database::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "{}\n{}",
        config(&db, "1s"),
        locking_program_type(dir.path())
    );
    let (mut first, mut second) = leader_then_standby(&toml).await;
    let mut client = first.client().await;
    let mut progress = common::watch(
        &mut client,
        pb::WatchAgentsRequest {
            include_progress: true,
            ..Default::default()
        },
    )
    .await;
    let running = common::spawn(
        &mut client,
        pb::SpawnRequest {
            agent: "prog".into(),
            ..keyed("go", "r")
        },
    )
    .await;
    assert_eq!(common::status(&running), pb::AgentStatus::Running);
    common::wait_for_event(&mut progress, &running.id, pb::AgentEventKind::Output).await;
    first.signal(Signal::SIGSTOP);
    serving_as_leader(&mut second).await;
    // The new leader stopped the frozen leader's program (same host: its
    // recorded process group) before it ran the agent again.
    let mut client = second.client().await;
    let mut progress = common::watch(
        &mut client,
        pb::WatchAgentsRequest {
            ids: vec![running.id.clone()],
            include_progress: true,
            include_snapshot: true,
            ..Default::default()
        },
    )
    .await;
    common::wait_for(&mut progress, |e| {
        e.kind == pb::AgentEventKind::Output as i32
            && e.agent.as_ref().is_some_and(|a| a.attempt == 2)
    })
    .await;
    first.signal(Signal::SIGCONT);
    // It steps down before anything else, stopping its runs, and becomes
    // a standby of the new leader in the same process, on the same port.
    first
        .log_line(|v| {
            v["message"]
                == "lost the leader lease: stopped every in-process run; becoming a standby"
        })
        .await;
    // Both, in either order: a standby that starts again after a refused
    // commit may learn the leader before its listening line.
    let (listening, forwarding) = (
        "subagentd listening as a standby; electing a leader",
        "forwarding to the leader",
    );
    let seen = first
        .log_line(|v| v["message"] == listening || v["message"] == forwarding)
        .await;
    let other = if seen["message"] == listening {
        forwarding
    } else {
        listening
    };
    first.log_line(|v| v["message"] == other).await;
    // It wrote nothing: the agent is the new leader's second attempt, still
    // running (seen through the old leader, which now forwards), and the
    // program never ran twice at once.
    let mut via_old_leader = first.client().await;
    let after = common::status_of(&mut via_old_leader, &running.id).await;
    assert_eq!(
        (common::status(&after), after.attempt),
        (pb::AgentStatus::Running, 2)
    );
    assert_eq!(leader_gauge(&first).await, 0.0);
    assert_eq!(leader_gauge(&second).await, 1.0);
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert_eq!(log, "start\nstart\n", "one run at a time");
    common::cancel(&mut client, &running.id).await;
    assert_eq!(first.stop().await.code(), Some(0));
    assert_eq!(second.stop().await.code(), Some(0));
}

/// A worker connected through a standby gets its assignments from the
/// leader; when the leader is killed, the standby leads, and the worker,
/// reconnecting, re-attaches its run and finishes it.
#[tokio::test]
async fn a_worker_behind_a_standby_keeps_its_run_across_a_failover() {
    let Some(db) = Database::create().await else {
        return;
    };
    let toml = format!(
        "{}\n[agents.coder]\nrunner = \"worker\"\n",
        config(&db, "1s")
    );
    let (first, mut second) = leader_then_standby(&toml).await;
    let mut worker = RawWorker::connect(&second, vec![]).await;
    let mut client = second.client().await;
    let run = common::spawn(
        &mut client,
        pb::SpawnRequest {
            agent: "coder".into(),
            ..keyed("survive the failover", "w")
        },
    )
    .await;
    let assigned = worker.assignments(1).await.remove(0).agent.unwrap();
    assert_eq!(
        (assigned.id.as_str(), assigned.attempt),
        (run.id.as_str(), 1)
    );

    first.signal(Signal::SIGKILL);
    // The relayed session ends UNAVAILABLE (not a reset, not a hang).
    let ended = tokio::time::timeout(Duration::from_secs(10), worker.rx.message())
        .await
        .expect("the relayed session ends");
    let status = ended.expect_err("the session ends with an error");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    drop(worker);
    serving_as_leader(&mut second).await;

    let worker = RawWorker::connect(
        &second,
        vec![pb::HeldRun {
            agent_id: run.id.clone(),
            attempt: 1,
        }],
    )
    .await;
    worker.done(&run.id, "finished after the failover");
    let mut client = second.client().await;
    let done = common::await_all(&mut client, &[&run.id]).await;
    assert_eq!(common::status(&done[0]), pb::AgentStatus::Done);
    assert_eq!(done[0].result, "finished after the failover");
    assert_eq!(done[0].attempt, 1, "re-attached, not retried");
    assert_eq!(second.stop().await.code(), Some(0));
}

/// A leader and a standby with the worker type `coder`, a `subagentd
/// worker` behind the standby (as behind a Kubernetes Service), and a
/// `coder` run on it that has printed its prompt.
async fn worker_run_behind_a_standby(
    db: &Database,
) -> (ChildServer, ChildServer, ChildWorker, pb::Agent) {
    let toml = format!(
        "{}\n[agents.coder]\nrunner = \"worker\"\n",
        config(db, "1s")
    );
    let (first, second) = leader_then_standby(&toml).await;
    let worker = ChildWorker::start(
        &second.addr,
        &format!("[worker]\nname = \"w\"\n\n{STEERED_COMMAND_TYPE}"),
    )
    .await;
    let mut client = second.client().await;
    let mut events = common::watch(
        &mut client,
        pb::WatchAgentsRequest {
            include_progress: true,
            ..Default::default()
        },
    )
    .await;
    let run = common::spawn(
        &mut client,
        pb::SpawnRequest {
            agent: "coder".into(),
            ..keyed("across", "w")
        },
    )
    .await;
    common::wait_for(&mut events, |ev| {
        ev.kind == pb::AgentEventKind::Output as i32
            && ev.agent.as_ref().is_some_and(|a| a.id == run.id)
    })
    .await;
    (first, second, worker, run)
}

/// Steers `run` (retrying while the new leader is not reachable yet) and
/// checks that the one program saw it: DONE, first attempt, one prompt.
async fn steered_to_the_end(server: &ChildServer, run: &pb::Agent) {
    let mut client = server.client().await;
    common::steer(&mut client, &run.id, "after").await;
    let done = common::await_all(&mut client, &[&run.id]).await.remove(0);
    assert_eq!(common::status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(
        done.result, "prompt=across\nsteer=after\n",
        "one program, uninterrupted"
    );
    assert_eq!(done.attempt, 1, "re-attached, not retried");
}

#[tokio::test]
async fn a_worker_process_run_started_before_the_leader_is_killed_finishes_done_after_it() {
    let Some(db) = Database::create().await else {
        return;
    };
    let (first, mut second, mut worker, run) = worker_run_behind_a_standby(&db).await;
    first.signal(Signal::SIGKILL);
    serving_as_leader(&mut second).await;
    // Steered while the worker may still be reconnecting: delivered after
    // its re-attach.
    steered_to_the_end(&second, &run).await;
    worker.connected().await;
    worker.signal(Signal::SIGTERM);
    assert_eq!(worker.exit_status().await.code(), Some(0));
    assert_eq!(second.stop().await.code(), Some(0));
}

#[tokio::test]
async fn a_rolling_handover_by_sigterm_never_interrupts_a_worker_run() {
    let Some(db) = Database::create().await else {
        return;
    };
    let (first, mut second, mut worker, run) = worker_run_behind_a_standby(&db).await;
    assert_eq!(first.stop().await.code(), Some(0));
    serving_as_leader(&mut second).await;
    worker.connected().await;
    steered_to_the_end(&second, &run).await;
    assert_eq!(second.stop().await.code(), Some(0));
}

/// What each live server's `subagentd_leader` says; a server that does not
/// answer (killed) counts as not leading.
async fn leaders(servers: &[&ChildServer]) -> Vec<bool> {
    let mut out = Vec::with_capacity(servers.len());
    for server in servers {
        let scraped = async {
            let body = reqwest::get(format!("http://{}/metrics", server.metrics))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            body.lines()
                .find_map(|l| l.strip_prefix("subagentd_leader "))
                .map(|v| v == "1")
        };
        out.push(scraped.await.unwrap_or(false));
    }
    out
}

#[tokio::test]
async fn of_three_servers_exactly_one_leads_before_and_after_a_kill() {
    let Some(db) = Database::create().await else {
        return;
    };
    let toml = config(&db, "1s");
    let mut first = ChildServer::start(&toml, &[]).await;
    serving_as_leader(&mut first).await;
    let mut others = vec![
        ChildServer::start(&toml, &[]).await,
        ChildServer::start(&toml, &[]).await,
    ];
    assert_eq!(
        leaders(&[&first, &others[0], &others[1]]).await,
        [true, false, false]
    );
    first.signal(Signal::SIGKILL);
    // Polled through the take-over: never two leaders, and then one.
    let elected = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let now = leaders(&[&others[0], &others[1]]).await;
            assert!(now.iter().filter(|l| **l).count() <= 1, "{now:?}");
            if let Some(i) = now.iter().position(|l| *l) {
                return i;
            }
        }
    })
    .await
    .expect("a standby leads");
    serving_as_leader(&mut others[elected]).await;
    for _ in 0..20 {
        let now = leaders(&[&others[0], &others[1]]).await;
        let mut expected = [false, false];
        expected[elected] = true;
        assert_eq!(now, expected);
    }
    // The one left a standby forwards to the new leader (once it has
    // learnt of it: its election polls every third of the lease).
    let new_leader = others[elected].addr.clone();
    others[1 - elected]
        .log_line(|v| v["message"] == "forwarding to the leader" && v["leader"] == new_leader)
        .await;
    let mut via_standby = others[1 - elected].client().await;
    common::spawn(&mut via_standby, keyed("output after", "after")).await;
    for server in others {
        assert_eq!(server.stop().await.code(), Some(0));
    }
}

/// `/mcp` on a standby (issue 33 §4): its tools call the standby's own
/// gRPC API, which forwards to the leader, so an agent spawned through a
/// standby's `/mcp` lives on the leader and its result comes back there.
#[tokio::test]
async fn mcp_over_http_on_a_standby_reaches_the_leader() {
    use rmcp::{
        model::CallToolRequestParams,
        transport::{
            streamable_http_client::StreamableHttpClientTransportConfig,
            StreamableHttpClientTransport,
        },
        ServiceExt,
    };
    let Some(db) = Database::create().await else {
        return;
    };
    let toml = config(&db, "2s");
    let (leader, standby) = leader_then_standby(&toml).await;
    let mut headers = std::collections::HashMap::new();
    headers.insert(
        http::HeaderName::from_static("subagentd-lead-id"),
        http::HeaderValue::from_static("standby-lead"),
    );
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", standby.http))
            .custom_headers(headers),
    );
    let client = ().serve(transport).await.expect("MCP on the standby");
    let args = serde_json::json!({
        "prompt": "output via the standby", "agent": "simulated", "description": null,
        "model": "acme/m", "wait_seconds": 10, "timeout_minutes": null, "continue_from": null,
        "fork": null,
    });
    let result = client
        .call_tool(
            CallToolRequestParams::new("agent_spawn")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let spawned = result.structured_content.expect("structured content");
    assert_eq!(spawned["status"], "done", "{spawned}");
    assert_eq!(spawned["result"], "via the standby");
    let id = spawned["id"].as_str().unwrap();
    let on_leader = common::status_of(&mut leader.client().await, id).await;
    assert_eq!(on_leader.lead_id, "standby-lead");
    assert!(
        on_leader.collected_time.is_some(),
        "collected on the leader"
    );
    client.cancel().await.unwrap();
}

/// `subagentd mcp` in front of a server that knows no leader: it starts
/// anyway (a host starts its MCP servers early), and a tool call retries
/// `NO_LEADER` a few times, then answers it as a tool error the model can
/// read, not a protocol error.
#[tokio::test]
async fn mcp_tools_retry_no_leader_then_report_it() {
    use rmcp::{
        model::CallToolRequestParams,
        transport::{ConfigureCommandExt, TokioChildProcess},
        ServiceExt,
    };
    let toml = "[store]\nbackend = \"postgres\"\nurl = \"postgres://subagentd@127.0.0.1:1/none?connect_timeout=1\"\n\n[ha]\nlease_ttl = \"1s\"\n";
    let mut server = ChildServer::start_unready(toml, &[]).await;
    server
        .log_line(|v| v["message"] == "cannot reach the lease; retrying")
        .await;
    let addr = server.addr.clone();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
        c.args(["mcp", "--addr", &addr, "--lead-id", "no-leader"])
            .env_remove("SUBAGENTD_AGENT_ID")
            .env_remove("SUBAGENTD_TOKEN");
    });
    let client =
        ().serve(TokioChildProcess::new(command).unwrap())
            .await
            .expect("subagentd mcp starts without a leader");
    let args = serde_json::json!({
        "prompt": "output x", "agent": "simulated", "description": null, "model": "acme/m",
        "wait_seconds": null, "timeout_minutes": null, "continue_from": null, "fork": null,
    });
    let refused = client
        .call_tool(
            CallToolRequestParams::new("agent_spawn")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .expect("a tool result, not a protocol error");
    assert_eq!(refused.is_error, Some(true));
    let text = refused.content[0].as_text().unwrap().text.clone();
    assert!(text.starts_with("Refused (NO_LEADER)"), "{text}");
    // Tried five times (with backoff) before it was reported.
    let body = reqwest::get(format!("http://{}/metrics", server.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let tries = body
        .lines()
        .find(|l| {
            l.starts_with("subagentd_rpc_requests_total{")
                && l.contains("method=\"GetServerInfo\"")
                && l.contains("code=\"UNAVAILABLE\"")
        })
        .unwrap_or_else(|| panic!("no refused GetServerInfo in {body}"));
    assert!(tries.ends_with(" 5"), "{tries}");
    client.cancel().await.unwrap();
    assert_eq!(server.stop().await.code(), Some(0));
}
