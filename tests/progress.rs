//! Progress events (OUTPUT, TOOL_CALL) on WatchAgents with
//! `include_progress`: their order within a run, that watchers without it
//! never see them, that they are not replayed, and the output and usage an
//! agent shows while and after it runs. Each test starts its own server.

mod common;

use std::time::Duration;

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient, AgentEventKind as Kind};
use tonic::transport::Channel;

type Events = tonic::Streaming<pb::WatchAgentsResponse>;
type Client = AgentServiceClient<Channel>;

const MODEL: &str = "acme/m1";

/// Two output chunks around a tool call.
const CHATTY: &str = "output one\ntool grep\noutput two";

// ----- helpers ---------------------------------------------------------------

fn kind(ev: &pb::WatchAgentsResponse) -> Kind {
    Kind::try_from(ev.kind).expect("known event kind")
}

fn agent(ev: &pb::WatchAgentsResponse) -> &pb::Agent {
    ev.agent.as_ref().expect("event carries its agent")
}

fn is_progress(k: Kind) -> bool {
    matches!(k, Kind::Output | Kind::ToolCall)
}

async fn watch_all(client: &mut Client, include_progress: bool) -> Events {
    watch(
        client,
        pb::WatchAgentsRequest {
            include_progress,
            ..Default::default()
        },
    )
    .await
}

/// Reads events until `id`'s terminal DONE event (inclusive) and returns
/// those of `id`; panics if an event takes more than 10 s.
async fn events_until_done(stream: &mut Events, id: &str) -> Vec<pb::WatchAgentsResponse> {
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("an event arrives within 10 s")
            .expect("watch stream ok")
            .expect("watch stream open");
        if agent(&ev).id != id {
            continue;
        }
        let done = matches!(kind(&ev), Kind::Done | Kind::Failed | Kind::Cancelled);
        out.push(ev);
        if done {
            return out;
        }
    }
}

fn kinds(events: &[pb::WatchAgentsResponse]) -> Vec<Kind> {
    events.iter().map(kind).collect()
}

fn assert_strictly_increasing(events: &[pb::WatchAgentsResponse]) {
    for pair in events.windows(2) {
        assert!(
            pair[0].sequence < pair[1].sequence,
            "sequence not strictly increasing: {:?}",
            events
                .iter()
                .map(|e| (e.sequence, kind(e)))
                .collect::<Vec<_>>()
        );
    }
}

// ----- progress events --------------------------------------------------------------

