//! The Approve RPC against a real server: approving and denying a pending
//! tool call, the preconditions (wrong approval, agent not awaiting,
//! unknown agent), request validation, resuming under the bucket limits
//! ahead of newer agents, cancelling a paused agent, and foreground spawns
//! that settle on an approval. Each test starts its own server.

mod common;

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient, AgentEventKind as Kind};
use tonic::{transport::Channel, Code};

type Client = AgentServiceClient<Channel>;

const MODEL: &str = "acme/m1";

/// Pauses for approval of `shell`, then outputs `after`.
const APPROVE_THEN_OUTPUT: &str = "approve shell\noutput after";

// ----- helpers ---------------------------------------------------------------

fn approve_req(
    id: &str,
    approval_id: &str,
    decision: pb::ApprovalDecision,
    note: &str,
) -> pb::ApproveRequest {
    pb::ApproveRequest {
        id: id.to_owned(),
        approval_id: approval_id.to_owned(),
        decision: decision as i32,
        note: note.to_owned(),
    }
}

/// Sends an Approve and returns the server's answer.
async fn try_approve(
    client: &mut Client,
    req: pb::ApproveRequest,
) -> Result<pb::Agent, tonic::Status> {
    client.approve(req).await.map(|r| {
        r.into_inner()
            .agent
            .expect("ApproveResponse carries the agent")
    })
}

/// Decides `id`'s pending approval `approval_id`, panicking on error.
async fn decide(
    client: &mut Client,
    id: &str,
    approval_id: &str,
    decision: pb::ApprovalDecision,
    note: &str,
) -> pb::Agent {
    try_approve(client, approve_req(id, approval_id, decision, note))
        .await
        .expect("approve succeeds")
}

/// An Approve that must fail.
async fn approve_refused(client: &mut Client, req: pb::ApproveRequest) -> tonic::Status {
    match try_approve(client, req).await {
        Ok(agent) => panic!("approve unexpectedly succeeded: {agent:?}"),
        Err(err) => err,
    }
}

/// Awaits one agent until it settles (terminal or AWAITING_APPROVAL).
async fn settled(client: &mut Client, id: &str) -> pb::Agent {
    await_all(client, &[id]).await.remove(0)
}

/// Awaits an agent that must be paused for approval; returns it and its
/// approval.
async fn paused(client: &mut Client, id: &str) -> (pb::Agent, pb::Approval) {
    let agent = settled(client, id).await;
    assert_eq!(
        status(&agent),
        pb::AgentStatus::AwaitingApproval,
        "{agent:?}"
    );
    let approval = agent
        .approval
        .clone()
        .expect("an agent AWAITING_APPROVAL has its approval set");
    (agent, approval)
}

fn unknown_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn assert_failed_precondition(err: &tonic::Status, reason: &str) {
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(error_info(err).0, reason, "{err:?}");
}

fn assert_invalid(err: &tonic::Status, fields: &[&str]) {
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(error_info(err).0, "INVALID_REQUEST", "{err:?}");
    let mut got = violated_fields(err);
    got.sort();
    got.dedup();
    let mut want: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
    want.sort();
    assert_eq!(got, want, "{err:?}");
}

fn is_resumed(a: &pb::Agent) -> bool {
    matches!(
        status(a),
        pb::AgentStatus::Queued | pb::AgentStatus::Running
    )
}

// ----- approve and deny ----------------------------------------------------------

