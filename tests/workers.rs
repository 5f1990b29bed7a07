//! WorkerService over real gRPC: registration, capacity as an admission
//! limit, run events, cancel, steer, approvals and lost workers. Each test
//! starts its own server; state is awaited through worker stream messages,
//! WatchAgents events or Await, never by sleeping.

mod common;

use std::time::Duration;

use common::*;
use subagentd::pb::{
    self, agent_service_client::AgentServiceClient, connect_request, connect_response, run_event,
    worker_service_client::WorkerServiceClient, AgentEventKind as Kind,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{transport::Channel, Code, Streaming};

type Client = AgentServiceClient<Channel>;

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
    /// `released` messages seen while waiting for others (they follow
    /// every terminal event, interleaved with whatever comes next).
    released: Vec<pb::RunReleased>,
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
            ..Default::default()
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
        Self::connect_named(addr, "test-worker", agents, capacity).await
    }

    async fn connect_named(
        addr: std::net::SocketAddr,
        name: &str,
        agents: &[&str],
        capacity: u32,
    ) -> Self {
        let (tx, mut rx) = open(addr, hello(name, agents, capacity))
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
            released: Vec::new(),
        }
    }

    /// The next message other than `released` (those are kept).
    async fn next(&mut self) -> connect_response::Message {
        loop {
            match next(&mut self.rx).await.message.expect("message set") {
                connect_response::Message::Released(r) => self.released.push(r),
                other => return other,
            }
        }
    }

    /// The `released` for `agent_id`: one seen already, or the next one.
    async fn released(&mut self, agent_id: &str) -> pb::RunReleased {
        loop {
            if let Some(at) = self.released.iter().position(|r| r.agent_id == agent_id) {
                return self.released.remove(at);
            }
            match next(&mut self.rx).await.message.expect("message set") {
                connect_response::Message::Released(r) => self.released.push(r),
                other => panic!("expected released for {agent_id}, got {other:?}"),
            }
        }
    }

    async fn assignment(&mut self) -> pb::RunAssignment {
        match self.next().await {
            connect_response::Message::Assign(a) => a,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    /// The next message, which must be a `cancel`.
    async fn cancel(&mut self) -> pb::CancelRun {
        match self.next().await {
            connect_response::Message::Cancel(c) => c,
            other => panic!("expected a cancel, got {other:?}"),
        }
    }

    /// The next message, which must be a `steer`.
    async fn steer(&mut self) -> pb::SteerRun {
        match self.next().await {
            connect_response::Message::Steer(m) => m,
            other => panic!("expected a steer, got {other:?}"),
        }
    }

    /// The next message, which must be an `approval`.
    async fn approval(&mut self) -> pb::ApprovalOutcome {
        match self.next().await {
            connect_response::Message::Approval(o) => o,
            other => panic!("expected an approval, got {other:?}"),
        }
    }

    /// Simulates the worker process dying: both halves of its stream go.
    fn die(self) {
        drop(self);
    }

    /// Sends a raw message (not necessarily a well-formed event).
    fn send_raw(&self, message: connect_request::Message) {
        self.tx
            .send(pb::ConnectRequest {
                message: Some(message),
            })
            .expect("session open");
    }

    fn send(&self, agent_id: &str, event: run_event::Event) {
        self.tx
            .send(pb::ConnectRequest {
                message: Some(connect_request::Message::Event(pb::RunEvent {
                    agent_id: agent_id.into(),
                    event: Some(event),
                    seq: 0,
                    attempt: 0,
                })),
            })
            .expect("session open");
    }

    fn done(&self, agent_id: &str, result: &str) {
        self.send(
            agent_id,
            run_event::Event::Done(pb::RunDone {
                result: result.into(),
                ..Default::default()
            }),
        );
    }
    /// Reports the run failed (terminal).
    fn failed(&self, agent_id: &str, code: &str, message: &str) {
        self.send(
            agent_id,
            run_event::Event::Failed(pb::RunFailed {
                code: code.into(),
                message: message.into(),
                ..Default::default()
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

/// A background spawn of a worker type whose assignment `w` must receive:
/// returns the agent (as Spawn returned it) and the assignment.
async fn spawn_assigned(
    s: &mut TestServer,
    w: &mut Worker,
    req: pb::SpawnRequest,
) -> (pb::Agent, pb::RunAssignment) {
    let a = spawn(&mut s.client, req).await;
    assert_eq!(status(&a), pb::AgentStatus::Running, "{a:?}");
    assert_eq!(a.worker_id, w.id, "{a:?}");
    let assigned = w.assignment().await;
    assert_eq!(assigned.agent.as_ref().expect("agent").id, a.id);
    (a, assigned)
}

/// The Approve RPC, panicking on error; the agent after the decision.
async fn approve_rpc(
    client: &mut Client,
    id: &str,
    approval_id: &str,
    decision: pb::ApprovalDecision,
    note: &str,
) -> pb::Agent {
    client
        .approve(pb::ApproveRequest {
            id: id.into(),
            approval_id: approval_id.into(),
            decision: decision as i32,
            note: note.into(),
        })
        .await
        .expect("approve succeeds")
        .into_inner()
        .agent
        .expect("agent set")
}

fn millis(ms: i32) -> prost_types::Duration {
    prost_types::Duration {
        seconds: 0,
        nanos: ms * 1_000_000,
    }
}

/// An ended agent's error code and message.
fn error_of(a: &pb::Agent) -> (&str, &str) {
    let e = a.error.as_ref().expect("error set");
    (&e.code, &e.message)
}

/// `id`'s events from the watch stream up to and including its terminal
/// one; panics if that takes more than 10 s.
async fn events_until_terminal(
    stream: &mut tonic::Streaming<pb::WatchAgentsResponse>,
    id: &str,
) -> Vec<pb::WatchAgentsResponse> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ev = stream
                .message()
                .await
                .expect("stream ok")
                .expect("stream open");
            if ev.agent.as_ref().map(|a| a.id.as_str()) != Some(id) {
                continue;
            }
            let terminal = matches!(
                Kind::try_from(ev.kind).unwrap(),
                Kind::Done | Kind::Failed | Kind::Cancelled
            );
            out.push(ev);
            if terminal {
                return;
            }
        }
    })
    .await
    .expect("the agent ends within 10 s");
    out
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
    // The terminal event is answered once it is durable: the worker may
    // forget the run.
    let released = w.released(&a.id).await;
    assert_eq!(released.attempt, 1);
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

const CAP_ONE: &str = r#"
[limits]
max_background_agents = 1
default_concurrency = 0
max_concurrent_per_parent = 0

[agents.coder]
runner = "worker"

[agents.simulated]
runner = "simulated"
"#;

const GRACE: &str = r#"
[limits]
max_background_agents = 20
default_concurrency = 0
max_concurrent_per_parent = 0

[runs]
cancel_grace = "300ms"

[agents.coder]
runner = "worker"

[agents.simulated]
runner = "simulated"
"#;

#[tokio::test]
async fn a_worker_gets_no_more_runs_than_its_capacity() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 2).await;
    let a = spawn(&mut s.client, worker_bg("coder", "a")).await;
    let b = spawn(&mut s.client, worker_bg("coder", "b")).await;
    let c = spawn(&mut s.client, worker_bg("coder", "c")).await;
    for expected in [&a, &b] {
        let assigned = w.assignment().await;
        assert_eq!(assigned.agent.expect("agent").id, expected.id);
    }
    for queued in [c.clone(), status_of(&mut s.client, &c.id).await] {
        assert_eq!(status(&queued), pb::AgentStatus::Queued, "{queued:?}");
        assert_eq!(queued.worker_id, "");
        let reason = &queued.queue_reason;
        assert!(
            reason.contains("\"coder\"") && reason.contains("busy") && reason.contains("2/2"),
            "{reason}"
        );
    }
    w.done(&a.id, "a done");
    // The next message is c's assignment: nothing else was sent meanwhile.
    let third = w.assignment().await;
    assert_eq!(third.agent.expect("agent").id, c.id);
    let c_now = status_of(&mut s.client, &c.id).await;
    assert_eq!(status(&c_now), pb::AgentStatus::Running);
    assert_eq!(c_now.worker_id, w.id);
    assert_eq!(c_now.queue_reason, "");
    let a_now = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&a_now), pb::AgentStatus::Done);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn runs_go_to_the_worker_with_the_most_free_capacity() {
    let mut s = TestServer::start(CONFIG).await;
    let addr = s.handle.addr();
    let mut small = Worker::connect_named(addr, "small", &["coder"], 1).await;
    let mut big = Worker::connect_named(addr, "big", &["coder"], 3).await;
    // big: 3 free, small: 1 free.
    spawn_assigned(&mut s, &mut big, worker_bg("coder", "r1")).await;
    // big: 2 free, small: 1 free.
    spawn_assigned(&mut s, &mut big, worker_bg("coder", "r2")).await;
    // 1 free each: either will do.
    let r3 = spawn(&mut s.client, worker_bg("coder", "r3")).await;
    let on_small = if r3.worker_id == small.id {
        assert_eq!(small.assignment().await.agent.unwrap().id, r3.id);
        true
    } else {
        assert_eq!(r3.worker_id, big.id, "{r3:?}");
        assert_eq!(big.assignment().await.agent.unwrap().id, r3.id);
        false
    };
    if on_small {
        // small is full, big has the only free slot.
        spawn_assigned(&mut s, &mut big, worker_bg("coder", "r4")).await;
        let r5 = spawn(&mut s.client, worker_bg("coder", "r5")).await;
        assert_eq!(status(&r5), pb::AgentStatus::Queued, "both are full");
        // big holds 3 (0 free), small frees its slot: r5 goes to small.
        small.done(&r3.id, "r3");
        assert_eq!(small.assignment().await.agent.unwrap().id, r5.id);
        let r5_now = status_of(&mut s.client, &r5.id).await;
        assert_eq!(r5_now.worker_id, small.id);
    } else {
        // big holds 3 (0 free), small 1 free.
        spawn_assigned(&mut s, &mut small, worker_bg("coder", "r4")).await;
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_a_worker_an_agent_waits_and_does_not_block_other_agents() {
    let mut s = TestServer::start(CONFIG).await;
    let a = spawn(&mut s.client, worker_bg("coder", "queued work")).await;
    let expected_reason = "no worker connected for agent type \"coder\"";
    assert_eq!(status(&a), pb::AgentStatus::Queued);
    assert_eq!(a.queue_reason, expected_reason);
    assert_eq!((a.worker_id.as_str(), a.attempt), ("", 0));
    // Same bucket, spawned later: runs at once.
    let sim = spawn(&mut s.client, bg("acme/m1", "hello")).await;
    let sim = await_all(&mut s.client, &[&sim.id]).await.remove(0);
    assert_eq!(status(&sim), pb::AgentStatus::Done);
    assert_eq!(sim.result, "hello");
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&a_now), pb::AgentStatus::Queued);
    assert_eq!(a_now.queue_reason, expected_reason);

    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let assigned = w.assignment().await;
    let agent = assigned.agent.expect("agent");
    assert_eq!(agent.id, a.id);
    assert_eq!(status(&agent), pb::AgentStatus::Running);
    assert_eq!(
        (agent.worker_id.as_str(), agent.attempt),
        (w.id.as_str(), 1)
    );
    assert_eq!(assigned.prompt, "queued work");
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&a_now), pb::AgentStatus::Running);
    assert_eq!(a_now.worker_id, w.id);
    assert_eq!(a_now.queue_reason, "");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_worker_fails_its_run_with_worker_lost_and_frees_the_slot() {
    let mut s = TestServer::start(CAP_ONE).await;
    let mut w = Worker::connect_named(s.handle.addr(), "box-17", &["coder"], 1).await;
    let worker_id = w.id.clone();
    let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "work")).await;
    let refused = s
        .client
        .spawn(bg("acme/m1", "too many"))
        .await
        .expect_err("the global limit is full");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");

    w.die();
    let a_now = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&a_now), pb::AgentStatus::Failed);
    let (code, message) = error_of(&a_now);
    assert_eq!(code, "WORKER_LOST");
    assert!(
        message.contains("box-17") && message.contains(&worker_id),
        "{message}"
    );
    assert_eq!(a_now.worker_id, "", "no worker holds an ended run");

    let next = spawn(&mut s.client, bg("acme/m1", "after")).await;
    let next = await_all(&mut s.client, &[&next.id]).await.remove(0);
    assert_eq!(status(&next), pb::AgentStatus::Done);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_worker_s_run_is_retried_once_when_its_type_allows_it() {
    let mut s = TestServer::start(CONFIG).await;
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;
    let addr = s.handle.addr();
    let mut first = Worker::connect_named(addr, "first", &["reviewer"], 1).await;
    let (a, assigned) =
        spawn_assigned(&mut s, &mut first, worker_bg("reviewer", "review it")).await;
    assert_eq!(assigned.agent.unwrap().attempt, 1);

    first.die();
    let retrying = wait_for_event(&mut events, &a.id, Kind::Retrying).await;
    let agent = retrying.agent.expect("agent");
    assert_eq!(status(&agent), pb::AgentStatus::Queued);
    // The next attempt counts from the RETRYING event: 2, after the
    // ended one, not started yet.
    assert_eq!((agent.worker_id.as_str(), agent.attempt), ("", 2));
    assert_eq!(agent.attempts.len(), 2, "{agent:?}");
    assert!(agent.attempts[0].error.is_some() && agent.attempts[1].started_at.is_none());
    assert_eq!(
        agent.queue_reason,
        "no worker connected for agent type \"reviewer\""
    );
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&a_now), pb::AgentStatus::Queued);
    assert_eq!(a_now.attempt, 2);

    let mut second = Worker::connect_named(addr, "second", &["reviewer"], 1).await;
    let assigned = second.assignment().await;
    let agent = assigned.agent.expect("agent");
    assert_eq!(agent.id, a.id);
    assert_eq!(
        (agent.worker_id.as_str(), agent.attempt),
        (second.id.as_str(), 2)
    );

    let second_id = second.id.clone();
    second.die();
    let a_now = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&a_now), pb::AgentStatus::Failed);
    assert_eq!(a_now.attempt, 2);
    let (code, message) = error_of(&a_now);
    assert_eq!(code, "WORKER_LOST");
    assert!(
        message.contains("second") && message.contains(&second_id),
        "{message}"
    );
    let rest = events_until_terminal(&mut events, &a.id).await;
    let kinds: Vec<Kind> = rest
        .iter()
        .map(|e| Kind::try_from(e.kind).unwrap())
        .collect();
    assert_eq!(kinds, [Kind::Started, Kind::Failed], "no second retry");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_retried_run_is_assigned_again_with_its_prompt_and_waiting_steers() {
    let mut s = TestServer::start(CONFIG).await;
    let addr = s.handle.addr();
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;
    let mut first = Worker::connect_named(addr, "first", &["reviewer"], 1).await;
    let (a, assigned) =
        spawn_assigned(&mut s, &mut first, worker_bg("reviewer", "review it")).await;
    assert_eq!(assigned.prompt, "review it");
    first.die();
    wait_for_event(&mut events, &a.id, Kind::Retrying).await;
    let resp = steer(&mut s.client, &a.id, "while queued").await;
    assert_eq!(resp.delivery, pb::SteerDelivery::Buffered as i32);

    let mut second = Worker::connect_named(addr, "second", &["reviewer"], 1).await;
    let assigned = second.assignment().await;
    assert_eq!(assigned.agent.expect("agent").attempt, 2);
    assert_eq!(assigned.steer_messages, ["while queued"]);
    assert_eq!(
        assigned.prompt, "review it",
        "the second attempt must run the agent's prompt"
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_cancel_reaches_the_worker_which_keeps_the_capacity_until_it_confirms() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "first")).await;
    let b = spawn(&mut s.client, worker_bg("coder", "second")).await;
    assert_eq!(status(&b), pb::AgentStatus::Queued);

    let cancelled = cancel(&mut s.client, &a.id).await;
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0].id, a.id);
    assert_eq!(status(&cancelled[0]), pb::AgentStatus::Cancelled);
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&a_now), pb::AgentStatus::Cancelled);
    let (code, message) = error_of(&a_now);
    assert_eq!(code, "CANCELLED");

    let stop = w.cancel().await;
    assert_eq!(stop.agent_id, a.id);
    assert!(!stop.reason.is_empty());
    assert_eq!(stop.reason, message);
    // The cancelled run still holds the worker's only slot.
    let b_now = status_of(&mut s.client, &b.id).await;
    assert_eq!(status(&b_now), pb::AgentStatus::Queued, "{b_now:?}");
    assert!(
        b_now.queue_reason.contains("busy"),
        "{}",
        b_now.queue_reason
    );

    w.done(&a.id, "the worker's result");
    let assigned = w.assignment().await;
    assert_eq!(assigned.agent.unwrap().id, b.id);
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&a_now), pb::AgentStatus::Cancelled);
    assert_ne!(a_now.result, "the worker's result");
    assert_eq!(error_of(&a_now).0, "CANCELLED");
    assert_eq!(a_now.worker_id, "", "no worker holds an ended run");
    w.done(&b.id, "b");
    let b_now = await_all(&mut s.client, &[&b.id]).await.remove(0);
    assert_eq!(
        (status(&b_now), b_now.result.as_str()),
        (pb::AgentStatus::Done, "b")
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unconfirmed_cancel_frees_the_capacity_after_the_cancel_grace() {
    let mut s = TestServer::start(GRACE).await;
    let mut progress = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            include_progress: true,
            ..Default::default()
        },
    )
    .await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "first")).await;
    let b = spawn(&mut s.client, worker_bg("coder", "second")).await;
    assert_eq!(status(&b), pb::AgentStatus::Queued);
    cancel(&mut s.client, &a.id).await;
    assert_eq!(w.cancel().await.agent_id, a.id);

    let assigned = tokio::time::timeout(Duration::from_secs(5), w.assignment())
        .await
        .expect("the grace frees the slot");
    assert_eq!(assigned.agent.unwrap().id, b.id);
    let b_now = status_of(&mut s.client, &b.id).await;
    assert_eq!(status(&b_now), pb::AgentStatus::Running);
    assert_eq!(b_now.worker_id, w.id);

    // A confirmation after the grace does not free the slot a second time.
    w.done(&a.id, "late");
    w.send(&b.id, run_event::Event::Output("marker".into()));
    wait_for(&mut progress, |ev| {
        ev.kind == Kind::Output as i32 && ev.output == "marker"
    })
    .await;
    let c = spawn(&mut s.client, worker_bg("coder", "third")).await;
    assert_eq!(status(&c), pb::AgentStatus::Queued, "{c:?}");
    assert_eq!(
        status(&status_of(&mut s.client, &a.id).await),
        pb::AgentStatus::Cancelled
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn steer_messages_reach_the_worker_now_or_with_the_assignment() {
    let mut s = TestServer::start(CONFIG).await;
    let a = spawn(&mut s.client, worker_bg("coder", "steer me")).await;
    assert_eq!(status(&a), pb::AgentStatus::Queued);
    for message in ["first", "second"] {
        let resp = steer(&mut s.client, &a.id, message).await;
        assert_eq!(resp.delivery, pb::SteerDelivery::Buffered as i32);
        assert_eq!(
            status(resp.agent.as_ref().unwrap()),
            pb::AgentStatus::Queued
        );
    }

    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let assigned = w.assignment().await;
    assert_eq!(assigned.agent.unwrap().id, a.id);
    assert_eq!(assigned.steer_messages, ["first", "second"]);

    let resp = steer(&mut s.client, &a.id, "third").await;
    assert_eq!(resp.delivery, pb::SteerDelivery::Delivered as i32);
    let steer = w.steer().await;
    assert_eq!(
        (steer.agent_id.as_str(), steer.message.as_str()),
        (a.id.as_str(), "third")
    );
    w.done(&a.id, "steered");
    let a_now = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&a_now), pb::AgentStatus::Done);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_approval_request_from_a_worker_is_decided_and_the_decision_sent_back() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    for (decision, note, approved) in [
        (pb::ApprovalDecision::Approve, "ok", true),
        (pb::ApprovalDecision::Deny, "not that", false),
    ] {
        let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "careful")).await;
        w.send(
            &a.id,
            run_event::Event::ApprovalRequest(pb::ApprovalRequest {
                tool_name: "shell".into(),
                detail: "rm x".into(),
            }),
        );
        let paused = await_all(&mut s.client, &[&a.id]).await.remove(0);
        assert_eq!(status(&paused), pb::AgentStatus::AwaitingApproval);
        let approval = paused.approval.expect("approval pending");
        assert_eq!(
            (approval.tool_name.as_str(), approval.detail.as_str()),
            ("shell", "rm x")
        );
        assert!(uuid::Uuid::parse_str(&approval.id).is_ok());
        // Steered while paused: buffered, handed over after the decision.
        let resp = steer(&mut s.client, &a.id, "meanwhile").await;
        assert_eq!(resp.delivery, pb::SteerDelivery::Buffered as i32);

        let resumed = approve_rpc(&mut s.client, &a.id, &approval.id, decision, note).await;
        assert_eq!(status(&resumed), pb::AgentStatus::Running);
        assert!(resumed.approval.is_none());
        let outcome = w.approval().await;
        assert_eq!(outcome.agent_id, a.id);
        assert_eq!(outcome.approval_id, approval.id);
        assert_eq!((outcome.approved, outcome.note.as_str()), (approved, note));
        let steer = w.steer().await;
        assert_eq!(
            (steer.agent_id.as_str(), steer.message.as_str()),
            (a.id.as_str(), "meanwhile")
        );

        w.done(&a.id, note);
        let a_now = await_all(&mut s.client, &[&a.id]).await.remove(0);
        assert_eq!(
            (status(&a_now), a_now.result.as_str()),
            (pb::AgentStatus::Done, note)
        );
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn reports_about_runs_a_worker_does_not_hold_are_ignored() {
    let mut s = TestServer::start(CONFIG).await;
    let addr = s.handle.addr();
    let mut w = Worker::connect(addr, &["coder"], 2).await;
    let mut other = Worker::connect_named(addr, "other", &["reviewer"], 1).await;
    let sim = spawn(&mut s.client, bg("acme/m1", "simulated result")).await;
    let sim = await_all(&mut s.client, &[&sim.id]).await.remove(0);
    assert_eq!(status(&sim), pb::AgentStatus::Done);
    let (ended, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "ended")).await;
    w.done(&ended.id, "final");
    let ended = await_all(&mut s.client, &[&ended.id]).await.remove(0);
    assert_eq!(
        (status(&ended), ended.result.as_str()),
        (pb::AgentStatus::Done, "final")
    );
    let (live, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "live")).await;

    let junk = |w: &Worker, id: &str| {
        w.send(id, run_event::Event::Output("junk".into()));
        w.send(
            id,
            run_event::Event::ToolCall(pb::ToolCall {
                name: "junk".into(),
                input_digest: String::new(),
            }),
        );
        w.send(
            id,
            run_event::Event::Usage(pb::TokenUsage {
                input_tokens: 100,
                output_tokens: 100,
            }),
        );
        w.send(
            id,
            run_event::Event::ApprovalRequest(pb::ApprovalRequest {
                tool_name: "junk".into(),
                detail: String::new(),
            }),
        );
        w.failed(id, "JUNK", "junk");
        w.done(id, "hijacked");
    };
    let fresh = uuid::Uuid::now_v7().to_string();
    for id in [fresh.as_str(), &sim.id, "not-a-uuid", &ended.id] {
        junk(&w, id);
    }
    w.send_raw(connect_request::Message::Event(pb::RunEvent {
        agent_id: live.id.clone(),
        event: None,
        seq: 0,
        attempt: 0,
    }));
    w.send_raw(connect_request::Message::Hello(pb::WorkerHello {
        name: "again".into(),
        agents: vec!["coder".into()],
        capacity: 5,
        ..Default::default()
    }));
    // Another worker's reports about w's live run.
    let (review, _) = spawn_assigned(&mut s, &mut other, worker_bg("reviewer", "r")).await;
    junk(&other, &live.id);
    // Barriers: each session applies its reports in order.
    other.done(&review.id, "reviewed");
    w.done(&live.id, "live result");
    let got = await_all(&mut s.client, &[&review.id, &live.id, &sim.id, &ended.id]).await;
    assert_eq!(
        (status(&got[0]), got[0].result.as_str()),
        (pb::AgentStatus::Done, "reviewed")
    );
    for (agent, result) in got[1..]
        .iter()
        .zip(["live result", "simulated result", "final"])
    {
        assert_eq!(
            (status(agent), agent.result.as_str()),
            (pb::AgentStatus::Done, result)
        );
        assert!(agent.error.is_none(), "{agent:?}");
        assert_eq!(
            agent.usage.unwrap_or_default(),
            pb::Usage::default(),
            "{agent:?}"
        );
    }
    assert_eq!(got[2].finished_at, sim.finished_at);
    assert_eq!(got[3].finished_at, ended.finished_at);

    // The session still works, with its whole capacity (a second hello
    // changed nothing).
    let (x, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "x")).await;
    let (y, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "y")).await;
    let z = spawn(&mut s.client, worker_bg("coder", "z")).await;
    assert_eq!(status(&z), pb::AgentStatus::Queued, "{z:?}");
    assert!(z.queue_reason.contains("2/2"), "{}", z.queue_reason);
    w.done(&x.id, "x");
    w.done(&y.id, "y");
    assert_eq!(w.assignment().await.agent.unwrap().id, z.id);
    w.done(&z.id, "z");
    let all = await_all(&mut s.client, &[&x.id, &y.id, &z.id]).await;
    assert!(
        all.iter().all(|a| status(a) == pb::AgentStatus::Done),
        "{all:?}"
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn worker_progress_streams_to_watchers_and_usage_adds_up() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "talk")).await;
    let mut events = watch(
        &mut s.client,
        pb::WatchAgentsRequest {
            ids: vec![a.id.clone()],
            include_progress: true,
            ..Default::default()
        },
    )
    .await;
    let tool = |name: &str, digest: &str| {
        run_event::Event::ToolCall(pb::ToolCall {
            name: name.into(),
            input_digest: digest.into(),
        })
    };
    let usage = |input_tokens, output_tokens| {
        run_event::Event::Usage(pb::TokenUsage {
            input_tokens,
            output_tokens,
        })
    };
    w.send(&a.id, run_event::Event::Output("chunk one, ".into()));
    w.send(&a.id, tool("grep", "sha256:abc"));
    w.send(&a.id, usage(10, 5));
    w.send(&a.id, usage(1, 2));
    w.send(&a.id, run_event::Event::Output("chunk two".into()));
    w.send(&a.id, tool("ls", ""));

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let ev = wait_for(&mut events, |_| true).await;
        seen.push(ev);
    }
    let kinds: Vec<Kind> = seen
        .iter()
        .map(|e| Kind::try_from(e.kind).unwrap())
        .collect();
    assert_eq!(
        kinds,
        [Kind::Output, Kind::ToolCall, Kind::Output, Kind::ToolCall]
    );
    assert_eq!(
        (seen[0].output.as_str(), seen[2].output.as_str()),
        ("chunk one, ", "chunk two")
    );
    for ev in &seen {
        assert_eq!(ev.agent.as_ref().unwrap().id, a.id);
    }
    let calls: Vec<(String, String)> = [&seen[1], &seen[3]]
        .iter()
        .map(|e| {
            let c = e.tool_call.clone().expect("tool call set");
            (c.name, c.input_digest)
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("grep".to_owned(), "sha256:abc".to_owned()),
            ("ls".to_owned(), String::new())
        ]
    );
    let expected = pb::Usage {
        input_tokens: 11,
        output_tokens: 7,
        tool_calls: 2,
    };
    let running = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&running), pb::AgentStatus::Running);
    assert_eq!(running.result, "chunk one, chunk two");
    assert_eq!(running.usage, Some(expected));

    w.done(&a.id, "final");
    let done = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(
        (status(&done), done.result.as_str()),
        (pb::AgentStatus::Done, "final")
    );
    assert_eq!(done.usage, Some(expected));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_worker_run_spawns_children_that_are_cancelled_with_it() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "lead")).await;
    assert_eq!(a.depth, 1);
    let child = spawn(
        &mut s.client,
        pb::SpawnRequest {
            parent_id: a.id.clone(),
            ..bg("acme/m1", "wait_steer")
        },
    )
    .await;
    assert_eq!(status(&child), pb::AgentStatus::Running);
    assert_eq!(
        (
            child.depth,
            child.root_id.as_str(),
            child.parent_id.as_str()
        ),
        (2, a.id.as_str(), a.id.as_str())
    );

    let cancelled = cancel(&mut s.client, &a.id).await;
    let mut ids: Vec<&str> = cancelled.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = vec![a.id.as_str(), child.id.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    let child_now = status_of(&mut s.client, &child.id).await;
    assert_eq!(status(&child_now), pb::AgentStatus::Cancelled);
    assert!(error_of(&child_now).1.contains(&a.id), "{child_now:?}");
    assert_eq!(w.cancel().await.agent_id, a.id);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_foreground_spawn_of_a_worker_type_returns_when_the_worker_is_done() {
    let s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let mut client = s.new_client().await;
    let call = tokio::spawn(async move {
        client
            .spawn(pb::SpawnRequest {
                agent: "coder".into(),
                ..fg("acme/m1", "in the foreground")
            })
            .await
    });
    let assigned = w.assignment().await;
    let agent = assigned.agent.expect("agent");
    assert!(!agent.background);
    assert_eq!(assigned.prompt, "in the foreground");
    assert!(!call.is_finished(), "the spawn waits for the run");
    w.send(&agent.id, run_event::Event::Output("working".into()));
    w.done(&agent.id, "fg result");
    let done = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("spawn returns")
        .unwrap()
        .expect("spawn succeeds")
        .into_inner()
        .agent
        .expect("agent");
    assert_eq!(done.id, agent.id);
    assert_eq!(
        (status(&done), done.result.as_str()),
        (pb::AgentStatus::Done, "fg result")
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failed_report_fails_the_agent_with_its_code_or_run_failed() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 2).await;
    let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "a")).await;
    let (b, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "b")).await;
    w.send(&a.id, run_event::Event::Output("partial".into()));
    w.failed(&a.id, "TOOL_ERROR", "boom");
    w.failed(&b.id, "", "no code given");
    let got = await_all(&mut s.client, &[&a.id, &b.id]).await;
    assert_eq!(status(&got[0]), pb::AgentStatus::Failed);
    assert_eq!(error_of(&got[0]), ("TOOL_ERROR", "boom"));
    assert_eq!(got[0].result, "partial", "a failed run keeps its output");
    assert_eq!(status(&got[1]), pb::AgentStatus::Failed);
    assert_eq!(error_of(&got[1]), ("RUN_FAILED", "no code given"));
    assert!(
        got.iter().all(|a| a.worker_id.is_empty()),
        "no worker holds an ended run: {got:?}"
    );
    // Both slots are free again.
    spawn_assigned(&mut s, &mut w, worker_bg("coder", "c")).await;
    spawn_assigned(&mut s, &mut w, worker_bg("coder", "d")).await;
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_worker_run_past_its_deadline_fails_and_the_worker_is_told_to_stop() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let (a, assigned) = spawn_assigned(
        &mut s,
        &mut w,
        pb::SpawnRequest {
            timeout: Some(millis(300)),
            ..worker_bg("coder", "slow")
        },
    )
    .await;
    let deadline = assigned.deadline.expect("deadline");
    let started = a.started_at.expect("started");
    let gap_ms = (deadline.seconds - started.seconds) * 1000
        + i64::from(deadline.nanos - started.nanos) / 1_000_000;
    assert!(
        (250..=1300).contains(&gap_ms),
        "deadline {gap_ms} ms after start"
    );

    let a_now = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&a_now), pb::AgentStatus::Failed);
    let (code, message) = error_of(&a_now);
    assert_eq!(code, "DEADLINE_EXCEEDED");
    let stop = w.cancel().await;
    assert_eq!(stop.agent_id, a.id);
    assert_eq!(stop.reason, message);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn at_shutdown_a_worker_is_told_to_stop_its_runs_and_its_stream_ends() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 1).await;
    let (a, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "long")).await;
    let shutdown = tokio::spawn(s.handle.shutdown());
    let stop = w.cancel().await;
    assert_eq!(stop.agent_id, a.id);
    assert!(stop.reason.contains("shutting down"), "{}", stop.reason);
    let end = tokio::time::timeout(Duration::from_secs(10), w.rx.message())
        .await
        .expect("the stream ends instead of hanging");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    tokio::time::timeout(Duration::from_secs(15), shutdown)
        .await
        .expect("shutdown finishes")
        .unwrap()
        .unwrap();
}

