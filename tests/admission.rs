//! Layered admission (issue #2, section 3) through the generated client:
//! bucket, provider and model concurrency, the global cap, per-parent and
//! per-lead limits, depth and tree-size limits, the slot release of every
//! terminal path, approval pauses, and limit changes by reload — in process
//! and by SIGHUP to the real binary.
//!
//! Nothing here sleeps to wait for a state: agents are kept RUNNING with
//! `wait_steer` and ended by Steer or Cancel; starts are observed as
//! WatchAgents STARTED events and ends with Await.

mod common;

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::{transport::Channel, Code};
use tonic_types::StatusExt;

type Client = AgentServiceClient<Channel>;
type Events = tonic::Streaming<pb::WatchAgentsResponse>;

/// Keeps a simulated agent RUNNING until it is steered (it then finishes
/// DONE) or cancelled.
const UNTIL_STEERED: &str = "wait_steer";

/// How long any single wait in these tests may take before it fails.
const WAIT: Duration = Duration::from_secs(10);

// ----- helpers ---------------------------------------------------------------

/// A background child of `parent`.
fn child(parent: &pb::Agent, model: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        parent_id: parent.id.clone(),
        ..bg(model, prompt)
    }
}

/// A background root agent of `lead`.
fn under_lead(lead: &str, model: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        lead_id: lead.to_owned(),
        ..bg(model, prompt)
    }
}

/// A Spawn that must be refused; returns the status.
async fn spawn_refused(client: &mut Client, req: pb::SpawnRequest) -> tonic::Status {
    match client.spawn(req).await {
        Ok(resp) => panic!(
            "spawn should have been refused, but admitted {:?}",
            resp.into_inner().agent
        ),
        Err(status) => status,
    }
}

/// Asserts `s` is the global-cap refusal for `limit` with `live` agents live.
fn assert_global_limit(s: &tonic::Status, limit: u32, live: u32) {
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    let (reason, metadata) = error_info(s);
    assert_eq!(reason, "GLOBAL_LIMIT_REACHED");
    assert_eq!(
        metadata.get("limit").map(String::as_str),
        Some(limit.to_string().as_str())
    );
    assert_eq!(
        metadata.get("live").map(String::as_str),
        Some(live.to_string().as_str())
    );
}

/// Sends a steer message (ending a `wait_steer`).
async fn steer(client: &mut Client, id: &str) {
    client
        .steer(pb::SteerRequest {
            id: id.to_owned(),
            message: "go on".into(),
        })
        .await
        .expect("steer succeeds");
}

/// A live-only watch over every agent. The subscription exists once this
/// returns, so no later event can be missed.
async fn watch_all(client: &mut Client) -> Events {
    watch(client, pb::WatchAgentsRequest::default()).await
}

/// Ids of the next `n` STARTED events, in stream order (other kinds are
/// skipped); panics after [`WAIT`].
async fn next_started(events: &mut Events, n: usize) -> Vec<String> {
    tokio::time::timeout(WAIT, async {
        let mut ids = Vec::with_capacity(n);
        while ids.len() < n {
            let ev = events
                .message()
                .await
                .expect("watch stream ok")
                .expect("watch stream open");
            if ev.kind == pb::AgentEventKind::Started as i32 {
                ids.push(ev.agent.expect("event carries the agent").id);
            }
        }
        ids
    })
    .await
    .unwrap_or_else(|_| panic!("{n} STARTED event(s) did not arrive within {WAIT:?}"))
}

/// Current status of each of `ids`, in order.
async fn statuses(client: &mut Client, ids: &[String]) -> Vec<pb::AgentStatus> {
    client
        .status(pb::StatusRequest {
            ids: ids.to_vec(),
            ..Default::default()
        })
        .await
        .expect("status succeeds")
        .into_inner()
        .agents
        .iter()
        .map(status)
        .collect()
}

/// How many of `ids` are in `wanted` now.
async fn count_in(client: &mut Client, ids: &[String], wanted: pb::AgentStatus) -> usize {
    statuses(client, ids)
        .await
        .into_iter()
        .filter(|s| *s == wanted)
        .count()
}

fn ids_of(agents: &[pb::Agent]) -> Vec<String> {
    agents.iter().map(|a| a.id.clone()).collect()
}

/// Spawns `n` background `wait_steer` agents on `model`.
async fn spawn_waiting(client: &mut Client, model: &str, n: usize) -> Vec<pb::Agent> {
    let mut agents = Vec::with_capacity(n);
    for _ in 0..n {
        agents.push(spawn(client, bg(model, UNTIL_STEERED)).await);
    }
    agents
}