#[tokio::test]
async fn an_approved_tool_call_resumes_the_run_which_then_finishes() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, APPROVE_THEN_OUTPUT)).await;

    let (agent, approval) = paused(&mut s.client, &a.id).await;
    let parsed = uuid::Uuid::parse_str(&approval.id).expect("approval id is a UUID");
    assert!(!parsed.is_nil(), "approval id is not the nil UUID");
    assert_eq!(approval.tool_name, "shell");
    assert_eq!(approval.detail, "", "the simulated runner gives no detail");
    assert_eq!(agent.result, "", "nothing was output before the approval");
    // Status shows the same pending approval.
    let seen = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&seen), pb::AgentStatus::AwaitingApproval);
    assert_eq!(seen.approval.as_ref(), Some(&approval));

    let resumed = decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    assert_eq!(resumed.id, a.id);
    assert!(
        is_resumed(&resumed),
        "QUEUED or RUNNING after approval: {resumed:?}"
    );
    assert!(
        resumed.approval.is_none(),
        "approval is set only while AWAITING_APPROVAL: {resumed:?}"
    );

    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "approved: shell\nafter");
    assert!(done.approval.is_none());
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_denied_tool_call_reaches_the_run_with_its_note() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, APPROVE_THEN_OUTPUT)).await;
    let (_, approval) = paused(&mut s.client, &a.id).await;

    let resumed = decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Deny,
        "too risky",
    )
    .await;
    assert!(is_resumed(&resumed), "{resumed:?}");

    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert!(
        done.result.contains("denied: shell: too risky"),
        "result: {:?}",
        done.result
    );
    assert!(
        !done.result.contains("approved"),
        "result: {:?}",
        done.result
    );
    assert_eq!(done.result, "denied: shell: too risky\nafter");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_denial_without_a_note_reaches_the_run_without_one() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, APPROVE_THEN_OUTPUT)).await;
    let (_, approval) = paused(&mut s.client, &a.id).await;

    decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Deny,
        "",
    )
    .await;
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "denied: shell\nafter");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn output_before_the_approval_is_shown_while_paused_and_kept_after() {
    let mut s = TestServer::start("").await;
    let a = spawn(
        &mut s.client,
        bg(MODEL, "output before\napprove shell\noutput after"),
    )
    .await;
    let (agent, approval) = paused(&mut s.client, &a.id).await;
    assert_eq!(agent.result, "before", "{agent:?}");
    decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "before\napproved: shell\nafter");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_steer_buffered_while_paused_reaches_the_run_after_the_decision() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, "approve shell\nwait_steer")).await;
    let (_, approval) = paused(&mut s.client, &a.id).await;
    let steered = s
        .client
        .steer(pb::SteerRequest {
            id: a.id.clone(),
            message: "hi".into(),
        })
        .await
        .expect("steer succeeds")
        .into_inner();
    assert_eq!(steered.delivery, pb::SteerDelivery::Buffered as i32);
    decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "approved: shell\nsteer: hi");
    s.handle.shutdown().await.unwrap();
}

// ----- preconditions ---------------------------------------------------------------