/// One running agent at a time on model `acme/one`.
const ONE_ON_ACME_ONE: &str = r#"
[limits]
max_background_agents = 20
default_concurrency = 0
max_concurrent_per_parent = 0

[limits.model_concurrency]
"acme/one" = 1

[agents.coder]
runner = "worker"

[agents.reviewer]
runner = "worker"
retry_on_worker_lost = 1

[agents.simulated]
runner = "simulated"
"#;

/// Spawns a worker run on `acme/one`, has it ask for approval, fills the
/// bucket with a simulated agent waiting for a steer, and approves: the
/// worker run is back in the queue behind the bucket limit while its worker
/// still holds it. Returns the worker run and the simulated agent.
async fn queued_after_approval(
    s: &mut TestServer,
    w: &mut Worker,
    agent_type: &str,
) -> (pb::Agent, pb::Agent) {
    let (a, _) = spawn_assigned(
        s,
        w,
        pb::SpawnRequest {
            agent: agent_type.into(),
            ..bg("acme/one", "needs approval")
        },
    )
    .await;
    w.send(
        &a.id,
        run_event::Event::ApprovalRequest(pb::ApprovalRequest {
            tool_name: "shell".into(),
            detail: "rm x".into(),
        }),
    );
    let paused = await_all(&mut s.client, &[&a.id]).await.remove(0);
    assert_eq!(status(&paused), pb::AgentStatus::AwaitingApproval);
    let blocker = spawn(&mut s.client, bg("acme/one", "wait_steer")).await;
    assert_eq!(status(&blocker), pb::AgentStatus::Running);
    let approval = paused.approval.expect("approval").id;
    let resumed = approve_rpc(
        &mut s.client,
        &a.id,
        &approval,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    assert_eq!(status(&resumed), pb::AgentStatus::Queued, "{resumed:?}");
    assert!(
        resumed.queue_reason.contains("acme/one"),
        "{}",
        resumed.queue_reason
    );
    (a, blocker)
}

#[tokio::test]
async fn a_run_queued_after_its_approval_is_retried_when_its_worker_is_lost() {
    let mut s = TestServer::start(ONE_ON_ACME_ONE).await;
    let addr = s.handle.addr();
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;
    let mut w = Worker::connect_named(addr, "first", &["reviewer", "coder"], 2).await;
    let (a, blocker) = queued_after_approval(&mut s, &mut w, "reviewer").await;
    // A second run on the same worker, spawned later, that is not retried:
    // once it has failed, the whole loss has been applied.
    let (c, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "other")).await;
    w.die();
    let c_now = await_all(&mut s.client, &[&c.id]).await.remove(0);
    assert_eq!(error_of(&c_now).0, "WORKER_LOST");
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&a_now), pb::AgentStatus::Queued, "{a_now:?}");
    assert_eq!((a_now.worker_id.as_str(), a_now.attempt), ("", 2));

    // The bucket frees and a worker connects: the run gets its second attempt.
    steer(&mut s.client, &blocker.id, "go").await;
    let blocker = await_all(&mut s.client, &[&blocker.id]).await.remove(0);
    assert_eq!(status(&blocker), pb::AgentStatus::Done);
    let mut second = Worker::connect_named(addr, "second", &["reviewer"], 1).await;
    let assigned = tokio::time::timeout(Duration::from_secs(5), second.assignment())
        .await
        .expect("the retried run is assigned to the new worker");
    let agent = assigned.agent.expect("agent");
    assert_eq!((agent.id.as_str(), agent.attempt), (a.id.as_str(), 2));

    // The loss was announced as a retry (events up to the second start).
    let mut kinds = Vec::new();
    loop {
        let ev = wait_for(&mut events, |ev| {
            ev.agent.as_ref().is_some_and(|x| x.id == a.id)
        })
        .await;
        let kind = Kind::try_from(ev.kind).unwrap();
        kinds.push(kind);
        if kind == Kind::Started && ev.agent.unwrap().attempt == 2 {
            break;
        }
    }
    assert_eq!(
        kinds,
        [
            Kind::Started,
            Kind::AwaitingApproval,
            Kind::Queued,
            Kind::Retrying,
            Kind::Started
        ]
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_done_report_while_the_run_is_queued_after_its_approval_finishes_it() {
    let mut s = TestServer::start(ONE_ON_ACME_ONE).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 2).await;
    let (a, blocker) = queued_after_approval(&mut s, &mut w, "coder").await;
    let (c, _) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "other")).await;
    // The worker gives up waiting for the decision and reports a result.
    w.done(&a.id, "gave up");
    w.done(&c.id, "c");
    let c_now = await_all(&mut s.client, &[&c.id]).await.remove(0);
    assert_eq!(status(&c_now), pb::AgentStatus::Done);
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(
        (status(&a_now), a_now.result.as_str()),
        (pb::AgentStatus::Done, "gave up"),
        "{a_now:?}"
    );
    steer(&mut s.client, &blocker.id, "go").await;
    s.handle.shutdown().await.unwrap();
}

