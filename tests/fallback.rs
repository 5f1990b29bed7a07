//! `[agents.NAME] fallback_models` over loopback gRPC: a run that fails
//! with a retryable provider error moves to the next model — QUEUED with a
//! RETRYING event in the new model's bucket at its original place in line,
//! keeping its global slot — until one succeeds or the chain is exhausted;
//! never on other 4xx or a cancel. Runs use the simulated runner's
//! `fail_on <model> <status>` directive; the openai runner's classification
//! is in `openai_runner.rs`.

mod common;

use common::*;
use subagentd::pb::{self, AgentEventKind as Kind};
use tonic::Code;

/// One running agent per model (every model its own bucket), three live
/// background agents at most, and a chain a/m1 → b/m2 → c/m3.
const CONFIG: &str = r#"
[limits]
default_concurrency = 1
max_background_agents = 3
max_concurrent_per_parent = 0

[agents.simulated]
runner = "simulated"
fallback_models = ["b/m2", "c/m3"]
"#;

const FAILS_TWICE: &str = "fail_on a/m1 429\nfail_on b/m2 503\noutput done";

/// (model, error code, started, ended) of every attempt.
fn attempts(a: &pb::Agent) -> Vec<(String, String, bool, bool)> {
    a.attempts
        .iter()
        .map(|x| {
            (
                x.model.clone(),
                x.error.as_ref().map(|e| e.code.clone()).unwrap_or_default(),
                x.started_at.is_some(),
                x.ended_at.is_some(),
            )
        })
        .collect()
}

fn att(model: &str, code: &str, ended: bool) -> (String, String, bool, bool) {
    (model.into(), code.into(), true, ended)
}

#[tokio::test]
async fn a_run_falls_back_through_two_models_in_each_bucket_at_its_place_in_line() {
    let mut s = TestServer::start(CONFIG).await;
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;
    // a/m1 and b/m2 are full; `a` waits on a/m1, then `c` on b/m2.
    let y = spawn(&mut s.client, bg("a/m1", "sleep 600000")).await;
    let x = spawn(&mut s.client, bg("b/m2", "sleep 600000")).await;
    let a = spawn(&mut s.client, bg("a/m1", FAILS_TWICE)).await;
    assert_eq!(status(&a), pb::AgentStatus::Queued);
    cancel(&mut s.client, &y.id).await;
    // `a` ran on a/m1, got a 429 and moved to b/m2, where it waits.
    let retrying = wait_for_event(&mut events, &a.id, Kind::Retrying).await;
    let moved = retrying.agent.unwrap();
    assert_eq!(status(&moved), pb::AgentStatus::Queued);
    assert_eq!(
        (moved.model.as_str(), moved.bucket.as_str()),
        ("b/m2", "b/m2")
    );
    // The next attempt counts from the move: attempt 2, listed after the
    // ended one, on the new model, not started yet.
    let next = ("b/m2".to_owned(), String::new(), false, false);
    assert_eq!(moved.attempt, 2);
    assert_eq!(
        attempts(&moved),
        [att("a/m1", "PROVIDER_429", true), next.clone()]
    );
    assert_eq!(moved.attempts[1].attempt, 2);
    assert!(moved.error.is_none(), "not failed: {moved:?}");
    let now = status_of(&mut s.client, &a.id).await;
    assert_eq!((status(&now), now.attempt), (pb::AgentStatus::Queued, 2));
    assert_eq!(attempts(&now), [att("a/m1", "PROVIDER_429", true), next]);
    // Spawned after `a` but queued on b/m2 before it moved there.
    let c = spawn(&mut s.client, bg("b/m2", "output c")).await;
    assert_eq!(status(&c), pb::AgentStatus::Queued);
    // It kept its global slot: x, a and c are the three live agents.
    let refused = s
        .client
        .spawn(bg("c/m3", "output d"))
        .await
        .expect_err("the global cap holds");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(error_info(&refused).0, "GLOBAL_LIMIT_REACHED");
    // a/m1 was given back: a new agent there runs at once... once a slot
    // of the global cap frees. Free b/m2 instead: `a` (older) goes first.
    cancel(&mut s.client, &x.id).await;
    let started = wait_for(&mut events, |ev| ev.kind == Kind::Started as i32).await;
    let started = started.agent.unwrap();
    assert_eq!(
        (started.id.as_str(), started.model.as_str()),
        (a.id.as_str(), "b/m2"),
        "at its original place in line, ahead of c"
    );
    assert_eq!(started.attempt, 2);
    // 503 on b/m2: on to c/m3, which has room: QUEUED (RETRYING), then
    // started in the same step.
    let retrying = wait_for_event(&mut events, &a.id, Kind::Retrying).await;
    let moved = retrying.agent.unwrap();
    assert_eq!(status(&moved), pb::AgentStatus::Queued);
    assert_eq!(moved.model, "c/m3");
    assert_eq!(moved.attempt, 3);
    assert_eq!(
        attempts(&moved),
        [
            att("a/m1", "PROVIDER_429", true),
            att("b/m2", "PROVIDER_503", true),
            ("c/m3".to_owned(), String::new(), false, false),
        ]
    );
    let done = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "done");
    assert_eq!((done.model.as_str(), done.attempt), ("c/m3", 3));
    assert_eq!(
        attempts(&done),
        [
            att("a/m1", "PROVIDER_429", true),
            att("b/m2", "PROVIDER_503", true),
            att("c/m3", "", true),
        ]
    );
    // c ran once b/m2 was free again.
    let c = await_all(&mut s.client, &[&c.id]).await.remove(0);
    assert_eq!(status(&c), pb::AgentStatus::Done);
    // Each bucket is empty again: one agent per model runs at once.
    for model in ["a/m1", "b/m2", "c/m3"] {
        let free = spawn(&mut s.client, bg(model, "sleep 600000")).await;
        assert_eq!(status(&free), pb::AgentStatus::Running, "{model}: {free:?}");
    }
}

