//! A worker session over the generated WorkerService client, speaking the
//! protocol by hand.

use std::time::Duration;

use subagentd::pb;

use super::child::ChildServer;

/// `[agents.coder]` of a `subagentd worker` file: a command that echoes its
/// prompt (`prompt=…`), then its first steer message (`steer=…`).
pub const STEERED_COMMAND_TYPE: &str = r#"[agents.coder]
runner = "command"
command = ["sh", "-c", "read p; echo \"prompt=$p\"; read s; echo \"steer=$s\""]
steer = "stdin"
"#;

/// A raw worker session over the generated client.
pub struct RawWorker {
    tx: tokio::sync::mpsc::UnboundedSender<pb::ConnectRequest>,
    pub rx: tonic::Streaming<pb::ConnectResponse>,
}

impl RawWorker {
    /// Opens a session to `server` as worker `durable-worker` of type
    /// `coder` (capacity 2), naming the runs it still holds.
    pub async fn connect(server: &ChildServer, held: Vec<pb::HeldRun>) -> Self {
        use pb::connect_request::Message;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(pb::ConnectRequest {
            message: Some(Message::Hello(pb::WorkerHello {
                name: "durable-worker".into(),
                agents: vec!["coder".into()],
                capacity: 2,
                held_runs: held,
                ..Default::default()
            })),
        })
        .unwrap();
        let mut rx = pb::worker_service_client::WorkerServiceClient::new(server.channel().await)
            .connect(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .expect("session opens")
            .into_inner();
        let welcome = Self::next_on(&mut rx).await;
        assert!(
            matches!(welcome, pb::connect_response::Message::Welcome(_)),
            "{welcome:?}"
        );
        Self { tx, rx }
    }

    async fn next_on(
        rx: &mut tonic::Streaming<pb::ConnectResponse>,
    ) -> pb::connect_response::Message {
        tokio::time::timeout(Duration::from_secs(10), rx.message())
            .await
            .expect("a message within 10 s")
            .expect("stream ok")
            .expect("stream open")
            .message
            .expect("message set")
    }

    /// The next message.
    pub async fn next(&mut self) -> pb::connect_response::Message {
        Self::next_on(&mut self.rx).await
    }

    /// Reports `agent_id`'s run (attempt 1) DONE with `result`.
    pub fn done(&self, agent_id: &str, result: &str) {
        let done = pb::run_event::Event::Done(pb::RunDone {
            result: result.into(),
            ..Default::default()
        });
        self.send(agent_id, 0, done);
    }

    /// Sends event number `seq` (0: not numbered) of `agent_id`'s run.
    pub fn send(&self, agent_id: &str, seq: u64, event: pb::run_event::Event) {
        self.tx
            .send(pb::ConnectRequest {
                message: Some(pb::connect_request::Message::Event(pb::RunEvent {
                    agent_id: agent_id.into(),
                    event: Some(event),
                    seq,
                    attempt: 1,
                })),
            })
            .unwrap();
    }
}

impl RawWorker {
    /// The next `n` messages, each of which must be an assignment.
    pub async fn assignments(&mut self, n: usize) -> Vec<pb::RunAssignment> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let pb::connect_response::Message::Assign(a) = self.next().await else {
                panic!("expected an assignment");
            };
            out.push(a);
        }
        out
    }
}
