//! `[agents.NAME] max_turns`, `grace_turns` and `wrap_up_message` over
//! loopback gRPC, for the simulated runner (its `turn` directive) and a
//! worker speaking the protocol by hand (`turn_started` reports). The
//! openai runner's turns are in `openai_runner.rs`.

mod common;

use std::time::Duration;

use common::*;
use subagentd::pb::{
    self, connect_request, connect_response, run_event, worker_service_client::WorkerServiceClient,
};
use tokio_stream::wrappers::UnboundedReceiverStream;

const MODEL: &str = "acme/m1";

const CONFIG: &str = r#"
[agents.simulated]
runner = "simulated"
max_turns = 2
grace_turns = 1
wrap_up_message = "Please finish."

[agents.unlimited]
runner = "simulated"

[agents.coder]
runner = "worker"
max_turns = 2
grace_turns = 2
"#;

/// The next message to the worker.
async fn next(down: &mut tonic::Streaming<pb::ConnectResponse>) -> connect_response::Message {
    tokio::time::timeout(Duration::from_secs(10), down.message())
        .await
        .expect("a message within 10 s")
        .unwrap()
        .unwrap()
        .message
        .unwrap()
}

fn typed(agent: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: agent.into(),
        ..fg(MODEL, prompt)
    }
}

#[tokio::test]
async fn past_the_grace_a_simulated_run_fails_turn_limit_keeping_its_output_and_can_be_continued() {
    let mut s = TestServer::start(CONFIG).await;
    let a = spawn(
        &mut s.client,
        typed(
            "simulated",
            "turn\noutput a\nturn\noutput b\nturn\noutput c\nturn\noutput never",
        ),
    )
    .await;
    assert_eq!(status(&a), pb::AgentStatus::Failed, "{a:?}");
    let error = a.error.as_ref().unwrap();
    assert_eq!(error.code, "TURN_LIMIT");
    assert!(
        error.message.contains("after 3 turns")
            && error.message.contains("[agents.simulated] max_turns = 2")
            && error.message.contains("grace_turns = 1"),
        "{}",
        error.message
    );
    assert_eq!(
        a.result, "a\nb\nwrap-up: Please finish.\nc",
        "the output so far, the wrap-up as the third turn's input"
    );
    // The wrap-up is in the transcript, as what the run was told.
    let t = s
        .client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: a.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let kinds: Vec<(pb::TranscriptEntryKind, &str)> = t
        .entries
        .iter()
        .map(|e| (e.kind(), e.text.as_str()))
        .collect();
    assert_eq!(kinds[1], (pb::TranscriptEntryKind::Steer, "Please finish."));
    assert_eq!(kinds[2].0, pb::TranscriptEntryKind::Result);
    assert_eq!(t.entries[2].status(), pb::AgentStatus::Failed);

    // A TURN_LIMIT agent can be continued; the continuation counts anew.
    let next = spawn(
        &mut s.client,
        pb::SpawnRequest {
            continue_from: a.id.clone(),
            prompt: "turn\nturn\noutput done".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(status(&next), pb::AgentStatus::Done, "{next:?}");
    assert_eq!(next.result, "done");
    assert_eq!(next.turn, 2);
}

#[tokio::test]
async fn a_run_that_ends_within_its_grace_is_done_and_without_a_limit_turns_are_free() {
    let mut s = TestServer::start(CONFIG).await;
    let a = spawn(
        &mut s.client,
        typed("simulated", "turn\nturn\nturn\noutput finished"),
    )
    .await;
    assert_eq!(status(&a), pb::AgentStatus::Done, "{a:?}");
    assert_eq!(a.result, "wrap-up: Please finish.\nfinished");
    let b = spawn(&mut s.client, typed("unlimited", &"turn\n".repeat(50))).await;
    assert_eq!(status(&b), pb::AgentStatus::Done, "{b:?}");
}

#[tokio::test]
async fn a_worker_gets_the_wrap_up_as_a_steer_and_a_cancel_past_the_grace() {
    let mut s = TestServer::start(CONFIG).await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(pb::ConnectRequest {
        message: Some(connect_request::Message::Hello(pb::WorkerHello {
            name: "w".into(),
            agents: vec!["coder".into()],
            capacity: 1,
            ..Default::default()
        })),
    })
    .unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.handle.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut down = WorkerServiceClient::new(channel)
        .connect(UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        next(&mut down).await,
        connect_response::Message::Welcome(_)
    ));
    let a = spawn(
        &mut s.client,
        pb::SpawnRequest {
            agent: "coder".into(),
            ..bg(MODEL, "work")
        },
    )
    .await;
    assert!(matches!(
        next(&mut down).await,
        connect_response::Message::Assign(_)
    ));
    let send = |event: run_event::Event| {
        tx.send(pb::ConnectRequest {
            message: Some(connect_request::Message::Event(pb::RunEvent {
                agent_id: a.id.clone(),
                event: Some(event),
                ..Default::default()
            })),
        })
        .unwrap();
    };
    let turn = || run_event::Event::TurnStarted(pb::TurnStarted {});
    send(turn());
    send(run_event::Event::Output("one ".into()));
    // Turn max_turns starts: the wrap-up goes out as a steer, the next
    // turn's input.
    send(turn());
    let connect_response::Message::Steer(steer) = next(&mut down).await else {
        panic!("expected the wrap-up steer");
    };
    assert_eq!(steer.agent_id, a.id);
    assert_eq!(steer.message, subagentd::config::DEFAULT_WRAP_UP_MESSAGE);
    send(run_event::Event::Output("two".into()));
    send(turn());
    send(turn());
    // Turn 5 > max_turns + grace_turns = 4: stopped.
    send(turn());
    let connect_response::Message::Cancel(cancel) = next(&mut down).await else {
        panic!("expected the cancel");
    };
    assert_eq!(cancel.agent_id, a.id);
    let ended = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&ended), pb::AgentStatus::Failed, "{ended:?}");
    assert_eq!(ended.error.as_ref().unwrap().code, "TURN_LIMIT");
    assert_eq!(ended.result, "one two");
}
