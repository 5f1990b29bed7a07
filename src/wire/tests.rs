//! Conversions both ways: round trips, and requests refused field by field.

use std::{sync::Arc, time::Duration, time::SystemTime};

use uuid::Uuid;

use super::{agent::*, check::*, requests::*};
use crate::pb;
use crate::scheduler::*;

fn fields(err: Error) -> Vec<String> {
    match err {
        Error::Invalid(v) => v.into_iter().map(|v| v.field).collect(),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn an_agent_survives_the_round_trip_a_worker_assignment_takes() {
    let (id, parent, worker) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let created = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
    let usage = Usage {
        input_tokens: 3,
        output_tokens: 5,
        tool_calls: 1,
    };
    let agent = AgentView {
        tenant: "t".into(),
        id,
        agent: "coder".into(),
        model: "openai/gpt".into(),
        description: "fix it".into(),
        parent_id: Some(parent),
        root_id: parent,
        lead_id: Some("lead-7".into()),
        depth: 2,
        status: AgentStatus::Running,
        created_at: created,
        started_at: Some(created + Duration::from_millis(5)),
        finished_at: None,
        collected_at: None,
        workspace: None,
        result: "partial".into(),
        error: Some(AgentError::new("STALE", "no progress")),
        approval: None,
        usage,
        total_usage: Usage {
            input_tokens: 30,
            ..usage
        },
        labels: Arc::new([("team".to_string(), "a".to_string())].into()),
        background: true,
        detached: true,
        queue_reason: None,
        bucket: "openai/gpt".into(),
        worker_id: Some(worker),
        trace_id: crate::scheduler::trace::TraceId::random(),
        attempt: 2,
        continuation: Some(Arc::new(Continuation {
            conversation_id: parent,
            continues_id: parent,
            turn: 3,
        })),
        attempts: Some(Arc::new(Attempts {
            ended: vec![Attempt {
                model: "openai/first".into(),
                error: AgentError::new("PROVIDER_429", "slow down"),
                started_at: Some(created + Duration::from_millis(5)),
                ended_at: created + Duration::from_millis(7),
            }],
            current_started_at: Some(created + Duration::from_millis(9)),
        })),
    };
    let back = agent_from_pb(&agent_to_pb(&agent, created)).unwrap();
    assert_eq!(back, agent);

    let mut bad = agent_to_pb(&agent, created);
    bad.parent_id = "nope".into();
    let err = agent_from_pb(&bad).unwrap_err();
    assert!(err.contains("agent.parent_id"), "{err}");
    bad = agent_to_pb(&agent, created);
    bad.trace_id.clear();
    assert!(agent_from_pb(&bad).unwrap_err().contains("agent.trace_id"));
}

#[test]
fn a_call_s_traceparent_is_read_and_a_malformed_one_ignored() {
    let with = |v: &str| {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("traceparent", v.parse().unwrap());
        trace_context_from(&m)
    };
    let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(with(valid).map(|c| c.traceparent()).as_deref(), Some(valid));
    assert_eq!(with("garbage"), None);
    assert_eq!(
        trace_context_from(&tonic::metadata::MetadataMap::new()),
        None
    );
}

#[test]
fn spawn_collects_every_violation() {
    let err = parse_spawn(pb::SpawnRequest {
        model: "no-slash".into(),
        parent_id: "nope".into(),
        lead_id: "x".repeat(257),
        timeout: Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        }),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(
        fields(err),
        vec![
            "agent",
            "model",
            "prompt",
            "parent_id",
            "lead_id",
            "timeout"
        ]
    );
}

#[test]
fn await_defaults_and_bounds() {
    let q = parse_await(pb::AwaitRequest {
        ids: vec![Uuid::new_v4().to_string()],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(q.timeout, DEFAULT_AWAIT_TIMEOUT);
    assert_eq!(q.mode, AwaitMode::All);
    let err = parse_await(pb::AwaitRequest {
        ids: vec![],
        timeout: Some(prost_types::Duration {
            seconds: 3601,
            nanos: 0,
        }),
        mode: 0,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(fields(err), vec!["ids", "timeout"]);
    let many: Vec<String> = (0..101).map(|_| Uuid::new_v4().to_string()).collect();
    let err = parse_await(pb::AwaitRequest {
        ids: many,
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(fields(err), vec!["ids"]);
}

#[test]
fn cancel_wants_exactly_one_target() {
    assert_eq!(
        fields(parse_cancel(pb::CancelRequest::default()).unwrap_err()),
        vec!["id"]
    );
    let both = pb::CancelRequest {
        id: Uuid::new_v4().to_string(),
        lead_id: "lead".into(),
        reason: String::new(),
    };
    assert_eq!(
        fields(parse_cancel(both).unwrap_err()),
        vec!["id", "lead_id"]
    );
}
