//! The inbox (issue 33 §1) against a real server: Await by `lead_id` or
//! `parent_id`, ANY and ALL, `collect` returning each settled agent once,
//! approvals returned but never collected, the `uncollected` Status
//! filter, and request validation. Each test starts its own server.

mod common;

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::{transport::Channel, Code};

type Client = AgentServiceClient<Channel>;

const MODEL: &str = "acme/m1";
const LEAD: &str = "lead-inbox";

fn under_lead(prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        lead_id: LEAD.into(),
        ..bg(MODEL, prompt)
    }
}

fn millis(ms: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: (ms / 1000).into(),
        nanos: (ms % 1000) * 1_000_000,
    })
}

fn lead_inbox(mode: pb::AwaitMode, collect: bool, timeout_ms: i32) -> pb::AwaitRequest {
    pb::AwaitRequest {
        lead_id: LEAD.into(),
        mode: mode as i32,
        collect,
        timeout: millis(timeout_ms),
        ..Default::default()
    }
}

async fn await_inbox(client: &mut Client, req: pb::AwaitRequest) -> (Vec<pb::Agent>, bool) {
    let r = client.r#await(req).await.expect("Await").into_inner();
    (r.agents, r.timed_out)
}

fn ids(agents: &[pb::Agent]) -> Vec<&str> {
    agents.iter().map(|a| a.id.as_str()).collect()
}

async fn uncollected(client: &mut Client, lead: &str) -> Vec<String> {
    client
        .status(pb::StatusRequest {
            lead_id: lead.into(),
            uncollected: true,
            ..Default::default()
        })
        .await
        .expect("Status")
        .into_inner()
        .agents
        .into_iter()
        .map(|a| a.id)
        .collect()
}

#[tokio::test]
async fn a_lead_inbox_returns_each_settled_root_once() {
    let mut s = TestServer::start("").await;
    let c = &mut s.client;
    let a = spawn(c, under_lead("wait_steer\noutput a")).await;
    let b = spawn(c, under_lead("wait_steer\noutput b")).await;
    // Not in the inbox: a child of `a` under the same lead, and another
    // lead's root.
    let child = spawn(
        c,
        pb::SpawnRequest {
            parent_id: a.id.clone(),
            ..under_lead("output child")
        },
    )
    .await;
    let other = spawn(
        c,
        pb::SpawnRequest {
            lead_id: "another-lead".into(),
            ..bg(MODEL, "output other")
        },
    )
    .await;
    await_all(c, &[&child.id, &other.id]).await;

    // Nothing settled yet: ANY times out, empty.
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, true, 100)).await;
    assert!(timed_out && agents.is_empty(), "{agents:?}");

    steer(c, &b.id, "go").await;
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, true, 10_000)).await;
    assert!(!timed_out);
    assert_eq!(ids(&agents), [b.id.as_str()]);
    assert_eq!(status(&agents[0]), pb::AgentStatus::Done);
    assert_eq!(agents[0].result, "steer: go\nb");
    assert!(agents[0].collected_time.is_some(), "{:?}", agents[0]);
    assert!(
        status_of(c, &b.id).await.collected_time.is_some(),
        "Status shows the collect"
    );

    // Collected: the next ANY returns nothing new, at its timeout.
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, true, 150)).await;
    assert!(timed_out && agents.is_empty(), "no repeat: {agents:?}");

    // Status lists the uncollected (a lead filter at every depth: the
    // child too, which only its parent's inbox would collect) and never
    // collects.
    steer(c, &a.id, "go").await;
    await_all(c, &[&a.id]).await;
    let both = [a.id.clone(), child.id.clone()];
    assert_eq!(uncollected(c, LEAD).await, both);
    assert_eq!(uncollected(c, LEAD).await, both);

    // ALL: none live, so it returns at once with what is uncollected.
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::All, true, 10_000)).await;
    assert!(!timed_out);
    assert_eq!(ids(&agents), [a.id.as_str()]);
    assert_eq!(uncollected(c, LEAD).await, std::slice::from_ref(&child.id));
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::All, false, 10_000)).await;
    assert!(!timed_out && agents.is_empty(), "{agents:?}");
}

