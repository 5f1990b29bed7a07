//! Agent lifecycle through the public API: Await, Cancel, trees, Steer,
//! usage, idempotency, foreground spawns, deadlines, retention and Status
//! listings. Each test starts its own server on 127.0.0.1:0.

mod common;

use std::{collections::BTreeSet, time::Duration};

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::{transport::Channel, Code};

type Client = AgentServiceClient<Channel>;

const MODEL: &str = "acme/m1";

fn ms(ms: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms / 1000,
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap(),
    }
}

/// A background agent that runs until it receives one steer message.
fn waiting() -> pb::SpawnRequest {
    bg(MODEL, "wait_steer")
}

/// A background child of `parent` that runs until steered.
fn waiting_child(parent: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        parent_id: parent.to_owned(),
        ..waiting()
    }
}

fn with_lead(req: pb::SpawnRequest, lead: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        lead_id: lead.to_owned(),
        ..req
    }
}

/// Await with an explicit mode and server-side timeout; the call itself
/// must answer within that timeout plus 10 s.
async fn await_mode(
    client: &mut Client,
    ids: &[&str],
    mode: pb::AwaitMode,
    timeout_ms: i64,
) -> Result<pb::AwaitResponse, tonic::Status> {
    let call = client.r#await(pb::AwaitRequest {
        ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        timeout: Some(ms(timeout_ms)),
        mode: mode as i32,
        ..Default::default()
    });
    let limit = Duration::from_millis(u64::try_from(timeout_ms).unwrap()) + Duration::from_secs(10);
    tokio::time::timeout(limit, call)
        .await
        .expect("Await answers by its own timeout")
        .map(tonic::Response::into_inner)
}

/// Server-side timeout of an Await that is expected to end by settling.
const LONG_AWAIT_MS: i64 = 120_000;
/// How soon such an Await must answer: far below [`LONG_AWAIT_MS`], so an
/// Await that only ends at its timeout fails the test whatever it reports.
const PROMPT: Duration = Duration::from_secs(15);

/// An Await that must end because the agents settled, not by its timeout.
async fn await_settled(
    client: &mut Client,
    ids: &[&str],
    mode: pb::AwaitMode,
) -> pb::AwaitResponse {
    let call = await_mode(client, ids, mode, LONG_AWAIT_MS);
    let resp = tokio::time::timeout(PROMPT, call)
        .await
        .expect("Await returns once the agents settle, not at its timeout")
        .expect("await succeeds");
    assert!(!resp.timed_out, "Await reported a timeout");
    resp
}

/// Awaits one agent until it settles.
async fn settled(client: &mut Client, id: &str) -> pb::Agent {
    await_settled(client, &[id], pb::AwaitMode::All)
        .await
        .agents
        .remove(0)
}

fn delivery(r: &pb::SteerResponse) -> pb::SteerDelivery {
    pb::SteerDelivery::try_from(r.delivery).unwrap()
}

fn id_set<'a>(ids: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    ids.into_iter().map(str::to_owned).collect()
}

fn ids_of(agents: &[pb::Agent]) -> BTreeSet<String> {
    agents.iter().map(|a| a.id.clone()).collect()
}

fn error_code(a: &pb::Agent) -> &str {
    a.error.as_ref().map_or("", |e| e.code.as_str())
}

fn assert_not_found(err: &tonic::Status, id: &str) {
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let (reason, metadata) = error_info(err);
    assert_eq!(reason, "AGENT_NOT_FOUND");
    assert_eq!(metadata.get("id").map(String::as_str), Some(id));
    assert!(
        err.message().contains(id),
        "message names the id: {}",
        err.message()
    );
}

fn assert_agent_finished(err: &tonic::Status) {
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(error_info(err).0, "AGENT_FINISHED");
}

fn unknown_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Reads events until one of `kind` arrives (for any agent); 10 s at most.
async fn next_event_of_kind(
    stream: &mut tonic::Streaming<pb::WatchAgentsResponse>,
    kind: pb::AgentEventKind,
) -> pb::WatchAgentsResponse {
    wait_for(stream, |ev| ev.kind == kind as i32).await
}

// ----- Await ------------------------------------------------------------------

