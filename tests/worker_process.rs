//! Issue 14 §4 end to end: `subagentd worker` runs agent types with the
//! built-in runners in a process of its own, against a real server (both
//! the built binary). The server declares the types `runner = "worker"`;
//! the worker's file says how it runs them. Its runs are steered,
//! cancelled, approved and guarded as in-process runs are, and SIGTERM
//! drains it. (Across a scheduler failover: `tests/ha.rs`.)

mod common;

use common::{
    child::{ChildServer, ChildWorker},
    openai::{completion, Fake},
};
use nix::sys::signal::Signal;
use subagentd::pb::{self, agent_service_client::AgentServiceClient, AgentEventKind as Kind};
use tonic::transport::Channel;

type Client = AgentServiceClient<Channel>;

/// A command type that echoes its prompt, then the first steer message.
const STEERED: &str = common::worker::STEERED_COMMAND_TYPE;

/// A command type that prints its pid and then sleeps until stopped.
const SLEEPER: &str = r#"[agents.sleeper]
runner = "command"
command = ["sh", "-c", "echo $$; exec sleep 1000"]
kill_grace = "200ms"
"#;

const SCRIPT: &str = "[agents.script]\nrunner = \"simulated\"\n";

/// The server's config: `extra` TOML, and each of `types` as a worker type.
fn server_toml(extra: &str, types: &[&str]) -> String {
    let mut toml =
        format!("[limits]\ndefault_concurrency = 0\nmax_background_agents = 100\n\n{extra}\n");
    for name in types {
        toml.push_str(&format!("[agents.{name}]\nrunner = \"worker\"\n"));
    }
    toml
}

/// The worker's config: `[worker]` lines, then its agent types.
fn worker_toml(worker: &str, types: &[&str]) -> String {
    format!("[worker]\nname = \"w1\"\n{worker}\n\n{}", types.join("\n"))
}

/// A server with the worker types `names`, and a worker process serving
/// them as `types` say.
async fn server_and_worker(
    server_extra: &str,
    worker: &str,
    names: &[&str],
    types: &[&str],
) -> (ChildServer, ChildWorker, Client) {
    let server = ChildServer::start(&server_toml(server_extra, names), &[]).await;
    let worker = ChildWorker::start(&server.addr, &worker_toml(worker, types)).await;
    let client = server.client().await;
    (server, worker, client)
}

fn bg(agent: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: agent.into(),
        ..common::bg("acme/gpt", prompt)
    }
}

async fn progress_watch(client: &mut Client) -> tonic::Streaming<pb::WatchAgentsResponse> {
    common::watch(
        client,
        pb::WatchAgentsRequest {
            include_progress: true,
            ..Default::default()
        },
    )
    .await
}

/// Reads progress until `id` outputs a chunk starting with `prefix`; returns it.
async fn output_of(
    events: &mut tonic::Streaming<pb::WatchAgentsResponse>,
    id: &str,
    prefix: &str,
) -> String {
    let event = common::wait_for(events, |ev| {
        ev.kind == Kind::Output as i32
            && ev.agent.as_ref().is_some_and(|a| a.id == id)
            && ev.output.starts_with(prefix)
    })
    .await;
    event.output
}

async fn settled(client: &mut Client, id: &str) -> pb::Agent {
    common::await_all(client, &[id]).await.remove(0)
}

fn error_code(agent: &pb::Agent) -> &str {
    agent.error.as_ref().map_or("", |e| e.code.as_str())
}

/// True once `pid` is no process, or a zombie that nothing runs in.
fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

#[tokio::test]
async fn a_command_type_runs_on_the_worker_process_and_is_steered() {
    let (_server, _worker, mut client) = server_and_worker("", "", &["coder"], &[STEERED]).await;
    let mut events = progress_watch(&mut client).await;
    let run = common::spawn(&mut client, bg("coder", "hello")).await;
    assert_eq!(
        output_of(&mut events, &run.id, "prompt=").await,
        "prompt=hello\n"
    );
    let running = common::status_of(&mut client, &run.id).await;
    assert!(
        !running.worker_id.is_empty(),
        "runs on the worker: {running:?}"
    );
    common::steer(&mut client, &run.id, "go on").await;
    let done = settled(&mut client, &run.id).await;
    assert_eq!(common::status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "prompt=hello\nsteer=go on\n");
    assert_eq!(done.attempt, 1);
}

