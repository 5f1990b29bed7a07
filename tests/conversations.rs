//! Conversations over loopback gRPC: continuing and forking finished
//! agents, every refusal, admission of continuations, transcripts
//! (GetTranscript), their retention and size bound, and the Status and
//! WatchAgents `conversation_id` filters.

mod common;

use std::{collections::HashMap, time::Duration};

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::{transport::Channel, Code};

type Client = AgentServiceClient<Channel>;

const MODEL: &str = "acme/m1";

/// A foreground continuation of `from` with `prompt`, inheriting the rest.
fn continue_fg(from: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        continue_from: from.to_owned(),
        prompt: prompt.to_owned(),
        ..Default::default()
    }
}

fn fork_fg(from: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        fork: true,
        ..continue_fg(from, prompt)
    }
}

async fn refused(client: &mut Client, req: pb::SpawnRequest) -> tonic::Status {
    client
        .spawn(req)
        .await
        .expect_err("the continuation is refused")
}

async fn transcript(
    client: &mut Client,
    req: pb::GetTranscriptRequest,
) -> pb::GetTranscriptResponse {
    client
        .get_transcript(req)
        .await
        .expect("GetTranscript succeeds")
        .into_inner()
}

fn of_agent(id: &str) -> pb::GetTranscriptRequest {
    pb::GetTranscriptRequest {
        agent_id: id.to_owned(),
        ..Default::default()
    }
}

fn of_conversation(id: &str) -> pb::GetTranscriptRequest {
    pb::GetTranscriptRequest {
        conversation_id: id.to_owned(),
        ..Default::default()
    }
}

