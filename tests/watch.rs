//! WatchAgents against a real server: event order per agent, filters,
//! snapshots, resuming with `after_sequence`, and cutting off a lagging
//! subscriber while the others continue.

mod common;

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient, AgentEventKind as Kind};
use tonic::transport::Channel;

type Events = tonic::Streaming<pb::WatchAgentsResponse>;
type Client = AgentServiceClient<Channel>;

/// Longest wait for any single event.
const EVENT_WAIT: Duration = Duration::from_secs(10);

// ----- helpers ---------------------------------------------------------------

fn kind(ev: &pb::WatchAgentsResponse) -> Kind {
    Kind::try_from(ev.kind).expect("known event kind")
}

fn agent(ev: &pb::WatchAgentsResponse) -> &pb::Agent {
    ev.agent.as_ref().expect("event carries its agent")
}

fn id_of(ev: &pb::WatchAgentsResponse) -> &str {
    &agent(ev).id
}

fn is_terminal(k: Kind) -> bool {
    matches!(k, Kind::Done | Kind::Failed | Kind::Cancelled)
}

/// The next event; panics if none arrives within 10 s or the stream ends.
async fn next_event(stream: &mut Events) -> pb::WatchAgentsResponse {
    tokio::time::timeout(EVENT_WAIT, stream.message())
        .await
        .expect("an event arrives within 10 s")
        .expect("watch stream ok")
        .expect("watch stream open")
}

/// Reads events until `done` holds for what has been read (checked after
/// every event), and returns them all.
async fn read_until(
    stream: &mut Events,
    mut done: impl FnMut(&[pb::WatchAgentsResponse]) -> bool,
) -> Vec<pb::WatchAgentsResponse> {
    let mut events = Vec::new();
    while !done(&events) {
        events.push(next_event(stream).await);
    }
    events
}

/// Reads events until every agent of `ids` has had a terminal event.
async fn read_until_terminal(stream: &mut Events, ids: &[&str]) -> Vec<pb::WatchAgentsResponse> {
    read_until(stream, |evs| {
        ids.iter()
            .all(|id| evs.iter().any(|e| id_of(e) == *id && is_terminal(kind(e))))
    })
    .await
}

/// The kinds of the events of one agent, in stream order.
fn kinds_of(events: &[pb::WatchAgentsResponse], id: &str) -> Vec<Kind> {
    events.iter().filter(|e| id_of(e) == id).map(kind).collect()
}

/// The one event of `kind` for `id`.
fn event_of<'a>(
    events: &'a [pb::WatchAgentsResponse],
    id: &str,
    k: Kind,
) -> &'a pb::WatchAgentsResponse {
    let mut found = events.iter().filter(|e| id_of(e) == id && kind(e) == k);
    let ev = found
        .next()
        .unwrap_or_else(|| panic!("no {k:?} event for {id}"));
    assert!(found.next().is_none(), "two {k:?} events for {id}");
    ev
}

fn assert_strictly_increasing(events: &[pb::WatchAgentsResponse]) {
    for pair in events.windows(2) {
        assert!(
            pair[0].sequence < pair[1].sequence,
            "sequence not strictly increasing: {} ({:?}) then {} ({:?})",
            pair[0].sequence,
            kind(&pair[0]),
            pair[1].sequence,
            kind(&pair[1]),
        );
    }
    assert!(
        events.iter().all(|e| e.sequence >= 1),
        "sequences start at 1"
    );
}

/// The agent status an event of `k` must show.
fn status_after(k: Kind) -> Option<pb::AgentStatus> {
    Some(match k {
        Kind::Queued => pb::AgentStatus::Queued,
        Kind::Started | Kind::Steered => pb::AgentStatus::Running,
        Kind::AwaitingApproval => pb::AgentStatus::AwaitingApproval,
        Kind::Done => pb::AgentStatus::Done,
        Kind::Failed => pb::AgentStatus::Failed,
        Kind::Cancelled => pb::AgentStatus::Cancelled,
        Kind::Snapshot | Kind::Unspecified | Kind::Output | Kind::ToolCall => return None,
        // After the terminal event: the agent stays as it ended.
        Kind::WorkspaceSaved => return None,
        Kind::Retrying => pb::AgentStatus::Queued,
    })
}

