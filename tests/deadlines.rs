//! Call deadlines (`grpc-timeout`): a call whose deadline passes on the
//! server ends DEADLINE_EXCEEDED, unary and streaming, and is counted as
//! such in the RPC metrics, also when the client resets it at its deadline.
//! The calls go through [`unenforced_client`]: tonic's own channel would
//! answer CANCELLED locally when the deadline passes, before the server.

mod common;

use std::time::Duration;

use common::*;
use subagentd::pb;
use tonic::Code;

const MODEL: &str = "acme/m1";

fn series(method: &str, code: &str) -> String {
    format!(
        "subagentd_rpc_requests_total{{service=\"subagents.v1.AgentService\",method=\"{method}\",code=\"{code}\"}}"
    )
}

/// Waits until the scrape counts `want` calls of `method` over all codes,
/// then returns the scrape.
async fn counted(
    s: &TestServer,
    method: &str,
    want: f64,
) -> std::collections::HashMap<String, f64> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(s).await;
        let n: f64 = m
            .iter()
            .filter(|(k, _)| {
                k.starts_with("subagentd_rpc_requests_total{")
                    && k.contains(&format!("method=\"{method}\""))
            })
            .map(|(_, v)| v)
            .sum();
        if n >= want {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{method} calls not counted"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_foreground_spawn_past_its_deadline_is_deadline_exceeded_and_cancels_the_agent() {
    let mut s = TestServer::start("").await;
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;
    let mut request = tonic::Request::new(pb::SpawnRequest {
        lead_id: "lead-fg".into(),
        ..fg(MODEL, "sleep 60000")
    });
    request.set_timeout(Duration::from_millis(300));
    let err = unenforced_client(s.handle.addr())
        .spawn(request)
        .await
        .expect_err("deadline passes");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("deadline"), "{err:?}");

    // The foreground agent is cancelled, and says why.
    let cancelled = wait_for(&mut events, |ev| {
        ev.kind == pb::AgentEventKind::Cancelled as i32
    })
    .await
    .agent
    .expect("agent");
    assert_eq!(cancelled.lead_id, "lead-fg");
    let error = cancelled.error.expect("error set");
    assert!(error.message.contains("deadline passed"), "{error:?}");

    let m = counted(&s, "Spawn", 1.0).await;
    assert_eq!(
        value(&m, &series("Spawn", "DEADLINE_EXCEEDED")),
        1.0,
        "{m:?}"
    );
    assert_eq!(m.get(&series("Spawn", "CANCELLED")), None, "{m:?}");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_await_past_its_call_deadline_is_deadline_exceeded_and_leaves_no_waiter() {
    let mut s = TestServer::start("").await;
    let waiting = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    let mut request = tonic::Request::new(pb::AwaitRequest {
        ids: vec![waiting.id.clone()],
        // Longer than the call's deadline: the deadline decides.
        timeout: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
        mode: pb::AwaitMode::All as i32,
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(200));
    let err = unenforced_client(s.handle.addr())
        .r#await(request)
        .await
        .expect_err("deadline passes");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert_eq!(s.handle.scheduler().inspect(|c| c.waiter_count()), 0);
    // The agent itself is untouched.
    assert_eq!(
        status(&status_of(&mut s.client, &waiting.id).await),
        pb::AgentStatus::Running
    );
    let m = counted(&s, "Await", 1.0).await;
    assert_eq!(
        value(&m, &series("Await", "DEADLINE_EXCEEDED")),
        1.0,
        "{m:?}"
    );
    cancel(&mut s.client, &waiting.id).await;
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_watch_past_its_deadline_ends_deadline_exceeded_after_its_events() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    let mut request = tonic::Request::new(pb::WatchAgentsRequest {
        include_snapshot: true,
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(400));
    let mut stream = unenforced_client(s.handle.addr())
        .watch_agents(request)
        .await
        .expect("watch starts")
        .into_inner();
    let first = stream.message().await.expect("snapshot").expect("open");
    assert_eq!(first.kind, pb::AgentEventKind::Snapshot as i32);
    assert_eq!(first.agent.expect("agent").id, a.id);
    let err = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream ends at its deadline")
        .expect_err("ends with an error status");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    let m = counted(&s, "WatchAgents", 1.0).await;
    assert_eq!(
        value(&m, &series("WatchAgents", "DEADLINE_EXCEEDED")),
        1.0,
        "{m:?}"
    );
    // The server let go of the subscription.
    assert_eq!(s.handle.scheduler().inspect(|c| c.watch_subscribers()), 0);
    cancel(&mut s.client, &a.id).await;
    s.handle.shutdown().await.unwrap();
}

/// The client's timer started first, so a client that resets the call at
/// its own deadline usually does so just before the server's timer fires:
/// that call still ended by its deadline.
#[tokio::test]
async fn a_call_the_client_resets_at_its_deadline_is_counted_deadline_exceeded() {
    let mut s = TestServer::start("").await;
    let waiting = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    let timeout = Duration::from_millis(300);
    let mut request = tonic::Request::new(pb::AwaitRequest {
        ids: vec![waiting.id.clone()],
        timeout: None,
        mode: pb::AwaitMode::All as i32,
        ..Default::default()
    });
    request.set_timeout(timeout);
    // The client's own timer: it drops the call (RST_STREAM) when it fires,
    // usually before the server's answer arrives.
    let mut client = unenforced_client(s.handle.addr());
    match tokio::time::timeout(timeout, client.r#await(request)).await {
        Err(_elapsed) => {}
        Ok(answer) => {
            let err = answer.expect_err("the deadline passed");
            assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
        }
    }
    let m = counted(&s, "Await", 1.0).await;
    assert_eq!(
        value(&m, &series("Await", "DEADLINE_EXCEEDED")),
        1.0,
        "{m:?}"
    );
    assert_eq!(m.get(&series("Await", "CANCELLED")), None, "{m:?}");
    cancel(&mut s.client, &waiting.id).await;
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_deadline_that_does_not_pass_changes_nothing() {
    let mut s = TestServer::start("").await;
    let mut request = tonic::Request::new(fg(MODEL, "output hello"));
    request.set_timeout(Duration::from_secs(30));
    let agent = s
        .client
        .spawn(request)
        .await
        .expect("spawn succeeds")
        .into_inner()
        .agent
        .expect("agent");
    assert_eq!(status(&agent), pb::AgentStatus::Done);
    let mut request = tonic::Request::new(pb::StatusRequest {
        ids: vec![agent.id.clone()],
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(30));
    let found = s.client.status(request).await.expect("status").into_inner();
    assert_eq!(found.agents[0].result, "hello");
    let m = counted(&s, "Status", 1.0).await;
    assert_eq!(value(&m, &series("Status", "OK")), 1.0, "{m:?}");
    s.handle.shutdown().await.unwrap();
}