/// The ids of the agents Status lists for conversation `id`.
async fn turns_of(client: &mut Client, id: &str) -> Vec<String> {
    client
        .status(pb::StatusRequest {
            conversation_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .expect("Status succeeds")
        .into_inner()
        .agents
        .into_iter()
        .map(|a| a.id)
        .collect()
}

/// (kind, agent id, turn, text) of every entry.
fn entries(t: &pb::GetTranscriptResponse) -> Vec<(pb::TranscriptEntryKind, String, u32, String)> {
    t.entries
        .iter()
        .map(|e| (e.kind(), e.agent_id.clone(), e.turn, e.text.clone()))
        .collect()
}

#[tokio::test]
async fn a_continuation_is_a_new_agent_that_inherits_and_sees_the_earlier_turns() {
    let mut s = TestServer::start("").await;
    let first = spawn(
        &mut s.client,
        pb::SpawnRequest {
            labels: HashMap::from([("team".into(), "red".into()), ("k".into(), "old".into())]),
            lead_id: "lead-1".into(),
            ..fg(MODEL, "output one")
        },
    )
    .await;
    assert_eq!(status(&first), pb::AgentStatus::Done);
    assert_eq!(
        (
            first.conversation_id.as_str(),
            first.continues_id.as_str(),
            first.turn
        ),
        (first.id.as_str(), "", 1)
    );

    let second = spawn(
        &mut s.client,
        pb::SpawnRequest {
            labels: HashMap::from([("k".into(), "new".into())]),
            ..continue_fg(&first.id, "history\noutput two")
        },
    )
    .await;
    assert_ne!(second.id, first.id, "a continuation is a new agent");
    assert_eq!(status(&second), pb::AgentStatus::Done);
    assert_eq!(second.conversation_id, first.id);
    assert_eq!(second.continues_id, first.id);
    assert_eq!(second.turn, 2);
    assert_eq!(
        (second.agent.as_str(), second.model.as_str()),
        ("simulated", MODEL)
    );
    assert_eq!(second.lead_id, "lead-1");
    assert_eq!(second.parent_id, "", "no parent: a root agent");
    assert_eq!(second.root_id, second.id);
    assert_eq!(second.labels["team"], "red");
    assert_eq!(second.labels["k"], "new", "the request's label wins");
    assert_eq!(
        second.result, "turn 1 prompt: output one\nturn 1 result: one\ntwo",
        "the run saw the earlier turn"
    );
    // The continued agent stays as it was.
    let first_now = status_of(&mut s.client, &first.id).await;
    assert_eq!(status(&first_now), pb::AgentStatus::Done);
    assert_eq!(first_now.result, "one");
    assert_eq!(first_now.turn, 1);

    // A third turn sees both before it.
    let third = spawn(&mut s.client, continue_fg(&second.id, "history")).await;
    assert_eq!(
        (third.turn, third.conversation_id.as_str()),
        (3, first.id.as_str())
    );
    assert_eq!(
        third.result.lines().collect::<Vec<_>>(),
        [
            "turn 1 prompt: output one",
            "turn 1 result: one",
            "turn 2 prompt: history\\noutput two",
            "turn 2 result: turn 1 prompt: output one\\nturn 1 result: one\\ntwo",
        ]
    );
}

#[tokio::test]
async fn failed_and_cancelled_agents_can_be_continued() {
    let mut s = TestServer::start("").await;
    let failed = spawn(&mut s.client, fg(MODEL, "output partial\nfail boom")).await;
    assert_eq!(status(&failed), pb::AgentStatus::Failed);
    let next = spawn(&mut s.client, continue_fg(&failed.id, "history")).await;
    assert_eq!(status(&next), pb::AgentStatus::Done);
    assert_eq!(
        next.result,
        "turn 1 prompt: output partial\\nfail boom\nturn 1 failed: partial"
    );

    let live = spawn(&mut s.client, bg(MODEL, "output begun\nwait_steer")).await;
    cancel(&mut s.client, &live.id).await;
    let next = spawn(&mut s.client, continue_fg(&live.id, "history")).await;
    assert_eq!(status(&next), pb::AgentStatus::Done);
    assert!(
        next.result.ends_with("turn 1 cancelled: begun"),
        "{}",
        next.result
    );
    // The transcript records how each turn ended.
    let t = transcript(&mut s.client, of_conversation(&live.id)).await;
    let result = t
        .entries
        .iter()
        .find(|e| e.kind() == pb::TranscriptEntryKind::Result && e.turn == 1)
        .expect("turn 1 has a result entry");
    assert_eq!(result.status(), pb::AgentStatus::Cancelled);
    assert_eq!(result.error.as_ref().unwrap().code, "CANCELLED");
}

#[tokio::test]
async fn a_live_agent_is_busy_and_an_older_turn_is_not_the_latest() {
    let mut s = TestServer::start("").await;
    let live = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    let err = refused(&mut s.client, continue_fg(&live.id, "next")).await;
    assert_eq!(err.code(), Code::FailedPrecondition);
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "AGENT_BUSY");
    assert_eq!(meta["id"], live.id);
    assert!(err.message().contains("Steer"), "{}", err.message());
    // A fork of a live agent is refused alike.
    let err = refused(&mut s.client, fork_fg(&live.id, "next")).await;
    assert_eq!(error_info(&err).0, "AGENT_BUSY");

    let first = spawn(&mut s.client, fg(MODEL, "output one")).await;
    let second = spawn(&mut s.client, continue_fg(&first.id, "output two")).await;
    let err = refused(&mut s.client, continue_fg(&first.id, "again")).await;
    assert_eq!(err.code(), Code::FailedPrecondition);
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "NOT_LATEST");
    assert_eq!(meta["latest_id"], second.id);
    assert_eq!(meta["conversation_id"], first.id);
    assert!(err.message().contains(&second.id), "{}", err.message());
    // Nothing was admitted by the refusals.
    let listed = turns_of(&mut s.client, &first.id).await;
    let ids: Vec<&str> = listed.iter().map(String::as_str).collect();
    assert_eq!(ids, [first.id.as_str(), second.id.as_str()]);
}