#[tokio::test]
async fn an_exhausted_chain_fails_with_the_last_error_and_every_attempt() {
    let mut s = TestServer::start(CONFIG).await;
    let a = spawn(
        &mut s.client,
        fg(
            "a/m1",
            "fail_on a/m1 429\nfail_on b/m2 404\nfail_on c/m3 500",
        ),
    )
    .await;
    let a = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&a), pb::AgentStatus::Failed, "{a:?}");
    assert_eq!(a.error.as_ref().unwrap().code, "PROVIDER_500");
    assert_eq!(a.attempt, 3);
    assert_eq!(
        attempts(&a),
        [
            att("a/m1", "PROVIDER_429", true),
            att("b/m2", "PROVIDER_404", true),
            att("c/m3", "PROVIDER_500", true),
        ]
    );
}

#[tokio::test]
async fn no_fallback_on_another_4xx_or_a_cancel() {
    let mut s = TestServer::start(CONFIG).await;
    let a = spawn(&mut s.client, fg("a/m1", "fail_on a/m1 400")).await;
    assert_eq!(status(&a), pb::AgentStatus::Failed, "{a:?}");
    assert_eq!(a.error.as_ref().unwrap().code, "PROVIDER_400");
    assert_eq!((a.model.as_str(), a.attempt), ("a/m1", 1));
    assert_eq!(attempts(&a), [att("a/m1", "PROVIDER_400", true)]);

    let b = spawn(&mut s.client, bg("a/m1", "sleep 600000")).await;
    let cancelled = cancel(&mut s.client, &b.id).await.remove(0);
    assert_eq!(status(&cancelled), pb::AgentStatus::Cancelled);
    assert_eq!((cancelled.model.as_str(), cancelled.attempt), ("a/m1", 1));
    // A type without a chain fails on the first retryable error too.
    let mut plain = TestServer::start("[agents.simulated]\nrunner = \"simulated\"\n").await;
    let c = spawn(&mut plain.client, fg("a/m1", "fail_on a/m1 429")).await;
    assert_eq!(status(&c), pb::AgentStatus::Failed);
    assert_eq!(c.error.as_ref().unwrap().code, "PROVIDER_429");
}

#[test]
fn fallback_models_must_be_provider_slash_model() {
    let err = subagentd::config::ConfigSource::from_toml_str(
        "[agents.simulated]\nrunner = \"simulated\"\nfallback_models = [\"b/m2\", \"nomodel\"]\n",
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("agents.simulated.fallback_models[1]"), "{msg}");
}
