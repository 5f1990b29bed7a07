//! Tenant isolation over loopback gRPC: every call by id, every listing,
//! watch, lead and idempotency key is scoped to the caller's tenant;
//! another tenant's agent is NOT_FOUND exactly like an id that never
//! existed; an admin sees and cancels across tenants and narrows with a
//! `tenant` filter; a worker only ever receives its own tenant's runs.

mod common;

use std::time::Duration;

use common::{
    auth::{config, key, open_worker_with, with_key, Key},
    bg, error_info, TestServer,
};
use subagentd::pb::{self, agent_service_client::AgentServiceClient, connect_response};
use tonic::{transport::Channel, Code};

/// Strings that only tenant A's agents carry; nothing B sees may hold them.
const CANARY: &str = "canary-7f3a";

struct Tenants {
    s: TestServer,
    a: Key,
    b: Key,
    admin: Key,
}

async fn start() -> Tenants {
    let a = key("fronta", "team-a", &["frontend"], None);
    let b = key("frontb", "team-b", &["frontend", "approver"], None);
    let admin = key("ops", "ops", &["admin"], None);
    let wb = key("workerb", "team-b", &["worker"], None);
    let s = TestServer::start(&config(
        &[
            ("fronta", &a),
            ("frontb", &b),
            ("ops", &admin),
            ("workerb", &wb),
        ],
        "",
    ))
    .await;
    Tenants { s, a, b, admin }
}

fn live(lead: &str, idempotency_key: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        lead_id: lead.into(),
        idempotency_key: idempotency_key.into(),
        labels: [("owner".to_owned(), format!("{CANARY}-label"))].into(),
        description: format!("{CANARY}-description"),
        ..bg("openai/gpt-4o", "sleep 60000")
    }
}

async fn spawn(c: &mut AgentServiceClient<Channel>, key: &str, req: pb::SpawnRequest) -> pb::Agent {
    c.spawn(with_key(req, key))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap()
}

/// The status with the id in it replaced, to compare a refusal of another
/// tenant's id with the refusal of an id that never existed.
fn shape(status: &tonic::Status, id: &str) -> String {
    let (reason, meta) = error_info(status);
    let meta: std::collections::BTreeMap<_, _> = meta.into_iter().collect();
    format!("{:?} {} {reason} {meta:?}", status.code(), status.message()).replace(id, "ID")
}

fn assert_clean(what: &str, answer: &impl std::fmt::Debug) {
    let text = format!("{answer:?}");
    assert!(
        !text.contains(CANARY),
        "{what} leaked tenant A's data: {text}"
    );
    assert!(!text.contains("team-a"), "{what} named tenant A: {text}");
}