#[tokio::test]
async fn a_fork_starts_a_conversation_of_its_own_from_any_turn() {
    let mut s = TestServer::start("").await;
    let first = spawn(&mut s.client, fg(MODEL, "output one")).await;
    let second = spawn(&mut s.client, continue_fg(&first.id, "output two")).await;
    let fork = spawn(&mut s.client, fork_fg(&first.id, "history")).await;
    assert_eq!(fork.conversation_id, fork.id);
    assert_eq!(fork.continues_id, first.id);
    assert_eq!(fork.turn, 2);
    assert_eq!(fork.result, "turn 1 prompt: output one\nturn 1 result: one");
    // The fork's conversation: the copied turn, then its own.
    let t = transcript(&mut s.client, of_conversation(&fork.id)).await;
    assert_eq!(t.conversation_id, fork.id);
    let kinds: Vec<(pb::TranscriptEntryKind, String, u32)> = entries(&t)
        .into_iter()
        .map(|(k, a, turn, _)| (k, a, turn))
        .collect();
    use pb::TranscriptEntryKind::{Prompt, Result};
    assert_eq!(
        kinds,
        [
            (Prompt, first.id.clone(), 1),
            (Result, first.id.clone(), 1),
            (Prompt, fork.id.clone(), 2),
            (Result, fork.id.clone(), 2),
        ]
    );
    // The fork's own conversation goes on from it; the original from its
    // latest.
    let after_fork = spawn(&mut s.client, continue_fg(&fork.id, "output more")).await;
    assert_eq!(
        (after_fork.conversation_id.as_str(), after_fork.turn),
        (fork.id.as_str(), 3)
    );
    let third = spawn(&mut s.client, continue_fg(&second.id, "output three")).await;
    assert_eq!(
        (third.conversation_id.as_str(), third.turn),
        (first.id.as_str(), 3)
    );
    // Status and Watch filter by conversation: a conversation's own turns.
    let listed = turns_of(&mut s.client, &fork.id).await;
    let ids: Vec<&str> = listed.iter().map(String::as_str).collect();
    assert_eq!(ids, [fork.id.as_str(), after_fork.id.as_str()]);
}

#[tokio::test]
async fn an_agent_type_that_is_not_continuable_refuses_continue_and_fork() {
    let mut s = TestServer::start(
        "[agents.simulated]\nrunner = \"simulated\"\n\
         [agents.oneshot]\nrunner = \"simulated\"\ncontinuable = false\n",
    )
    .await;
    let once = spawn(
        &mut s.client,
        pb::SpawnRequest {
            agent: "oneshot".into(),
            ..fg(MODEL, "output x")
        },
    )
    .await;
    for req in [continue_fg(&once.id, "more"), fork_fg(&once.id, "more")] {
        let err = refused(&mut s.client, req).await;
        assert_eq!(err.code(), Code::FailedPrecondition);
        let (reason, meta) = error_info(&err);
        assert_eq!(reason, "NOT_RESUMABLE");
        assert_eq!(meta["agent"], "oneshot");
    }
    // Continuing into a type that takes no history is refused too.
    let other = spawn(&mut s.client, fg(MODEL, "output y")).await;
    let err = refused(
        &mut s.client,
        pb::SpawnRequest {
            agent: "oneshot".into(),
            ..continue_fg(&other.id, "more")
        },
    )
    .await;
    assert_eq!(error_info(&err).0, "NOT_RESUMABLE");
}

#[tokio::test]
async fn bad_continuations_are_invalid_or_not_found() {
    let mut s = TestServer::start("").await;
    let err = refused(
        &mut s.client,
        pb::SpawnRequest {
            continue_from: "nope".into(),
            prompt: "x".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&err), ["continue_from"]);
    let err = refused(
        &mut s.client,
        pb::SpawnRequest {
            fork: true,
            ..fg(MODEL, "x")
        },
    )
    .await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&err), ["fork"]);
    // A fresh id that never existed is not found, like any unknown id.
    let unknown = uuid::Uuid::now_v7().to_string();
    let err = refused(&mut s.client, continue_fg(&unknown, "x")).await;
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(error_info(&err).0, "AGENT_NOT_FOUND");
    let err = s
        .client
        .get_transcript(of_agent(&unknown))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = s
        .client
        .get_transcript(pb::GetTranscriptRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&err), ["agent_id"]);
}

#[tokio::test]
async fn a_continuation_is_admitted_like_any_spawn() {
    let mut s =
        TestServer::start("[limits]\ndefault_concurrency = 1\nmax_background_agents = 2\n").await;
    let first = spawn(&mut s.client, fg(MODEL, "output one")).await;
    let busy = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    assert_eq!(status(&busy), pb::AgentStatus::Running);
    // The bucket is full: the continuation queues behind it.
    let queued = spawn(
        &mut s.client,
        pb::SpawnRequest {
            background: true,
            ..continue_fg(&first.id, "output two")
        },
    )
    .await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    assert!(
        queued.queue_reason.contains("acme/m1"),
        "{}",
        queued.queue_reason
    );
    // The global cap is reached: another continuation is refused at once.
    let other = spawn(&mut s.client, fg(MODEL, "output other")).await;
    let err = refused(
        &mut s.client,
        pb::SpawnRequest {
            background: true,
            ..continue_fg(&other.id, "more")
        },
    )
    .await;
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(error_info(&err).0, "GLOBAL_LIMIT_REACHED");
    steer(&mut s.client, &busy.id, "go").await;
    let done = await_all(&mut s.client, &[&queued.id]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done);
    assert_eq!(done[0].result, "two");
}