#[tokio::test]
async fn a_cancelled_run_stops_its_program_and_the_worker_frees_its_slot_at_once() {
    // A cancel_grace far beyond the test: only the worker's confirmation
    // can free its one slot for the next run.
    let (_server, _worker, mut client) = server_and_worker(
        "[runs]\ncancel_grace = \"1h\"\n",
        "capacity = 1",
        &["sleeper", "script"],
        &[SLEEPER, SCRIPT],
    )
    .await;
    let mut events = progress_watch(&mut client).await;
    let run = common::spawn(&mut client, bg("sleeper", "sleep")).await;
    output_of(&mut events, &run.id, "").await;
    let worker_id = common::status_of(&mut client, &run.id).await.worker_id;
    let cancelled = common::cancel(&mut client, &run.id).await;
    assert_eq!(common::status(&cancelled[0]), pb::AgentStatus::Cancelled);

    let next = common::spawn(&mut client, bg("script", "sleep 100000")).await;
    let started = common::wait_for_event(&mut events, &next.id, Kind::Started).await;
    let started = started.agent.unwrap();
    assert_eq!(
        started.worker_id, worker_id,
        "on the one slot of the same worker"
    );
}

#[tokio::test]
async fn an_approval_pauses_the_workers_run_until_it_is_decided() {
    let (_server, _worker, mut client) = server_and_worker("", "", &["script"], &[SCRIPT]).await;
    let run = common::spawn(
        &mut client,
        bg("script", "output before\napprove shell\noutput after"),
    )
    .await;
    let waiting = settled(&mut client, &run.id).await;
    assert_eq!(
        common::status(&waiting),
        pb::AgentStatus::AwaitingApproval,
        "{waiting:?}"
    );
    let approval = waiting.approval.expect("the pending approval");
    assert_eq!(approval.tool_name, "shell");
    client
        .approve(pb::ApproveRequest {
            id: run.id.clone(),
            approval_id: approval.id,
            decision: pb::ApprovalDecision::Approve as i32,
            note: String::new(),
        })
        .await
        .expect("approve");
    let done = settled(&mut client, &run.id).await;
    assert_eq!(common::status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "before\napproved: shell\nafter");
}

#[tokio::test]
async fn the_run_guards_end_a_workers_run_and_free_its_slot() {
    let (_server, _worker, mut client) = server_and_worker(
        "[runs]\nmax_tool_calls = 2\nstale_timeout = \"1s\"\ncancel_grace = \"1h\"\n",
        "capacity = 1",
        &["sleeper", "script"],
        &[SLEEPER, SCRIPT],
    )
    .await;
    let looping = common::spawn(
        &mut client,
        bg("script", "tool grep\ntool grep\ntool grep\nsleep 100000"),
    )
    .await;
    let broken = settled(&mut client, &looping.id).await;
    assert_eq!(common::status(&broken), pb::AgentStatus::Cancelled);
    assert_eq!(error_code(&broken), "CIRCUIT_BREAKER", "{broken:?}");

    // The slot came back (the worker confirmed the stop), and a silent
    // program on it goes stale.
    let quiet = common::spawn(&mut client, bg("sleeper", "sleep")).await;
    let stale = settled(&mut client, &quiet.id).await;
    assert_eq!(common::status(&stale), pb::AgentStatus::Failed);
    assert_eq!(error_code(&stale), "STALE", "{stale:?}");
    let next = common::spawn(&mut client, bg("script", "output ok")).await;
    let next = settled(&mut client, &next.id).await;
    assert_eq!(common::status(&next), pb::AgentStatus::Done, "{next:?}");
}