#[tokio::test]
async fn a_progress_watcher_sees_output_and_tool_calls_in_order_within_the_run() {
    let mut s = TestServer::start("").await;
    let mut progress = watch_all(&mut s.client, true).await;
    let a = spawn(&mut s.client, bg(MODEL, CHATTY)).await;

    let events = events_until_done(&mut progress, &a.id).await;
    assert_strictly_increasing(&events);
    let got = kinds(&events);
    let lifecycle: Vec<Kind> = got.iter().copied().filter(|k| !is_progress(*k)).collect();
    assert_eq!(lifecycle, [Kind::Started, Kind::Done], "{got:?}");
    assert_eq!(
        got,
        [
            Kind::Started,
            Kind::Output,
            Kind::ToolCall,
            Kind::Output,
            Kind::Done
        ],
        "progress between STARTED and DONE, in the order the run reported it"
    );

    let outputs: Vec<&str> = events
        .iter()
        .filter(|e| kind(e) == Kind::Output)
        .map(|e| e.output.as_str())
        .collect();
    assert_eq!(outputs, ["one", "\ntwo"]);
    for ev in events.iter().filter(|e| is_progress(kind(e))) {
        let ag = agent(ev);
        assert_eq!(ag.id, a.id);
        assert_eq!(
            ag.result, "",
            "progress events leave the agent's result empty: {ev:?}"
        );
        assert_eq!(status(ag), pb::AgentStatus::Running, "{ev:?}");
    }
    let call = events.iter().find(|e| kind(e) == Kind::ToolCall).unwrap();
    assert_eq!(
        call.tool_call.as_ref().map(|t| t.name.as_str()),
        Some("grep"),
        "{call:?}"
    );
    assert_eq!(call.output, "", "a TOOL_CALL event has no output chunk");
    for ev in events.iter().filter(|e| kind(e) != Kind::ToolCall) {
        assert!(
            ev.tool_call.is_none(),
            "only TOOL_CALL carries a call: {ev:?}"
        );
    }

    let done = events.last().unwrap();
    let done_agent = agent(done);
    assert_eq!(done_agent.result, "one\ntwo");
    assert_eq!(
        done_agent.usage.as_ref().map(|u| u.tool_calls),
        Some(1),
        "{done_agent:?}"
    );
    // The chunks concatenate to the result.
    assert_eq!(outputs.concat(), done_agent.result);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_watcher_without_progress_sees_only_lifecycle_events() {
    let mut s = TestServer::start("").await;
    // Both subscribed before the run: the progress watcher makes the server
    // produce progress, the other must still not receive it.
    let mut plain = watch_all(&mut s.client, false).await;
    let mut progress = watch_all(&mut s.client, true).await;
    let a = spawn(&mut s.client, bg(MODEL, CHATTY)).await;

    let seen_plain = events_until_done(&mut plain, &a.id).await;
    let seen_progress = events_until_done(&mut progress, &a.id).await;

    // Progress was produced ...
    assert_eq!(
        kinds(&seen_progress)
            .into_iter()
            .filter(|k| is_progress(*k))
            .count(),
        3,
        "{:?}",
        kinds(&seen_progress)
    );
    // ... but not sent to the plain watcher.
    assert_eq!(kinds(&seen_plain), [Kind::Started, Kind::Done]);
    assert!(seen_plain
        .iter()
        .all(|e| e.output.is_empty() && e.tool_call.is_none()));
    // Both saw the same lifecycle events.
    let lifecycle_seqs = |evs: &[pb::WatchAgentsResponse]| -> Vec<u64> {
        evs.iter()
            .filter(|e| !is_progress(kind(e)))
            .map(|e| e.sequence)
            .collect()
    };
    assert_eq!(lifecycle_seqs(&seen_plain), lifecycle_seqs(&seen_progress));
    assert_eq!(agent(seen_plain.last().unwrap()).result, "one\ntwo");
    s.handle.shutdown().await.unwrap();
}

/// Progress fills only the buffers of watchers that asked for it: a burst
/// of output many times `subscriber_buffer` must not cut off a plain
/// watcher, even while an idle progress watcher makes the server produce it.
#[tokio::test]
async fn a_burst_of_progress_does_not_cut_off_a_plain_watcher() {
    let mut s = TestServer::start("[watch]\nsubscriber_buffer = 4\n").await;
    let mut plain = watch_all(&mut s.client, false).await;
    // Subscribed and never read: progress is produced for it.
    let _idle_progress = watch_all(&mut s.client, true).await;
    let prompt: Vec<String> = (0..40).map(|i| format!("output line {i}")).collect();
    let a = spawn(&mut s.client, bg(MODEL, &prompt.join("\n"))).await;

    let seen = events_until_done(&mut plain, &a.id).await;
    assert_eq!(kinds(&seen), [Kind::Started, Kind::Done]);
    assert_eq!(
        agent(&seen[1]).result,
        prompt.join("\n").replace("output ", "")
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn progress_events_are_not_replayed() {
    let mut s = TestServer::start("").await;
    // A first agent takes the first sequence numbers, so replaying after 1
    // covers all of the second agent's events.
    let warmup = spawn(&mut s.client, fg(MODEL, "output warm")).await;
    assert_eq!(status(&warmup), pb::AgentStatus::Done);

    let mut live = watch_all(&mut s.client, true).await;
    let a = spawn(&mut s.client, bg(MODEL, CHATTY)).await;
    let seen_live = events_until_done(&mut live, &a.id).await;
    assert_eq!(
        kinds(&seen_live),
        [
            Kind::Started,
            Kind::Output,
            Kind::ToolCall,
            Kind::Output,
            Kind::Done
        ]
    );
    assert!(seen_live[0].sequence > 1, "{seen_live:?}");

    // Keep `live` open so progress would still be published for anyone.
    let mut replay = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            after_sequence: 1,
            include_progress: true,
            ..Default::default()
        },
    )
    .await;
    let replayed = events_until_done(&mut replay, &a.id).await;
    assert_eq!(
        kinds(&replayed),
        [Kind::Started, Kind::Done],
        "replay has the lifecycle events but no progress"
    );
    let live_lifecycle: Vec<u64> = seen_live
        .iter()
        .filter(|e| !is_progress(kind(e)))
        .map(|e| e.sequence)
        .collect();
    let replayed_seqs: Vec<u64> = replayed.iter().map(|e| e.sequence).collect();
    assert_eq!(replayed_seqs, live_lifecycle, "the same events as live");
    assert_eq!(agent(replayed.last().unwrap()).result, "one\ntwo");
    drop(live);
    s.handle.shutdown().await.unwrap();
}

// ----- output and usage on the agent --------------------------------------------------

#[tokio::test]
async fn a_running_agent_shows_its_output_so_far_and_keeps_it_when_cancelled() {
    let mut s = TestServer::start("").await;
    let mut progress = watch_all(&mut s.client, true).await;
    let a = spawn(&mut s.client, bg(MODEL, "output partial\nwait_steer")).await;

    let ev = wait_for_event(&mut progress, &a.id, Kind::Output).await;
    assert_eq!(ev.output, "partial");

    let running = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&running), pb::AgentStatus::Running, "{running:?}");
    assert_eq!(running.result, "partial");

    let cancelled = cancel(&mut s.client, &a.id).await;
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert_eq!(status(&cancelled[0]), pb::AgentStatus::Cancelled);
    assert_eq!(cancelled[0].result, "partial");
    let after = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&after), pb::AgentStatus::Cancelled);
    assert_eq!(after.result, "partial");
    let ev = wait_for_event(&mut progress, &a.id, Kind::Cancelled).await;
    assert_eq!(agent(&ev).result, "partial");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn usage_adds_up_tokens_and_counts_tool_calls() {
    let mut s = TestServer::start("").await;
    let a = spawn(
        &mut s.client,
        bg(MODEL, "usage 10 20\nusage 1 2\ntool a\ntool b"),
    )
    .await;
    let done = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    let usage = done.usage.expect("usage set");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.tool_calls),
        (11, 22, 2)
    );
    s.handle.shutdown().await.unwrap();
}

/// A TOOL_CALL event shows the agent after the call: its usage counts it.
#[tokio::test]
async fn a_tool_call_event_shows_the_call_counted() {
    let mut s = TestServer::start("").await;
    let mut progress = watch_all(&mut s.client, true).await;
    let a = spawn(&mut s.client, bg(MODEL, "tool a\ntool b\ntool c")).await;
    let seen = events_until_done(&mut progress, &a.id).await;
    let counts: Vec<u64> = seen
        .iter()
        .filter(|e| kind(e) == Kind::ToolCall)
        .map(|e| agent(e).usage.as_ref().expect("usage").tool_calls)
        .collect();
    assert_eq!(counts, [1, 2, 3]);
    s.handle.shutdown().await.unwrap();
}
