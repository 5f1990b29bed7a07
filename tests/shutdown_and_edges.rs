//! Shutdown as clients see it, and edge cases found in review: resuming
//! from a sequence this server never issued, an extreme page token, and an
//! idempotent retry after the parent ended.

mod common;

use common::*;
use subagentd::pb;

#[tokio::test]
async fn shutdown_cancels_live_agents_watchers_see_it_and_streams_end_cleanly() {
    let s = TestServer::start("[limits]\ndefault_concurrency = 1\n").await;
    let mut client = s.client.clone();
    let running = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    let queued = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    let mut watcher = watch(&mut s.new_client().await, pb::WatchAgentsRequest::default()).await;
    let mut awaiting = s.new_client().await;
    let ids = vec![running.id.clone(), queued.id.clone()];
    let await_call = tokio::spawn(async move {
        awaiting
            .r#await(pb::AwaitRequest {
                ids,
                timeout: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                mode: 0,
                ..Default::default()
            })
            .await
    });
    // The Await is registered once the server shows a waiter.
    let scheduler = s.handle.scheduler().clone();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while scheduler.inspect(|c| c.waiter_count()) == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    let TestServer { handle, .. } = s;
    handle.shutdown().await.unwrap();

    // Every event up to the end, then a clean end of stream.
    let mut kinds = Vec::new();
    while let Some(ev) = watcher
        .message()
        .await
        .expect("stream ends without an error")
    {
        kinds.push((ev.agent.unwrap().id, ev.kind));
    }
    let cancelled = pb::AgentEventKind::Cancelled as i32;
    assert!(
        kinds.contains(&(running.id.clone(), cancelled)),
        "{kinds:?}"
    );
    assert!(kinds.contains(&(queued.id.clone(), cancelled)), "{kinds:?}");
    // The queued agent was never started by the slot the running one freed.
    let started = pb::AgentEventKind::Started as i32;
    assert!(!kinds.contains(&(queued.id.clone(), started)), "{kinds:?}");

    let awaited = await_call.await.unwrap().unwrap().into_inner();
    assert!(!awaited.timed_out);
    for a in &awaited.agents {
        assert_eq!(status(a), pb::AgentStatus::Cancelled);
        assert_eq!(a.error.as_ref().unwrap().message, "server shutting down");
    }
}

#[tokio::test]
async fn spawn_after_shutdown_began_is_unavailable() {
    let s = TestServer::start("").await;
    let scheduler = s.handle.scheduler().clone();
    assert_eq!(scheduler.shut_down("server shutting down"), 0);
    let mut client = s.client.clone();
    let err = client.spawn(bg("acme/m", "hi")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(error_info(&err).0, "SHUTTING_DOWN");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn resuming_after_a_sequence_this_server_never_issued_sends_snapshots() {
    let s = TestServer::start("").await;
    let mut client = s.client.clone();
    let a = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    // A cursor from before a restart: far beyond anything issued here.
    let mut stream = watch(
        &mut client,
        pb::WatchAgentsRequest {
            after_sequence: 1_000_000,
            ..Default::default()
        },
    )
    .await;
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.kind, pb::AgentEventKind::Snapshot as i32);
    assert_eq!(first.agent.unwrap().id, a.id);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_largest_page_token_gives_an_empty_last_page() {
    let s = TestServer::start("").await;
    let mut client = s.client.clone();
    spawn(&mut client, bg("acme/m", "hi")).await;
    let resp = client
        .status(pb::StatusRequest {
            page_token: u64::MAX.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.agents.is_empty());
    assert!(resp.next_page_token.is_empty());
    // The connection survived: the next call works.
    assert_eq!(
        client
            .status(pb::StatusRequest::default())
            .await
            .unwrap()
            .into_inner()
            .agents
            .len(),
        1
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_idempotent_retry_returns_the_first_child_even_after_its_parent_ended() {
    let s = TestServer::start("").await;
    let mut client = s.client.clone();
    let parent = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    let req = pb::SpawnRequest {
        parent_id: parent.id.clone(),
        idempotency_key: "retry-1".into(),
        detached: true,
        ..bg("acme/m", "wait_steer")
    };
    let first = spawn(&mut client, req.clone()).await;
    finish_parent(&mut client, &parent.id).await;
    let again = spawn(&mut client, req).await;
    assert_eq!(again.id, first.id);
    s.handle.shutdown().await.unwrap();
}

/// Ends the parent on its own (steer its `wait_steer`), so the detached
/// child survives.
async fn finish_parent(
    client: &mut pb::agent_service_client::AgentServiceClient<tonic::transport::Channel>,
    parent: &str,
) {
    client
        .steer(pb::SteerRequest {
            id: parent.to_owned(),
            message: "done".into(),
        })
        .await
        .unwrap();
    let done = await_all(client, &[parent]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done);
}

#[tokio::test]
async fn lead_and_root_listings_page_through_their_own_agents_only() {
    let s =
        TestServer::start("[limits]\nmax_background_agents = 50\nmax_concurrent_per_parent = 0\n")
            .await;
    let mut client = s.client.clone();
    let root = spawn(
        &mut client,
        pb::SpawnRequest {
            lead_id: "lead-a".into(),
            ..bg("acme/m", "wait_steer")
        },
    )
    .await;
    let mut expected = vec![root.id.clone()];
    for _ in 0..4 {
        let child = spawn(
            &mut client,
            pb::SpawnRequest {
                parent_id: root.id.clone(),
                ..bg("acme/m", "wait_steer")
            },
        )
        .await;
        expected.push(child.id);
        // Noise that neither filter may return.
        spawn(
            &mut client,
            pb::SpawnRequest {
                lead_id: "lead-b".into(),
                ..bg("acme/m", "wait_steer")
            },
        )
        .await;
    }
    for by_lead in [true, false] {
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let resp = client
                .status(pb::StatusRequest {
                    lead_id: if by_lead {
                        "lead-a".into()
                    } else {
                        String::new()
                    },
                    root_id: if by_lead {
                        String::new()
                    } else {
                        root.id.clone()
                    },
                    page_size: 2,
                    page_token: token.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert!(resp.agents.len() <= 2);
            seen.extend(resp.agents.into_iter().map(|a| a.id));
            if resp.next_page_token.is_empty() {
                break;
            }
            token = resp.next_page_token;
        }
        assert_eq!(seen, expected, "by_lead = {by_lead}");
    }
    s.handle.shutdown().await.unwrap();
}
