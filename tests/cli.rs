//! The binary as people and scripts use it: `serve` flags and config errors,
//! and the client subcommands against a real server.

mod common;

use std::process::Command;

use common::{cli::*, *};

#[test]
fn dump_config_prints_the_effective_config_with_env_overrides() {
    let out = Command::new(env!("CARGO_BIN_EXE_subagentd"))
        .args(["serve", "--dump-config", "--listen", "127.0.0.1:6000"])
        .env("SUBAGENTD_LIMITS__MAX_BACKGROUND_AGENTS", "11")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("max_background_agents = 11"), "{text}");
    assert!(text.contains("listen = \"127.0.0.1:6000\""), "{text}");
    assert!(text.contains("default_timeout = \"30m\""), "{text}");
    assert!(text.contains("[agents.simulated]"), "{text}");
}

/// The issue-31 case: `[ha]`, `[auth]` and `[tenants]` through the
/// environment, and a variable naming no section refused by `serve` and
/// `worker` alike, `--dump-config` included.
#[test]
fn dump_config_reads_every_section_from_the_environment_and_refuses_an_unknown_one() {
    let dump = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_subagentd"));
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let out = dump(
        &["serve", "--dump-config"],
        &[
            ("SUBAGENTD_HA__LEASE_TTL", "4s"),
            ("SUBAGENTD_AUTH__KEYS_DIR", "/etc/env-keys"),
            ("SUBAGENTD_TENANTS__ACME__MAX_BACKGROUND_AGENTS", "3"),
            // The worker's section: not the server's business.
            ("SUBAGENTD_WORKER__CAPACITY", "2"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("lease_ttl = \"4s\""), "{text}");
    assert!(text.contains("keys_dir = \"/etc/env-keys\""), "{text}");
    assert!(text.contains("[tenants.acme]"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let worker_file = dir.path().join("worker.toml");
    std::fs::write(&worker_file, "[agents.a]\nrunner = \"simulated\"\n").unwrap();
    let worker_file = worker_file.to_str().unwrap();
    let worker_args = [
        "worker",
        "--server",
        "http://127.0.0.1:1",
        "--config",
        worker_file,
        "--dump-config",
    ];
    let out = dump(&worker_args, &[("SUBAGENTD_HA__LEASE_TTL", "4s")]);
    assert!(out.status.success(), "{}", stderr(&out));
    for args in [&["serve", "--dump-config"][..], &worker_args[..]] {
        let out = dump(args, &[("SUBAGENTD_LIMIT__MAX_DEPTH", "2")]);
        assert!(!out.status.success(), "{args:?}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(
            err.contains("SUBAGENTD_LIMIT__MAX_DEPTH"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn an_invalid_config_exits_non_zero_naming_the_key_and_rule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[limits]\nmax_background_agents = 0\n").unwrap();
    let out = subagentd(&["serve", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("max_background_agents") && err.contains("≥ 1"),
        "{err}"
    );

    let out = subagentd(&["serve", "--config", "/nonexistent/subagentd.toml"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
}

#[tokio::test]
async fn client_subcommands_round_trip_and_report_errors_with_exit_codes() {
    let s = TestServer::start("").await;
    let addr = format!("http://{}", s.handle.addr());

    // Foreground spawn prints the finished agent as JSON.
    let out = subagentd_async(
        [
            "spawn",
            "--addr",
            &addr,
            "--json",
            "--agent",
            "simulated",
            "--model",
            "acme/m",
            "--prompt",
            "hello",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let agent: serde_json::Value =
        serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(agent["status"], "AGENT_STATUS_DONE");
    assert_eq!(agent["result"], "hello");
    let id = agent["id"].as_str().unwrap().to_owned();

    // Status by id.
    let out = subagentd_async(
        ["status", "--addr", &addr, "--json", &id]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&id));

    // Await that times out exits 2.
    let out = subagentd_async(
        [
            "spawn",
            "--addr",
            &addr,
            "--json",
            "--background",
            "--agent",
            "simulated",
            "--model",
            "acme/m",
            "--prompt",
            "wait_steer",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let waiting: serde_json::Value =
        serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    let waiting_id = waiting["id"].as_str().unwrap().to_owned();
    let out = subagentd_async(
        ["await", "--addr", &addr, "--timeout", "50ms", &waiting_id]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // Steer then await succeeds.
    let out = subagentd_async(
        ["steer", "--addr", &addr, &waiting_id, "go"]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = subagentd_async(
        [
            "await",
            "--addr",
            &addr,
            "--json",
            "--timeout",
            "10s",
            &waiting_id,
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("steer: go"), "{}", stdout(&out));

    // An error status exits 1 and prints the code and the reason.
    let out = subagentd_async(
        [
            "spawn", "--addr", &addr, "--agent", "nope", "--model", "a/b", "--prompt", "x",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("INVALID_ARGUMENT") && err.contains("UNKNOWN_AGENT_TYPE"),
        "{err}"
    );

    let unknown = uuid::Uuid::new_v4().to_string();
    let out = subagentd_async(
        ["cancel", "--addr", &addr, "--id", &unknown]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("NOT_FOUND"), "{}", stderr(&out));

    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_await_whose_client_went_away_leaves_no_waiter_behind() {
    let s = TestServer::start("").await;
    let mut client = s.client.clone();
    let agent = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    let mut waiter_client = s.new_client().await;
    let id = agent.id.clone();
    let call = tokio::spawn(async move {
        waiter_client
            .r#await(subagentd::pb::AwaitRequest {
                ids: vec![id],
                timeout: Some(prost_types::Duration {
                    seconds: 600,
                    nanos: 0,
                }),
                mode: 0,
                ..Default::default()
            })
            .await
    });
    let scheduler = s.handle.scheduler().clone();
    // The waiter appears once the server is inside the Await...
    wait_until(|| scheduler.inspect(|c| c.waiter_count()) == 1).await;
    call.abort();
    // ...and is gone once the server notices the cancelled call.
    wait_until(|| scheduler.inspect(|c| c.waiter_count()) == 0).await;
    s.handle.shutdown().await.unwrap();
}

/// Polls a server-internal condition that has no event (bounded, 10 s).
async fn wait_until(cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached in 10 s"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn watch_prints_a_snapshot_then_live_events_as_json_lines() {
    let s = TestServer::start("").await;
    let mut client = s.client.clone();
    let existing = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    let addr = format!("http://{}", s.handle.addr());
    let mut watch = CliChild::start(&["watch", "--addr", &addr, "--json", "--snapshot"]);
    let snapshot = watch.next_json().await;
    assert_eq!(snapshot["kind"], "AGENT_EVENT_KIND_SNAPSHOT");
    assert_eq!(snapshot["agent"]["id"], existing.id.as_str());
    // The snapshot was printed, so the subscription exists: a steer now is a
    // live event.
    client
        .steer(subagentd::pb::SteerRequest {
            id: existing.id.clone(),
            message: "go".into(),
        })
        .await
        .unwrap();
    let steered = watch.next_json().await;
    assert_eq!(steered["kind"], "AGENT_EVENT_KIND_STEERED");
    assert!(steered["sequence"].as_u64().unwrap() > snapshot["sequence"].as_u64().unwrap());
    let done = watch.next_json().await;
    assert_eq!(done["kind"], "AGENT_EVENT_KIND_DONE");
    assert_eq!(done["agent"]["result"], "steer: go");
    watch.kill().await;
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn spawn_continues_an_agent_and_transcript_prints_the_conversation() {
    let s = TestServer::start("").await;
    let addr = format!("http://{}", s.handle.addr());
    let run = |args: Vec<&str>| subagentd_async(args.into_iter().map(String::from).collect());
    let out = run(vec![
        "spawn",
        "--addr",
        &addr,
        "--json",
        "--agent",
        "simulated",
        "--model",
        "acme/m",
        "--prompt",
        "output one",
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let first: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let first_id = first["id"].as_str().unwrap().to_owned();
    // No --agent or --model: both inherited.
    let out = run(vec![
        "spawn",
        "--addr",
        &addr,
        "--json",
        "--continue-from",
        &first_id,
        "--prompt",
        "output two\nmore",
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let second: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(second["turn"], 2);
    assert_eq!(second["conversationId"], first_id.as_str());
    let second_id = second["id"].as_str().unwrap().to_owned();

    let out = run(vec!["transcript", "--addr", &addr, &second_id]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            format!("conversation {first_id}"),
            format!("turn 1  prompt     {first_id}  output one"),
            format!("turn 1  result     {first_id}  one"),
            format!("turn 2  prompt     {second_id}  output two"),
            "    more".to_owned(),
            format!("turn 2  result     {second_id}  two"),
            "    more".to_owned(),
        ],
        "{text}"
    );
    // By conversation id, as JSON lines, one page of two at a time.
    let out = run(vec![
        "transcript",
        "--addr",
        &addr,
        "--json",
        "--conversation",
        "--page-size",
        "2",
        &first_id,
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let kinds: Vec<String> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"].to_string())
        .collect();
    assert_eq!(kinds.len(), 4, "every page: {kinds:?}");
    assert_eq!(kinds[0], "\"TRANSCRIPT_ENTRY_KIND_PROMPT\"");
    // A live-agent refusal exits non-zero with the reason.
    let out = run(vec![
        "spawn",
        "--addr",
        &addr,
        "--continue-from",
        &first_id,
        "--prompt",
        "again",
    ])
    .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("NOT_LATEST"), "{}", stderr(&out));
}