#[tokio::test]
async fn an_idempotent_continuation_returns_the_first_one() {
    let mut s = TestServer::start("").await;
    let first = spawn(
        &mut s.client,
        pb::SpawnRequest {
            lead_id: "lead".into(),
            ..fg(MODEL, "output one")
        },
    )
    .await;
    let req = pb::SpawnRequest {
        idempotency_key: "k1".into(),
        ..continue_fg(&first.id, "output two")
    };
    let a = spawn(&mut s.client, req.clone()).await;
    // The retry finds the first continuation, not NOT_LATEST.
    let b = spawn(&mut s.client, req).await;
    assert_eq!(a.id, b.id);
    assert_eq!(a.turn, 2);
}

#[tokio::test]
async fn a_continuation_keeps_a_live_parent_and_drops_an_ended_one() {
    let mut s = TestServer::start("").await;
    let parent = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    let child = spawn(
        &mut s.client,
        pb::SpawnRequest {
            parent_id: parent.id.clone(),
            lead_id: "ignored".into(),
            ..fg(MODEL, "output c")
        },
    )
    .await;
    let again = spawn(&mut s.client, continue_fg(&child.id, "output d")).await;
    assert_eq!(again.parent_id, parent.id, "a live parent is inherited");
    assert_eq!(again.depth, 2);
    assert_eq!(again.root_id, parent.id);
    steer(&mut s.client, &parent.id, "end").await;
    await_all(&mut s.client, &[&parent.id]).await;
    let after = spawn(&mut s.client, continue_fg(&again.id, "output e")).await;
    assert_eq!(after.parent_id, "", "an ended parent is replaced by none");
    assert_eq!(after.depth, 1);
    assert_eq!(after.root_id, after.id);
}

#[tokio::test]
async fn a_transcript_holds_prompts_steers_tool_calls_and_results_in_order() {
    let mut s = TestServer::start("").await;
    let a = spawn(
        &mut s.client,
        bg(MODEL, "tool grep\nwait_steer\noutput done"),
    )
    .await;
    steer(&mut s.client, &a.id, "look at main.rs").await;
    await_all(&mut s.client, &[&a.id]).await;
    let b = spawn(&mut s.client, continue_fg(&a.id, "output more")).await;
    use pb::TranscriptEntryKind::{Prompt, Result, Steer, ToolCall};
    let all = transcript(&mut s.client, of_conversation(&a.id)).await;
    assert_eq!(all.conversation_id, a.id);
    let got: Vec<(pb::TranscriptEntryKind, u32, String)> = entries(&all)
        .into_iter()
        .map(|(k, _, turn, text)| (k, turn, text))
        .collect();
    assert_eq!(
        got,
        [
            (Prompt, 1, "tool grep\nwait_steer\noutput done".to_owned()),
            (ToolCall, 1, "grep".to_owned()),
            (Steer, 1, "look at main.rs".to_owned()),
            (Result, 1, "steer: look at main.rs\ndone".to_owned()),
            (Prompt, 2, "output more".to_owned()),
            (Result, 2, "more".to_owned()),
        ]
    );
    for e in &all.entries {
        assert!(e.time.is_some());
        let owner = if e.turn == 1 { &a.id } else { &b.id };
        assert_eq!(&e.agent_id, owner);
    }
    // By agent id: the history up to and including that agent.
    let upto_a = transcript(&mut s.client, of_agent(&a.id)).await;
    assert_eq!(upto_a.entries.len(), 4);
    let upto_b = transcript(&mut s.client, of_agent(&b.id)).await;
    assert_eq!(upto_b.entries.len(), 6);
    // Pages: oldest first, a token to go on, empty on the last page.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = transcript(
            &mut s.client,
            pb::GetTranscriptRequest {
                page_size: 4,
                page_token: token.clone(),
                ..of_conversation(&a.id)
            },
        )
        .await;
        assert!(page.entries.len() <= 4);
        seen.extend(page.entries.into_iter().map(|e| e.text));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen.len(), 6);
    assert_eq!(seen.last().unwrap(), "more");
}