fn assert_queued_on(a: &pb::Agent, bucket: &str, reason_mentions: &str) {
    assert_eq!(status(a), pb::AgentStatus::Queued, "{a:?}");
    assert_eq!(a.bucket, bucket);
    assert!(
        a.queue_reason.contains(reason_mentions),
        "queue_reason {:?} should mention {reason_mentions:?}",
        a.queue_reason
    );
}

fn assert_running_on(a: &pb::Agent, bucket: &str) {
    assert_eq!(status(a), pb::AgentStatus::Running, "{a:?}");
    assert_eq!(a.bucket, bucket);
    assert!(a.queue_reason.is_empty(), "{a:?}");
}

fn millis(ms: i32) -> prost_types::Duration {
    prost_types::Duration {
        seconds: 0,
        nanos: ms * 1_000_000,
    }
}

// ----- bucket limits -----------------------------------------------------------

#[tokio::test]
async fn ten_spawns_on_a_bucket_of_five_run_five_queue_five_and_start_the_queued_in_fifo_order() {
    let mut s = TestServer::start(
        "[limits]\ndefault_concurrency = 5\nmax_background_agents = 20\nmax_concurrent_per_parent = 20\n",
    )
    .await;
    let agents = spawn_waiting(&mut s.client, "acme/m1", 10).await;
    for a in &agents[..5] {
        assert_running_on(a, "acme/m1");
    }
    for a in &agents[5..] {
        assert_queued_on(a, "acme/m1", "acme/m1");
    }
    let all = ids_of(&agents);
    assert_eq!(
        count_in(&mut s.client, &all, pb::AgentStatus::Running).await,
        5
    );
    assert_eq!(
        count_in(&mut s.client, &all, pb::AgentStatus::Queued).await,
        5
    );

    let mut events = watch_all(&mut s.client).await;
    for i in 0..5 {
        // Half the slots are freed by finishing, half by cancelling.
        if i % 2 == 0 {
            steer(&mut s.client, &agents[i].id).await;
        } else {
            cancel(&mut s.client, &agents[i].id).await;
        }
        let started = next_started(&mut events, 1).await;
        assert_eq!(started, vec![agents[5 + i].id.clone()], "FIFO at slot {i}");
        // One freed slot starts exactly one agent: never more than 5 run.
        assert_eq!(
            count_in(&mut s.client, &all, pb::AgentStatus::Running).await,
            5
        );
        assert_eq!(
            count_in(&mut s.client, &all, pb::AgentStatus::Queued).await,
            4 - i
        );
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_provider_limit_is_shared_by_all_models_of_that_provider() {
    let mut s = TestServer::start(
        "[limits]\ndefault_concurrency = 10\nmax_background_agents = 20\n\
         [limits.provider_concurrency]\nacme = 2\n",
    )
    .await;
    let m1a = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let m2a = spawn(&mut s.client, bg("acme/m2", UNTIL_STEERED)).await;
    let m1b = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let m2b = spawn(&mut s.client, bg("acme/m2", UNTIL_STEERED)).await;
    assert_running_on(&m1a, "acme");
    assert_running_on(&m2a, "acme");
    assert_queued_on(&m1b, "acme", "acme");
    assert_queued_on(&m2b, "acme", "acme");
    // Another provider has its own (default) bucket.
    let other = spawn(&mut s.client, bg("other/m1", UNTIL_STEERED)).await;
    assert_running_on(&other, "other/m1");

    let mut events = watch_all(&mut s.client).await;
    // A slot freed by an m2 agent goes to the oldest queued agent, an m1.
    cancel(&mut s.client, &m2a.id).await;
    assert_eq!(next_started(&mut events, 1).await, vec![m1b.id.clone()]);
    cancel(&mut s.client, &m1a.id).await;
    assert_eq!(next_started(&mut events, 1).await, vec![m2b.id.clone()]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_model_entry_overrides_its_provider_and_gets_a_bucket_of_its_own() {
    let mut s = TestServer::start(
        "[limits]\ndefault_concurrency = 10\nmax_background_agents = 20\n\
         [limits.provider_concurrency]\nacme = 3\n\
         [limits.model_concurrency]\n\"acme/big\" = 1\n",
    )
    .await;
    let big = spawn_waiting(&mut s.client, "acme/big", 2).await;
    assert_running_on(&big[0], "acme/big");
    assert_queued_on(&big[1], "acme/big", "acme/big");
    // The running acme/big agent does not use one of the provider's 3 slots.
    let small = spawn_waiting(&mut s.client, "acme/small", 4).await;
    for a in &small[..3] {
        assert_running_on(a, "acme");
    }
    assert_queued_on(&small[3], "acme", "acme");

    let mut events = watch_all(&mut s.client).await;
    cancel(&mut s.client, &big[0].id).await;
    assert_eq!(next_started(&mut events, 1).await, vec![big[1].id.clone()]);
    assert_eq!(
        status(&status_of(&mut s.client, &small[3].id).await),
        pb::AgentStatus::Queued
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_default_concurrency_of_zero_is_unlimited() {
    let mut s =
        TestServer::start("[limits]\ndefault_concurrency = 0\nmax_background_agents = 50\n").await;
    let agents = spawn_waiting(&mut s.client, "acme/m1", 20).await;
    for a in &agents {
        assert_running_on(a, "acme/m1");
    }
    let all = ids_of(&agents);
    assert_eq!(
        count_in(&mut s.client, &all, pb::AgentStatus::Running).await,
        20
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_zero_provider_or_model_entry_is_unlimited_even_when_the_default_is_one() {
    let mut s = TestServer::start(
        "[limits]\ndefault_concurrency = 1\nmax_background_agents = 50\n\
         [limits.provider_concurrency]\nacme = 0\n\
         [limits.model_concurrency]\n\"other/free\" = 0\n",
    )
    .await;
    for a in spawn_waiting(&mut s.client, "acme/m1", 6).await {
        assert_running_on(&a, "acme");
    }
    for a in spawn_waiting(&mut s.client, "other/free", 6).await {
        assert_running_on(&a, "other/free");
    }
    // The default still applies elsewhere, so the limits above were live.
    let limited = spawn_waiting(&mut s.client, "other/m1", 2).await;
    assert_running_on(&limited[0], "other/m1");
    assert_queued_on(&limited[1], "other/m1", "other/m1");
    s.handle.shutdown().await.unwrap();
}

// ----- the global cap --------------------------------------------------------------

#[tokio::test]
async fn a_background_spawn_beyond_max_background_agents_is_refused_with_resource_exhausted() {
    let mut s =
        TestServer::start("[limits]\nmax_background_agents = 2\ndefault_concurrency = 1\n").await;
    // One running and one queued: both count as live.
    let running = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let queued = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&running), pb::AgentStatus::Running);
    assert_eq!(status(&queued), pb::AgentStatus::Queued);

    let err = spawn_refused(&mut s.client, bg("other/m1", UNTIL_STEERED)).await;
    assert_global_limit(&err, 2, 2);
    let quota = err
        .get_details_quota_failure()
        .expect("status carries QuotaFailure");
    assert!(!quota.violations.is_empty(), "{quota:?}");
    assert!(
        err.message().contains("max_background_agents"),
        "message should name the config key: {}",
        err.message()
    );
    assert!(err.message().contains('2'), "{}", err.message());
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn foreground_spawns_are_not_counted_by_the_global_cap() {
    let mut s = TestServer::start("[limits]\nmax_background_agents = 1\n").await;
    let bg1 = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await,
        1,
        1,
    );
    // With the cap reached, a foreground spawn still runs to its result ...
    let fg_done = spawn(&mut s.client, fg("acme/m1", "output hi")).await;
    assert_eq!(status(&fg_done), pb::AgentStatus::Done);
    assert_eq!(fg_done.result, "hi");
    // ... and one that stays live (paused for approval) takes no slot.
    let fg_live = spawn(&mut s.client, fg("acme/m1", "approve shell")).await;
    assert_eq!(status(&fg_live), pb::AgentStatus::AwaitingApproval);

    cancel(&mut s.client, &bg1.id).await;
    let bg2 = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&bg2), pb::AgentStatus::Running);
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await,
        1,
        1,
    );
    s.handle.shutdown().await.unwrap();
}

// ----- every terminal path frees its global slot --------------------------------------

const CAP_ONE: &str = "[limits]\nmax_background_agents = 1\n";

#[tokio::test]
async fn a_slot_freed_by_done_lets_the_next_spawn_in() {
    let mut s = TestServer::start(CAP_ONE).await;
    let a = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        1,
        1,
    );
    steer(&mut s.client, &a.id).await;
    let done = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done);
    let next = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&next), pb::AgentStatus::Running);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_slot_freed_by_failure_lets_the_next_spawn_in() {
    let mut s = TestServer::start(CAP_ONE).await;
    let a = spawn(&mut s.client, bg("acme/m1", "wait_steer\nfail x")).await;
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        1,
        1,
    );
    steer(&mut s.client, &a.id).await;
    let failed = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&failed[0]), pb::AgentStatus::Failed);
    assert_eq!(failed[0].error.as_ref().expect("error set").message, "x");
    let next = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&next), pb::AgentStatus::Running);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_slot_freed_by_cancelling_a_queued_agent_lets_the_next_spawn_in() {
    // A queued agent needs a running one ahead of it in its bucket, so the
    // cap is 2 here.
    let mut s =
        TestServer::start("[limits]\nmax_background_agents = 2\ndefault_concurrency = 1\n").await;
    let running = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let queued = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        2,
        2,
    );

    let cancelled = cancel(&mut s.client, &queued.id).await;
    assert_eq!(ids_of(&cancelled), vec![queued.id.clone()]);
    let settled = await_all(&mut s.client, &[&queued.id]).await;
    assert_eq!(status(&settled[0]), pb::AgentStatus::Cancelled);
    let next = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&next), pb::AgentStatus::Queued);
    // The bucket slot of the running agent was untouched by the cancel.
    assert_eq!(
        status(&status_of(&mut s.client, &running.id).await),
        pb::AgentStatus::Running
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_slot_freed_by_cancelling_a_running_agent_lets_the_next_spawn_in() {
    let mut s = TestServer::start(CAP_ONE).await;
    let a = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        1,
        1,
    );
    cancel(&mut s.client, &a.id).await;
    let settled = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&settled[0]), pb::AgentStatus::Cancelled);
    let next = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&next), pb::AgentStatus::Running);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_slot_freed_by_a_run_deadline_lets_the_next_spawn_in() {
    let mut s = TestServer::start(CAP_ONE).await;
    // Long enough that the refusal check below happens inside it.
    let a = spawn(
        &mut s.client,
        pb::SpawnRequest {
            timeout: Some(millis(500)),
            ..bg("acme/m1", "sleep 600000")
        },
    )
    .await;
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        1,
        1,
    );
    let failed = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&failed[0]), pb::AgentStatus::Failed);
    assert_eq!(
        failed[0].error.as_ref().expect("error set").code,
        "DEADLINE_EXCEEDED"
    );
    let next = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&next), pb::AgentStatus::Running);
    s.handle.shutdown().await.unwrap();
}

