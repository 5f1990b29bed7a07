//! Issue 15 §6, in `cargo test`: arbitrary bytes and arbitrary field values
//! sent to every RPC of a real server over loopback never crash it and are
//! always answered INVALID_ARGUMENT (with the violated fields, when a field
//! is wrong) or an answer the contract allows: never INTERNAL or UNKNOWN.
//! The server answers the next request afterwards.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{error_info, violated_fields, TestServer};
use proptest::prelude::*;
use subagentd::pb;
use tonic::Code;

const CONFIG: &str = r#"
[limits]
max_background_agents = 10000
default_concurrency = 0

[agents.simulated]
runner = "simulated"

[agents.coder]
runner = "worker"
"#;

/// The methods and whether their request is a stream (Connect).
const METHODS: &[&str] = &[
    "/subagents.v1.AgentService/Spawn",
    "/subagents.v1.AgentService/Status",
    "/subagents.v1.AgentService/Await",
    "/subagents.v1.AgentService/Cancel",
    "/subagents.v1.AgentService/Steer",
    "/subagents.v1.AgentService/Approve",
    "/subagents.v1.AgentService/WatchAgents",
    "/subagents.v1.WorkerService/Connect",
];

/// Codes an arbitrary request may get: a refusal of the input, a lookup
/// that finds nothing, a state or limit that does not allow it, the call's
/// own deadline, or success. Never a server fault.
fn allowed(code: Code) -> bool {
    matches!(
        code,
        Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::DeadlineExceeded
            | Code::AlreadyExists
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

type Raw = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<Bytes>,
>;

/// Sends `message` (any bytes) as one gRPC message to `method` and returns
/// the status the server answers (from the headers or the trailers).
async fn raw_call(client: &Raw, addr: std::net::SocketAddr, method: &str, message: &[u8]) -> Code {
    let mut framed = Vec::with_capacity(message.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    let request = http::Request::post(format!("http://{addr}{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "2S")
        .body(http_body_util::Full::new(Bytes::from(framed)))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .expect("the server answers in time")
        .expect("the server answers");
    if let Some(status) = response.headers().get("grpc-status") {
        return Code::from_bytes(status.as_bytes());
    }
    let mut body = response.into_body();
    let mut last = None;
    let read = async {
        while let Some(frame) = std::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await
        {
            let Ok(frame) = frame else { break };
            if let Ok(trailers) = frame.into_trailers() {
                last = trailers
                    .get("grpc-status")
                    .map(|s| Code::from_bytes(s.as_bytes()));
            }
        }
    };
    // A watch streams until its deadline; its status ends it.
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    last.expect("the answer carries a grpc-status")
}

fn raw_client() -> Raw {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_to_every_method_are_refused_or_answered(
        messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..256), METHODS.len()),
    ) {
        let rt = runtime();
        rt.block_on(async {
            let s = TestServer::start(CONFIG).await;
            let raw = raw_client();
            for (method, message) in METHODS.iter().zip(&messages) {
                let code = raw_call(&raw, s.handle.addr(), method, message).await;
                assert!(allowed(code), "{method} with {message:02x?}: {code:?}");
            }
            // Still serving.
            s.client.clone().status(pb::StatusRequest::default()).await.unwrap();
        });
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z/]{1,12}",
        any::<String>(),
        Just("openai/gpt-4o".to_owned()),
        Just("simulated".to_owned()),
        Just(uuid::Uuid::nil().to_string()),
        Just("x".repeat(5000)),
    ]
}

fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    proptest::option::of((any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| {
        prost_types::Duration {
            seconds: seconds % 100_000,
            nanos,
        }
    }))
}

fn spawn_request() -> impl Strategy<Value = pb::SpawnRequest> {
    (
        (text(), text(), text(), text()),
        (text(), text(), text()),
        (
            duration(),
            proptest::collection::hash_map(text(), text(), 0..3),
        ),
    )
        .prop_map(
            |(
                (agent, model, prompt, description),
                (parent_id, lead_id, key),
                (timeout, labels),
            )| {
                pb::SpawnRequest {
                    agent,
                    model,
                    prompt,
                    description,
                    parent_id,
                    lead_id,
                    idempotency_key: key,
                    // Background: a foreground run of an arbitrary prompt
                    // could run for long.
                    background: true,
                    timeout,
                    labels,
                    ..Default::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_field_values_are_refused_field_by_field_or_answered(
        spawn in spawn_request(),
        ids in proptest::collection::vec(text(), 0..4),
        lead in text(),
        page_size in any::<u32>(),
        page_token in text(),
        await_timeout in duration(),
        steer in text(),
        decision in any::<i32>(),
        after in any::<u64>(),
    ) {
        let rt = runtime();
        rt.block_on(async {
            let s = TestServer::start(CONFIG).await;
            let mut c = s.client.clone();
            let check = |what: &str, result: Result<(), tonic::Status>| {
                if let Err(status) = result {
                    assert!(allowed(status.code()), "{what}: {status:?}");
                    if status.code() == Code::InvalidArgument {
                        let (reason, _) = error_info(&status);
                        let fields = violated_fields(&status);
                        assert!(
                            !fields.is_empty() || !reason.is_empty(),
                            "{what}: INVALID_ARGUMENT names no field and no reason: {status:?}"
                        );
                    }
                }
            };
            let first = ids.first().cloned().unwrap_or_default();
            let r = c.spawn(spawn.clone()).await.map(drop);
            check("Spawn", r);
            let r = c.status(pb::StatusRequest {
                ids: ids.clone(),
                lead_id: lead.clone(),
                page_size,
                page_token: page_token.clone(),
                ..Default::default()
            }).await.map(drop);
            check("Status", r);
            let mut request = tonic::Request::new(pb::AwaitRequest {
                ids: ids.clone(),
                timeout: await_timeout,
                ..Default::default()
            });
            request.set_timeout(Duration::from_secs(2));
            let r = c.r#await(request).await.map(drop);
            check("Await", r);
            let r = c.steer(pb::SteerRequest { id: first.clone(), message: steer.clone() }).await.map(drop);
            check("Steer", r);
            let r = c.approve(pb::ApproveRequest {
                id: first.clone(),
                approval_id: page_token.clone(),
                decision,
                note: steer.clone(),
            }).await.map(drop);
            check("Approve", r);
            let mut request = tonic::Request::new(pb::WatchAgentsRequest {
                ids: ids.clone(),
                lead_id: lead.clone(),
                after_sequence: after,
                ..Default::default()
            });
            request.set_timeout(Duration::from_millis(300));
            let r = match c.watch_agents(request).await {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(_)) => continue,
                            Ok(None) => break Ok(()),
                            Err(e) => break Err(e),
                        }
                    }
                }
                Err(e) => Err(e),
            };
            check("WatchAgents", r);
            let r = c.cancel(pb::CancelRequest { id: first, lead_id: lead, reason: steer }).await.map(drop);
            check("Cancel", r);
            c.status(pb::StatusRequest::default()).await.unwrap();
        });
    }
}