#[tokio::test]
async fn settled_agents_come_oldest_settled_first_and_without_collect_stay() {
    let mut s = TestServer::start("").await;
    let c = &mut s.client;
    let first = spawn(c, under_lead("wait_steer\noutput first")).await;
    let second = spawn(c, under_lead("wait_steer\noutput second")).await;
    let live = spawn(c, under_lead("wait_steer")).await;
    // Settle the newer agent first.
    steer(c, &second.id, "go").await;
    await_all(c, &[&second.id]).await;
    steer(c, &first.id, "go").await;
    await_all(c, &[&first.id]).await;

    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, false, 1000)).await;
    assert!(!timed_out);
    assert_eq!(ids(&agents), [second.id.as_str(), first.id.as_str()]);
    assert!(agents.iter().all(|a| a.collected_time.is_none()));
    // ALL waits for the live one, and times out with the settled ones.
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::All, false, 150)).await;
    assert!(timed_out);
    assert_eq!(ids(&agents), [second.id.as_str(), first.id.as_str()]);
    steer(c, &live.id, "go").await;
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::All, true, 10_000)).await;
    assert!(!timed_out);
    assert_eq!(agents.len(), 3, "{agents:?}");
    assert_eq!(agents[2].id, live.id);
}

#[tokio::test]
async fn a_waiting_inbox_await_wakes_when_a_root_settles() {
    let mut s = TestServer::start("").await;
    let mut waiter = s.new_client().await;
    let a = spawn(&mut s.client, under_lead("wait_steer\noutput a")).await;
    let wait = tokio::spawn(async move {
        await_inbox(&mut waiter, lead_inbox(pb::AwaitMode::Any, true, 30_000)).await
    });
    // A root spawned after the Await began is in its inbox too.
    let late = spawn(&mut s.client, under_lead("wait_steer\noutput late")).await;
    steer(&mut s.client, &late.id, "go").await;
    let (agents, timed_out) = wait.await.unwrap();
    assert!(!timed_out);
    assert_eq!(ids(&agents), [late.id.as_str()]);
    cancel(&mut s.client, &a.id).await;
    let (agents, _) =
        await_inbox(&mut s.client, lead_inbox(pb::AwaitMode::Any, true, 10_000)).await;
    assert_eq!(ids(&agents), [a.id.as_str()]);
    assert_eq!(status(&agents[0]), pb::AgentStatus::Cancelled);
}

#[tokio::test]
async fn a_parent_inbox_holds_its_direct_children() {
    let mut s = TestServer::start("").await;
    let c = &mut s.client;
    let parent = spawn(c, bg(MODEL, "wait_steer")).await;
    let child = |prompt: &str| pb::SpawnRequest {
        parent_id: parent.id.clone(),
        ..bg(MODEL, prompt)
    };
    let quick = spawn(c, child("output quick")).await;
    let slow = spawn(c, child("wait_steer\noutput slow")).await;
    spawn(
        c,
        pb::SpawnRequest {
            parent_id: slow.id.clone(),
            ..bg(MODEL, "output grandchild")
        },
    )
    .await;
    let inbox = |mode: pb::AwaitMode, timeout_ms| pb::AwaitRequest {
        parent_id: parent.id.clone(),
        mode: mode as i32,
        collect: true,
        timeout: millis(timeout_ms),
        ..Default::default()
    };
    let (agents, timed_out) = await_inbox(c, inbox(pb::AwaitMode::Any, 10_000)).await;
    assert!(!timed_out);
    assert_eq!(ids(&agents), [quick.id.as_str()]);
    let (agents, timed_out) = await_inbox(c, inbox(pb::AwaitMode::All, 150)).await;
    assert!(timed_out && agents.is_empty(), "{agents:?}");
    steer(c, &slow.id, "go").await;
    let (agents, timed_out) = await_inbox(c, inbox(pb::AwaitMode::All, 10_000)).await;
    assert!(!timed_out);
    assert_eq!(ids(&agents), [slow.id.as_str()]);

    let err = c
        .r#await(pb::AwaitRequest {
            parent_id: uuid::Uuid::new_v4().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
}

