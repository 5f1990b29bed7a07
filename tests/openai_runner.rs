//! The `openai` runner against a small OpenAI-wire-compatible server that
//! each test runs in process (axum on 127.0.0.1:0): the streamed deltas as
//! OUTPUT progress and the final text as the result, usage from the usage
//! chunk, the request body and headers (model mapping, system prompt,
//! max_tokens, temperature, Authorization, traceparent), retries of 429 and
//! 5xx and their bound, provider errors, cancel and deadline aborting the
//! HTTP request, multi-turn steering, a missing API key, an unreachable
//! server, and config validation of the openai keys.
//!
//! The fake server records every request (headers and JSON body) and
//! reports its arrival on a channel; streams that must stay open wait on a
//! gate the test opens, or hold forever with a guard that signals when the
//! server drops the response body — so no test sleeps to wait for state.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{openai::*, *};
use serde_json::json;
use subagentd::{
    config::{ConfigError, ConfigSource},
    pb::{self, agent_service_client::AgentServiceClient, AgentEventKind as Kind},
    runner::openai::MAX_ATTEMPTS,
};
use tokio::sync::{oneshot, Notify};
use tonic::transport::Channel;

type Client = AgentServiceClient<Channel>;
type Events = tonic::Streaming<pb::WatchAgentsResponse>;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// ----- helpers -----------------------------------------------------------------

/// `[agents.NAME]` of the openai runner at `base_url` with extra TOML lines.
fn openai_type(name: &str, base_url: &str, extra: &str) -> String {
    format!("[agents.{name}]\nrunner = \"openai\"\nbase_url = \"{base_url}\"\n{extra}\n")
}

/// A background Spawn of agent type `agent` on `model`.
fn spawn_req(agent: &str, model: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: agent.into(),
        ..bg(model, prompt)
    }
}

/// Spawns with a `traceparent` in the call's metadata.
async fn spawn_traced(client: &mut Client, req: pb::SpawnRequest) -> pb::Agent {
    let mut request = tonic::Request::new(req);
    request
        .metadata_mut()
        .insert("traceparent", TRACEPARENT.parse().unwrap());
    client
        .spawn(request)
        .await
        .expect("spawn succeeds")
        .into_inner()
        .agent
        .expect("agent set")
}

/// Awaits one agent and returns it ended.
async fn ended(client: &mut Client, id: &str) -> pb::Agent {
    let agent = await_all(client, &[id]).await.remove(0);
    assert_eq!(agent.id, id);
    agent
}

/// Asserts `agent` FAILED with `code`; returns the error message.
fn failed_with(agent: &pb::Agent, code: &str) -> String {
    assert_eq!(status(agent), pb::AgentStatus::Failed, "{agent:?}");
    let error = agent.error.as_ref().expect("a failed agent has an error");
    assert_eq!(error.code, code, "{error:?}");
    error.message.clone()
}

fn usage(agent: &pb::Agent) -> (u64, u64, u64) {
    let u = agent.usage.as_ref().expect("usage");
    (u.input_tokens, u.output_tokens, u.tool_calls)
}

/// A watcher of every agent's events, progress included.
async fn watch_progress(client: &mut Client) -> Events {
    watch(
        client,
        pb::WatchAgentsRequest {
            include_progress: true,
            ..Default::default()
        },
    )
    .await
}

/// The OUTPUT chunks of `id` until its terminal event.
async fn outputs_until_end(events: &mut Events, id: &str) -> Vec<String> {
    let mut outputs = Vec::new();
    loop {
        let ev = tokio::time::timeout(GUARD, events.message())
            .await
            .expect("an event arrives within the guard")
            .expect("watch stream ok")
            .expect("watch stream open");
        if ev.agent.as_ref().map(|a| a.id.as_str()) != Some(id) {
            continue;
        }
        match Kind::try_from(ev.kind).expect("known kind") {
            Kind::Output => outputs.push(ev.output),
            Kind::Done | Kind::Failed | Kind::Cancelled => return outputs,
            _ => {}
        }
    }
}