/// The Spawn call's W3C trace context reaches the worker, so the worker's
/// spans join the caller's trace; a malformed one is ignored, not refused,
/// and the run starts a trace of its own (as without one).
#[tokio::test]
async fn the_spawn_calls_trace_context_reaches_the_worker() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 2).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (sent, inherited) in [
        (traceparent, true),
        ("00-not-a-trace-context", false),
        (
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            false,
        ),
    ] {
        let mut request = tonic::Request::new(worker_bg("coder", "traced"));
        request
            .metadata_mut()
            .insert("traceparent", sent.parse().unwrap());
        let a = s
            .client
            .spawn(request)
            .await
            .expect("spawn succeeds")
            .into_inner()
            .agent
            .expect("agent");
        let assigned = w.assignment().await;
        assert_eq!(assigned.agent.expect("agent").id, a.id);
        if inherited {
            assert_eq!(assigned.traceparent, sent);
            assert_eq!(a.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        } else {
            assert_traceparent_in(&assigned.traceparent, &a.trace_id, false);
        }
        w.done(&a.id, "ok");
    }
    s.handle.shutdown().await.unwrap();
}

/// Roots without a lead have no per-parent limit, so however many of them
/// run, a worker-type root waiting for a worker says so.
#[tokio::test]
async fn a_leadless_root_waiting_for_a_worker_names_the_worker_not_a_parent_limit() {
    let mut s = TestServer::start(
        "[limits]\nmax_background_agents = 20\nmax_concurrent_per_parent = 3\n\
         [agents.coder]\nrunner = \"worker\"\n[agents.simulated]\nrunner = \"simulated\"\n",
    )
    .await;
    for _ in 0..4 {
        let a = spawn(&mut s.client, bg("acme/m1", "wait_steer")).await;
        assert_eq!(status(&a), pb::AgentStatus::Running);
    }
    let waiting = spawn(&mut s.client, worker_bg("coder", "work")).await;
    assert_eq!(status(&waiting), pb::AgentStatus::Queued);
    assert_eq!(
        waiting.queue_reason,
        "no worker connected for agent type \"coder\""
    );
    s.handle.shutdown().await.unwrap();
}

