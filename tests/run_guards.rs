//! Run guards over real gRPC: the tool-call circuit breakers, and the usage
//! roll-up of a tree (stale detection is unit-tested with a paused clock in
//! `scheduler::tests`).

mod common;

use common::*;
use subagentd::pb;

fn tools(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("tool {n}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn more_tool_calls_than_max_tool_calls_cancel_the_run_with_circuit_breaker() {
    let mut s = TestServer::start("[runs]\nmax_tool_calls = 3\n").await;
    let a = spawn(
        &mut s.client,
        bg(
            "acme/m1",
            &format!("{}\noutput never", tools(&["a", "b", "c", "d"])),
        ),
    )
    .await;
    let ended = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(
        status(&ended[0]),
        pb::AgentStatus::Cancelled,
        "{:?}",
        ended[0]
    );
    let error = ended[0].error.as_ref().expect("an error");
    assert_eq!(error.code, "CIRCUIT_BREAKER");
    assert!(
        error.message.contains("[runs] max_tool_calls = 3"),
        "{}",
        error.message
    );
    assert_eq!(ended[0].usage.as_ref().unwrap().tool_calls, 4);
    assert!(!ended[0].result.contains("never"));
    // Exactly at the limit is fine.
    let b = spawn(&mut s.client, bg("acme/m1", &tools(&["a", "b", "c"]))).await;
    let done = await_all(&mut s.client, &[&b.id]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done, "{:?}", done[0]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn too_many_identical_calls_in_a_row_trip_the_breaker_but_alternating_ones_do_not() {
    let mut s = TestServer::start("[runs]\nmax_identical_tool_calls = 2\n").await;
    let looping = spawn(
        &mut s.client,
        bg("acme/m1", &tools(&["grep", "grep", "grep"])),
    )
    .await;
    let alternating = spawn(
        &mut s.client,
        bg(
            "acme/m1",
            &tools(&["grep", "ls", "grep", "ls", "grep", "ls"]),
        ),
    )
    .await;
    let ended = await_all(&mut s.client, &[&looping.id, &alternating.id]).await;
    assert_eq!(status(&ended[0]), pb::AgentStatus::Cancelled);
    let error = ended[0].error.as_ref().expect("an error");
    assert_eq!(error.code, "CIRCUIT_BREAKER");
    assert!(
        error.message.contains("\"grep\"")
            && error
                .message
                .contains("[runs] max_identical_tool_calls = 2"),
        "{}",
        error.message
    );
    assert_eq!(status(&ended[1]), pb::AgentStatus::Done, "{:?}", ended[1]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn zero_turns_the_breakers_off() {
    let mut s =
        TestServer::start("[runs]\nmax_tool_calls = 0\nmax_identical_tool_calls = 0\n").await;
    let a = spawn(&mut s.client, bg("acme/m1", &tools(&["x"; 50]))).await;
    let done = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done, "{:?}", done[0]);
    assert_eq!(done[0].usage.as_ref().unwrap().tool_calls, 50);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_tripped_breaker_cancels_the_runs_children_and_frees_its_slots() {
    let mut s = TestServer::start(
        "[limits]\nmax_background_agents = 2\n[runs]\nmax_identical_tool_calls = 1\n",
    )
    .await;
    let parent = spawn(&mut s.client, bg("acme/m1", "wait_steer\ntool t\ntool t")).await;
    let child = spawn(
        &mut s.client,
        pb::SpawnRequest {
            parent_id: parent.id.clone(),
            ..bg("acme/m1", "wait_steer")
        },
    )
    .await;
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;
    let steered = steer(&mut s.client, &parent.id, "go").await;
    assert_eq!(steered.delivery, pb::SteerDelivery::Delivered as i32);
    let ended = await_all(&mut s.client, &[&parent.id, &child.id]).await;
    assert_eq!(status(&ended[0]), pb::AgentStatus::Cancelled);
    assert_eq!(ended[0].error.as_ref().unwrap().code, "CIRCUIT_BREAKER");
    assert_eq!(status(&ended[1]), pb::AgentStatus::Cancelled, "the cascade");
    wait_for_event(&mut events, &child.id, pb::AgentEventKind::Cancelled).await;
    // Both global slots are free again.
    for _ in 0..2 {
        spawn(&mut s.client, bg("acme/m1", "wait_steer")).await;
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn total_usage_adds_up_the_whole_subtree() {
    let mut s = TestServer::start("[limits]\nmax_concurrent_per_parent = 0\n").await;
    let root = spawn(&mut s.client, bg("acme/m1", "usage 1 2\nwait_steer")).await;
    let child = spawn(
        &mut s.client,
        pb::SpawnRequest {
            parent_id: root.id.clone(),
            ..bg("acme/m1", "usage 10 20\ntool t\nwait_steer")
        },
    )
    .await;
    let grandchild = spawn(
        &mut s.client,
        pb::SpawnRequest {
            parent_id: child.id.clone(),
            ..bg("acme/m1", "usage 100 200\ntool t\ntool u")
        },
    )
    .await;
    let done = await_all(&mut s.client, &[&grandchild.id]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done);
    // The grandchild is done; its usage counts toward its ancestors while
    // they still run. Steer them to finish.
    for id in [&child.id, &root.id] {
        steer(&mut s.client, id, "finish").await;
    }
    let ended = await_all(&mut s.client, &[&root.id, &child.id, &grandchild.id]).await;
    let total = |a: &pb::Agent| {
        let u = a.total_usage.as_ref().expect("total usage");
        (u.input_tokens, u.output_tokens, u.tool_calls)
    };
    let own = |a: &pb::Agent| {
        let u = a.usage.as_ref().expect("usage");
        (u.input_tokens, u.output_tokens, u.tool_calls)
    };
    assert_eq!(own(&ended[0]), (1, 2, 0));
    assert_eq!(total(&ended[0]), (111, 222, 3), "root: the whole tree");
    assert_eq!(
        total(&ended[1]),
        (110, 220, 3),
        "child: itself and the grandchild"
    );
    assert_eq!(total(&ended[2]), own(&ended[2]), "a leaf: its own usage");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_run_silent_for_the_stale_timeout_fails_stale_and_frees_its_slot() {
    let mut s = TestServer::start(
        "[limits]\nmax_background_agents = 1\n[runs]\nstale_timeout = \"300ms\"\n",
    )
    .await;
    let a = spawn(&mut s.client, bg("acme/m1", "output hi\nsleep 600000")).await;
    let ended = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&ended[0]), pb::AgentStatus::Failed, "{:?}", ended[0]);
    let error = ended[0].error.as_ref().expect("an error");
    assert_eq!(error.code, "STALE");
    assert!(error.message.contains("stale_timeout"), "{}", error.message);
    assert_eq!(ended[0].result, "hi", "what it output is kept");
    // Its global slot is free again.
    spawn(&mut s.client, bg("acme/m1", "hi")).await;
    s.handle.shutdown().await.unwrap();
}
