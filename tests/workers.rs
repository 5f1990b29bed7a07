//! WorkerService over real gRPC: registration, capacity as an admission
//! limit, run events, cancel, steer, approvals and lost workers.

mod common;

use std::time::Duration;

use common::*;
use subagentd::pb::{
    self, connect_request, connect_response, run_event, worker_service_client::WorkerServiceClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{transport::Channel, Code, Streaming};

const CONFIG: &str = r#"
[limits]
max_background_agents = 20
default_concurrency = 0
max_concurrent_per_parent = 0

[agents.coder]
runner = "worker"

[agents.reviewer]
runner = "worker"
retry_on_worker_lost = 1

[agents.simulated]
runner = "simulated"
"#;

/// A worker connected over its own gRPC stream.
struct Worker {
    id: String,
    tx: mpsc::UnboundedSender<pb::ConnectRequest>,
    rx: Streaming<pb::ConnectResponse>,
}

async fn worker_client(addr: std::net::SocketAddr) -> WorkerServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("worker connects");
    WorkerServiceClient::new(channel)
}

fn hello(name: &str, agents: &[&str], capacity: u32) -> pb::ConnectRequest {
    pb::ConnectRequest {
        message: Some(connect_request::Message::Hello(pb::WorkerHello {
            name: name.into(),
            agents: agents.iter().map(|a| (*a).into()).collect(),
            capacity,
            labels: Default::default(),
        })),
    }
}

/// Opens a session with `first` as the first message; the raw result.
async fn open(
    addr: std::net::SocketAddr,
    first: pb::ConnectRequest,
) -> Result<
    (
        mpsc::UnboundedSender<pb::ConnectRequest>,
        Streaming<pb::ConnectResponse>,
    ),
    tonic::Status,
> {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(first).unwrap();
    let mut client = worker_client(addr).await;
    let stream = client
        .connect(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, stream))
}

impl Worker {
    async fn connect(addr: std::net::SocketAddr, agents: &[&str], capacity: u32) -> Self {
        let (tx, mut rx) = open(addr, hello("test-worker", agents, capacity))
            .await
            .expect("session opens");
        let first = next(&mut rx).await;
        let Some(connect_response::Message::Welcome(w)) = first.message else {
            panic!("expected welcome, got {first:?}");
        };
        assert!(uuid::Uuid::parse_str(&w.worker_id).is_ok());
        Self {
            id: w.worker_id,
            tx,
            rx,
        }
    }

    async fn next(&mut self) -> connect_response::Message {
        next(&mut self.rx).await.message.expect("message set")
    }

    async fn assignment(&mut self) -> pb::RunAssignment {
        match self.next().await {
            connect_response::Message::Assign(a) => a,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    fn send(&self, agent_id: &str, event: run_event::Event) {
        self.tx
            .send(pb::ConnectRequest {
                message: Some(connect_request::Message::Event(pb::RunEvent {
                    agent_id: agent_id.into(),
                    event: Some(event),
                })),
            })
            .expect("session open");
    }

    fn done(&self, agent_id: &str, result: &str) {
        self.send(
            agent_id,
            run_event::Event::Done(pb::RunDone {
                result: result.into(),
            }),
        );
    }
}

async fn next(rx: &mut Streaming<pb::ConnectResponse>) -> pb::ConnectResponse {
    tokio::time::timeout(Duration::from_secs(10), rx.message())
        .await
        .expect("a message within 10 s")
        .expect("stream ok")
        .expect("stream open")
}

fn worker_bg(agent: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: agent.into(),
        ..bg("acme/m1", prompt)
    }
}

#[tokio::test]
async fn a_worker_runs_an_agent_to_done() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 2).await;
    let a = spawn(&mut s.client, worker_bg("coder", "write it")).await;
    let assigned = w.assignment().await;
    let agent = assigned.agent.expect("agent");
    assert_eq!(agent.id, a.id);
    assert_eq!(agent.worker_id, w.id);
    assert_eq!(agent.attempt, 1);
    assert_eq!(assigned.prompt, "write it");
    assert!(assigned.deadline.is_some());
    w.send(&a.id, run_event::Event::Output("part one".into()));
    w.done(&a.id, "all done");
    let done = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&done[0]), pb::AgentStatus::Done);
    assert_eq!(done[0].result, "all done");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_first_message_other_than_hello_or_a_hello_without_types_is_invalid() {
    let s = TestServer::start(CONFIG).await;
    let event = pb::ConnectRequest {
        message: Some(connect_request::Message::Event(pb::RunEvent::default())),
    };
    for (first, field) in [
        (event, "hello"),
        (hello("w", &[], 1), "hello.agents"),
        (hello("w", &["coder"], 0), "hello.capacity"),
        (hello("w", &["nope"], 1), "hello.agents[0]"),
        (hello("w", &["simulated"], 1), "hello.agents[0]"),
    ] {
        let status = match open(s.handle.addr(), first).await {
            Err(status) => status,
            Ok((_tx, mut rx)) => rx.message().await.expect_err("the stream fails"),
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(violated_fields(&status), [field], "{status:?}");
    }
    s.handle.shutdown().await.unwrap();
}