/// Every transition event shows the agent in the state the event names.
fn assert_event_states(events: &[pb::WatchAgentsResponse]) {
    for e in events {
        if let Some(expected) = status_after(kind(e)) {
            assert_eq!(
                status(agent(e)),
                expected,
                "{:?} event #{} shows the agent as {:?}",
                kind(e),
                e.sequence,
                status(agent(e))
            );
        }
    }
}

fn all_agents() -> pb::WatchAgentsRequest {
    pb::WatchAgentsRequest::default()
}

fn child(parent: &pb::Agent, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        parent_id: parent.id.clone(),
        ..bg("m/x", prompt)
    }
}

fn with_lead(lead: &str, req: pb::SpawnRequest) -> pb::SpawnRequest {
    pb::SpawnRequest {
        lead_id: lead.to_owned(),
        ..req
    }
}

/// A client whose HTTP/2 stream window is the protocol default (64 KiB
/// instead of hyper's 2 MiB), so a stream that is not read stops the server
/// from sending after a few hundred events instead of after megabytes. The
/// connection window stays large: h2 sizes its budget for buffered small
/// DATA frames from it, and a small one makes the client itself abort the
/// connection (GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames").
async fn connect_with_small_window(addr: std::net::SocketAddr) -> Client {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(Some(65_535))
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("client connects");
    AgentServiceClient::new(channel)
}

// ----- event order -------------------------------------------------------------