/// A lost worker held a run that is retried and one that fails: both give
/// back their buckets before anything starts, so the older of two queued
/// agents, one waiting on each bucket, starts first (the model-based test
/// found a drain in between that started the newer one first).
#[tokio::test]
async fn a_lost_workers_runs_free_their_buckets_before_the_queue_moves_on() {
    let config = r#"
[limits]
max_background_agents = 20
default_concurrency = 1
max_concurrent_per_parent = 0

[agents.coder]
runner = "worker"

[agents.reviewer]
runner = "worker"
retry_on_worker_lost = 1

[agents.simulated]
runner = "simulated"
"#;
    let mut s = TestServer::start(config).await;
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder", "reviewer"], 2).await;
    let on = |agent: &str, model: &str| pb::SpawnRequest {
        agent: agent.into(),
        ..bg(model, "work")
    };
    let (retried, _) = spawn_assigned(&mut s, &mut w, on("reviewer", "acme/a")).await;
    let (failed, _) = spawn_assigned(&mut s, &mut w, on("coder", "acme/b")).await;
    // Each bucket is full: one agent waits on each, the older on acme/a.
    let older = spawn(&mut s.client, bg("acme/a", "older")).await;
    let newer = spawn(&mut s.client, bg("acme/b", "newer")).await;
    assert_eq!(status(&older), pb::AgentStatus::Queued);
    assert_eq!(status(&newer), pb::AgentStatus::Queued);

    w.die();
    let got = await_all(&mut s.client, &[&failed.id, &older.id, &newer.id]).await;
    assert_eq!(status(&got[0]), pb::AgentStatus::Failed);
    assert_eq!(status(&got[1]), pb::AgentStatus::Done);
    assert_eq!(status(&got[2]), pb::AgentStatus::Done);
    let mut started = Vec::new();
    while started.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("events flow")
            .unwrap()
            .unwrap();
        let id = ev.agent.as_ref().map(|a| a.id.clone()).unwrap_or_default();
        if Kind::try_from(ev.kind).unwrap() == Kind::Started && (id == older.id || id == newer.id) {
            started.push(id);
        }
    }
    assert_eq!(
        started,
        [older.id.clone(), newer.id.clone()],
        "FIFO across the freed buckets"
    );
    let r = status_of(&mut s.client, &retried.id).await;
    assert_eq!(
        status(&r),
        pb::AgentStatus::Queued,
        "waits for a worker: {r:?}"
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_continued_worker_run_gets_the_transcript_and_the_session_its_worker_returned() {
    let mut s = TestServer::start(CONFIG).await;
    let mut w = Worker::connect(s.handle.addr(), &["coder"], 2).await;
    let (first, assigned) = spawn_assigned(&mut s, &mut w, worker_bg("coder", "find it")).await;
    assert!(
        assigned.transcript.is_empty(),
        "a first turn has no history"
    );
    assert_eq!(assigned.session, "");
    w.send(
        &first.id,
        run_event::Event::ToolCall(pb::ToolCall {
            name: "grep".into(),
            input_digest: String::new(),
        }),
    );
    w.send(
        &first.id,
        run_event::Event::Done(pb::RunDone {
            result: "found it".into(),
            session: "worker-session-1".into(),
        }),
    );
    w.released(&first.id).await;
    await_all(&mut s.client, &[&first.id]).await;

    let (second, assigned) = spawn_assigned(
        &mut s,
        &mut w,
        pb::SpawnRequest {
            continue_from: first.id.clone(),
            prompt: "now fix it".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(assigned.prompt, "now fix it");
    assert_eq!(assigned.session, "worker-session-1");
    let history: Vec<(pb::TranscriptEntryKind, &str, u32, &str)> = assigned
        .transcript
        .iter()
        .map(|e| (e.kind(), e.agent_id.as_str(), e.turn, e.text.as_str()))
        .collect();
    use pb::TranscriptEntryKind as K;
    assert_eq!(
        history,
        [
            (K::Prompt, first.id.as_str(), 1, "find it"),
            (K::ToolCall, first.id.as_str(), 1, "grep"),
            (K::Result, first.id.as_str(), 1, "found it"),
        ]
    );
    assert_eq!(
        assigned.transcript[2].status(),
        pb::AgentStatus::Done,
        "a result entry says how the turn ended"
    );
    // A failed run's session is kept too, and the next turn gets it.
    w.send(
        &second.id,
        run_event::Event::Failed(pb::RunFailed {
            code: "TOOL_ERROR".into(),
            message: "tests fail".into(),
            session: "worker-session-2".into(),
            retryable: false,
        }),
    );
    w.released(&second.id).await;
    await_all(&mut s.client, &[&second.id]).await;
    let (_, assigned) = spawn_assigned(
        &mut s,
        &mut w,
        pb::SpawnRequest {
            continue_from: second.id.clone(),
            prompt: "try again".into(),
            background: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(assigned.session, "worker-session-2");
    assert_eq!(assigned.transcript.len(), 5);
    let last = assigned.transcript.last().unwrap();
    assert_eq!(
        (
            last.kind(),
            last.status(),
            last.error.as_ref().unwrap().code.as_str()
        ),
        (K::Result, pb::AgentStatus::Failed, "TOOL_ERROR")
    );
    s.handle.shutdown().await.unwrap();
}