#[tokio::test]
async fn an_openai_type_runs_on_the_worker_process() {
    let fake = Fake::start(|_| completion(&["Hel", "lo"], 7, 3)).await;
    let llm = format!(
        "[agents.llm]\nrunner = \"openai\"\nbase_url = \"{}\"\n",
        fake.base_url
    );
    let (_server, _worker, mut client) = server_and_worker("", "", &["llm"], &[&llm]).await;
    let mut events = progress_watch(&mut client).await;
    let run = common::spawn(&mut client, bg("llm", "say hello")).await;
    assert_eq!(output_of(&mut events, &run.id, "Hel").await, "Hel");
    let done = settled(&mut client, &run.id).await;
    assert_eq!(common::status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "Hello");
    let usage = done.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (7, 3));
    let request = &fake.requests()[0];
    assert_eq!(request.body["model"], "gpt");
    assert_eq!(
        request
            .header("traceparent")
            .map(|t| t.split('-').nth(1).unwrap().to_owned()),
        Some(done.trace_id.clone()),
        "the request joins the agent's trace"
    );
}

#[tokio::test]
async fn sigterm_drains_the_worker_it_gets_nothing_new_and_finishes_what_it_holds() {
    let (mut server, mut worker, mut client) =
        server_and_worker("", "capacity = 2", &["coder", "script"], &[STEERED, SCRIPT]).await;
    let mut events = progress_watch(&mut client).await;
    let held = common::spawn(&mut client, bg("coder", "held")).await;
    output_of(&mut events, &held.id, "prompt=").await;

    worker.signal(Signal::SIGTERM);
    server
        .log_line(|v| v["message"] == "worker draining: no new runs for it")
        .await;
    // A free slot, but the worker drains: the new agent waits.
    let waiting = common::spawn(&mut client, bg("script", "output later")).await;
    assert_eq!(
        common::status(&waiting),
        pb::AgentStatus::Queued,
        "{waiting:?}"
    );

    // Steer still reaches the held run, which finishes; then the worker
    // exits on its own.
    common::steer(&mut client, &held.id, "finish").await;
    let done = settled(&mut client, &held.id).await;
    assert_eq!(common::status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "prompt=held\nsteer=finish\n");
    worker.log_line(|v| v["message"] == "drained").await;
    assert_eq!(worker.exit_status().await.code(), Some(0));
    let still = common::status_of(&mut client, &waiting.id).await;
    assert_eq!(common::status(&still), pb::AgentStatus::Queued, "{still:?}");
}

