//! Traces as an operator's collector sees them: the built binary exports
//! OTLP to a receiver in this test (opentelemetry-proto TraceService over
//! real gRPC on 127.0.0.1:0), and the test checks the spans of agent trees.

mod common;

use std::collections::HashMap;

use common::{child::ChildServer, otlp::Receiver};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::any_value,
    trace::v1::{span::SpanKind, status::StatusCode, Span},
};
use subagentd::pb::{
    self, agent_service_client::AgentServiceClient, connect_request, connect_response, run_event,
    worker_service_client::WorkerServiceClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

/// The caller's span: what a frontend's own tracing would send.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

const CONFIG: &str = "\
[limits]
max_background_agents = 20
default_concurrency = 10
[agents.simulated]
runner = \"simulated\"
[agents.coder]
runner = \"worker\"
[agents.printer]
runner = \"command\"
command = [\"sh\", \"-c\", \"printf '%s' \\\"$TRACEPARENT\\\"\"]
";

/// The built binary, exporting to `receiver`, with JSON logs on stderr
/// (`extra_env` last, so it may override the defaults here).
async fn start_server(receiver: &Receiver, extra_env: &[(&str, &str)]) -> ChildServer {
    let endpoint = format!("http://{}", receiver.addr);
    let mut env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "subagentd-under-test"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("SUBAGENTD_SERVER__SHUTDOWN_GRACE", "0s"),
    ];
    env.extend_from_slice(extra_env);
    ChildServer::start(CONFIG, &env).await
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attrs(span: &Span) -> HashMap<String, any_value::Value> {
    span.attributes
        .iter()
        .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?.value?)))
        .collect()
}

fn str_attr(span: &Span, key: &str) -> String {
    match attrs(span).get(key) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        other => panic!(
            "{key} is not a string attribute of {}: {other:?}",
            span.name
        ),
    }
}

fn int_attr(span: &Span, key: &str) -> i64 {
    match attrs(span).get(key) {
        Some(any_value::Value::IntValue(i)) => *i,
        other => panic!("{key} is not an int attribute of {}: {other:?}", span.name),
    }
}

fn run_span_of<'a>(spans: &'a [Span], agent_id: &str) -> Option<&'a Span> {
    spans.iter().find(|s| {
        s.name.starts_with("invoke_agent ")
            && s.attributes.iter().any(|kv| {
                kv.key == "gen_ai.agent.id"
                    && matches!(
                        kv.value.as_ref().and_then(|v| v.value.as_ref()),
                        Some(any_value::Value::StringValue(id)) if id == agent_id
                    )
            })
    })
}

async fn spawn_traced(
    client: &mut AgentServiceClient<Channel>,
    req: pb::SpawnRequest,
    traceparent: Option<&str>,
) -> pb::Agent {
    let mut request = tonic::Request::new(req);
    if let Some(tp) = traceparent {
        request
            .metadata_mut()
            .insert("traceparent", tp.parse().unwrap());
    }
    client
        .spawn(request)
        .await
        .expect("spawn succeeds")
        .into_inner()
        .agent
        .expect("agent")
}

fn simulated(prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: "simulated".into(),
        model: "acme/m1".into(),
        prompt: prompt.into(),
        background: true,
        ..Default::default()
    }
}

async fn await_ids(client: &mut AgentServiceClient<Channel>, ids: &[&str]) -> Vec<pb::Agent> {
    let resp = client
        .r#await(pb::AwaitRequest {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            timeout: Some(prost_types::Duration {
                seconds: 20,
                nanos: 0,
            }),
            mode: pb::AwaitMode::All as i32,
            ..Default::default()
        })
        .await
        .expect("await succeeds")
        .into_inner();
    assert!(!resp.timed_out);
    resp.agents
}