#[tokio::test]
async fn a_wrong_approval_id_is_a_mismatch_and_changes_nothing() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, APPROVE_THEN_OUTPUT)).await;
    let (_, approval) = paused(&mut s.client, &a.id).await;

    let wrong = unknown_id();
    let err = approve_refused(
        &mut s.client,
        approve_req(&a.id, &wrong, pb::ApprovalDecision::Approve, ""),
    )
    .await;
    assert_failed_precondition(&err, "APPROVAL_MISMATCH");

    // Nothing changed: still paused on the same approval.
    let still = status_of(&mut s.client, &a.id).await;
    assert_eq!(
        status(&still),
        pb::AgentStatus::AwaitingApproval,
        "{still:?}"
    );
    assert_eq!(still.approval.as_ref(), Some(&approval));

    // The right id still works.
    let resumed = decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    assert!(is_resumed(&resumed), "{resumed:?}");
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "approved: shell\nafter");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn approving_an_agent_that_is_not_awaiting_approval_is_a_failed_precondition() {
    let mut s = TestServer::start("[limits.model_concurrency]\n\"acme/one\" = 1\n").await;

    // RUNNING.
    let running = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    assert_eq!(status(&running), pb::AgentStatus::Running);
    let err = approve_refused(
        &mut s.client,
        approve_req(
            &running.id,
            &unknown_id(),
            pb::ApprovalDecision::Approve,
            "",
        ),
    )
    .await;
    assert_failed_precondition(&err, "NOT_AWAITING_APPROVAL");
    assert_eq!(
        status(&status_of(&mut s.client, &running.id).await),
        pb::AgentStatus::Running
    );

    // QUEUED (never ran, so never asked).
    let holder = spawn(&mut s.client, bg("acme/one", "wait_steer")).await;
    assert_eq!(status(&holder), pb::AgentStatus::Running);
    let queued = spawn(&mut s.client, bg("acme/one", APPROVE_THEN_OUTPUT)).await;
    assert_eq!(status(&queued), pb::AgentStatus::Queued);
    let err = approve_refused(
        &mut s.client,
        approve_req(&queued.id, &unknown_id(), pb::ApprovalDecision::Approve, ""),
    )
    .await;
    assert_failed_precondition(&err, "NOT_AWAITING_APPROVAL");
    assert_eq!(
        status(&status_of(&mut s.client, &queued.id).await),
        pb::AgentStatus::Queued
    );

    // DONE (a foreground spawn returns it settled).
    let done = spawn(&mut s.client, fg(MODEL, "output hi")).await;
    assert_eq!(status(&done), pb::AgentStatus::Done);
    let err = approve_refused(
        &mut s.client,
        approve_req(&done.id, &unknown_id(), pb::ApprovalDecision::Deny, "no"),
    )
    .await;
    assert_failed_precondition(&err, "NOT_AWAITING_APPROVAL");
    let after = status_of(&mut s.client, &done.id).await;
    assert_eq!(status(&after), pb::AgentStatus::Done);
    assert_eq!(after.result, "hi");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn approving_an_unknown_agent_is_not_found() {
    let mut s = TestServer::start("").await;
    let id = unknown_id();
    let err = approve_refused(
        &mut s.client,
        approve_req(&id, &unknown_id(), pb::ApprovalDecision::Approve, ""),
    )
    .await;
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let (reason, metadata) = error_info(&err);
    assert_eq!(reason, "AGENT_NOT_FOUND");
    assert_eq!(metadata.get("id").map(String::as_str), Some(id.as_str()));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn approving_the_same_approval_twice_fails_the_second_time() {
    let mut s = TestServer::start("").await;
    // Two approvals in a row: after the first decision the agent may be
    // running, or already paused again on a new approval.
    let a = spawn(&mut s.client, bg(MODEL, "approve shell\napprove shell")).await;
    let (_, first) = paused(&mut s.client, &a.id).await;

    let resumed = decide(
        &mut s.client,
        &a.id,
        &first.id,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    assert!(is_resumed(&resumed), "{resumed:?}");

    let err = approve_refused(
        &mut s.client,
        approve_req(&a.id, &first.id, pb::ApprovalDecision::Approve, ""),
    )
    .await;
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let reason = error_info(&err).0;
    assert!(
        reason == "NOT_AWAITING_APPROVAL" || reason == "APPROVAL_MISMATCH",
        "reason {reason}"
    );

    // The run got the first decision exactly once and asked again.
    let (again, second) = paused(&mut s.client, &a.id).await;
    assert_ne!(second.id, first.id, "a new approval has a new id");
    assert_eq!(again.result, "approved: shell");
    // Now the first id is certainly stale.
    let err = approve_refused(
        &mut s.client,
        approve_req(&a.id, &first.id, pb::ApprovalDecision::Approve, ""),
    )
    .await;
    assert_failed_precondition(&err, "APPROVAL_MISMATCH");

    decide(
        &mut s.client,
        &a.id,
        &second.id,
        pb::ApprovalDecision::Deny,
        "",
    )
    .await;
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "approved: shell\ndenied: shell");
    // And once it is over, the second id is refused too.
    let err = approve_refused(
        &mut s.client,
        approve_req(&a.id, &second.id, pb::ApprovalDecision::Approve, ""),
    )
    .await;
    assert_failed_precondition(&err, "NOT_AWAITING_APPROVAL");
    s.handle.shutdown().await.unwrap();
}

// ----- validation -------------------------------------------------------------------

#[tokio::test]
async fn invalid_approve_requests_name_every_bad_field() {
    let mut s = TestServer::start("").await;
    let a = spawn(&mut s.client, bg(MODEL, APPROVE_THEN_OUTPUT)).await;
    let (_, approval) = paused(&mut s.client, &a.id).await;
    let good = approve_req(&a.id, &approval.id, pb::ApprovalDecision::Approve, "");
    let long_note = "x".repeat(64 * 1024 + 1);

    let cases: Vec<(pb::ApproveRequest, &str)> = vec![
        (
            pb::ApproveRequest {
                id: String::new(),
                ..good.clone()
            },
            "id",
        ),
        (
            pb::ApproveRequest {
                id: "not-a-uuid".into(),
                ..good.clone()
            },
            "id",
        ),
        (
            pb::ApproveRequest {
                approval_id: "not-a-uuid".into(),
                ..good.clone()
            },
            "approval_id",
        ),
        (
            pb::ApproveRequest {
                approval_id: String::new(),
                ..good.clone()
            },
            "approval_id",
        ),
        (
            pb::ApproveRequest {
                decision: pb::ApprovalDecision::Unspecified as i32,
                ..good.clone()
            },
            "decision",
        ),
        (
            pb::ApproveRequest {
                decision: 42,
                ..good.clone()
            },
            "decision",
        ),
        (
            pb::ApproveRequest {
                note: long_note.clone(),
                ..good.clone()
            },
            "note",
        ),
    ];
    for (req, field) in cases {
        let err = approve_refused(&mut s.client, req.clone()).await;
        assert_invalid(&err, &[field]);
    }

    // All bad at once: one call names all four.
    let err = approve_refused(
        &mut s.client,
        pb::ApproveRequest {
            id: String::new(),
            approval_id: "nope".into(),
            decision: pb::ApprovalDecision::Unspecified as i32,
            note: long_note,
        },
    )
    .await;
    assert_invalid(&err, &["id", "approval_id", "decision", "note"]);

    // None of that touched the agent; a note of exactly 64 KiB is fine.
    let still = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&still), pb::AgentStatus::AwaitingApproval);
    assert_eq!(still.approval.as_ref(), Some(&approval));
    let note = "n".repeat(64 * 1024);
    let resumed = decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Deny,
        &note,
    )
    .await;
    assert!(is_resumed(&resumed), "{resumed:?}");
    let done = settled(&mut s.client, &a.id).await;
    assert_eq!(done.result, format!("denied: shell: {note}\nafter"));
    s.handle.shutdown().await.unwrap();
}