#[tokio::test]
async fn await_all_returns_only_when_every_agent_has_settled() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, waiting()).await;
    let b = spawn(&mut s.client, waiting()).await;
    let mut events = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            ids: vec![a.id.clone()],
            ..Default::default()
        },
    )
    .await;
    steer(&mut s.client, &a.id, "go").await;
    wait_for_event(&mut events, &a.id, pb::AgentEventKind::Done).await;

    // One of two settled: ALL keeps waiting until its timeout.
    let partial = await_mode(&mut s.client, &[&a.id, &b.id], pb::AwaitMode::All, 200)
        .await
        .unwrap();
    assert!(partial.timed_out);
    assert_eq!(status(&partial.agents[0]), pb::AgentStatus::Done);
    assert_eq!(status(&partial.agents[1]), pb::AgentStatus::Running);

    let mut client = s.new_client().await;
    let (a_id, b_id) = (a.id.clone(), b.id.clone());
    let all = tokio::spawn(async move {
        await_settled(&mut client, &[&a_id, &b_id], pb::AwaitMode::All).await
    });
    steer(&mut s.client, &b.id, "go").await;
    let resp = all.await.unwrap();
    assert!(resp
        .agents
        .iter()
        .all(|a| status(a) == pb::AgentStatus::Done));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn await_any_returns_when_the_first_agent_settles_and_leaves_the_others_running() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, waiting()).await;
    let b = spawn(&mut s.client, waiting()).await;
    let c = spawn(&mut s.client, waiting()).await;
    let mut client = s.new_client().await;
    let ids = [a.id.clone(), b.id.clone(), c.id.clone()];
    let any = tokio::spawn(async move {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        await_settled(&mut client, &ids, pb::AwaitMode::Any).await
    });
    steer(&mut s.client, &b.id, "go").await;
    let resp = any.await.unwrap();
    let got: Vec<_> = resp.agents.iter().map(status).collect();
    assert_eq!(
        got,
        [
            pb::AgentStatus::Running,
            pb::AgentStatus::Done,
            pb::AgentStatus::Running
        ]
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn await_times_out_with_the_agent_as_it_is() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, waiting()).await;
    let started = tokio::time::Instant::now();
    let resp = await_mode(&mut s.client, &[&a.id], pb::AwaitMode::All, 100)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert!(resp.timed_out);
    assert_eq!(resp.agents.len(), 1);
    assert_eq!(resp.agents[0].id, a.id);
    assert_eq!(status(&resp.agents[0]), pb::AgentStatus::Running);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn await_returns_agents_in_the_order_of_ids() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, "output a")).await;
    let b = spawn(&mut s.client, bg(MODEL, "output b")).await;
    let c = spawn(&mut s.client, bg(MODEL, "output c")).await;
    for order in [[&c, &a, &b], [&b, &c, &a], [&a, &b, &c]] {
        let ids: Vec<&str> = order.iter().map(|x| x.id.as_str()).collect();
        let got = await_settled(&mut s.client, &ids, pb::AwaitMode::All)
            .await
            .agents;
        let got_ids: Vec<&str> = got.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(got_ids, ids);
        let results: Vec<&str> = got.iter().map(|x| x.result.as_str()).collect();
        let expected: Vec<String> = order
            .iter()
            .map(|x| {
                if x.id == a.id {
                    "a"
                } else if x.id == b.id {
                    "b"
                } else {
                    "c"
                }
                .to_owned()
            })
            .collect();
        assert_eq!(results, expected);
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn await_of_an_unknown_id_is_not_found_naming_it() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, waiting()).await;
    let missing = unknown_id();
    let err = await_mode(&mut s.client, &[&a.id, &missing], pb::AwaitMode::All, 1_000)
        .await
        .unwrap_err();
    assert_not_found(&err, &missing);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn await_returns_at_once_for_an_agent_awaiting_approval() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, "approve shell")).await;
    // Nothing resumes an approval in this version, so only the pause itself
    // can end this Await before its timeout.
    let resp = await_settled(&mut s.client, &[&a.id], pb::AwaitMode::All).await;
    let got = &resp.agents[0];
    assert_eq!(status(got), pb::AgentStatus::AwaitingApproval);
    let approval = got.approval.as_ref().expect("approval set while awaiting");
    assert_eq!(approval.tool_name, "shell");
    assert!(!approval.id.is_empty());
    s.handle.shutdown().await.unwrap();
}