#[tokio::test]
async fn a_run_unfinished_after_the_drain_grace_is_stopped_and_follows_the_worker_lost_rules() {
    let (_server, mut worker, mut client) =
        server_and_worker("", "drain_grace = \"300ms\"", &["sleeper"], &[SLEEPER]).await;
    let mut events = progress_watch(&mut client).await;
    let run = common::spawn(&mut client, bg("sleeper", "sleep")).await;
    let pid: i32 = output_of(&mut events, &run.id, "")
        .await
        .trim()
        .parse()
        .unwrap();

    worker.signal(Signal::SIGTERM);
    worker
        .log_line(|v| {
            v["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("drain grace over")
        })
        .await;
    assert_eq!(worker.exit_status().await.code(), Some(0));
    // The worker waited for the program's group before it exited.
    assert!(is_gone(pid), "the program was stopped");
    let lost = settled(&mut client, &run.id).await;
    assert_eq!(common::status(&lost), pb::AgentStatus::Failed, "{lost:?}");
    assert_eq!(error_code(&lost), "WORKER_LOST", "{lost:?}");
}

#[tokio::test]
async fn a_worker_started_before_its_server_connects_once_it_is_up() {
    // The port is free once the probe listener is dropped; the server
    // then binds it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut worker = ChildWorker::start_unconnected(&addr, &worker_toml("", &[SCRIPT]));
    worker
        .log_line(|v| v["message"] == "worker session ended; reconnecting")
        .await;
    let server = ChildServer::start_listening(&addr, &server_toml("", &["script"]), &[]).await;
    worker.connected().await;
    let mut client = server.client().await;
    let run = common::spawn(&mut client, bg("script", "output up")).await;
    let done = settled(&mut client, &run.id).await;
    assert_eq!(done.result, "up");
}

#[tokio::test]
async fn a_worker_config_the_server_does_not_match_is_refused_and_the_worker_exits() {
    // The server runs `script` in process: a worker cannot serve it.
    let server = ChildServer::start("[agents.script]\nrunner = \"simulated\"\n", &[]).await;
    let worker = ChildWorker::start_unconnected(&server.addr, &worker_toml("", &[SCRIPT]));
    let status = worker.exit_status().await;
    assert_eq!(status.code(), Some(1), "refused for good, not retried");
}

/// A worker key in a server with `[auth] mode = "required"`: the worker
/// sends it (`SUBAGENTD_TOKEN`) and serves its types; without it the
/// server refuses the session and the worker exits 1.
#[tokio::test]
async fn a_worker_authenticates_with_its_key_and_without_one_is_refused() {
    use subagentd::auth::keys;
    let worker_key = keys::generate("w1").unwrap();
    let front_key = keys::generate("f1").unwrap();
    let entry = |key: &str, roles: &str| {
        format!(
            "sha256 = \"{}\"\ntenant = \"t\"\nroles = [{roles}]\n",
            keys::digest_hex(&keys::digest(key))
        )
    };
    let auth = format!(
        "[auth]\nmode = \"required\"\n\n[auth.keys.w1]\n{}agent_types = [\"script\"]\n\n[auth.keys.f1]\n{}",
        entry(&worker_key, "\"worker\""),
        entry(&front_key, "\"frontend\""),
    );
    let server = ChildServer::start(&server_toml(&auth, &["script"]), &[]).await;

    let refused = ChildWorker::start_unconnected(&server.addr, &worker_toml("", &[SCRIPT]));
    assert_eq!(
        refused.exit_status().await.code(),
        Some(1),
        "no key: refused for good"
    );

    let mut worker = ChildWorker::start_unconnected_with_env(
        &server.addr,
        &worker_toml("", &[SCRIPT]),
        &[("SUBAGENTD_TOKEN", &worker_key)],
    );
    worker.connected().await;
    let mut client = server.client().await;
    let mut request = tonic::Request::new(bg("script", "output done"));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {front_key}").parse().unwrap(),
    );
    let agent = client
        .spawn(request)
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    let mut wait = tonic::Request::new(pb::AwaitRequest {
        ids: vec![agent.id.clone()],
        ..Default::default()
    });
    wait.metadata_mut().insert(
        "authorization",
        format!("Bearer {front_key}").parse().unwrap(),
    );
    let done = client
        .r#await(wait)
        .await
        .unwrap()
        .into_inner()
        .agents
        .remove(0);
    assert_eq!(done.status(), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "done");
}

#[tokio::test]
async fn a_worker_process_resumes_its_command_s_session_and_gives_simulated_runs_the_history() {
    // Writes "sess-<n>" as its session; with --resume ID it says so.
    let cli = r#"[agents.cli]
runner = "command"
command = ["sh", "-c", "cat > /dev/null; echo \"args: $*\"; echo \" sess-$$ \" > \"$SUBAGENTD_SESSION_FILE\"", "cli"]
continue_args = ["--resume", "{session}"]
"#;
    let (_server, _worker, mut client) =
        server_and_worker("", "", &["cli", "script"], &[cli, SCRIPT]).await;
    let first = common::spawn(&mut client, bg("cli", "start")).await;
    let first = settled(&mut client, &first.id).await;
    assert_eq!(first.result, "args: \n");
    let second = common::spawn(
        &mut client,
        pb::SpawnRequest {
            continue_from: first.id.clone(),
            prompt: "go on".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    let second = settled(&mut client, &second.id).await;
    assert_eq!(common::status(&second), pb::AgentStatus::Done, "{second:?}");
    // The session id as written, surrounding whitespace trimmed.
    let pid = second
        .result
        .strip_prefix("args: --resume sess-")
        .and_then(|rest| rest.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("resumed with the session written: {:?}", second.result));
    assert!(
        !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()),
        "{pid:?}"
    );

    // The simulated runner on the worker sees the earlier turns.
    let one = common::spawn(&mut client, bg("script", "output one")).await;
    let one = settled(&mut client, &one.id).await;
    let two = common::spawn(
        &mut client,
        pb::SpawnRequest {
            continue_from: one.id.clone(),
            prompt: "history".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    let two = settled(&mut client, &two.id).await;
    assert_eq!(
        two.result, "turn 1 prompt: output one\nturn 1 result: one",
        "{two:?}"
    );
}