#[tokio::test]
async fn past_its_size_bound_a_transcript_elides_its_oldest_entries_with_a_marker() {
    let mut s = TestServer::start("[conversations]\nmax_transcript_bytes = 4096\n").await;
    let big = "x".repeat(3000);
    let a = spawn(&mut s.client, fg(MODEL, &format!("output {big}"))).await;
    // Prompt + result: 3007 + 3000 bytes, over 4096: the prompt is elided.
    let t = transcript(&mut s.client, of_conversation(&a.id)).await;
    let first = &t.entries[0];
    assert_eq!(first.kind(), pb::TranscriptEntryKind::Elided);
    assert!(
        first.text.contains("1 earlier transcript entries"),
        "{}",
        first.text
    );
    assert!(
        first.text.contains("max_transcript_bytes"),
        "{}",
        first.text
    );
    assert_eq!(t.entries.len(), 2);
    assert_eq!(t.entries[1].kind(), pb::TranscriptEntryKind::Result);
    // A continuation sees the marker too.
    let b = spawn(&mut s.client, continue_fg(&a.id, "history")).await;
    assert!(
        b.result
            .starts_with("elided: 1 entries, 3007 bytes\nturn 1 result: xxx"),
        "{}",
        &b.result[..80]
    );
}

#[tokio::test]
async fn a_transcript_expires_after_the_conversation_retention() {
    let mut s = TestServer::start(
        "[conversations]\nretention = \"200ms\"\n[runs]\nfinished_retention = \"1h\"\n",
    )
    .await;
    let a = spawn(&mut s.client, fg(MODEL, "output one")).await;
    // Forgetting emits no event, so poll, bounded at 10 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let err = loop {
        match s.client.get_transcript(of_agent(&a.id)).await {
            Err(err) => break err,
            Ok(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "transcript still retained 10 s after a 200 ms retention"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(error_info(&err).0, "CONVERSATION_EXPIRED");
    // The agent itself is still retained, and cannot be continued.
    assert_eq!(
        status(&status_of(&mut s.client, &a.id).await),
        pb::AgentStatus::Done
    );
    let err = refused(&mut s.client, continue_fg(&a.id, "more")).await;
    assert_eq!(err.code(), Code::NotFound);
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "CONVERSATION_EXPIRED");
    assert_eq!(meta["field"], "continue_from");
}

#[tokio::test]
async fn a_conversation_can_be_continued_after_its_agent_record_is_forgotten() {
    let mut s = TestServer::start("[runs]\nfinished_retention = \"50ms\"\n").await;
    let a = spawn(
        &mut s.client,
        pb::SpawnRequest {
            lead_id: "lead-x".into(),
            ..fg(MODEL, "output one")
        },
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s
        .client
        .status(pb::StatusRequest {
            ids: vec![a.id.clone()],
            ..Default::default()
        })
        .await
        .is_ok()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "agent never forgotten"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = spawn(&mut s.client, continue_fg(&a.id, "history")).await;
    assert_eq!((b.turn, b.conversation_id.as_str()), (2, a.id.as_str()));
    assert_eq!(
        (b.agent.as_str(), b.model.as_str(), b.lead_id.as_str()),
        ("simulated", MODEL, "lead-x")
    );
    assert_eq!(b.result, "turn 1 prompt: output one\nturn 1 result: one");
}

#[tokio::test]
async fn a_conversation_watch_sees_only_that_conversations_turns() {
    let mut s = TestServer::start("").await;
    let first = spawn(&mut s.client, fg(MODEL, "output one")).await;
    let mut client = s.new_client().await;
    let mut stream = watch(
        &mut client,
        pb::WatchAgentsRequest {
            conversation_id: first.id.clone(),
            ..Default::default()
        },
    )
    .await;
    let _unrelated = spawn(&mut s.client, fg(MODEL, "output other")).await;
    let second = spawn(&mut s.client, continue_fg(&first.id, "output two")).await;
    // Every event up to the continuation's DONE is about the continuation:
    // the unrelated agent, spawned first, is filtered out.
    let done = wait_for(&mut stream, |e| {
        let agent = e.agent.as_ref().unwrap();
        assert_eq!(agent.id, second.id, "only the conversation's turns: {e:?}");
        assert_eq!(agent.conversation_id, first.id);
        e.kind() == pb::AgentEventKind::Done
    })
    .await;
    assert_eq!(done.agent.unwrap().turn, 2);
}