/// Waits for the OUTPUT event `chunk` of `id`.
async fn wait_for_output(events: &mut Events, id: &str, chunk: &str) {
    wait_for(events, |ev| {
        ev.kind == Kind::Output as i32
            && ev.agent.as_ref().map(|a| a.id.as_str()) == Some(id)
            && ev.output == chunk
    })
    .await;
}

/// Waits for the fake server to drop a held response body.
async fn dropped(rx: oneshot::Receiver<()>, what: &str) {
    tokio::time::timeout(GUARD, rx)
        .await
        .unwrap_or_else(|_| panic!("{what}: the HTTP response was not dropped within {GUARD:?}"))
        .expect("drop signal sent");
}

// ----- streaming, request shape and headers ------------------------------------

#[tokio::test]
async fn a_streamed_completion_becomes_output_result_and_usage_and_the_request_is_shaped_by_the_config(
) {
    let key_var = "SUBAGENTD_TEST_OPENAI_KEY_STREAMING";
    let key = "sk-test-streaming-0123456789";
    std::env::set_var(key_var, key);
    let fake = Fake::start(|_| completion(&["Hel", "lo", " world"], 12, 5)).await;
    let toml = format!(
        "{}{}",
        openai_type(
            "full",
            &fake.base_url,
            &format!(
                "api_key_env = \"{key_var}\"\nsystem_prompt = \"You are terse.\"\n\
                 max_tokens = 64\ntemperature = 0.25\n\
                 model_map = {{ \"local/fast\" = \"qwen-fast\" }}"
            ),
        ),
        openai_type("plain", &fake.base_url, ""),
    );
    let mut s = TestServer::start(&toml).await;
    let mut events = watch_progress(&mut s.client).await;

    // The plain type: default model mapping, no key, no trace context.
    let plain = spawn(
        &mut s.client,
        spawn_req("plain", "local/qwen2.5:7b", "Say hello."),
    )
    .await;
    let outputs = outputs_until_end(&mut events, &plain.id).await;
    assert_eq!(outputs, ["Hel", "lo", " world"], "OUTPUT events in order");
    let done = ended(&mut s.client, &plain.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "Hello world");
    assert_eq!(usage(&done), (12, 5, 0));

    // The full type: model_map, key, system prompt, sampling, traceparent.
    let full = spawn_traced(
        &mut s.client,
        spawn_req("full", "local/fast", "Say hello again."),
    )
    .await;
    let outputs = outputs_until_end(&mut events, &full.id).await;
    assert_eq!(outputs, ["Hel", "lo", " world"]);
    let done = ended(&mut s.client, &full.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "Hello world");
    assert_eq!(usage(&done), (12, 5, 0));

    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "one request per run");

    let plain_req = &requests[0];
    assert_eq!(plain_req.body["stream"], json!(true), "{}", plain_req.body);
    assert_eq!(plain_req.body["model"], json!("qwen2.5:7b"));
    assert_eq!(
        plain_req.messages(),
        [("user".to_owned(), "Say hello.".to_owned())],
        "no system message without system_prompt"
    );
    assert!(
        plain_req.body.get("max_tokens").is_none(),
        "{}",
        plain_req.body
    );
    assert!(
        plain_req.body.get("temperature").is_none(),
        "{}",
        plain_req.body
    );
    assert_eq!(plain_req.header("authorization"), None, "no api_key_env");
    // Spawn carried no traceparent: the run started an unsampled trace of
    // its own, which the request names.
    let plain_traceparent = plain_req.header("traceparent").expect("traceparent sent");
    assert_traceparent_in(plain_traceparent, &plain.trace_id, false);

    let full_req = &requests[1];
    assert_eq!(full_req.body["stream"], json!(true), "{}", full_req.body);
    assert_eq!(full_req.body["model"], json!("qwen-fast"), "model_map");
    assert_eq!(
        full_req.messages(),
        [
            ("system".to_owned(), "You are terse.".to_owned()),
            ("user".to_owned(), "Say hello again.".to_owned()),
        ],
        "the system message first, then the prompt"
    );
    assert_eq!(full_req.body["max_tokens"], json!(64));
    assert_eq!(full_req.body["temperature"], json!(0.25));
    assert_eq!(
        full_req.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    assert_eq!(full_req.header("traceparent"), Some(TRACEPARENT));
    s.handle.shutdown().await.unwrap();
}