/// Parent and child are both background, so the cap is 2; after the
/// cascade both slots must be free again.
const CAP_TWO: &str = "[limits]\nmax_background_agents = 2\n";

#[tokio::test]
async fn slots_freed_by_cancelling_a_parent_and_its_cascade_let_the_next_spawns_in() {
    let mut s = TestServer::start(CAP_TWO).await;
    let parent = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let kid = spawn(&mut s.client, child(&parent, "acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&kid), pb::AgentStatus::Running);
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        2,
        2,
    );

    let mut cancelled = ids_of(&cancel(&mut s.client, &parent.id).await);
    cancelled.sort();
    let mut expected = vec![parent.id.clone(), kid.id.clone()];
    expected.sort();
    assert_eq!(cancelled, expected);
    let settled = await_all(&mut s.client, &[&kid.id]).await;
    assert_eq!(status(&settled[0]), pb::AgentStatus::Cancelled);

    for _ in 0..2 {
        let next = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
        assert_eq!(status(&next), pb::AgentStatus::Running);
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn slots_freed_by_a_parent_finishing_and_cancelling_its_child_let_the_next_spawns_in() {
    let mut s = TestServer::start(CAP_TWO).await;
    let parent = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let kid = spawn(&mut s.client, child(&parent, "acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&kid), pb::AgentStatus::Running);
    assert!(!kid.detached);
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        2,
        2,
    );

    steer(&mut s.client, &parent.id).await;
    let settled = await_all(&mut s.client, &[&parent.id, &kid.id]).await;
    assert_eq!(status(&settled[0]), pb::AgentStatus::Done);
    assert_eq!(status(&settled[1]), pb::AgentStatus::Cancelled);
    let why = &settled[1]
        .error
        .as_ref()
        .expect("cascade sets an error")
        .message;
    assert!(
        why.contains(&parent.id),
        "reason should name the parent: {why}"
    );

    for _ in 0..2 {
        let next = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
        assert_eq!(status(&next), pb::AgentStatus::Running);
    }
    s.handle.shutdown().await.unwrap();
}

// ----- per-parent and per-lead limits -------------------------------------------------

const PARENT_TWO: &str =
    "[limits]\nmax_concurrent_per_parent = 2\ndefault_concurrency = 10\nmax_background_agents = 20\n";

#[tokio::test]
async fn background_children_beyond_max_concurrent_per_parent_are_queued() {
    let mut s = TestServer::start(PARENT_TWO).await;
    let parent = spawn(&mut s.client, bg("acme/p", UNTIL_STEERED)).await;
    let mut kids = Vec::new();
    for _ in 0..3 {
        kids.push(spawn(&mut s.client, child(&parent, "acme/c", UNTIL_STEERED)).await);
    }
    assert_running_on(&kids[0], "acme/c");
    assert_running_on(&kids[1], "acme/c");
    assert_queued_on(&kids[2], "acme/c", "parent limit");
    // Another parent's children are not held by this one's limit.
    let other = spawn(&mut s.client, bg("acme/p", UNTIL_STEERED)).await;
    let other_kid = spawn(&mut s.client, child(&other, "acme/c", UNTIL_STEERED)).await;
    assert_running_on(&other_kid, "acme/c");

    let mut events = watch_all(&mut s.client).await;
    cancel(&mut s.client, &kids[0].id).await;
    assert_eq!(next_started(&mut events, 1).await, vec![kids[2].id.clone()]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn root_agents_of_one_lead_beyond_max_concurrent_per_parent_are_queued() {
    let mut s = TestServer::start(PARENT_TWO).await;
    let mut roots = Vec::new();
    for _ in 0..3 {
        roots.push(
            spawn(
                &mut s.client,
                under_lead("lead-a", "acme/m1", UNTIL_STEERED),
            )
            .await,
        );
    }
    assert_running_on(&roots[0], "acme/m1");
    assert_running_on(&roots[1], "acme/m1");
    assert_queued_on(&roots[2], "acme/m1", "parent limit");
    assert_eq!(roots[2].lead_id, "lead-a");
    // Another lead, and roots without a lead, are not held.
    let other_lead = spawn(
        &mut s.client,
        under_lead("lead-b", "acme/m1", UNTIL_STEERED),
    )
    .await;
    assert_running_on(&other_lead, "acme/m1");
    let no_lead = spawn_waiting(&mut s.client, "acme/m1", 3).await;
    for a in &no_lead {
        assert_running_on(a, "acme/m1");
    }

    let mut events = watch_all(&mut s.client).await;
    steer(&mut s.client, &roots[1].id).await;
    assert_eq!(
        next_started(&mut events, 1).await,
        vec![roots[2].id.clone()]
    );
    s.handle.shutdown().await.unwrap();
}

// ----- depth and tree size ----------------------------------------------------------------

#[tokio::test]
async fn a_spawn_deeper_than_max_depth_is_refused_with_failed_precondition() {
    let mut s = TestServer::start("[limits]\nmax_depth = 2\n").await;
    let root = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let kid = spawn(&mut s.client, child(&root, "acme/m1", UNTIL_STEERED)).await;
    assert_eq!(kid.depth, 2);
    for background in [true, false] {
        let req = pb::SpawnRequest {
            background,
            ..child(&kid, "acme/m1", "output too deep")
        };
        let err = spawn_refused(&mut s.client, req).await;
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert_eq!(error_info(&err).0, "DEPTH_LIMIT_REACHED");
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_tree_beyond_max_live_descendants_per_root_refuses_new_agents() {
    let mut s = TestServer::start("[limits]\nmax_live_descendants_per_root = 2\n").await;
    let root = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let kid = spawn(&mut s.client, child(&root, "acme/m1", UNTIL_STEERED)).await;
    // Root and child are live: a sibling, a grandchild and a foreground
    // child are all a third live agent of the tree.
    let refused = [
        child(&root, "acme/m1", UNTIL_STEERED),
        child(&kid, "acme/m1", UNTIL_STEERED),
        pb::SpawnRequest {
            background: false,
            ..child(&root, "acme/m1", "output hi")
        },
    ];
    for req in refused {
        let err = spawn_refused(&mut s.client, req).await;
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        assert_eq!(error_info(&err).0, "DESCENDANT_LIMIT_REACHED");
    }
    // Another tree is not affected.
    let other = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    spawn(&mut s.client, child(&other, "acme/m1", UNTIL_STEERED)).await;
    // An ended member frees its place in the tree.
    cancel(&mut s.client, &kid.id).await;
    let again = spawn(&mut s.client, child(&root, "acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&again), pb::AgentStatus::Running);
    s.handle.shutdown().await.unwrap();
}

// ----- no head-of-line blocking ----------------------------------------------------------

#[tokio::test]
async fn a_full_bucket_with_queued_agents_does_not_delay_a_spawn_on_another_bucket() {
    let mut s =
        TestServer::start("[limits]\ndefault_concurrency = 1\nmax_background_agents = 20\n").await;
    let a = spawn_waiting(&mut s.client, "acme/a", 3).await;
    assert_running_on(&a[0], "acme/a");
    assert_queued_on(&a[1], "acme/a", "acme/a");
    assert_queued_on(&a[2], "acme/a", "acme/a");
    let b = spawn(&mut s.client, bg("acme/b", UNTIL_STEERED)).await;
    assert_running_on(&b, "acme/b");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_queued_agent_held_by_its_parent_does_not_block_later_agents_of_its_bucket() {
    let mut s = TestServer::start(
        "[limits]\ndefault_concurrency = 2\nmax_concurrent_per_parent = 1\nmax_background_agents = 20\n",
    )
    .await;
    let parent = spawn(&mut s.client, bg("other/p", UNTIL_STEERED)).await;
    let c1 = spawn(&mut s.client, child(&parent, "acme/m", UNTIL_STEERED)).await;
    let c2 = spawn(&mut s.client, child(&parent, "acme/m", UNTIL_STEERED)).await;
    assert_running_on(&c1, "acme/m");
    assert_queued_on(&c2, "acme/m", "parent limit");
    // c2 is earlier in the bucket but held by its parent: r1 starts past it.
    let r1 = spawn(&mut s.client, bg("acme/m", UNTIL_STEERED)).await;
    assert_running_on(&r1, "acme/m");
    let r2 = spawn(&mut s.client, bg("acme/m", UNTIL_STEERED)).await;
    assert_queued_on(&r2, "acme/m", "acme/m");

    let mut events = watch_all(&mut s.client).await;
    // Frees only a bucket slot (roots without a lead have no parent limit):
    // r2 starts, c2 is still held by its parent.
    cancel(&mut s.client, &r1.id).await;
    assert_eq!(next_started(&mut events, 1).await, vec![r2.id.clone()]);
    assert_eq!(
        status(&status_of(&mut s.client, &c2.id).await),
        pb::AgentStatus::Queued
    );
    // Frees a bucket slot and the parent's slot: now c2 starts.
    cancel(&mut s.client, &c1.id).await;
    assert_eq!(next_started(&mut events, 1).await, vec![c2.id.clone()]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn queued_agents_of_different_leads_in_one_bucket_start_in_admission_order() {
    let mut s = TestServer::start(
        "[limits]\ndefault_concurrency = 1\nmax_concurrent_per_parent = 5\nmax_background_agents = 20\n",
    )
    .await;
    let first = spawn(&mut s.client, under_lead("l2", "acme/m", UNTIL_STEERED)).await;
    assert_running_on(&first, "acme/m");
    let mut queued = Vec::new();
    for lead in ["l1", "l2", "l1", "l2"] {
        let a = spawn(&mut s.client, under_lead(lead, "acme/m", UNTIL_STEERED)).await;
        assert_queued_on(&a, "acme/m", "acme/m");
        queued.push(a);
    }

    let mut events = watch_all(&mut s.client).await;
    // Each freed slot frees the bucket and the ender's lead; the oldest
    // queued agent wins even when it belongs to the other lead.
    let mut ending = first.id.clone();
    for (i, next) in queued.iter().enumerate() {
        steer(&mut s.client, &ending).await;
        assert_eq!(
            next_started(&mut events, 1).await,
            vec![next.id.clone()],
            "queued agent {i} (of leads l1, l2, l1, l2) should start next"
        );
        ending = next.id.clone();
    }
    s.handle.shutdown().await.unwrap();
}

// ----- approval pauses --------------------------------------------------------------------

#[tokio::test]
async fn awaiting_approval_frees_the_bucket_slot_but_keeps_the_global_slot() {
    let mut s =
        TestServer::start("[limits]\ndefault_concurrency = 1\nmax_background_agents = 2\n").await;
    let pausing = spawn(&mut s.client, bg("acme/m1", "wait_steer\napprove shell")).await;
    let queued = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_running_on(&pausing, "acme/m1");
    assert_queued_on(&queued, "acme/m1", "acme/m1");

    let mut events = watch_all(&mut s.client).await;
    steer(&mut s.client, &pausing.id).await;
    // Await returns as soon as the agent pauses.
    let paused = await_all(&mut s.client, &[&pausing.id]).await;
    assert_eq!(status(&paused[0]), pb::AgentStatus::AwaitingApproval);
    assert_eq!(
        paused[0].approval.as_ref().expect("approval set").tool_name,
        "shell"
    );
    assert_eq!(next_started(&mut events, 1).await, vec![queued.id.clone()]);

    // The paused agent still counts against the cap.
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("other/m1", "x")).await,
        2,
        2,
    );
    assert_eq!(
        status(&status_of(&mut s.client, &pausing.id).await),
        pb::AgentStatus::AwaitingApproval
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn awaiting_approval_frees_the_parent_slot() {
    let mut s = TestServer::start(
        "[limits]\nmax_concurrent_per_parent = 1\ndefault_concurrency = 10\nmax_background_agents = 10\n",
    )
    .await;
    let parent = spawn(&mut s.client, bg("acme/p", UNTIL_STEERED)).await;
    let pausing = spawn(
        &mut s.client,
        child(&parent, "acme/c", "wait_steer\napprove shell"),
    )
    .await;
    let queued = spawn(&mut s.client, child(&parent, "acme/c", UNTIL_STEERED)).await;
    assert_running_on(&pausing, "acme/c");
    assert_queued_on(&queued, "acme/c", "parent limit");

    let mut events = watch_all(&mut s.client).await;
    steer(&mut s.client, &pausing.id).await;
    let paused = await_all(&mut s.client, &[&pausing.id]).await;
    assert_eq!(status(&paused[0]), pb::AgentStatus::AwaitingApproval);
    assert_eq!(next_started(&mut events, 1).await, vec![queued.id.clone()]);
    s.handle.shutdown().await.unwrap();
}

// ----- limit changes by reload ------------------------------------------------------------

const RELOAD_LOW: &str = "[limits]\ndefault_concurrency = 1\nmax_background_agents = 10\n";
const RELOAD_HIGH: &str = "[limits]\ndefault_concurrency = 5\nmax_background_agents = 10\n";

#[tokio::test]
async fn raising_a_limit_by_reload_starts_the_queued_agents_and_lowering_it_preempts_nothing() {
    let mut s = TestServer::start_with_file(RELOAD_LOW).await;
    let agents = spawn_waiting(&mut s.client, "acme/m1", 4).await;
    assert_running_on(&agents[0], "acme/m1");
    for a in &agents[1..] {
        assert_queued_on(a, "acme/m1", "acme/m1");
    }

    let mut events = watch_all(&mut s.client).await;
    s.rewrite_and_reload(RELOAD_HIGH).expect("valid reload");
    assert_eq!(next_started(&mut events, 3).await, ids_of(&agents[1..]));
    let all = ids_of(&agents);
    assert_eq!(
        count_in(&mut s.client, &all, pb::AgentStatus::Running).await,
        4
    );

    // Lowering again leaves all four running; the new limit holds new ones.
    s.rewrite_and_reload(RELOAD_LOW).expect("valid reload");
    assert_eq!(
        count_in(&mut s.client, &all, pb::AgentStatus::Running).await,
        4
    );
    let late = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_queued_on(&late, "acme/m1", "acme/m1");
    // Three still run after one ends, which is over the lowered limit of 1.
    cancel(&mut s.client, &agents[0].id).await;
    assert_eq!(
        status(&status_of(&mut s.client, &late.id).await),
        pb::AgentStatus::Queued
    );
    for a in &agents[1..] {
        cancel(&mut s.client, &a.id).await;
    }
    assert_eq!(next_started(&mut events, 1).await, vec![late.id.clone()]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_invalid_reload_is_refused_and_the_old_limits_stay_in_force() {
    let mut s = TestServer::start_with_file(
        "[limits]\ndefault_concurrency = 1\nmax_background_agents = 3\n",
    )
    .await;
    let running = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    let queued = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&running), pb::AgentStatus::Running);
    assert_eq!(status(&queued), pb::AgentStatus::Queued);

    let err = s
        .rewrite_and_reload("[limits]\ndefault_concurrency = 5\nmax_background_agents = 0\n")
        .expect_err("max_background_agents = 0 is invalid");
    assert!(err.to_string().contains("max_background_agents"), "{err}");

    // default_concurrency is still 1 and the cap is still 3.
    assert_eq!(
        status(&status_of(&mut s.client, &queued.id).await),
        pb::AgentStatus::Queued
    );
    let third = spawn(&mut s.client, bg("acme/m1", UNTIL_STEERED)).await;
    assert_eq!(status(&third), pb::AgentStatus::Queued);
    assert_global_limit(
        &spawn_refused(&mut s.client, bg("acme/m1", "x")).await,
        3,
        3,
    );
    s.handle.shutdown().await.unwrap();
}

// ----- the real binary --------------------------------------------------------------------

/// Kills the server process if the test fails before stopping it.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn send_signal(signal: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill {signal} {pid} failed");
}

/// A free loopback port: bind port 0, read it, release it.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Connects to a server that is still starting, retrying for up to [`WAIT`].
async fn connect_when_ready(addr: &str, server: &mut ChildGuard) -> Client {
    let started = Instant::now();
    loop {
        let endpoint = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(1));
        match endpoint.connect().await {
            Ok(channel) => {
                // Listening is not serving: calls get RECOVERING until the
                // server has read its state back. Wait for SERVING.
                use tonic_health::pb::{
                    health_check_response::ServingStatus, health_client::HealthClient,
                    HealthCheckRequest,
                };
                let mut updates = HealthClient::new(channel.clone())
                    .watch(HealthCheckRequest {
                        service: "subagents.v1.AgentService".into(),
                    })
                    .await
                    .expect("health watch")
                    .into_inner();
                while let Some(update) = updates.message().await.expect("health update") {
                    if update.status == ServingStatus::Serving as i32 {
                        return AgentServiceClient::new(channel);
                    }
                }
                panic!("the health watch ended before SERVING");
            }
            Err(e) => {
                let child = server.0.as_mut().expect("server process");
                if let Some(exit) = child.try_wait().unwrap() {
                    panic!("subagentd exited before it was ready: {exit}");
                }
                assert!(
                    started.elapsed() < WAIT,
                    "subagentd not ready on {addr} within {WAIT:?}: {e}"
                );
                // Polling a process we cannot observe otherwise; bounded above.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test]
async fn the_binary_reloads_its_config_on_sighup_and_starts_the_queued_agents() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), RELOAD_LOW).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let process = Command::new(env!("CARGO_BIN_EXE_subagentd"))
        .arg("serve")
        .arg("--config")
        .arg(config.path())
        .args(["--listen", &addr])
        .env("RUST_LOG", "warn")
        .env("SUBAGENTD_TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")
        .env("SUBAGENTD_HTTP__LISTEN", "127.0.0.1:0")
        .env("SUBAGENTD_SERVER__SHUTDOWN_GRACE", "0s")
        // Not ./subagentd-data: the tests run in the repository.
        .env("SUBAGENTD_STORE__BACKEND", "memory")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("subagentd starts");
    let pid = process.id();
    let mut server = ChildGuard(Some(process));
    let mut client = connect_when_ready(&addr, &mut server).await;

    let agents = spawn_waiting(&mut client, "acme/m1", 3).await;
    assert_running_on(&agents[0], "acme/m1");
    assert_queued_on(&agents[1], "acme/m1", "acme/m1");
    assert_queued_on(&agents[2], "acme/m1", "acme/m1");

    let mut events = watch_all(&mut client).await;
    std::fs::write(config.path(), RELOAD_HIGH).unwrap();
    send_signal("-HUP", pid);
    assert_eq!(next_started(&mut events, 2).await, ids_of(&agents[1..]));
    let all = ids_of(&agents);
    assert_eq!(
        count_in(&mut client, &all, pb::AgentStatus::Running).await,
        3
    );

    drop(events);
    drop(client);
    send_signal("-TERM", pid);
    let mut process = server.0.take().expect("server process");
    let exit = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::task::spawn_blocking(move || process.wait()),
    )
    .await;
    let exit = match exit {
        Ok(joined) => joined.unwrap().expect("wait for subagentd"),
        Err(_) => {
            // Ends the process we started; the blocking wait then returns.
            send_signal("-KILL", pid);
            panic!("subagentd did not exit within 15 s of SIGTERM");
        }
    };
    assert!(exit.success(), "subagentd exited with {exit}");
}