/// One message of each kind the fuzz targets take, from arbitrary field
/// values, behind each selector byte: what a coverage-guided fuzzer finds
/// from the seeds, reached here without one.
fn encoded_messages(spawn: pb::SpawnRequest, id: String, text: String) -> Vec<Vec<u8>> {
    use prost::Message;
    let event = pb::RunEvent {
        agent_id: id.clone(),
        attempt: 1,
        seq: 1,
        event: Some(pb::run_event::Event::Output(text.clone())),
    };
    vec![
        spawn.encode_to_vec(),
        pb::StatusRequest {
            ids: vec![id.clone()],
            lead_id: text.clone(),
            ..Default::default()
        }
        .encode_to_vec(),
        pb::CancelRequest {
            id: id.clone(),
            lead_id: text.clone(),
            reason: text.clone(),
        }
        .encode_to_vec(),
        pb::ConnectRequest {
            message: Some(pb::connect_request::Message::Event(event)),
        }
        .encode_to_vec(),
        pb::ConnectRequest {
            message: Some(pb::connect_request::Message::Hello(pb::WorkerHello {
                name: text.clone(),
                agents: vec![text, id],
                ..Default::default()
            })),
        }
        .encode_to_vec(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// The cargo-fuzz targets' entry points (fuzz/, docs/security.md "Fuzzing") on
    /// random bytes and on encodings of random field values: none panics.
    #[test]
    fn the_fuzz_targets_take_any_input(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        selector in any::<u8>(),
        spawn in spawn_request(),
        id in text(),
        text in text(),
    ) {
        subagentd::fuzzing::agent_request(&bytes);
        subagentd::fuzzing::worker_message(&bytes);
        subagentd::fuzzing::credential(&bytes);
        for message in encoded_messages(spawn, id, text.clone()) {
            let mut input = vec![selector];
            input.extend_from_slice(&message);
            subagentd::fuzzing::agent_request(&input);
            subagentd::fuzzing::worker_message(&input);
        }
        let mut header = vec![selector];
        header.extend_from_slice(format!("Bearer {text}").as_bytes());
        subagentd::fuzzing::credential(&header);
    }
}