// ----- resuming under limits ------------------------------------------------------------

const BUCKET_OF_ONE: &str = "[limits]\ndefault_concurrency = 10\nmax_background_agents = 10\n\
     max_concurrent_per_parent = 10\n\
     [limits.model_concurrency]\n\"acme/m1\" = 1\n";

#[tokio::test]
async fn an_approved_agent_waits_for_its_bucket_and_starts_ahead_of_newer_agents() {
    let mut s = TestServer::start(BUCKET_OF_ONE).await;
    let mut events = watch(&mut s.client, pb::WatchAgentsRequest::default()).await;

    // A pauses for approval and gives its bucket slot back ...
    let a = spawn(&mut s.client, bg(MODEL, "approve shell\nwait_steer")).await;
    assert_eq!(status(&a), pb::AgentStatus::Running);
    let ev = wait_for_event(&mut events, &a.id, Kind::AwaitingApproval).await;
    let approval = ev
        .agent
        .and_then(|ag| ag.approval)
        .expect("AWAITING_APPROVAL event carries the approval");

    // ... so B takes it, and C (newer) queues behind B.
    let b = spawn(&mut s.client, bg(MODEL, "wait_steer")).await;
    assert_eq!(status(&b), pb::AgentStatus::Running, "{b:?}");
    let c = spawn(&mut s.client, bg(MODEL, "output c")).await;
    assert_eq!(status(&c), pb::AgentStatus::Queued, "{c:?}");

    // Approving A while the bucket is full queues it.
    let resumed = decide(
        &mut s.client,
        &a.id,
        &approval.id,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    assert_eq!(status(&resumed), pb::AgentStatus::Queued, "{resumed:?}");
    assert!(!resumed.queue_reason.is_empty(), "{resumed:?}");
    assert!(resumed.approval.is_none(), "{resumed:?}");
    let a_now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&a_now), pb::AgentStatus::Queued);

    // B ends: the freed slot goes to A, not to the newer C.
    s.client
        .steer(pb::SteerRequest {
            id: b.id.clone(),
            message: "go".into(),
        })
        .await
        .expect("steer succeeds");
    let first = wait_for(&mut events, |ev| {
        ev.kind == Kind::Started as i32
            && ev
                .agent
                .as_ref()
                .is_some_and(|ag| ag.id == a.id || ag.id == c.id)
    })
    .await;
    let started = first.agent.unwrap();
    assert_eq!(
        started.id, a.id,
        "the approved agent (older) must start before the newer queued one"
    );
    // A holds the slot (waiting for a steer); C is still queued.
    let c_now = status_of(&mut s.client, &c.id).await;
    assert_eq!(status(&c_now), pb::AgentStatus::Queued, "{c_now:?}");

    s.client
        .steer(pb::SteerRequest {
            id: a.id.clone(),
            message: "go".into(),
        })
        .await
        .expect("steer succeeds");
    let all = await_all(&mut s.client, &[&a.id, &b.id, &c.id]).await;
    assert!(
        all.iter().all(|x| status(x) == pb::AgentStatus::Done),
        "{all:?}"
    );
    assert_eq!(all[0].result, "approved: shell\nsteer: go");
    assert_eq!(all[2].result, "c");
    s.handle.shutdown().await.unwrap();
}