// ----- Cancel -------------------------------------------------------------------

#[tokio::test]
async fn cancel_moves_a_running_agent_to_cancelled() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, waiting()).await;
    let other = spawn(&mut s.client, waiting()).await;
    let cancelled = cancel(&mut s.client, &a.id).await;
    assert_eq!(ids_of(&cancelled), id_set([a.id.as_str()]));
    assert_eq!(status(&cancelled[0]), pb::AgentStatus::Cancelled);
    let now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&now), pb::AgentStatus::Cancelled);
    assert_eq!(error_code(&now), "CANCELLED");
    assert!(now.finished_at.is_some());
    assert_eq!(
        status(&status_of(&mut s.client, &other.id).await),
        pb::AgentStatus::Running
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancel_cascades_to_children_and_grandchildren() {
    let mut s = TestServer::start("").await;
    let parent = spawn(&mut s.client, waiting()).await;
    let child = spawn(&mut s.client, waiting_child(&parent.id)).await;
    let grandchild = spawn(&mut s.client, waiting_child(&child.id)).await;
    let cancelled = cancel(&mut s.client, &parent.id).await;
    assert_eq!(
        ids_of(&cancelled),
        id_set([
            parent.id.as_str(),
            child.id.as_str(),
            grandchild.id.as_str()
        ])
    );
    assert_eq!(cancelled.len(), 3, "each agent listed once");
    assert!(cancelled
        .iter()
        .all(|a| status(a) == pb::AgentStatus::Cancelled));
    for a in [&parent, &child, &grandchild] {
        let now = status_of(&mut s.client, &a.id).await;
        assert_eq!(status(&now), pb::AgentStatus::Cancelled, "{}", a.id);
        assert_eq!(error_code(&now), "CANCELLED");
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancel_by_lead_cancels_every_live_agent_under_the_lead() {
    let mut s =
        TestServer::start("[limits]\nmax_background_agents = 10\ndefault_concurrency = 0").await;
    let finished = spawn(&mut s.client, with_lead(bg(MODEL, "output done"), "lead-a")).await;
    settled(&mut s.client, &finished.id).await;
    let r1 = spawn(&mut s.client, with_lead(waiting(), "lead-a")).await;
    let r2 = spawn(&mut s.client, with_lead(waiting(), "lead-a")).await;
    let c1 = spawn(&mut s.client, waiting_child(&r1.id)).await;
    let g1 = spawn(&mut s.client, waiting_child(&c1.id)).await;
    let other_lead = spawn(&mut s.client, with_lead(waiting(), "lead-b")).await;
    let no_lead = spawn(&mut s.client, waiting()).await;

    let cancelled = s
        .client
        .cancel(pb::CancelRequest {
            lead_id: "lead-a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents;
    let expected = id_set([
        r1.id.as_str(),
        r2.id.as_str(),
        c1.id.as_str(),
        g1.id.as_str(),
    ]);
    assert_eq!(ids_of(&cancelled), expected);
    assert_eq!(cancelled.len(), 4, "each agent listed once");
    for id in &expected {
        assert_eq!(
            status(&status_of(&mut s.client, id).await),
            pb::AgentStatus::Cancelled
        );
    }
    assert_eq!(
        status(&status_of(&mut s.client, &finished.id).await),
        pb::AgentStatus::Done
    );
    for survivor in [&other_lead, &no_lead] {
        assert_eq!(
            status(&status_of(&mut s.client, &survivor.id).await),
            pb::AgentStatus::Running
        );
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancelling_an_agent_that_already_ended_is_ok_and_lists_nothing() {
    let mut s = TestServer::start("").await;
    let done = spawn(&mut s.client, bg(MODEL, "output x")).await;
    assert_eq!(
        status(&settled(&mut s.client, &done.id).await),
        pb::AgentStatus::Done
    );
    assert!(cancel(&mut s.client, &done.id).await.is_empty());
    let running = spawn(&mut s.client, waiting()).await;
    assert_eq!(cancel(&mut s.client, &running.id).await.len(), 1);
    assert!(cancel(&mut s.client, &running.id).await.is_empty());
    // Nothing about the ended agents changed.
    let after = status_of(&mut s.client, &done.id).await;
    assert_eq!(status(&after), pb::AgentStatus::Done);
    assert_eq!(after.result, "x");
    assert_eq!(
        status(&status_of(&mut s.client, &running.id).await),
        pb::AgentStatus::Cancelled
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancel_of_an_unknown_id_is_not_found() {
    let mut s = TestServer::start("").await;
    let missing = unknown_id();
    let err = s
        .client
        .cancel(pb::CancelRequest {
            id: missing.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_not_found(&err, &missing);
    s.handle.shutdown().await.unwrap();
}

// ----- parents and trees -----------------------------------------------------------

#[tokio::test]
async fn a_parent_that_finishes_cancels_its_children_but_not_detached_ones() {
    let mut s = TestServer::start("").await;
    let parent = spawn(&mut s.client, waiting()).await;
    let child = spawn(&mut s.client, waiting_child(&parent.id)).await;
    let grandchild = spawn(&mut s.client, waiting_child(&child.id)).await;
    let detached = spawn(
        &mut s.client,
        pb::SpawnRequest {
            detached: true,
            ..waiting_child(&parent.id)
        },
    )
    .await;
    assert!(detached.detached);

    steer(&mut s.client, &parent.id, "finish").await;
    let parent_now = settled(&mut s.client, &parent.id).await;
    assert_eq!(status(&parent_now), pb::AgentStatus::Done);

    let got = await_settled(
        &mut s.client,
        &[&child.id, &grandchild.id],
        pb::AwaitMode::All,
    )
    .await
    .agents;
    for a in &got {
        assert_eq!(status(a), pb::AgentStatus::Cancelled, "{}", a.id);
        assert_eq!(error_code(a), "CANCELLED");
    }
    let message = &got[0].error.as_ref().unwrap().message;
    assert!(
        message.contains(&parent.id),
        "the reason names the parent: {message}"
    );
    // The cascade happens in the same step as the parent's DONE, so the
    // detached child would already show CANCELLED if it had been included.
    let d = status_of(&mut s.client, &detached.id).await;
    assert_eq!(status(&d), pb::AgentStatus::Running);
    // And it is still a working run.
    steer(&mut s.client, &detached.id, "still here").await;
    let d = settled(&mut s.client, &detached.id).await;
    assert_eq!(status(&d), pb::AgentStatus::Done);
    assert!(d.result.contains("steer: still here"));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_parent_that_fails_cancels_its_children() {
    let mut s = TestServer::start("").await;
    let parent = spawn(&mut s.client, bg(MODEL, "wait_steer\nfail boom")).await;
    let child = spawn(&mut s.client, waiting_child(&parent.id)).await;
    steer(&mut s.client, &parent.id, "go").await;
    assert_eq!(
        status(&settled(&mut s.client, &parent.id).await),
        pb::AgentStatus::Failed
    );
    let c = settled(&mut s.client, &child.id).await;
    assert_eq!(status(&c), pb::AgentStatus::Cancelled);
    assert!(c.error.as_ref().unwrap().message.contains(&parent.id));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn spawn_under_an_unknown_parent_is_not_found() {
    let mut s = TestServer::start("").await;
    let missing = unknown_id();
    let err = s.client.spawn(waiting_child(&missing)).await.unwrap_err();
    assert_not_found(&err, &missing);
    assert!(list_all(&mut s.client, Default::default()).await.is_empty());
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn spawn_under_an_ended_parent_is_failed_precondition() {
    let mut s = TestServer::start("").await;
    let parent = spawn(&mut s.client, bg(MODEL, "output p")).await;
    settled(&mut s.client, &parent.id).await;
    let err = s.client.spawn(waiting_child(&parent.id)).await.unwrap_err();
    assert_agent_finished(&err);
    assert_eq!(
        ids_of(&list_all(&mut s.client, Default::default()).await),
        id_set([parent.id.as_str()])
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn children_inherit_depth_root_and_lead_from_their_parent() {
    let mut s = TestServer::start("").await;
    let root = spawn(&mut s.client, with_lead(waiting(), "lead-tree")).await;
    assert_eq!(root.depth, 1);
    assert_eq!(root.root_id, root.id);
    assert_eq!(root.parent_id, "");
    assert_eq!(root.lead_id, "lead-tree");

    let child = spawn(&mut s.client, waiting_child(&root.id)).await;
    assert_eq!(child.depth, 2);
    assert_eq!(child.parent_id, root.id);
    assert_eq!(child.root_id, root.id);
    assert_eq!(child.lead_id, "lead-tree");

    let grandchild = spawn(&mut s.client, waiting_child(&child.id)).await;
    assert_eq!(grandchild.depth, 3);
    assert_eq!(grandchild.parent_id, child.id);
    assert_eq!(grandchild.root_id, root.id);
    assert_eq!(grandchild.lead_id, "lead-tree");

    // Status shows the same tree fields.
    let now = status_of(&mut s.client, &grandchild.id).await;
    assert_eq!(
        (now.depth, now.root_id.as_str(), now.lead_id.as_str()),
        (3, root.id.as_str(), "lead-tree")
    );
    s.handle.shutdown().await.unwrap();
}

// ----- Steer ----------------------------------------------------------------------

#[tokio::test]
async fn steering_a_running_agent_delivers_the_message_to_the_run() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, waiting()).await;
    assert_eq!(status(&a), pb::AgentStatus::Running);
    let resp = steer(&mut s.client, &a.id, "look left").await;
    assert_eq!(delivery(&resp), pb::SteerDelivery::Delivered);
    assert_eq!(resp.agent.as_ref().unwrap().id, a.id);
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done);
    assert!(
        done.result.contains("steer: look left"),
        "result: {:?}",
        done.result
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn steering_a_queued_agent_buffers_the_message_until_it_runs() {
    let mut s = TestServer::start("[limits]\ndefault_concurrency = 1").await;
    let first = spawn(&mut s.client, waiting()).await;
    assert_eq!(status(&first), pb::AgentStatus::Running);
    let queued = spawn(&mut s.client, waiting()).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    assert!(queued.started_at.is_none());

    let resp = steer(&mut s.client, &queued.id, "from the queue").await;
    assert_eq!(delivery(&resp), pb::SteerDelivery::Buffered);
    assert_eq!(
        status(&status_of(&mut s.client, &queued.id).await),
        pb::AgentStatus::Queued
    );

    // Free the bucket slot; the queued agent starts and its wait_steer
    // consumes the buffered message.
    steer(&mut s.client, &first.id, "done").await;
    let got = await_settled(&mut s.client, &[&first.id, &queued.id], pb::AwaitMode::All)
        .await
        .agents;
    assert_eq!(status(&got[1]), pb::AgentStatus::Done);
    assert!(
        got[1].result.contains("steer: from the queue"),
        "result: {:?}",
        got[1].result
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_steer_that_arrived_before_a_wait_steer_satisfies_it_and_each_wait_steer_takes_one() {
    // One slot: the agent queues, so its steer is buffered and is in the
    // run's inbox when it starts; the run receives it during its `sleep`.
    let mut s = TestServer::start("[limits]\ndefault_concurrency = 1").await;
    let first = spawn(&mut s.client, waiting()).await;
    let script = "sleep 100\nwait_steer\noutput between\nwait_steer\noutput end";
    let queued = spawn(&mut s.client, bg(MODEL, script)).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    let mut progress = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            ids: vec![queued.id.clone()],
            include_progress: true,
            ..Default::default()
        },
    )
    .await;
    let resp = steer(&mut s.client, &queued.id, "early").await;
    assert_eq!(delivery(&resp), pb::SteerDelivery::Buffered);
    steer(&mut s.client, &first.id, "done").await;

    // The first wait_steer went on with the steer that came before it...
    wait_for(&mut progress, |ev| {
        ev.kind == pb::AgentEventKind::Output as i32 && ev.output == "\nbetween"
    })
    .await;
    // ...and the second waits for a steer of its own.
    let waiting = status_of(&mut s.client, &queued.id).await;
    assert_eq!(status(&waiting), pb::AgentStatus::Running);
    assert_eq!(waiting.result, "steer: early\nbetween");
    let resp = steer(&mut s.client, &queued.id, "late").await;
    assert_eq!(delivery(&resp), pb::SteerDelivery::Delivered);
    let done = settled(&mut s.client, &queued.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done);
    assert_eq!(done.result, "steer: early\nbetween\nsteer: late\nend");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn steering_an_agent_awaiting_approval_buffers_the_message() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, "approve shell")).await;
    let paused = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&paused), pb::AgentStatus::AwaitingApproval);
    let resp = steer(&mut s.client, &a.id, "while paused").await;
    assert_eq!(delivery(&resp), pb::SteerDelivery::Buffered);
    let now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&now), pb::AgentStatus::AwaitingApproval);
    assert!(!now.result.contains("while paused"));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn steering_a_finished_agent_is_failed_precondition() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, "output x")).await;
    settled(&mut s.client, &a.id).await;
    let err = s
        .client
        .steer(pb::SteerRequest {
            id: a.id.clone(),
            message: "too late".into(),
        })
        .await
        .unwrap_err();
    assert_agent_finished(&err);
    assert_eq!(status_of(&mut s.client, &a.id).await.result, "x");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn steering_an_unknown_agent_is_not_found() {
    let mut s = TestServer::start("").await;
    let missing = unknown_id();
    let err = s
        .client
        .steer(pb::SteerRequest {
            id: missing.clone(),
            message: "hello?".into(),
        })
        .await
        .unwrap_err();
    assert_not_found(&err, &missing);
    s.handle.shutdown().await.unwrap();
}

// ----- usage ------------------------------------------------------------------------

#[tokio::test]
async fn tool_calls_and_token_usage_are_reported_after_done() {
    let mut s = TestServer::start("").await;
    let a = spawn(
        &mut s.client,
        bg(MODEL, "tool grep\nusage 10 20\ntool ls\nusage 1 2"),
    )
    .await;
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done);
    let usage = done.usage.expect("usage set");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.tool_calls),
        (11, 22, 2)
    );
    let again = status_of(&mut s.client, &a.id).await.usage.unwrap();
    assert_eq!(again, usage);
    s.handle.shutdown().await.unwrap();
}

// ----- idempotency --------------------------------------------------------------------

#[tokio::test]
async fn a_repeated_idempotency_key_under_the_same_lead_returns_the_first_agent() {
    let mut s = TestServer::start("").await;
    let req = pb::SpawnRequest {
        idempotency_key: "key-1".into(),
        ..with_lead(waiting(), "lead-1")
    };
    let first = spawn(&mut s.client, req.clone()).await;
    let second = spawn(&mut s.client, req.clone()).await;
    assert_eq!(second.id, first.id);
    let by_lead = pb::StatusRequest {
        lead_id: "lead-1".into(),
        ..Default::default()
    };
    assert_eq!(list_all(&mut s.client, by_lead).await.len(), 1);

    // The same key under another lead is another agent.
    let other = spawn(&mut s.client, with_lead(req, "lead-2")).await;
    assert_ne!(other.id, first.id);
    assert_eq!(other.lead_id, "lead-2");
    let by_lead = pb::StatusRequest {
        lead_id: "lead-2".into(),
        ..Default::default()
    };
    assert_eq!(list_all(&mut s.client, by_lead).await.len(), 1);
    assert_eq!(list_all(&mut s.client, Default::default()).await.len(), 2);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_repeated_idempotency_key_under_the_same_parent_returns_the_first_child() {
    let mut s = TestServer::start("").await;
    let parent = spawn(&mut s.client, waiting()).await;
    let req = pb::SpawnRequest {
        idempotency_key: "child-key".into(),
        ..waiting_child(&parent.id)
    };
    let first = spawn(&mut s.client, req.clone()).await;
    let second = spawn(&mut s.client, req).await;
    assert_eq!(second.id, first.id);
    let children = pb::StatusRequest {
        parent_id: parent.id.clone(),
        ..Default::default()
    };
    assert_eq!(list_all(&mut s.client, children).await.len(), 1);
    s.handle.shutdown().await.unwrap();
}

// ----- foreground ------------------------------------------------------------------------

#[tokio::test]
async fn foreground_spawn_returns_the_settled_agent_with_its_result() {
    let mut s = TestServer::start("").await;
    let a = spawn(
        &mut s.client,
        fg(MODEL, "sleep 50\noutput first\noutput second"),
    )
    .await;
    assert_eq!(status(&a), pb::AgentStatus::Done);
    assert_eq!(a.result, "first\nsecond");
    assert!(!a.background);
    assert!(a.finished_at.is_some());
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn foreground_spawn_is_cancelled_when_its_caller_goes_away() {
    let mut s = TestServer::start("").await;
    let lead = "fg-lead";
    let mut events = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            lead_id: lead.into(),
            ..Default::default()
        },
    )
    .await;
    let mut caller = s.new_client().await;
    let call =
        tokio::spawn(async move { caller.spawn(with_lead(fg(MODEL, "wait_steer"), lead)).await });
    let started = next_event_of_kind(&mut events, pb::AgentEventKind::Started).await;
    let id = started.agent.unwrap().id;
    assert!(!call.is_finished(), "a foreground wait_steer cannot return");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());

    let ev = wait_for_event(&mut events, &id, pb::AgentEventKind::Cancelled).await;
    let agent = ev.agent.unwrap();
    assert_eq!(status(&agent), pb::AgentStatus::Cancelled);
    assert_eq!(error_code(&agent), "CANCELLED");
    s.handle.shutdown().await.unwrap();
}

// ----- deadlines and retention -------------------------------------------------------------

#[tokio::test]
async fn a_run_past_its_timeout_fails_with_deadline_exceeded() {
    let mut s = TestServer::start("").await;
    let a = spawn(
        &mut s.client,
        pb::SpawnRequest {
            timeout: Some(ms(200)),
            ..bg(MODEL, "sleep 600000")
        },
    )
    .await;
    let got = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&got), pb::AgentStatus::Failed);
    assert_eq!(error_code(&got), "DEADLINE_EXCEEDED");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_configured_default_timeout_applies_when_spawn_sets_none() {
    let mut s = TestServer::start("[runs]\ndefault_timeout = \"200ms\"").await;
    let a = spawn(&mut s.client, bg(MODEL, "sleep 600000")).await;
    let got = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&got), pb::AgentStatus::Failed);
    assert_eq!(error_code(&got), "DEADLINE_EXCEEDED");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn finished_agents_are_forgotten_after_the_retention() {
    let mut s = TestServer::start("[runs]\nfinished_retention = \"100ms\"").await;
    let live = spawn(&mut s.client, waiting()).await;
    let a = spawn(&mut s.client, bg(MODEL, "output x")).await;
    assert_eq!(
        status(&settled(&mut s.client, &a.id).await),
        pb::AgentStatus::Done
    );
    // Forgetting emits no event, so poll, bounded at 5 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let err = loop {
        let res = s
            .client
            .status(pb::StatusRequest {
                ids: vec![a.id.clone()],
                ..Default::default()
            })
            .await;
        match res {
            Err(err) => break err,
            Ok(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "agent still retained 5 s after finishing with a 100 ms retention"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_not_found(&err, &a.id);
    // A live agent is never forgotten.
    assert_eq!(
        status(&status_of(&mut s.client, &live.id).await),
        pb::AgentStatus::Running
    );
    s.handle.shutdown().await.unwrap();
}

// ----- Status listings -------------------------------------------------------------------------

#[tokio::test]
async fn status_filters_by_parent_root_lead_and_status() {
    let mut s =
        TestServer::start("[limits]\nmax_background_agents = 20\ndefault_concurrency = 0").await;
    let root = spawn(&mut s.client, with_lead(waiting(), "lead-f")).await;
    let c1 = spawn(&mut s.client, waiting_child(&root.id)).await;
    let c2 = spawn(&mut s.client, waiting_child(&root.id)).await;
    let g1 = spawn(&mut s.client, waiting_child(&c1.id)).await;
    let root2 = spawn(&mut s.client, with_lead(waiting(), "lead-f")).await;
    let root2_child = spawn(&mut s.client, waiting_child(&root2.id)).await;
    let other = spawn(&mut s.client, bg(MODEL, "output other")).await;
    settled(&mut s.client, &other.id).await;

    let by_parent = list_all(
        &mut s.client,
        pb::StatusRequest {
            parent_id: root.id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids_of(&by_parent), id_set([c1.id.as_str(), c2.id.as_str()]));

    let by_root = list_all(
        &mut s.client,
        pb::StatusRequest {
            root_id: root.id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        ids_of(&by_root),
        id_set([
            root.id.as_str(),
            c1.id.as_str(),
            c2.id.as_str(),
            g1.id.as_str()
        ])
    );

    let by_lead = list_all(
        &mut s.client,
        pb::StatusRequest {
            lead_id: "lead-f".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        ids_of(&by_lead),
        id_set([
            root.id.as_str(),
            c1.id.as_str(),
            c2.id.as_str(),
            g1.id.as_str(),
            root2.id.as_str(),
            root2_child.id.as_str()
        ])
    );

    let done = list_all(
        &mut s.client,
        pb::StatusRequest {
            statuses: vec![pb::AgentStatus::Done as i32],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids_of(&done), id_set([other.id.as_str()]));

    let running = list_all(
        &mut s.client,
        pb::StatusRequest {
            statuses: vec![pb::AgentStatus::Running as i32],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(running.len(), 6);
    assert!(!ids_of(&running).contains(&other.id));

    // Filters combine: the DONE agents of a tree with none.
    let none = list_all(
        &mut s.client,
        pb::StatusRequest {
            root_id: root.id.clone(),
            statuses: vec![pb::AgentStatus::Done as i32],
            ..Default::default()
        },
    )
    .await;
    assert!(none.is_empty());
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn status_pages_through_a_listing_without_duplicates() {
    let mut s = TestServer::start("").await;
    let mut spawned = Vec::new();
    for i in 0..5 {
        let a = spawn(&mut s.client, bg(MODEL, &format!("output {i}"))).await;
        spawned.push(a.id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut sizes = Vec::new();
    loop {
        let resp = s
            .client
            .status(pb::StatusRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        sizes.push(resp.agents.len());
        seen.extend(resp.agents.into_iter().map(|a| a.id));
        if resp.next_page_token.is_empty() {
            break;
        }
        assert_ne!(resp.next_page_token, token, "the token moves forward");
        token = resp.next_page_token;
        assert!(sizes.len() < 10, "paging does not end");
    }
    assert_eq!(sizes, [2, 2, 1]);
    assert_eq!(
        seen.iter().collect::<BTreeSet<_>>().len(),
        5,
        "no duplicates"
    );
    // Listings are in creation order.
    assert_eq!(seen, spawned);
    s.handle.shutdown().await.unwrap();
}

/// Without an exporter every run still has a trace context: a root starts
/// a trace of its own (each root a different one), a child is in its
/// parent's, and a caller's `traceparent` is inherited as it is.
#[tokio::test]
async fn every_agent_has_a_trace_id_without_an_exporter() {
    let mut s = TestServer::start("").await;
    let root = spawn(&mut s.client, waiting()).await;
    let other = spawn(&mut s.client, waiting()).await;
    let child = spawn(&mut s.client, waiting_child(&root.id)).await;
    assert_eq!(root.trace_id.len(), 32, "{root:?}");
    assert_ne!(root.trace_id, "0".repeat(32));
    assert_ne!(
        root.trace_id, other.trace_id,
        "each root starts its own trace"
    );
    assert_eq!(
        child.trace_id, root.trace_id,
        "a child is in its parent's trace"
    );
    assert_eq!(
        status_of(&mut s.client, &root.id).await.trace_id,
        root.trace_id
    );

    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut request = tonic::Request::new(waiting());
    request
        .metadata_mut()
        .insert("traceparent", caller.parse().unwrap());
    let traced = s
        .client
        .spawn(request)
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(traced.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    for a in [&root, &other, &traced] {
        cancel(&mut s.client, &a.id).await;
    }
    s.handle.shutdown().await.unwrap();
}