#[tokio::test]
async fn another_tenants_agent_is_not_found_like_one_that_never_existed() {
    let t = start().await;
    let mut c = t.s.client.clone();
    let theirs = spawn(&mut c, &t.a.key, live("lead-1", "key-1")).await;
    assert_eq!(theirs.tenant, "team-a");
    let id = theirs.id.clone();
    let never = uuid::Uuid::now_v7().to_string();
    let b = &t.b.key;

    // Each call by id, with A's id and with an unknown one: same answer.
    type Call<'a> = Box<
        dyn Fn(
                AgentServiceClient<Channel>,
                String,
            ) -> futures_util::future::BoxFuture<'a, tonic::Status>
            + 'a,
    >;
    let calls: Vec<(&str, Call)> = vec![
        (
            "Status",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::StatusRequest {
                        ids: vec![id],
                        ..Default::default()
                    };
                    c.status(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "Await",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::AwaitRequest {
                        ids: vec![id],
                        timeout: Some(prost_types::Duration {
                            seconds: 1,
                            nanos: 0,
                        }),
                        ..Default::default()
                    };
                    c.r#await(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "Cancel",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::CancelRequest {
                        id,
                        ..Default::default()
                    };
                    c.cancel(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "Steer",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::SteerRequest {
                        id,
                        message: "go on".into(),
                    };
                    c.steer(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "Approve",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::ApproveRequest {
                        id,
                        approval_id: uuid::Uuid::now_v7().to_string(),
                        decision: pb::ApprovalDecision::Approve as i32,
                        ..Default::default()
                    };
                    c.approve(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "Spawn with parent_id",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::SpawnRequest {
                        parent_id: id,
                        ..bg("openai/gpt-4o", "hi")
                    };
                    c.spawn(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "Spawn with continue_from",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::SpawnRequest {
                        continue_from: id,
                        prompt: "go on".into(),
                        ..Default::default()
                    };
                    c.spawn(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "Spawn with continue_from and fork",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::SpawnRequest {
                        continue_from: id,
                        fork: true,
                        prompt: "go on".into(),
                        ..Default::default()
                    };
                    c.spawn(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "GetTranscript by agent",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::GetTranscriptRequest {
                        agent_id: id,
                        ..Default::default()
                    };
                    c.get_transcript(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
        (
            "GetTranscript by conversation",
            Box::new(|mut c, id| {
                Box::pin(async move {
                    let req = pb::GetTranscriptRequest {
                        conversation_id: id,
                        ..Default::default()
                    };
                    c.get_transcript(with_key(req, b)).await.unwrap_err()
                })
            }),
        ),
    ];
    for (name, call) in &calls {
        let other = call(c.clone(), id.clone()).await;
        let unknown = call(c.clone(), never.clone()).await;
        assert_clean(name, &other);
        assert_eq!(other.code(), Code::NotFound, "{name}: {other:?}");
        assert_eq!(shape(&other, &id), shape(&unknown, &never), "{name}");
    }

    // Nothing B did touched A's agent.
    let still = c
        .status(with_key(
            pb::StatusRequest {
                ids: vec![id.clone()],
                ..Default::default()
            },
            &t.a.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(still.agents[0].status, pb::AgentStatus::Running as i32);

    // A watch by ids naming A's agent and B's own shows only B's: the
    // snapshot, then (after A's agent ended) B's own cancel.
    let own = spawn(&mut c, b, bg_lead("", "")).await;
    let mut watch = c
        .watch_agents(with_key(
            pb::WatchAgentsRequest {
                ids: vec![id.clone(), own.id.clone()],
                include_snapshot: true,
                ..Default::default()
            },
            b,
        ))
        .await
        .unwrap()
        .into_inner();
    let cancel = |id: &str| pb::CancelRequest {
        id: id.to_owned(),
        ..Default::default()
    };
    c.cancel(with_key(cancel(&id), &t.a.key)).await.unwrap();
    c.cancel(with_key(cancel(&own.id), b)).await.unwrap();
    for kind in [pb::AgentEventKind::Snapshot, pb::AgentEventKind::Cancelled] {
        let event = watch.message().await.unwrap().expect("stream open");
        assert_clean("WatchAgents by id", &event);
        assert_eq!(event.kind, kind as i32, "{event:?}");
        assert_eq!(event.agent.unwrap().id, own.id);
    }
}

#[tokio::test]
async fn listings_leads_and_idempotency_keys_are_per_tenant() {
    let t = start().await;
    let mut c = t.s.client.clone();
    // Both tenants use the same lead id and idempotency key.
    let a1 = spawn(&mut c, &t.a.key, live("lead-1", "same-key")).await;
    let b1 = spawn(&mut c, &t.b.key, bg_lead("lead-1", "same-key")).await;
    assert_ne!(a1.id, b1.id, "the same key in two tenants names two agents");
    let again = spawn(&mut c, &t.b.key, bg_lead("lead-1", "same-key")).await;
    assert_eq!(
        again.id, b1.id,
        "within a tenant the key still deduplicates"
    );

    let reader = c.clone();
    let list = |key: &str, req: pb::StatusRequest| {
        let mut c = reader.clone();
        let req = with_key(req, key);
        async move { c.status(req).await.map(|r| r.into_inner().agents) }
    };
    let ids = |agents: &[pb::Agent]| agents.iter().map(|a| a.id.clone()).collect::<Vec<_>>();
    let everything = list(&t.b.key, pb::StatusRequest::default()).await.unwrap();
    assert_eq!(ids(&everything), vec![b1.id.clone()]);
    assert_clean("Status listing", &everything);
    let by_lead = pb::StatusRequest {
        lead_id: "lead-1".into(),
        ..Default::default()
    };
    let led = list(&t.b.key, by_lead.clone()).await.unwrap();
    assert_eq!(ids(&led), vec![b1.id.clone()]);
    let by_root = pb::StatusRequest {
        root_id: a1.id.clone(),
        ..Default::default()
    };
    assert!(list(&t.b.key, by_root).await.unwrap().is_empty());
    let running = pb::StatusRequest {
        statuses: vec![pb::AgentStatus::Running as i32],
        ..Default::default()
    };
    assert_eq!(
        ids(&list(&t.b.key, running).await.unwrap()),
        vec![b1.id.clone()]
    );

    // Naming a tenant: one's own is allowed, another's is an admin's
    // privilege.
    let own = pb::StatusRequest {
        tenant: "team-b".into(),
        ..Default::default()
    };
    assert_eq!(
        ids(&list(&t.b.key, own).await.unwrap()),
        vec![b1.id.clone()]
    );
    let other = pb::StatusRequest {
        tenant: "team-a".into(),
        ..Default::default()
    };
    let err = list(&t.b.key, other.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert_eq!(error_info(&err).1["required_roles"], "admin");

    // Admin: every tenant, or one.
    let all = list(&t.admin.key, pb::StatusRequest::default())
        .await
        .unwrap();
    assert_eq!(ids(&all), vec![a1.id.clone(), b1.id.clone()]);
    let only_a = list(&t.admin.key, other).await.unwrap();
    assert_eq!(ids(&only_a), vec![a1.id.clone()]);
    let led_everywhere = list(&t.admin.key, by_lead).await.unwrap();
    assert_eq!(ids(&led_everywhere), vec![a1.id.clone(), b1.id.clone()]);
    let both = list(
        &t.admin.key,
        pb::StatusRequest {
            ids: vec![a1.id.clone(), b1.id.clone()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(ids(&both), vec![a1.id.clone(), b1.id.clone()]);

    // Cancel by lead cancels the caller's lead only.
    let cancelled = c
        .cancel(with_key(
            pb::CancelRequest {
                lead_id: "lead-1".into(),
                ..Default::default()
            },
            &t.b.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&cancelled.agents), vec![b1.id.clone()]);
    let a_now = list(
        &t.a.key,
        pb::StatusRequest {
            ids: vec![a1.id.clone()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(a_now[0].status, pb::AgentStatus::Running as i32);

    // An admin cancels across tenants by id.
    let cancelled = c
        .cancel(with_key(
            pb::CancelRequest {
                id: a1.id.clone(),
                ..Default::default()
            },
            &t.admin.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&cancelled.agents), vec![a1.id.clone()]);

    // An admin's own Spawn lands in its own tenant.
    let mine = spawn(&mut c, &t.admin.key, bg("openai/gpt-4o", "hi")).await;
    assert_eq!(mine.tenant, "ops");
}

fn bg_lead(lead: &str, idempotency_key: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        lead_id: lead.into(),
        idempotency_key: idempotency_key.into(),
        ..bg("openai/gpt-4o", "sleep 60000")
    }
}

#[tokio::test]
async fn a_watch_sees_only_its_tenants_events() {
    let t = start().await;
    let mut c = t.s.client.clone();
    let a1 = spawn(&mut c, &t.a.key, live("lead-1", "")).await;
    let b1 = spawn(&mut c, &t.b.key, bg_lead("lead-1", "")).await;
    let watcher = c.clone();
    let watch = |key: &str, req: pb::WatchAgentsRequest| {
        let mut c = watcher.clone();
        let req = with_key(req, key);
        async move { c.watch_agents(req).await.map(|r| r.into_inner()) }
    };
    let unfiltered = pb::WatchAgentsRequest {
        include_snapshot: true,
        include_progress: true,
        ..Default::default()
    };
    let by_lead = pb::WatchAgentsRequest {
        lead_id: "lead-1".into(),
        include_snapshot: true,
        ..Default::default()
    };
    let replay = pb::WatchAgentsRequest {
        after_sequence: 1,
        ..Default::default()
    };
    let mut streams = Vec::new();
    for req in [unfiltered, by_lead, replay] {
        streams.push(watch(&t.b.key, req).await.unwrap());
    }
    // Tenant A acts, then B: each of B's streams must show B's agent next.
    let a2 = spawn(&mut c, &t.a.key, live("lead-1", "")).await;
    c.cancel(with_key(
        pb::CancelRequest {
            id: a2.id.clone(),
            ..Default::default()
        },
        &t.a.key,
    ))
    .await
    .unwrap();
    let b2 = spawn(&mut c, &t.b.key, bg_lead("lead-1", "")).await;
    for (i, stream) in streams.iter_mut().enumerate() {
        let mut seen = Vec::new();
        while !seen.contains(&b2.id) {
            let event = stream.message().await.unwrap().expect("stream open");
            assert_clean(&format!("watch {i}"), &event);
            let agent = event.agent.unwrap();
            assert_eq!(agent.tenant, "team-b");
            assert!(agent.id == b1.id || agent.id == b2.id, "{agent:?}");
            seen.push(agent.id);
        }
    }
    // Naming tenant A is an admin's privilege; an admin watching A sees A.
    let named = pb::WatchAgentsRequest {
        tenant: "team-a".into(),
        include_snapshot: true,
        ..Default::default()
    };
    let err = watch(&t.b.key, named.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let mut admin = watch(&t.admin.key, named).await.unwrap();
    let first = admin.message().await.unwrap().unwrap().agent.unwrap();
    assert_eq!(first.id, a1.id);
    let second = admin.message().await.unwrap().unwrap().agent.unwrap();
    assert_eq!(second.id, a2.id, "the admin's snapshot holds only team-a");
}

#[tokio::test]
async fn a_worker_receives_only_its_own_tenants_runs() {
    let wa = key("workera", "team-a", &["worker"], None);
    let wb = key("workerb", "team-b", &["worker"], None);
    let a = key("fronta", "team-a", &["frontend"], None);
    let b = key("frontb", "team-b", &["frontend"], None);
    let s = TestServer::start(&config(
        &[
            ("workera", &wa),
            ("workerb", &wb),
            ("fronta", &a),
            ("frontb", &b),
        ],
        "",
    ))
    .await;
    let mut c = s.client.clone();
    let hello = |held: Vec<pb::HeldRun>| pb::WorkerHello {
        name: "w".into(),
        agents: vec!["coder".into()],
        capacity: 4,
        held_runs: held,
        ..Default::default()
    };
    let (_tx_b, mut worker_b) = open_worker_with(s.handle.addr(), &wb.key, hello(Vec::new()))
        .await
        .unwrap();
    let coder = |prompt: &str| pb::SpawnRequest {
        agent: "coder".into(),
        ..bg("openai/gpt-4o", prompt)
    };
    // A's run waits for a worker of A: B's idle worker does not take it.
    let secret = pb::SpawnRequest {
        labels: [("owner".to_owned(), format!("{CANARY}-label"))].into(),
        ..coder(&format!("{CANARY}-prompt"))
    };
    let theirs = spawn(&mut c, &a.key, secret).await;
    assert_eq!(theirs.status, pb::AgentStatus::Queued as i32);
    assert!(
        theirs.queue_reason.contains("no worker connected"),
        "{}",
        theirs.queue_reason
    );
    let ours = spawn(&mut c, &b.key, coder("b's work")).await;
    let assigned = worker_b.message().await.unwrap().unwrap();
    assert_clean("B's worker stream", &assigned);
    let Some(connect_response::Message::Assign(run)) = assigned.message else {
        panic!("{assigned:?}");
    };
    assert_eq!(run.agent.unwrap().id, ours.id);

    // A worker of B claiming A's run at its hello gets told to stop it,
    // and the run stays A's, still waiting.
    let claim = pb::HeldRun {
        agent_id: theirs.id.clone(),
        attempt: 1,
    };
    let (_tx, mut claimer) = open_worker_with(s.handle.addr(), &wb.key, hello(vec![claim]))
        .await
        .unwrap();
    let answer = claimer.message().await.unwrap().unwrap();
    assert_clean("claimer stream", &answer);
    assert!(
        matches!(answer.message, Some(connect_response::Message::Cancel(ref x)) if x.agent_id == theirs.id),
        "{answer:?}"
    );

    // A's own worker gets it.
    let (_tx_a, mut worker_a) = open_worker_with(s.handle.addr(), &wa.key, hello(Vec::new()))
        .await
        .unwrap();
    let assigned = worker_a.message().await.unwrap().unwrap();
    let Some(connect_response::Message::Assign(run)) = assigned.message else {
        panic!("{assigned:?}");
    };
    assert_eq!(run.agent.unwrap().id, theirs.id);
}

#[tokio::test]
async fn a_tenants_own_limits_refuse_only_its_spawns_with_their_details() {
    let a = key("fronta", "team-a", &["frontend"], None);
    let b = key("frontb", "team-b", &["frontend"], None);
    let s = TestServer::start(&config(
        &[("fronta", &a), ("frontb", &b)],
        "
[tenants.team-a]
max_background_agents = 1

[tenants.team-b]
spawn_rate = 0.01
spawn_burst = 2
",
    ))
    .await;
    let mut c = s.client.clone();
    let first = spawn(&mut c, &a.key, bg_lead("", "")).await;
    let err = c
        .spawn(with_key(bg_lead("", ""), &a.key))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "TENANT_LIMIT_REACHED");
    assert_eq!(meta["tenant"], "team-a");
    assert_eq!(meta["limit"], "1");
    assert_eq!(meta["live"], "1");
    // The slot frees with the agent; B never shared it.
    c.cancel(with_key(
        pb::CancelRequest {
            id: first.id,
            ..Default::default()
        },
        &a.key,
    ))
    .await
    .unwrap();
    let keyed = spawn(&mut c, &a.key, bg_lead("", "k")).await;
    // A retry of an admitted Spawn (its idempotency key) gets the agent,
    // though the tenant is at its limit.
    let again = spawn(&mut c, &a.key, bg_lead("", "k")).await;
    assert_eq!(again.id, keyed.id);

    // B: a burst of two, then a rate of one per 100 s.
    spawn(&mut c, &b.key, bg_lead("", "")).await;
    spawn(&mut c, &b.key, bg_lead("", "")).await;
    let err = c
        .spawn(with_key(bg_lead("", ""), &b.key))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "RATE_LIMITED");
    assert_eq!(meta["tenant"], "team-b");
    assert_eq!(meta["spawn_rate"], "0.01");
    assert_eq!(meta["spawn_burst"], "2");
    use tonic_types::StatusExt;
    let retry = err
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo with a delay");
    assert!(
        retry > Duration::from_secs(90) && retry <= Duration::from_secs(100),
        "{retry:?}"
    );
}