// ----- cancel ------------------------------------------------------------------------------

#[tokio::test]
async fn cancelling_an_agent_awaiting_approval_frees_its_global_slot() {
    let mut s = TestServer::start("[limits]\nmax_background_agents = 1\n").await;
    let a = spawn(&mut s.client, bg(MODEL, APPROVE_THEN_OUTPUT)).await;
    let (_, approval) = paused(&mut s.client, &a.id).await;

    // The paused agent keeps its global slot.
    let err = s
        .client
        .spawn(bg(MODEL, "output b"))
        .await
        .expect_err("the global cap is reached");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");

    let cancelled = cancel(&mut s.client, &a.id).await;
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert_eq!(cancelled[0].id, a.id);
    assert_eq!(status(&cancelled[0]), pb::AgentStatus::Cancelled);
    let now = status_of(&mut s.client, &a.id).await;
    assert_eq!(status(&now), pb::AgentStatus::Cancelled);
    assert!(now.approval.is_none(), "{now:?}");

    // The slot is free again.
    let b = spawn(&mut s.client, bg(MODEL, "output b")).await;
    assert!(
        matches!(status(&b), pb::AgentStatus::Running | pb::AgentStatus::Done),
        "{b:?}"
    );
    let b = settled(&mut s.client, &b.id).await;
    assert_eq!(b.result, "b");

    // And the old approval can no longer be decided.
    let err = approve_refused(
        &mut s.client,
        approve_req(&a.id, &approval.id, pb::ApprovalDecision::Approve, ""),
    )
    .await;
    assert_failed_precondition(&err, "NOT_AWAITING_APPROVAL");
    s.handle.shutdown().await.unwrap();
}

// ----- foreground --------------------------------------------------------------------------

#[tokio::test]
async fn a_foreground_spawn_returns_at_the_approval_and_finishes_after_it() {
    let mut s = TestServer::start("").await;
    let spawned = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.client.spawn(fg(MODEL, APPROVE_THEN_OUTPUT)),
    )
    .await
    .expect("a foreground spawn returns once the agent is settled")
    .expect("spawn succeeds")
    .into_inner()
    .agent
    .expect("agent set");
    assert_eq!(
        status(&spawned),
        pb::AgentStatus::AwaitingApproval,
        "{spawned:?}"
    );
    assert!(!spawned.background);
    let approval = spawned.approval.clone().expect("approval set");
    assert_eq!(approval.tool_name, "shell");

    // Returning did not cancel it: it is still paused.
    let still = status_of(&mut s.client, &spawned.id).await;
    assert_eq!(status(&still), pb::AgentStatus::AwaitingApproval);

    let resumed = decide(
        &mut s.client,
        &spawned.id,
        &approval.id,
        pb::ApprovalDecision::Approve,
        "",
    )
    .await;
    assert!(is_resumed(&resumed), "{resumed:?}");
    let done = settled(&mut s.client, &spawned.id).await;
    assert_eq!(status(&done), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, "approved: shell\nafter");
    s.handle.shutdown().await.unwrap();
}