#[tokio::test]
async fn an_agent_awaiting_approval_is_returned_but_never_collected() {
    let mut s = TestServer::start("").await;
    let c = &mut s.client;
    let paused = spawn(c, under_lead("approve shell\noutput after")).await;
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, true, 10_000)).await;
    assert!(!timed_out);
    assert_eq!(ids(&agents), [paused.id.as_str()]);
    assert_eq!(status(&agents[0]), pb::AgentStatus::AwaitingApproval);
    assert!(agents[0].collected_time.is_none());
    // Still there: its approval must be seen until it is decided.
    let (again, _) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, true, 10_000)).await;
    assert_eq!(ids(&again), [paused.id.as_str()]);
    let approval_id = again[0]
        .approval
        .as_ref()
        .expect("pending approval")
        .id
        .clone();
    c.approve(pb::ApproveRequest {
        id: paused.id.clone(),
        approval_id,
        decision: pb::ApprovalDecision::Approve as i32,
        note: String::new(),
    })
    .await
    .expect("Approve");
    await_all(c, &[&paused.id]).await;
    let (agents, _) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, true, 10_000)).await;
    assert_eq!(status(&agents[0]), pb::AgentStatus::Done);
    assert!(agents[0].collected_time.is_some());
}

#[tokio::test]
async fn an_await_by_ids_with_collect_takes_the_settled_ones_out_of_the_inbox() {
    let mut s = TestServer::start("").await;
    let c = &mut s.client;
    let done = spawn(c, under_lead("output done")).await;
    let live = spawn(c, under_lead("wait_steer")).await;
    let r = c
        .r#await(pb::AwaitRequest {
            ids: vec![done.id.clone(), live.id.clone()],
            mode: pb::AwaitMode::Any as i32,
            collect: true,
            timeout: millis(10_000),
            ..Default::default()
        })
        .await
        .expect("Await")
        .into_inner();
    assert_eq!(ids(&r.agents), [done.id.as_str(), live.id.as_str()]);
    assert!(r.agents[0].collected_time.is_some());
    assert!(r.agents[1].collected_time.is_none(), "live: not collected");
    let (agents, timed_out) = await_inbox(c, lead_inbox(pb::AwaitMode::Any, true, 150)).await;
    assert!(timed_out && agents.is_empty(), "{agents:?}");
}

#[tokio::test]
async fn an_await_names_exactly_one_target() {
    let mut s = TestServer::start("").await;
    let c = &mut s.client;
    let id = uuid::Uuid::new_v4().to_string();
    let cases: Vec<(pb::AwaitRequest, Vec<&str>)> = vec![
        (pb::AwaitRequest::default(), vec!["ids"]),
        (
            pb::AwaitRequest {
                ids: vec![id.clone()],
                lead_id: LEAD.into(),
                ..Default::default()
            },
            vec!["ids", "lead_id"],
        ),
        (
            pb::AwaitRequest {
                lead_id: LEAD.into(),
                parent_id: id.clone(),
                ..Default::default()
            },
            vec!["lead_id", "parent_id"],
        ),
        (
            pb::AwaitRequest {
                parent_id: "not-a-uuid".into(),
                ..Default::default()
            },
            vec!["parent_id"],
        ),
        (
            pb::AwaitRequest {
                lead_id: "x".repeat(300),
                ..Default::default()
            },
            vec!["lead_id"],
        ),
    ];
    for (req, fields) in cases {
        let err = c.r#await(req.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{req:?}: {err:?}");
        assert_eq!(violated_fields(&err), fields, "{req:?}");
    }
    let err = c
        .status(pb::StatusRequest {
            ids: vec![id],
            uncollected: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&err), ["ids"]);
}