// ----- retries and provider errors ----------------------------------------------

/// The first request answers `first`; the second streams normally.
async fn retried_once_then_done(first: fn() -> Reply) {
    let fake = Fake::start(move |n| {
        if n == 0 {
            first()
        } else {
            completion(&["Hel", "lo", " world"], 12, 5)
        }
    })
    .await;
    let mut s = TestServer::start(&openai_type("llm", &fake.base_url, "")).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "hi")).await;
    let done = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "Hello world");
    assert_eq!(usage(&done), (12, 5, 0));
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "the failed attempt and the retry");
    assert_eq!(
        requests[0].body, requests[1].body,
        "the retry is the same request"
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_429_is_retried_after_retry_after_and_the_run_completes() {
    retried_once_then_done(|| {
        error_reply(
            429,
            Some("0"),
            "Rate limit reached for requests",
            "requests",
        )
    })
    .await;
}

#[tokio::test]
async fn a_503_is_retried_and_the_run_completes() {
    retried_once_then_done(|| {
        error_reply(503, Some("0"), "The server is overloaded", "server_error")
    })
    .await;
}

#[tokio::test]
async fn a_retry_waits_as_long_as_retry_after_asks() {
    // 1 s, twice the default first backoff (0.5 s).
    let fake = Fake::start(|n| {
        if n == 0 {
            error_reply(429, Some("1"), "Rate limit reached", "requests")
        } else {
            completion(&["ok"], 1, 1)
        }
    })
    .await;
    let mut s = TestServer::start(&openai_type("llm", &fake.base_url, "")).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "hi")).await;
    let done = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "ok");
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let waited = requests[1].at - requests[0].at;
    assert!(
        waited >= Duration::from_millis(950),
        "the retry came {waited:?} after a Retry-After: 1"
    );
    s.handle.shutdown().await.unwrap();
}

/// Every request answers `reply`; returns the ended agent and the number
/// of requests.
async fn always(reply: fn() -> Reply) -> (pb::Agent, usize) {
    let fake = Fake::start(move |_| reply()).await;
    let mut s = TestServer::start(&openai_type("llm", &fake.base_url, "")).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "hi")).await;
    let agent = ended(&mut s.client, &a.id).await;
    // The run has ended: no request can follow.
    let n = fake.requests().len();
    s.handle.shutdown().await.unwrap();
    (agent, n)
}

#[tokio::test]
async fn a_400_fails_the_run_with_the_providers_message_without_retrying() {
    let (agent, requests) =
        always(|| error_reply(400, None, "model not found", "invalid_request_error")).await;
    let message = failed_with(&agent, "PROVIDER_400");
    assert_eq!(message, "model not found");
    assert_eq!(requests, 1, "4xx other than 429 is not retried");
}

#[tokio::test]
async fn a_401_fails_the_run_with_provider_401_without_retrying() {
    let (agent, requests) = always(|| {
        error_reply(
            401,
            None,
            "Incorrect API key provided",
            "invalid_request_error",
        )
    })
    .await;
    let message = failed_with(&agent, "PROVIDER_401");
    assert_eq!(message, "Incorrect API key provided");
    assert_eq!(requests, 1, "4xx other than 429 is not retried");
}

#[tokio::test]
async fn retries_are_bounded_and_a_persistent_500_fails_with_provider_500() {
    let (agent, requests) =
        always(|| error_reply(500, Some("0"), "internal failure", "server_error")).await;
    let message = failed_with(&agent, "PROVIDER_500");
    assert_eq!(message, "internal failure");
    assert_eq!(
        requests, MAX_ATTEMPTS as usize,
        "exactly MAX_ATTEMPTS requests"
    );
    assert_eq!(MAX_ATTEMPTS, 4);
}

// ----- cancel and deadline abort the request ------------------------------------

/// A fake whose first completion streams "Hel" and then holds the stream
/// open forever; the receiver fires when the server drops that stream.
async fn held_open() -> (Fake, oneshot::Receiver<()>) {
    let (tx, rx) = oneshot::channel();
    let signal = Mutex::new(Some(tx));
    let fake = Fake::start(move |_| {
        let tx = signal.lock().unwrap().take();
        Reply::Stream(vec![text("Hel"), Piece::Hold(DropSignal(tx))])
    })
    .await;
    (fake, rx)
}