/// A caller's trace contains the tree: the caller's span → the lead's run
/// span → its child's run span; each run span links to the Spawn RPC span
/// that created it, carries the GenAI and subagentd attributes, and a
/// failed run's span has Error status.
#[tokio::test]
async fn one_agent_tree_is_one_trace_under_the_caller_s_span() {
    let mut receiver = Receiver::start().await;
    let mut server = start_server(&receiver, &[]).await;
    let mut client = server.client().await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");

    let parent = spawn_traced(
        &mut client,
        simulated("usage 7 11\nwait_steer"),
        Some(&caller),
    )
    .await;
    assert_eq!(parent.trace_id, CALLER_TRACE, "the record names its trace");
    // The child is spawned by (on behalf of) the parent agent: no
    // traceparent of its own, its parent_id is what places it.
    let child = spawn_traced(
        &mut client,
        pb::SpawnRequest {
            parent_id: parent.id.clone(),
            ..simulated("fail boom")
        },
        None,
    )
    .await;
    assert_eq!(child.trace_id, CALLER_TRACE);
    await_ids(&mut client, &[&child.id]).await;
    client
        .steer(pb::SteerRequest {
            id: parent.id.clone(),
            message: "finish".into(),
        })
        .await
        .unwrap();
    await_ids(&mut client, &[&parent.id]).await;

    let (parent_span, child_span) = receiver
        .wait_for("run spans of both agents", |spans| {
            Some((
                run_span_of(spans, &parent.id)?.clone(),
                run_span_of(spans, &child.id)?.clone(),
            ))
        })
        .await;
    // One trace, and the tree is the span tree.
    assert_eq!(hex(&parent_span.trace_id), CALLER_TRACE);
    assert_eq!(hex(&child_span.trace_id), CALLER_TRACE);
    assert_eq!(hex(&parent_span.parent_span_id), CALLER_SPAN);
    assert_eq!(child_span.parent_span_id, parent_span.span_id);
    assert_eq!(parent_span.name, "invoke_agent simulated");
    assert_eq!(parent_span.kind, SpanKind::Internal as i32);

    // Attributes (GenAI conventions and subagentd's own).
    assert_eq!(
        str_attr(&parent_span, "gen_ai.operation.name"),
        "invoke_agent"
    );
    assert_eq!(str_attr(&parent_span, "gen_ai.agent.name"), "simulated");
    assert_eq!(str_attr(&parent_span, "gen_ai.request.model"), "m1");
    assert_eq!(str_attr(&parent_span, "gen_ai.provider.name"), "acme");
    assert_eq!(int_attr(&parent_span, "gen_ai.usage.input_tokens"), 7);
    assert_eq!(int_attr(&parent_span, "gen_ai.usage.output_tokens"), 11);
    assert_eq!(int_attr(&parent_span, "subagentd.depth"), 1);
    assert_eq!(int_attr(&child_span, "subagentd.depth"), 2);
    assert_eq!(str_attr(&child_span, "subagentd.parent_id"), parent.id);
    assert_eq!(str_attr(&child_span, "subagentd.root_id"), parent.id);
    assert_eq!(str_attr(&parent_span, "subagentd.bucket"), "acme/m1");
    assert_eq!(str_attr(&parent_span, "subagentd.tenant"), "default");
    assert!(matches!(
        attrs(&parent_span).get("subagentd.background"),
        Some(any_value::Value::BoolValue(true))
    ));
    assert!(int_attr(&parent_span, "subagentd.queue_wait_ms") >= 0);
    assert_eq!(str_attr(&parent_span, "subagentd.status"), "DONE");
    assert_eq!(str_attr(&child_span, "subagentd.status"), "FAILED");
    assert_eq!(str_attr(&child_span, "subagentd.error_code"), "RUN_FAILED");

    // Status: Error on FAILED only.
    let child_status = child_span.status.clone().unwrap_or_default();
    assert_eq!(child_status.code, StatusCode::Error as i32);
    assert!(child_status.message.contains("boom"), "{child_status:?}");
    let parent_status = parent_span.status.clone().unwrap_or_default();
    assert_ne!(parent_status.code, StatusCode::Error as i32);

    // The steer reached the running parent: an event on its span.
    assert!(
        parent_span
            .events
            .iter()
            .any(|e| e.name == "steer_delivered"),
        "{:?}",
        parent_span.events
    );

    // Each run span links to the server span of the Spawn RPC that created
    // it; that RPC span is itself a child of the caller's span.
    let spans = receiver.spans();
    for run in [&parent_span, &child_span] {
        let link = run.links.first().expect("run span has a link");
        let rpc = spans
            .iter()
            .find(|s| s.span_id == link.span_id)
            .unwrap_or_else(|| panic!("linked span of {} was exported", run.name));
        assert_eq!(rpc.name, "subagents.v1.AgentService/Spawn");
        assert_eq!(rpc.kind, SpanKind::Server as i32);
        assert_eq!(str_attr(rpc, "rpc.system"), "grpc");
        assert_eq!(str_attr(rpc, "rpc.method"), "Spawn");
        assert_eq!(int_attr(rpc, "rpc.grpc.status_code"), 0);
    }
    let parent_rpc = spans
        .iter()
        .find(|s| s.span_id == parent_span.links[0].span_id)
        .unwrap();
    assert_eq!(hex(&parent_rpc.trace_id), CALLER_TRACE);
    assert_eq!(hex(&parent_rpc.parent_span_id), CALLER_SPAN);

    // Resource: service name and attributes from the standard variables.
    let resource = receiver.resource_of(&parent_span.span_id);
    let resource: HashMap<_, _> = resource
        .iter()
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some((kv.key.as_str(), s.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(resource.get("service.name"), Some(&"subagentd-under-test"));
    assert_eq!(resource.get("deployment.environment"), Some(&"test"));

    // The lifecycle log line is JSON with the agent as fields and its trace.
    let line = server
        .log_line(|v| v["message"] == "agent ended" && v["agent_id"] == parent.id.as_str())
        .await;
    assert_eq!(line["trace_id"], CALLER_TRACE);
    assert_eq!(line["span_id"], hex(&parent_span.span_id));
    assert_eq!(line["status"], "DONE");
    assert_eq!(line["level"], "INFO");

    assert!(server.stop().await.success());
}

/// Without a caller context a root starts a new trace; cancellation is an
/// event with its reason; spans still queued are exported when the server
/// stops (SIGTERM) rather than lost.
#[tokio::test]
async fn a_root_without_a_caller_starts_a_trace_and_spans_are_flushed_at_shutdown() {
    let mut receiver = Receiver::start().await;
    // Spans leave only when the batch is full or at shutdown; and one
    // runtime worker, as in a one-CPU container.
    let server = start_server(
        &receiver,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
            ("TOKIO_WORKER_THREADS", "1"),
        ],
    )
    .await;
    let mut client = server.client().await;
    let root = spawn_traced(&mut client, simulated("wait_steer"), None).await;
    assert_eq!(root.trace_id.len(), 32, "{root:?}");
    let done = spawn_traced(&mut client, simulated("hello"), None).await;
    await_ids(&mut client, &[&done.id]).await;
    assert_ne!(done.trace_id, root.trace_id, "each root is its own trace");
    client
        .cancel(pb::CancelRequest {
            id: root.id.clone(),
            reason: "no longer needed".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let status = server.stop().await;
    assert!(status.success(), "{status:?}");

    let root_span = receiver
        .wait_for("the cancelled root's span", |spans| {
            run_span_of(spans, &root.id).cloned()
        })
        .await;
    assert_eq!(hex(&root_span.trace_id), root.trace_id);
    assert!(
        root_span.parent_span_id.is_empty(),
        "a root span of its own trace"
    );
    assert_eq!(str_attr(&root_span, "subagentd.status"), "CANCELLED");
    let cancelled = root_span
        .events
        .iter()
        .find(|e| e.name == "cancelled")
        .expect("a cancelled event");
    let reason = cancelled
        .attributes
        .iter()
        .find(|kv| kv.key == "subagentd.cancel.reason")
        .and_then(|kv| kv.value.clone()?.value);
    assert!(
        matches!(&reason, Some(any_value::Value::StringValue(r)) if r.contains("no longer needed")),
        "{reason:?}"
    );
    assert!(run_span_of(&receiver.spans(), &done.id).is_some());
}

/// A worker's assignment carries the run span's context, so the span the
/// worker records for its work is a child of the run span in the same
/// trace (here the test plays the worker and exports its span itself).
#[tokio::test]
async fn a_worker_s_own_span_joins_the_agent_s_trace() {
    let mut receiver = Receiver::start().await;
    let server = start_server(&receiver, &[]).await;
    let mut client = server.client().await;

    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(pb::ConnectRequest {
        message: Some(connect_request::Message::Hello(pb::WorkerHello {
            name: "traced-worker".into(),
            agents: vec!["coder".into()],
            capacity: 1,
            ..Default::default()
        })),
    })
    .unwrap();
    let mut stream = WorkerServiceClient::new(server.channel().await)
        .connect(UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let welcome = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        welcome.message,
        Some(connect_response::Message::Welcome(_))
    ));

    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let agent = spawn_traced(
        &mut client,
        pb::SpawnRequest {
            agent: "coder".into(),
            ..simulated("work")
        },
        Some(&caller),
    )
    .await;
    let assigned = match stream.message().await.unwrap().unwrap().message {
        Some(connect_response::Message::Assign(a)) => a,
        other => panic!("expected an assignment, got {other:?}"),
    };
    // The worker's side: parse the traceparent and record a span under it.
    let parts: Vec<&str> = assigned.traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{}", assigned.traceparent);
    assert_eq!(parts[1], CALLER_TRACE);
    assert_ne!(parts[2], CALLER_SPAN, "the run span, not the caller's");
    let worker_span_id = [7u8; 8];
    let worker_span = Span {
        trace_id: (0..16)
            .map(|i| u8::from_str_radix(&parts[1][2 * i..2 * i + 2], 16).unwrap())
            .collect(),
        span_id: worker_span_id.to_vec(),
        parent_span_id: (0..8)
            .map(|i| u8::from_str_radix(&parts[2][2 * i..2 * i + 2], 16).unwrap())
            .collect(),
        name: "worker: do the work".into(),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: 1,
        end_time_unix_nano: 2,
        ..Default::default()
    };
    let mut exporter = opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient::connect(
        format!("http://{}", receiver.addr),
    )
    .await
    .unwrap();
    exporter
        .export(ExportTraceServiceRequest {
            resource_spans: vec![opentelemetry_proto::tonic::trace::v1::ResourceSpans {
                scope_spans: vec![opentelemetry_proto::tonic::trace::v1::ScopeSpans {
                    spans: vec![worker_span],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
        .await
        .unwrap();
    tx.send(pb::ConnectRequest {
        message: Some(connect_request::Message::Event(pb::RunEvent {
            agent_id: agent.id.clone(),
            event: Some(run_event::Event::Done(pb::RunDone {
                result: "ok".into(),
                ..Default::default()
            })),
            seq: 0,
            attempt: 0,
        })),
    })
    .unwrap();
    await_ids(&mut client, &[&agent.id]).await;

    let (run, worker) = receiver
        .wait_for("the run span and the worker's span", |spans| {
            let run = run_span_of(spans, &agent.id)?.clone();
            let worker = spans.iter().find(|s| s.span_id == worker_span_id)?.clone();
            Some((run, worker))
        })
        .await;
    assert_eq!(run.name, "invoke_agent coder");
    assert_eq!(worker.trace_id, run.trace_id, "one trace");
    assert_eq!(worker.parent_span_id, run.span_id, "under the run span");
    assert_eq!(hex(&run.parent_span_id), CALLER_SPAN);
    drop(tx);
    assert!(server.stop().await.success());
}

/// A command program gets the run span's context in `TRACEPARENT`: what
/// it records (or passes to its own calls) lands under the run span.
#[tokio::test]
async fn a_command_run_gets_its_run_span_as_traceparent() {
    let mut receiver = Receiver::start().await;
    let server = start_server(&receiver, &[]).await;
    let mut client = server.client().await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let agent = spawn_traced(
        &mut client,
        pb::SpawnRequest {
            agent: "printer".into(),
            ..simulated("go")
        },
        Some(&caller),
    )
    .await;
    let done = await_ids(&mut client, &[&agent.id]).await.remove(0);
    assert_eq!(done.status, pb::AgentStatus::Done as i32, "{done:?}");
    let run = receiver
        .wait_for("the command run's span", |spans| {
            run_span_of(spans, &agent.id).cloned()
        })
        .await;
    assert_eq!(
        done.result,
        format!("00-{CALLER_TRACE}-{}-01", hex(&run.span_id)),
        "TRACEPARENT names the run span"
    );
    assert!(server.stop().await.success());
}

/// An approval request is an event on the run's span, naming the tool.
#[tokio::test]
async fn an_approval_request_is_an_event_on_the_run_span() {
    let mut receiver = Receiver::start().await;
    let server = start_server(&receiver, &[]).await;
    let mut client = server.client().await;
    let agent = spawn_traced(&mut client, simulated("approve shell\noutput after"), None).await;
    // Await returns once the agent is settled: here, awaiting approval.
    let waiting = await_ids(&mut client, &[&agent.id]).await.remove(0);
    assert_eq!(
        waiting.status,
        pb::AgentStatus::AwaitingApproval as i32,
        "{waiting:?}"
    );
    let approval = waiting.approval.expect("pending approval");
    client
        .approve(pb::ApproveRequest {
            id: agent.id.clone(),
            approval_id: approval.id,
            decision: pb::ApprovalDecision::Approve as i32,
            note: String::new(),
        })
        .await
        .unwrap();
    let done = await_ids(&mut client, &[&agent.id]).await.remove(0);
    assert_eq!(done.status, pb::AgentStatus::Done as i32, "{done:?}");
    let run = receiver
        .wait_for("the run's span", |spans| {
            run_span_of(spans, &agent.id).cloned()
        })
        .await;
    let event = run
        .events
        .iter()
        .find(|e| e.name == "approval_requested")
        .expect("approval_requested event");
    let tool = event
        .attributes
        .iter()
        .find(|kv| kv.key == "gen_ai.tool.name")
        .and_then(|kv| kv.value.clone()?.value);
    assert_eq!(tool, Some(any_value::Value::StringValue("shell".into())));
    assert!(server.stop().await.success());
}