#[tokio::test]
async fn an_agent_that_starts_at_once_emits_started_then_done_without_queued() {
    let mut s = TestServer::start("").await;
    let mut w = watch(&mut s.client, all_agents()).await;
    let a = spawn(&mut s.client, bg("m/x", "hello")).await;
    let events = read_until_terminal(&mut w, &[&a.id]).await;
    assert_eq!(kinds_of(&events, &a.id), [Kind::Started, Kind::Done]);
    assert_event_states(&events);
    assert_eq!(agent(event_of(&events, &a.id, Kind::Done)).result, "hello");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_queued_agent_emits_queued_then_started_then_done_in_order() {
    let mut s = TestServer::start("[limits]\ndefault_concurrency = 1\n").await;
    let mut w = watch(&mut s.client, all_agents()).await;
    let blocker = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let queued = spawn(&mut s.client, bg("m/x", "hi")).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    steer(&mut s.client, &blocker.id, "finish").await;
    let events = read_until_terminal(&mut w, &[&blocker.id, &queued.id]).await;

    assert_eq!(
        kinds_of(&events, &blocker.id),
        [Kind::Started, Kind::Steered, Kind::Done]
    );
    assert_eq!(
        kinds_of(&events, &queued.id),
        [Kind::Queued, Kind::Started, Kind::Done]
    );
    assert_event_states(&events);
    // The queued agent starts only once the blocker has freed the bucket.
    assert!(
        event_of(&events, &blocker.id, Kind::Done).sequence
            < event_of(&events, &queued.id, Kind::Started).sequence
    );
    assert_strictly_increasing(&events);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn sequence_numbers_strictly_increase_along_a_stream() {
    let toml = "[limits]\nmax_background_agents = 50\ndefault_concurrency = 2\n";
    let mut s = TestServer::start(toml).await;
    let mut w = watch(&mut s.client, all_agents()).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let prompt = match i % 3 {
            0 => "hi".to_owned(),
            1 => format!("output {i}"),
            _ => "fail on purpose".to_owned(),
        };
        let model = if i % 2 == 0 { "m/a" } else { "m/b" };
        ids.push(spawn(&mut s.client, bg(model, &prompt)).await.id);
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let events = read_until_terminal(&mut w, &refs).await;
    assert_strictly_increasing(&events);
    assert_event_states(&events);
    // Every agent's own events are a valid life: optional QUEUED, STARTED,
    // one terminal event last.
    for id in &refs {
        let kinds = kinds_of(&events, id);
        let life: &[Kind] = if kinds[0] == Kind::Queued {
            &kinds[1..]
        } else {
            &kinds
        };
        assert_eq!(life.len(), 2, "{id}: {kinds:?}");
        assert_eq!(life[0], Kind::Started, "{id}: {kinds:?}");
        assert!(is_terminal(life[1]), "{id}: {kinds:?}");
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn steering_a_running_agent_emits_steered_before_it_finishes() {
    let mut s = TestServer::start("").await;
    let mut w = watch(&mut s.client, all_agents()).await;
    let a = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    wait_for_event(&mut w, &a.id, Kind::Started).await;
    steer(&mut s.client, &a.id, "go left").await;
    let events = read_until_terminal(&mut w, &[&a.id]).await;
    assert_eq!(kinds_of(&events, &a.id), [Kind::Steered, Kind::Done]);
    assert_event_states(&events);
    assert_eq!(
        agent(event_of(&events, &a.id, Kind::Done)).result,
        "steer: go left"
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_approval_request_emits_awaiting_approval_with_the_tool_name() {
    let mut s = TestServer::start("").await;
    let mut w = watch(&mut s.client, all_agents()).await;
    let a = spawn(&mut s.client, bg("m/x", "approve shell")).await;
    let events = read_until(&mut w, |evs| {
        evs.iter()
            .any(|e| id_of(e) == a.id && kind(e) == Kind::AwaitingApproval)
    })
    .await;
    assert_eq!(
        kinds_of(&events, &a.id),
        [Kind::Started, Kind::AwaitingApproval]
    );
    assert_event_states(&events);
    let approval = agent(event_of(&events, &a.id, Kind::AwaitingApproval))
        .approval
        .clone()
        .expect("AWAITING_APPROVAL event carries the approval");
    assert_eq!(approval.tool_name, "shell");
    assert!(!approval.id.is_empty());

    cancel(&mut s.client, &a.id).await;
    let ev = next_event(&mut w).await;
    assert_eq!((id_of(&ev), kind(&ev)), (a.id.as_str(), Kind::Cancelled));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failing_agent_emits_failed_with_its_error() {
    let mut s = TestServer::start("").await;
    let mut w = watch(&mut s.client, all_agents()).await;
    let a = spawn(&mut s.client, bg("m/x", "output partial\nfail boom")).await;
    let events = read_until_terminal(&mut w, &[&a.id]).await;
    assert_eq!(kinds_of(&events, &a.id), [Kind::Started, Kind::Failed]);
    assert_event_states(&events);
    let failed = agent(event_of(&events, &a.id, Kind::Failed));
    let error = failed
        .error
        .as_ref()
        .expect("FAILED event carries the error");
    assert_eq!(error.message, "boom");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancelling_queued_and_running_agents_emits_cancelled() {
    let mut s = TestServer::start("[limits]\ndefault_concurrency = 1\n").await;
    let mut w = watch(&mut s.client, all_agents()).await;
    let running = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let queued = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    // The queued one first, so it never starts.
    cancel(&mut s.client, &queued.id).await;
    cancel(&mut s.client, &running.id).await;
    let events = read_until_terminal(&mut w, &[&running.id, &queued.id]).await;
    assert_eq!(
        kinds_of(&events, &running.id),
        [Kind::Started, Kind::Cancelled]
    );
    assert_eq!(
        kinds_of(&events, &queued.id),
        [Kind::Queued, Kind::Cancelled]
    );
    assert_event_states(&events);
    assert_strictly_increasing(&events);
    s.handle.shutdown().await.unwrap();
}

// ----- filters -------------------------------------------------------------------

#[tokio::test]
async fn ids_filter_delivers_only_the_named_agents() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let b = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let mut w = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            ids: vec![a.id.clone()],
            ..Default::default()
        },
    )
    .await;
    // b's events come first in server order; a filtering stream skips them.
    steer(&mut s.client, &b.id, "x").await;
    await_all(&mut s.client, &[&b.id]).await;
    let c = spawn(&mut s.client, bg("m/x", "hi")).await;
    await_all(&mut s.client, &[&c.id]).await;
    steer(&mut s.client, &a.id, "y").await;
    let events = read_until_terminal(&mut w, &[&a.id]).await;
    assert!(
        events.iter().all(|e| id_of(e) == a.id),
        "events of other agents leaked: {:?}",
        events
            .iter()
            .map(|e| (id_of(e), kind(e)))
            .collect::<Vec<_>>()
    );
    assert_eq!(kinds_of(&events, &a.id), [Kind::Steered, Kind::Done]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn parent_id_filter_delivers_direct_children_only() {
    let mut s = TestServer::start("").await;
    let root = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let mut w = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            parent_id: root.id.clone(),
            ..Default::default()
        },
    )
    .await;
    let c1 = spawn(&mut s.client, child(&root, "wait_steer")).await;
    let grandchild = spawn(&mut s.client, child(&c1, "hi")).await;
    let other_root = spawn(&mut s.client, bg("m/x", "hi")).await;
    let c2 = spawn(&mut s.client, child(&root, "hi")).await;
    await_all(&mut s.client, &[&grandchild.id, &other_root.id, &c2.id]).await;
    // Ending the root cascades to c1: the last event this watcher expects.
    steer(&mut s.client, &root.id, "done").await;
    let events = read_until_terminal(&mut w, &[&c1.id, &c2.id]).await;

    let seen: HashSet<&str> = events.iter().map(id_of).collect();
    assert_eq!(seen, HashSet::from([c1.id.as_str(), c2.id.as_str()]));
    assert!(events.iter().all(|e| agent(e).parent_id == root.id));
    assert_eq!(kinds_of(&events, &c1.id), [Kind::Started, Kind::Cancelled]);
    assert_eq!(kinds_of(&events, &c2.id), [Kind::Started, Kind::Done]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn root_id_filter_delivers_the_whole_tree() {
    let mut s = TestServer::start("").await;
    let root = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let mut w = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            root_id: root.id.clone(),
            ..Default::default()
        },
    )
    .await;
    let c1 = spawn(&mut s.client, child(&root, "wait_steer")).await;
    let grandchild = spawn(&mut s.client, child(&c1, "hi")).await;
    let other_root = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let other_child = spawn(&mut s.client, child(&other_root, "hi")).await;
    await_all(&mut s.client, &[&grandchild.id, &other_child.id]).await;
    cancel(&mut s.client, &other_root.id).await;
    cancel(&mut s.client, &root.id).await;
    let events = read_until_terminal(&mut w, &[&root.id, &c1.id]).await;

    let seen: HashSet<&str> = events.iter().map(id_of).collect();
    assert_eq!(
        seen,
        HashSet::from([root.id.as_str(), c1.id.as_str(), grandchild.id.as_str()])
    );
    assert!(events.iter().all(|e| agent(e).root_id == root.id));
    assert_eq!(kinds_of(&events, &root.id), [Kind::Cancelled]);
    assert_eq!(kinds_of(&events, &c1.id), [Kind::Started, Kind::Cancelled]);
    assert_eq!(
        kinds_of(&events, &grandchild.id),
        [Kind::Started, Kind::Done]
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn lead_id_filter_delivers_agents_of_the_lead_at_every_depth() {
    let mut s = TestServer::start("").await;
    let mut w = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            lead_id: "lead-a".into(),
            ..Default::default()
        },
    )
    .await;
    let root = spawn(&mut s.client, with_lead("lead-a", bg("m/x", "wait_steer"))).await;
    let c = spawn(&mut s.client, child(&root, "wait_steer")).await;
    let g = spawn(&mut s.client, child(&c, "hi")).await;
    let other_lead = spawn(&mut s.client, with_lead("lead-b", bg("m/x", "wait_steer"))).await;
    let other_child = spawn(&mut s.client, child(&other_lead, "hi")).await;
    let no_lead = spawn(&mut s.client, bg("m/x", "hi")).await;
    await_all(&mut s.client, &[&g.id, &other_child.id, &no_lead.id]).await;
    cancel(&mut s.client, &other_lead.id).await;
    let cancelled = s
        .client
        .cancel(pb::CancelRequest {
            lead_id: "lead-a".into(),
            ..Default::default()
        })
        .await
        .expect("cancel by lead succeeds")
        .into_inner()
        .agents;
    assert_eq!(cancelled.len(), 2);
    let events = read_until_terminal(&mut w, &[&root.id, &c.id]).await;

    let seen: HashSet<&str> = events.iter().map(id_of).collect();
    assert_eq!(
        seen,
        HashSet::from([root.id.as_str(), c.id.as_str(), g.id.as_str()])
    );
    assert!(events.iter().all(|e| agent(e).lead_id == "lead-a"));
    assert_eq!(kinds_of(&events, &g.id), [Kind::Started, Kind::Done]);
    assert_eq!(kinds_of(&events, &c.id), [Kind::Started, Kind::Cancelled]);
    s.handle.shutdown().await.unwrap();
}

// ----- snapshot and resume ------------------------------------------------------------

#[tokio::test]
async fn include_snapshot_sends_one_snapshot_per_matching_agent_then_live_events() {
    let toml = "[limits]\ndefault_concurrency = 1\n";
    let mut s = TestServer::start(toml).await;
    let running = spawn(&mut s.client, with_lead("lead-a", bg("m/a", "wait_steer"))).await;
    let failed = spawn(&mut s.client, with_lead("lead-a", bg("m/b", "fail boom"))).await;
    await_all(&mut s.client, &[&failed.id]).await;
    let queued = spawn(&mut s.client, with_lead("lead-a", bg("m/a", "hi"))).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    // Not under the lead: neither snapshotted nor streamed.
    let outsider = spawn(&mut s.client, bg("m/c", "wait_steer")).await;

    let mut w = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            lead_id: "lead-a".into(),
            include_snapshot: true,
            ..Default::default()
        },
    )
    .await;
    let mut snapshots = Vec::new();
    for _ in 0..3 {
        snapshots.push(next_event(&mut w).await);
    }
    assert!(snapshots.iter().all(|e| kind(e) == Kind::Snapshot));
    let states: HashMap<&str, pb::AgentStatus> = snapshots
        .iter()
        .map(|e| (id_of(e), status(agent(e))))
        .collect();
    assert_eq!(
        states,
        HashMap::from([
            (running.id.as_str(), pb::AgentStatus::Running),
            (failed.id.as_str(), pb::AgentStatus::Failed),
            (queued.id.as_str(), pb::AgentStatus::Queued),
        ])
    );

    steer(&mut s.client, &outsider.id, "x").await;
    await_all(&mut s.client, &[&outsider.id]).await;
    steer(&mut s.client, &running.id, "y").await;
    let live = read_until_terminal(&mut w, &[&running.id, &queued.id]).await;
    assert!(live.iter().all(|e| kind(e) != Kind::Snapshot));
    assert!(live.iter().all(|e| id_of(e) != outsider.id));
    assert_eq!(kinds_of(&live, &running.id), [Kind::Steered, Kind::Done]);
    assert_eq!(kinds_of(&live, &queued.id), [Kind::Started, Kind::Done]);
    let all: Vec<_> = snapshots.into_iter().chain(live).collect();
    assert_strictly_increasing(&all);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn after_sequence_replays_retained_events_in_order_then_live_events() {
    let mut s = TestServer::start("").await;
    let mut first = watch(&mut s.client, all_agents()).await;
    let a = spawn(&mut s.client, bg("m/x", "hi")).await;
    let b = spawn(&mut s.client, bg("m/x", "fail boom")).await;
    let before = read_until_terminal(&mut first, &[&a.id, &b.id]).await;
    let resume_after = event_of(&before, &a.id, Kind::Started).sequence;

    let mut resumed = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            after_sequence: resume_after,
            ..Default::default()
        },
    )
    .await;
    let c = spawn(&mut s.client, bg("m/x", "hi")).await;
    let after = read_until_terminal(&mut first, &[&c.id]).await;
    let replayed = read_until_terminal(&mut resumed, &[&a.id, &b.id, &c.id]).await;

    let expected: Vec<(u64, Kind, &str)> = before
        .iter()
        .chain(&after)
        .filter(|e| e.sequence > resume_after)
        .map(|e| (e.sequence, kind(e), id_of(e)))
        .collect();
    let got: Vec<(u64, Kind, &str)> = replayed
        .iter()
        .map(|e| (e.sequence, kind(e), id_of(e)))
        .collect();
    assert_eq!(got, expected);
    // The replay starts right after the given sequence and carries no
    // snapshots: the history still holds everything.
    assert_eq!(kinds_of(&replayed, &a.id), [Kind::Done]);
    assert_eq!(kinds_of(&replayed, &c.id), [Kind::Started, Kind::Done]);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn after_sequence_older_than_the_history_sends_snapshots_then_live_events() {
    let toml = "[limits]\nmax_background_agents = 20\n[watch]\nhistory = 4\n";
    let mut s = TestServer::start(toml).await;
    let mut first = watch(&mut s.client, all_agents()).await;
    let long = spawn(&mut s.client, bg("m/x", "wait_steer")).await;
    let resume_after = wait_for_event(&mut first, &long.id, Kind::Started)
        .await
        .sequence;
    // 20 more events (STARTED + DONE of 10 agents) push it out of the history.
    let mut short = Vec::new();
    for _ in 0..10 {
        let a = spawn(&mut s.client, bg("m/x", "hi")).await;
        short.push(a.id);
    }
    let refs: Vec<&str> = short.iter().map(String::as_str).collect();
    await_all(&mut s.client, &refs).await;

    let mut resumed = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            after_sequence: resume_after,
            ..Default::default()
        },
    )
    .await;
    let mut snapshots = Vec::new();
    for _ in 0..11 {
        snapshots.push(next_event(&mut resumed).await);
    }
    assert!(
        snapshots.iter().all(|e| kind(e) == Kind::Snapshot),
        "expected 11 SNAPSHOT events first, got {:?}",
        snapshots.iter().map(kind).collect::<Vec<_>>()
    );
    let states: HashMap<&str, pb::AgentStatus> = snapshots
        .iter()
        .map(|e| (id_of(e), status(agent(e))))
        .collect();
    let mut expected: HashMap<&str, pb::AgentStatus> =
        refs.iter().map(|id| (*id, pb::AgentStatus::Done)).collect();
    expected.insert(long.id.as_str(), pb::AgentStatus::Running);
    assert_eq!(states, expected);
    assert!(snapshots.iter().all(|e| e.sequence > resume_after));

    steer(&mut s.client, &long.id, "end").await;
    let live = read_until_terminal(&mut resumed, &[&long.id]).await;
    assert_eq!(kinds_of(&live, &long.id), [Kind::Steered, Kind::Done]);
    assert!(live.iter().all(|e| kind(e) != Kind::Snapshot));
    let all: Vec<_> = snapshots.into_iter().chain(live).collect();
    assert_strictly_increasing(&all);
    s.handle.shutdown().await.unwrap();
}

// ----- lagging subscribers -----------------------------------------------------------------

/// Agents spawned by the lagging-subscriber test: 6000 events, far more than
/// a 64 KiB window plus an 8-event ring can hold.
const FLOOD: usize = 3000;

const FLOOD_CONFIG: &str = "[limits]\nmax_background_agents = 10000\ndefault_concurrency = 0\n\
                            max_concurrent_per_parent = 0\n[watch]\nsubscriber_buffer = 8\n";

#[tokio::test]
async fn a_lagging_subscriber_is_cut_with_a_resume_hint_while_others_continue() {
    lagging_subscriber(None).await;
}

/// The same for subscribers routed by their filter (their own bounded
/// queues instead of the broadcast ring).
#[tokio::test]
async fn a_lagging_lead_subscriber_is_cut_with_a_resume_hint_while_others_continue() {
    lagging_subscriber(Some("flood-lead")).await;
}

/// A routed subscriber's buffer holds only the events routed to it: a
/// watcher of a quiet lead that is not read while another lead floods the
/// server is not cut off, and then gets its own lead's events.
#[tokio::test]
async fn a_quiet_lead_s_watcher_is_not_cut_by_another_lead_s_flood() {
    let mut s = TestServer::start(FLOOD_CONFIG).await;
    let mut quiet_client = connect_with_small_window(s.handle.addr()).await;
    let mut quiet = watch(
        &mut quiet_client,
        pb::WatchAgentsRequest {
            lead_id: "quiet".into(),
            ..all_agents()
        },
    )
    .await;
    for _ in 0..FLOOD {
        spawn(&mut s.client, with_lead("loud", bg("m/x", "hi"))).await;
    }
    let mine = spawn(&mut s.client, with_lead("quiet", bg("m/x", "hi"))).await;
    let events = read_until_terminal(&mut quiet, &[&mine.id]).await;
    assert!(
        events.iter().all(|ev| id_of(ev) == mine.id),
        "only the quiet lead's events: {events:?}"
    );
    assert_eq!(
        events.iter().map(kind).collect::<Vec<_>>(),
        [Kind::Started, Kind::Done]
    );
    // A routed watcher that goes away is unsubscribed.
    drop(quiet);
    let scheduler = s.handle.scheduler().clone();
    let until = tokio::time::Instant::now() + EVENT_WAIT;
    while scheduler.inspect(|c| c.watch_subscribers()) != 0 {
        assert!(tokio::time::Instant::now() < until, "still subscribed");
        tokio::task::yield_now().await;
    }
    s.handle.shutdown().await.unwrap();
}

/// One watcher that is not read during a flood of `FLOOD` agents is cut
/// off with a resume hint that works, while one that reads keeps up. Both
/// watch `lead` (every flood agent is under it) or, with None, everything.
async fn lagging_subscriber(lead: Option<&str>) {
    let mut s = TestServer::start(FLOOD_CONFIG).await;
    let filter = pb::WatchAgentsRequest {
        lead_id: lead.unwrap_or_default().to_owned(),
        ..all_agents()
    };
    let flood_agent = || with_lead(lead.unwrap_or_default(), bg("m/x", "hi"));

    // The slow watcher is never read until the flood is over.
    let mut slow_client = connect_with_small_window(s.handle.addr()).await;
    let mut slow = watch(&mut slow_client, filter.clone()).await;

    // The fast watcher reads everything as it comes, on its own connection.
    let mut fast_client = s.new_client().await;
    let mut fast = watch(&mut fast_client, filter.clone()).await;
    let fast_reader = tokio::spawn(async move {
        let mut done = HashSet::new();
        while done.len() < FLOOD {
            match tokio::time::timeout(EVENT_WAIT, fast.message()).await {
                Err(_) => return Err(format!("no event for 10 s after {} DONE", done.len())),
                Ok(Err(status)) => {
                    return Err(format!(
                        "fast watcher cut after {} DONE: {status:?}",
                        done.len()
                    ))
                }
                Ok(Ok(None)) => return Err("fast watcher's stream ended".to_owned()),
                Ok(Ok(Some(ev))) => {
                    if kind(&ev) == Kind::Done {
                        done.insert(id_of(&ev).to_owned());
                    }
                }
            }
        }
        Ok(done)
    });

    let mut spawned = HashSet::new();
    for _ in 0..FLOOD {
        spawned.insert(spawn(&mut s.client, flood_agent()).await.id);
    }
    let done = tokio::time::timeout(Duration::from_secs(120), fast_reader)
        .await
        .expect("fast watcher finishes within 120 s")
        .expect("fast watcher task does not panic")
        .expect("fast watcher keeps up");
    assert_eq!(done, spawned, "the fast watcher saw every DONE event");

    // Now drain the slow watcher: some events, then the cut-off status.
    let mut received = 0usize;
    let mut last_sequence = 0;
    let cut = loop {
        match tokio::time::timeout(EVENT_WAIT, slow.message())
            .await
            .expect("the slow stream moves within 10 s")
        {
            Ok(Some(ev)) => {
                received += 1;
                last_sequence = ev.sequence;
            }
            Ok(None) => panic!("the slow stream ended cleanly after {received} events"),
            Err(cut) => break cut,
        }
    };
    assert!(
        received < 2 * FLOOD,
        "the slow watcher received all {received} events"
    );
    assert_eq!(cut.code(), tonic::Code::ResourceExhausted, "{cut:?}");
    assert!(
        cut.message().contains("after_sequence"),
        "message says how to resume after {received} events: {cut:?}"
    );
    let (reason, metadata) = error_info(&cut);
    assert_eq!(reason, "WATCH_LAGGED");
    let resume_after: u64 = metadata
        .get("resume_after_sequence")
        .expect("metadata resume_after_sequence")
        .parse()
        .expect("resume_after_sequence is a number");
    assert_eq!(
        resume_after, last_sequence,
        "resume after the last event delivered"
    );
    // The stream is over after the status.
    assert!(matches!(slow.message().await, Ok(None) | Err(_)));

    // The hint works: resuming after it replays from the very next event
    // (no snapshots were taken, so every sequence number is an event).
    let mut resumed = watch(
        &mut slow_client,
        pb::WatchAgentsRequest {
            after_sequence: resume_after,
            ..filter.clone()
        },
    )
    .await;
    let next = next_event(&mut resumed).await;
    assert_eq!(next.sequence, resume_after + 1);
    assert_ne!(kind(&next), Kind::Snapshot);

    // The server still admits and runs agents.
    let a = spawn(&mut s.client, bg("m/x", "after the flood")).await;
    let a = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&a[0]), pb::AgentStatus::Done);
    s.handle.shutdown().await.unwrap();
}