#[tokio::test]
async fn cancel_aborts_the_streaming_request() {
    let (fake, stream_dropped) = held_open().await;
    let mut s = TestServer::start(&openai_type("llm", &fake.base_url, "")).await;
    let mut events = watch_progress(&mut s.client).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "talk forever")).await;
    wait_for_output(&mut events, &a.id, "Hel").await;
    let cancelled = cancel(&mut s.client, &a.id).await;
    assert!(cancelled.iter().any(|c| c.id == a.id), "{cancelled:?}");
    let agent = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&agent), pb::AgentStatus::Cancelled, "{agent:?}");
    dropped(stream_dropped, "after Cancel").await;
    assert_eq!(fake.requests().len(), 1);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_deadline_aborts_the_streaming_request() {
    let (fake, stream_dropped) = held_open().await;
    let mut s = TestServer::start(&openai_type("llm", &fake.base_url, "")).await;
    let a = spawn(
        &mut s.client,
        pb::SpawnRequest {
            timeout: Some(prost_types::Duration {
                seconds: 0,
                nanos: 300_000_000,
            }),
            ..spawn_req("llm", "local/m", "talk forever")
        },
    )
    .await;
    let agent = ended(&mut s.client, &a.id).await;
    failed_with(&agent, "DEADLINE_EXCEEDED");
    dropped(stream_dropped, "after the deadline").await;
    assert_eq!(fake.requests().len(), 1);
    s.handle.shutdown().await.unwrap();
}

// ----- multi-turn steering -------------------------------------------------------