/// A collect changes what the lead's next Await returns: a viewer may
/// Await an inbox but not collect it; a frontend may. A lead id names a lead
/// of the caller's own tenant: another tenant's same lead id is another
/// inbox.
#[tokio::test]
async fn a_viewer_may_not_collect_and_an_inbox_is_per_tenant() {
    let lead = common::auth::key("lead1", "team-a", &["frontend"], None);
    let viewer = common::auth::key("view1", "team-a", &["viewer"], None);
    let other = common::auth::key("lead2", "team-b", &["frontend"], None);
    let toml = common::auth::config(
        &[("lead1", &lead), ("view1", &viewer), ("lead2", &other)],
        "",
    );
    let s = TestServer::start(&toml).await;
    let mut c = s.client.clone();
    let with = |key: &str, req: pb::AwaitRequest| common::auth::with_key(req, key);
    let agent = c
        .spawn(common::auth::with_key(under_lead("output a"), &lead.key))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    let refused = c
        .r#await(with(
            &viewer.key,
            lead_inbox(pb::AwaitMode::Any, true, 5000),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let seen = c
        .r#await(with(
            &viewer.key,
            lead_inbox(pb::AwaitMode::Any, false, 5000),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&seen.agents), [agent.id.as_str()], "a viewer may look");
    // Team B's lead of the same name has nothing.
    let elsewhere = c
        .r#await(with(&other.key, lead_inbox(pb::AwaitMode::Any, true, 100)))
        .await
        .unwrap()
        .into_inner();
    assert!(elsewhere.timed_out && elsewhere.agents.is_empty());
    let collected = c
        .r#await(with(&lead.key, lead_inbox(pb::AwaitMode::Any, true, 5000)))
        .await
        .unwrap()
        .into_inner();
    assert!(collected.agents[0].collected_time.is_some());
}

#[tokio::test]
async fn an_inbox_answer_holds_at_most_100_and_concurrent_collects_never_share_one() {
    let mut s = TestServer::start("[limits]\nmax_background_agents = 500\n").await;
    let mut spawned = Vec::new();
    for n in 0..130 {
        let a = spawn(&mut s.client, under_lead(&format!("output {n}"))).await;
        spawned.push(a.id);
    }
    // ALL without collect: returns once none is live.
    let (_, timed_out) =
        await_inbox(&mut s.client, lead_inbox(pb::AwaitMode::All, false, 20_000)).await;
    assert!(!timed_out);
    // Two Awaits at once: each result goes to exactly one of them.
    let mut other = s.new_client().await;
    let mut mine = s.client.clone();
    let (a, b) = tokio::join!(
        await_inbox(&mut mine, lead_inbox(pb::AwaitMode::Any, true, 5000)),
        await_inbox(&mut other, lead_inbox(pb::AwaitMode::Any, true, 5000)),
    );
    let mut seen: Vec<String> = a.0.iter().chain(&b.0).map(|a| a.id.clone()).collect();
    assert!(
        a.0.len() <= 100 && b.0.len() <= 100,
        "{} {}",
        a.0.len(),
        b.0.len()
    );
    // The rest, collected by later Awaits.
    loop {
        let (more, timed_out) =
            await_inbox(&mut s.client, lead_inbox(pb::AwaitMode::Any, true, 200)).await;
        if timed_out {
            break;
        }
        assert!(more.len() <= 100);
        seen.extend(more.into_iter().map(|a| a.id));
    }
    let count = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), count, "no result handed over twice");
    spawned.sort();
    assert_eq!(seen, spawned, "every result handed over once");
}