#[tokio::test]
async fn a_steer_during_a_completion_becomes_the_next_user_turn() {
    let gate = Arc::new(Notify::new());
    let first_gate = gate.clone();
    let mut fake = Fake::start(move |n| match n {
        0 => Reply::Stream(vec![
            text("first"),
            Piece::Gate(first_gate.clone()),
            Piece::Usage {
                prompt: 10,
                completion: 1,
            },
        ]),
        _ => completion(&["second"], 20, 2),
    })
    .await;
    let mut s = TestServer::start(&openai_type("llm", &fake.base_url, "")).await;
    let mut events = watch_progress(&mut s.client).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "do the task")).await;
    wait_for_output(&mut events, &a.id, "first").await;
    let steered = steer(&mut s.client, &a.id, "also do X").await;
    assert_eq!(steered.delivery, pb::SteerDelivery::Delivered as i32);
    gate.notify_one();
    fake.wait_for_request(1).await;
    let done = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "second", "the final completion's text");
    assert_eq!(usage(&done), (30, 3, 0), "usage of both completions");
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "one request per turn");
    assert_eq!(
        requests[1].messages(),
        [
            ("user".to_owned(), "do the task".to_owned()),
            ("assistant".to_owned(), "first".to_owned()),
            ("user".to_owned(), "also do X".to_owned()),
        ]
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_continuation_sends_the_conversation_so_far_then_its_prompt() {
    let fake = Fake::start(|n| match n {
        0 => completion(&["Paris"], 10, 1),
        1 => completion(&["About 2.1 million."], 20, 4),
        _ => completion(&["It is the capital."], 30, 4),
    })
    .await;
    let mut s = TestServer::start(&openai_type(
        "llm",
        &fake.base_url,
        "system_prompt = \"Be brief.\"",
    ))
    .await;
    let first = spawn(
        &mut s.client,
        spawn_req("llm", "local/m", "Capital of France?"),
    )
    .await;
    let first = ended(&mut s.client, &first.id).await;
    assert_eq!(first.result, "Paris");
    let second = spawn(
        &mut s.client,
        pb::SpawnRequest {
            continue_from: first.id.clone(),
            prompt: "Its population?".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        (second.agent.as_str(), second.model.as_str()),
        ("llm", "local/m")
    );
    let second = ended(&mut s.client, &second.id).await;
    assert_eq!(status(&second), pb::AgentStatus::Done, "{second:?}");
    // A fork of the first turn sees only that turn.
    let fork = spawn(
        &mut s.client,
        pb::SpawnRequest {
            continue_from: first.id.clone(),
            fork: true,
            prompt: "Why Paris?".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    ended(&mut s.client, &fork.id).await;
    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    let m = |role: &str, text: &str| (role.to_owned(), text.to_owned());
    assert_eq!(
        requests[1].messages(),
        [
            m("system", "Be brief."),
            m("user", "Capital of France?"),
            m("assistant", "Paris"),
            m("user", "Its population?"),
        ],
        "the transcript is the message list, then the new prompt"
    );
    assert_eq!(
        requests[2].messages(),
        [
            m("system", "Be brief."),
            m("user", "Capital of France?"),
            m("assistant", "Paris"),
            m("user", "Why Paris?"),
        ]
    );
    s.handle.shutdown().await.unwrap();
}

// ----- configuration problems at run time -----------------------------------------

#[tokio::test]
async fn a_missing_api_key_variable_fails_the_run_without_a_request() {
    let var = "SUBAGENTD_TEST_UNSET_VAR_OPENAI_MISSING_KEY";
    std::env::remove_var(var);
    let fake = Fake::start(|_| completion(&["never"], 1, 1)).await;
    let mut s = TestServer::start(&openai_type(
        "llm",
        &fake.base_url,
        &format!("api_key_env = \"{var}\""),
    ))
    .await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "hi")).await;
    let agent = ended(&mut s.client, &a.id).await;
    let message = failed_with(&agent, "PROVIDER_CONFIG");
    assert!(message.contains(var), "{message}");
    assert_eq!(fake.requests().len(), 0, "no request without the key");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unreachable_server_fails_with_provider_unreachable_after_bounded_retries() {
    // A port nobody listens on: bind one, then free it.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let mut s = TestServer::start(&openai_type("llm", &base_url, "")).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "hi")).await;
    // Default backoff: 0.5 + 1 + 2 s between the four attempts.
    let agent = ended(&mut s.client, &a.id).await;
    let message = failed_with(&agent, "PROVIDER_UNREACHABLE");
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    s.handle.shutdown().await.unwrap();
}

// ----- config validation -----------------------------------------------------------

fn invalid(toml: &str) -> (String, String) {
    match ConfigSource::from_toml_str(toml) {
        Err(ConfigError::Invalid { key, rule }) => (key, rule),
        other => panic!("expected an invalid config for\n{toml}\ngot {other:?}"),
    }
}

#[test]
fn the_openai_keys_are_validated() {
    // A complete type loads.
    let c = ConfigSource::from_toml_str(
        "[agents.llm]\nrunner = \"openai\"\nbase_url = \"https://api.example.com/v1\"\n\
         api_key_env = \"OPENAI_API_KEY\"\nsystem_prompt = \"Be brief.\"\nmax_tokens = 256\n\
         temperature = 0.7\nrequest_timeout = \"90s\"\nmodel_map = { \"openai/fast\" = \"gpt-4.1-mini\" }\n",
    )
    .expect("a complete openai type is valid");
    let llm = &c.agents["llm"];
    assert_eq!(llm.base_url.as_deref(), Some("https://api.example.com/v1"));
    assert_eq!(llm.request_timeout(), Duration::from_secs(90));
    assert_eq!(llm.model_map["openai/fast"], "gpt-4.1-mini");

    let (key, rule) = invalid("[agents.llm]\nrunner = \"openai\"\n");
    assert_eq!(key, "agents.llm.base_url", "{rule}");

    let (key, rule) =
        invalid("[agents.llm]\nrunner = \"openai\"\nbase_url = \"127.0.0.1:11434/v1\"\n");
    assert_eq!(key, "agents.llm.base_url");
    assert!(rule.contains("http"), "{rule}");
    let (key, _) = invalid("[agents.llm]\nrunner = \"openai\"\nbase_url = \"ftp://host/v1\"\n");
    assert_eq!(key, "agents.llm.base_url");

    let (key, rule) = invalid(
        "[agents.llm]\nrunner = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\ntemperature = 3.0\n",
    );
    assert_eq!(key, "agents.llm.temperature", "{rule}");
    // An integer 3 is refused too, naming the key either way.
    let err = ConfigSource::from_toml_str(
        "[agents.llm]\nrunner = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\ntemperature = 3\n",
    )
    .expect_err("temperature 3 is out of range");
    assert!(err.to_string().contains("temperature"), "{err}");

    let (key, _) = invalid(
        "[agents.llm]\nrunner = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmax_tokens = 0\n",
    );
    assert_eq!(key, "agents.llm.max_tokens");
    let (key, _) = invalid(
        "[agents.llm]\nrunner = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nrequest_timeout = \"0s\"\n",
    );
    assert_eq!(key, "agents.llm.request_timeout");

    // openai keys on other runners.
    let (key, rule) =
        invalid("[agents.sim]\nrunner = \"simulated\"\nbase_url = \"http://127.0.0.1:1/v1\"\n");
    assert_eq!(key, "agents.sim.base_url");
    assert_eq!(rule, "applies only to runner = \"openai\"");
    let (key, rule) = invalid("[agents.sim]\nrunner = \"simulated\"\ntemperature = 0.5\n");
    assert_eq!(key, "agents.sim.temperature");
    assert_eq!(rule, "applies only to runner = \"openai\"");
    let (key, rule) = invalid(
        "[agents.cmd]\nrunner = \"command\"\ncommand = [\"true\"]\nmodel_map = { \"a/b\" = \"c\" }\n",
    );
    assert_eq!(key, "agents.cmd.model_map");
    assert_eq!(rule, "applies only to runner = \"openai\"");
    // And command keys on an openai type.
    let (key, rule) = invalid(
        "[agents.llm]\nrunner = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\ncwd = \"/tmp\"\n",
    );
    assert_eq!(key, "agents.llm.cwd");
    assert_eq!(rule, "applies only to runner = \"command\"");
}

/// One streamed completion of `reply` that waits at `gate` before its
/// usage, so a test can steer while it runs.
fn gated(reply: &str, gate: &Arc<Notify>) -> Reply {
    Reply::Stream(vec![
        text(reply),
        Piece::Gate(gate.clone()),
        Piece::Usage {
            prompt: 1,
            completion: 1,
        },
    ])
}

#[tokio::test]
async fn past_max_turns_a_completion_gets_the_wrap_up_and_past_the_grace_the_run_fails_turn_limit()
{
    // max_turns = 1, grace_turns = 1: turn 2 gets the wrap-up, turn 3 does
    // not run. Every completion is steered into another turn.
    let gate = Arc::new(Notify::new());
    let replies = gate.clone();
    let mut fake = Fake::start(move |n| gated(&format!("turn {}", n + 1), &replies)).await;
    let mut s = TestServer::start(&openai_type(
        "llm",
        &fake.base_url,
        "max_turns = 1\ngrace_turns = 1\nwrap_up_message = \"Wrap up now.\"",
    ))
    .await;
    let mut events = watch_progress(&mut s.client).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "do the task")).await;
    for turn in 1..=2 {
        wait_for_output(&mut events, &a.id, &format!("turn {turn}")).await;
        steer(&mut s.client, &a.id, &format!("more {turn}")).await;
        gate.notify_one();
    }
    let failed = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&failed), pb::AgentStatus::Failed, "{failed:?}");
    let error = failed.error.as_ref().unwrap();
    assert_eq!(error.code, "TURN_LIMIT");
    assert!(error.message.contains("max_turns = 1"), "{}", error.message);
    assert_eq!(
        failed.result, "turn 1turn 2",
        "the output produced so far is the result"
    );
    fake.wait_for_request(1).await;
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "no third completion");
    assert_eq!(
        requests[1].messages(),
        [
            ("user".to_owned(), "do the task".to_owned()),
            ("assistant".to_owned(), "turn 1".to_owned()),
            ("user".to_owned(), "more 1".to_owned()),
            ("user".to_owned(), "Wrap up now.".to_owned()),
        ]
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_run_that_ends_within_its_grace_turns_is_done() {
    let gate = Arc::new(Notify::new());
    let replies = gate.clone();
    let mut fake = Fake::start(move |n| match n {
        0 => gated("working", &replies),
        _ => completion(&["final answer"], 1, 1),
    })
    .await;
    let mut s = TestServer::start(&openai_type("llm", &fake.base_url, "max_turns = 1")).await;
    let mut events = watch_progress(&mut s.client).await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/m", "do the task")).await;
    wait_for_output(&mut events, &a.id, "working").await;
    steer(&mut s.client, &a.id, "and X").await;
    gate.notify_one();
    let done = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "final answer");
    fake.wait_for_request(1).await;
    let second = fake.requests()[1].messages();
    assert_eq!(
        second.last().unwrap(),
        &(
            "user".to_owned(),
            subagentd::config::DEFAULT_WRAP_UP_MESSAGE.to_owned()
        ),
        "the default wrap-up message"
    );
    s.handle.shutdown().await.unwrap();
}

/// An error reply with an OpenAI `code` (error_reply sets none).
fn coded_error(status: u16, code: &str) -> Reply {
    Reply::Error {
        status,
        retry_after: None,
        body: serde_json::json!({
            "error": {"message": "no such model", "type": "invalid_request_error", "code": code}
        })
        .to_string(),
    }
}

#[tokio::test]
async fn retryable_provider_errors_fall_back_through_the_chain_after_the_runners_own_retries() {
    // The runner tries each model MAX_ATTEMPTS times (Retry-After: 0, so at
    // once): requests 0..4 are model a (429), 4..8 model b (503), then c.
    let attempts = subagentd::runner::openai::MAX_ATTEMPTS as usize;
    let mut fake = Fake::start(move |n| match n / attempts {
        0 => error_reply(429, Some("0"), "slow down", "rate_limit_error"),
        1 => error_reply(503, Some("0"), "overloaded", "server_error"),
        _ => completion(&["from c"], 1, 1),
    })
    .await;
    let mut s = TestServer::start(&openai_type(
        "llm",
        &fake.base_url,
        "fallback_models = [\"local/b\", \"local/c\"]",
    ))
    .await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/a", "hi")).await;
    let done = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(
        (done.result.as_str(), done.model.as_str()),
        ("from c", "local/c")
    );
    let codes: Vec<(&str, &str)> = done
        .attempts
        .iter()
        .map(|x| {
            (
                x.model.as_str(),
                x.error.as_ref().map_or("", |e| e.code.as_str()),
            )
        })
        .collect();
    assert_eq!(
        codes,
        [
            ("local/a", "PROVIDER_429"),
            ("local/b", "PROVIDER_503"),
            ("local/c", "")
        ]
    );
    fake.wait_for_request(2 * attempts).await;
    let models: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap().to_owned())
        .collect();
    let mut expected = vec!["a".to_owned(); attempts];
    expected.extend(vec!["b".to_owned(); attempts]);
    expected.push("c".to_owned());
    assert_eq!(
        models, expected,
        "each model after the runner's own retries"
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unknown_model_falls_back_by_its_error_code_and_a_plain_400_does_not() {
    let fake = Fake::start(|n| match n {
        0 => coded_error(400, "model_not_found"),
        1 => completion(&["ok"], 1, 1),
        _ => error_reply(400, None, "bad request", "invalid_request_error"),
    })
    .await;
    let mut s = TestServer::start(&openai_type(
        "llm",
        &fake.base_url,
        "fallback_models = [\"local/b\"]",
    ))
    .await;
    let a = spawn(&mut s.client, spawn_req("llm", "local/a", "hi")).await;
    let a = ended(&mut s.client, &a.id).await;
    assert_eq!(status(&a), pb::AgentStatus::Done, "{a:?}");
    assert_eq!((a.model.as_str(), a.attempt), ("local/b", 2));
    let b = spawn(&mut s.client, spawn_req("llm", "local/a", "again")).await;
    let b = ended(&mut s.client, &b.id).await;
    assert_eq!(status(&b), pb::AgentStatus::Failed, "{b:?}");
    assert_eq!(b.error.as_ref().unwrap().code, "PROVIDER_400");
    assert_eq!((b.model.as_str(), b.attempt), ("local/a", 1), "no fallback");
    s.handle.shutdown().await.unwrap();
}
