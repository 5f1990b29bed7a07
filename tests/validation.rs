//! Every malformed request is INVALID_ARGUMENT with `google.rpc.BadRequest`
//! field violations naming the field, and changes nothing.

mod common;

use common::*;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tonic::{transport::Channel, Code};

type Client = AgentServiceClient<Channel>;

const MODEL: &str = "acme/m1";

fn secs(seconds: i64) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos: 0 }
}

fn some_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Asserts `err` is INVALID_ARGUMENT with reason INVALID_REQUEST and a field
/// violation for which `names_field` holds; returns the violated fields.
fn assert_invalid_by(err: &tonic::Status, what: &str, names_field: impl Fn(&str) -> bool) {
    assert_eq!(err.code(), Code::InvalidArgument, "{what}: {err:?}");
    assert_eq!(error_info(err).0, "INVALID_REQUEST", "{what}");
    let fields = violated_fields(err);
    assert!(
        fields.iter().any(|f| names_field(f)),
        "{what}: violations {fields:?} do not name the field"
    );
}

/// Asserts `err` is INVALID_ARGUMENT with a violation of exactly `field`.
fn assert_invalid(err: &tonic::Status, field: &str) {
    assert_invalid_by(err, field, |f| f == field);
}

/// Asserts `err` is INVALID_ARGUMENT with a violation of `field` or of one
/// of its elements (`ids` or `ids[0]`).
fn assert_invalid_list(err: &tonic::Status, field: &str) {
    assert_invalid_by(err, field, |f| {
        f == field
            || f.strip_prefix(field)
                .is_some_and(|rest| rest.starts_with('['))
    });
}

/// Every agent the server knows (live or retained), following page tokens.
async fn all_agents(client: &mut Client) -> Vec<pb::Agent> {
    list_all(
        client,
        pb::StatusRequest {
            page_size: 1000,
            ..Default::default()
        },
    )
    .await
}

async fn spawn_err(client: &mut Client, req: pb::SpawnRequest) -> tonic::Status {
    match client.spawn(req).await {
        Ok(r) => panic!("spawn accepted: {:?}", r.into_inner().agent),
        Err(e) => e,
    }
}

/// A server with one live agent, to show that a bad request leaves it
/// (and everything else) as it was.
struct World {
    s: TestServer,
    live: pb::Agent,
}

impl World {
    async fn start(toml: &str) -> Self {
        let mut s = TestServer::start(toml).await;
        let live = spawn(
            &mut s.client,
            pb::SpawnRequest {
                lead_id: "lead-v".into(),
                ..bg(MODEL, "wait_steer")
            },
        )
        .await;
        Self { s, live }
    }

    /// Nothing was created and the live agent still runs untouched.
    async fn assert_unchanged(&mut self) {
        let agents = all_agents(&mut self.s.client).await;
        assert_eq!(agents.len(), 1, "no agent was created: {agents:?}");
        let live = &agents[0];
        assert_eq!(live.id, self.live.id);
        assert_eq!(status(live), pb::AgentStatus::Running);
        assert_eq!(live.result, "");
    }

    async fn shutdown(self) {
        self.s.handle.shutdown().await.unwrap();
    }
}

// ----- Spawn ---------------------------------------------------------------------

#[tokio::test]
async fn spawn_with_an_empty_prompt_is_invalid() {
    let mut w = World::start("").await;
    let err = spawn_err(&mut w.s.client, bg(MODEL, "")).await;
    assert_invalid(&err, "prompt");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn spawn_with_a_prompt_over_max_prompt_bytes_is_invalid() {
    let mut w = World::start("[limits]\nmax_prompt_bytes = 16").await;
    let err = spawn_err(&mut w.s.client, bg(MODEL, &"x".repeat(17))).await;
    assert_invalid(&err, "prompt");
    assert!(
        err.message().contains("16"),
        "message states the limit: {}",
        err.message()
    );
    w.assert_unchanged().await;
    // Exactly at the limit is fine.
    let ok = spawn(&mut w.s.client, bg(MODEL, &"y".repeat(16))).await;
    assert_eq!(
        settled_result(&mut w.s.client, &ok.id).await,
        "y".repeat(16)
    );
    w.shutdown().await;
}

async fn settled_result(client: &mut Client, id: &str) -> String {
    await_all(client, &[id]).await.remove(0).result
}

#[tokio::test]
async fn spawn_with_a_model_not_of_the_form_provider_slash_model_is_invalid() {
    let mut w = World::start("").await;
    for model in ["gpt4", "/x", "x/", ""] {
        let err = spawn_err(&mut w.s.client, bg(model, "output hi")).await;
        assert_invalid_by(&err, model, |f| f == "model");
    }
    w.assert_unchanged().await;
    w.shutdown().await;
}

/// `[agents.NAME] default_model`: a Spawn that names no model gets it; a
/// type without one still needs the model, and the refusal says why.
#[tokio::test]
async fn spawn_without_a_model_gets_its_types_default_model_or_is_invalid_naming_model() {
    let mut w = World::start(
        "[agents.simulated]\nrunner = \"simulated\"\n\
         description = \"Scripted runs for tests\"\n\
         [agents.plain]\nrunner = \"simulated\"\n\
         [agents.defaulted]\nrunner = \"simulated\"\ndefault_model = \"acme/default\"\n",
    )
    .await;
    for agent in ["simulated", "plain"] {
        let err = spawn_err(
            &mut w.s.client,
            pb::SpawnRequest {
                agent: agent.into(),
                ..bg("", "output hi")
            },
        )
        .await;
        assert_invalid(&err, "model");
        assert!(
            err.message().contains("has no default_model"),
            "{agent}: {}",
            err.message()
        );
    }
    w.assert_unchanged().await;
    let spawned = spawn(
        &mut w.s.client,
        pb::SpawnRequest {
            agent: "defaulted".into(),
            ..bg("", "output hi")
        },
    )
    .await;
    assert_eq!(spawned.model, "acme/default");
    let settled = await_all(&mut w.s.client, &[&spawned.id]).await.remove(0);
    assert_eq!(
        (settled.model.as_str(), settled.result.as_str()),
        ("acme/default", "hi")
    );
    // A model named in the request wins over the default.
    let named = spawn(
        &mut w.s.client,
        pb::SpawnRequest {
            agent: "defaulted".into(),
            ..bg("acme/named", "output hi")
        },
    )
    .await;
    assert_eq!(named.model, "acme/named");
    w.shutdown().await;
}

#[tokio::test]
async fn spawn_without_an_agent_type_is_invalid() {
    let mut w = World::start("").await;
    let err = spawn_err(
        &mut w.s.client,
        pb::SpawnRequest {
            agent: String::new(),
            ..bg(MODEL, "output hi")
        },
    )
    .await;
    assert_invalid(&err, "agent");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn spawn_of_an_unknown_agent_type_is_invalid_and_lists_the_known_types() {
    let mut w = World::start(
        "[agents.simulated]\nrunner = \"simulated\"\n[agents.coder]\nrunner = \"simulated\"",
    )
    .await;
    let err = spawn_err(
        &mut w.s.client,
        pb::SpawnRequest {
            agent: "wizard".into(),
            ..bg(MODEL, "output hi")
        },
    )
    .await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(error_info(&err).0, "UNKNOWN_AGENT_TYPE");
    assert!(violated_fields(&err).iter().any(|f| f == "agent"));
    let message = err.message();
    for name in ["wizard", "simulated", "coder"] {
        assert!(message.contains(name), "message names {name}: {message}");
    }
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn spawn_with_a_malformed_parent_id_is_invalid() {
    let mut w = World::start("").await;
    let err = spawn_err(
        &mut w.s.client,
        pb::SpawnRequest {
            parent_id: "nope".into(),
            ..bg(MODEL, "output hi")
        },
    )
    .await;
    assert_invalid(&err, "parent_id");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn spawn_with_a_negative_timeout_is_invalid() {
    let mut w = World::start("").await;
    for timeout in [
        secs(-1),
        prost_types::Duration {
            seconds: 0,
            nanos: -1,
        },
    ] {
        let err = spawn_err(
            &mut w.s.client,
            pb::SpawnRequest {
                timeout: Some(timeout),
                ..bg(MODEL, "output hi")
            },
        )
        .await;
        assert_invalid(&err, "timeout");
    }
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn spawn_with_a_lead_id_over_256_bytes_is_invalid() {
    let mut w = World::start("").await;
    let err = spawn_err(
        &mut w.s.client,
        pb::SpawnRequest {
            lead_id: "l".repeat(257),
            ..bg(MODEL, "output hi")
        },
    )
    .await;
    assert_invalid(&err, "lead_id");
    w.assert_unchanged().await;
    // 256 bytes is the most allowed.
    let ok = spawn(
        &mut w.s.client,
        pb::SpawnRequest {
            lead_id: "l".repeat(256),
            ..bg(MODEL, "output hi")
        },
    )
    .await;
    assert_eq!(ok.lead_id.len(), 256);
    w.shutdown().await;
}

// ----- Status ----------------------------------------------------------------------

async fn status_err(client: &mut Client, req: pb::StatusRequest) -> tonic::Status {
    match client.status(req).await {
        Ok(r) => panic!("status accepted: {:?}", r.into_inner()),
        Err(e) => e,
    }
}

#[tokio::test]
async fn status_with_a_malformed_id_is_invalid() {
    let mut w = World::start("").await;
    let err = status_err(
        &mut w.s.client,
        pb::StatusRequest {
            ids: vec!["x".into()],
            ..Default::default()
        },
    )
    .await;
    assert_invalid_list(&err, "ids");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn status_with_more_than_100_ids_is_invalid() {
    let mut w = World::start("").await;
    let mut ids: Vec<String> = (0..100).map(|_| some_id()).collect();
    ids.push(w.live.id.clone());
    let err = status_err(
        &mut w.s.client,
        pb::StatusRequest {
            ids,
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "ids");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn status_with_a_page_token_it_did_not_issue_is_invalid() {
    let mut w = World::start("").await;
    let err = status_err(
        &mut w.s.client,
        pb::StatusRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "page_token");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn status_with_an_invalid_statuses_value_is_invalid() {
    let mut w = World::start("").await;
    for bad in [0, 99] {
        let err = status_err(
            &mut w.s.client,
            pb::StatusRequest {
                statuses: vec![bad],
                ..Default::default()
            },
        )
        .await;
        assert_invalid_list(&err, "statuses");
    }
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn status_with_a_lead_id_over_256_bytes_is_invalid() {
    let mut w = World::start("").await;
    let err = status_err(
        &mut w.s.client,
        pb::StatusRequest {
            lead_id: "l".repeat(257),
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "lead_id");
    w.assert_unchanged().await;
    w.shutdown().await;
}

// ----- Await -----------------------------------------------------------------------

async fn await_err(client: &mut Client, req: pb::AwaitRequest) -> tonic::Status {
    // A valid request naming the live agent would wait out its timeout;
    // an invalid one must be refused before any waiting.
    let call = client.r#await(req);
    match tokio::time::timeout(std::time::Duration::from_secs(10), call)
        .await
        .expect("an invalid Await is refused at once")
    {
        Ok(r) => panic!("await accepted: {:?}", r.into_inner()),
        Err(e) => e,
    }
}

#[tokio::test]
async fn await_with_a_malformed_id_is_invalid() {
    let mut w = World::start("").await;
    let err = await_err(
        &mut w.s.client,
        pb::AwaitRequest {
            ids: vec!["x".into()],
            ..Default::default()
        },
    )
    .await;
    assert_invalid_list(&err, "ids");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn await_with_more_than_100_ids_is_invalid() {
    let mut w = World::start("").await;
    let ids: Vec<String> = std::iter::repeat_n(w.live.id.clone(), 101).collect();
    let err = await_err(
        &mut w.s.client,
        pb::AwaitRequest {
            ids,
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "ids");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn await_with_no_ids_is_invalid() {
    let mut w = World::start("").await;
    let err = await_err(&mut w.s.client, pb::AwaitRequest::default()).await;
    assert_invalid(&err, "ids");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn await_with_a_negative_timeout_is_invalid() {
    let mut w = World::start("").await;
    let err = await_err(
        &mut w.s.client,
        pb::AwaitRequest {
            ids: vec![w.live.id.clone()],
            timeout: Some(secs(-1)),
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "timeout");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn await_with_a_timeout_over_one_hour_is_invalid() {
    let mut w = World::start("").await;
    let err = await_err(
        &mut w.s.client,
        pb::AwaitRequest {
            ids: vec![w.live.id.clone()],
            timeout: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 1,
            }),
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "timeout");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn await_of_exactly_one_hour_is_accepted() {
    let mut w = World::start("").await;
    let done = spawn(&mut w.s.client, bg(MODEL, "output x")).await;
    let resp =
        w.s.client
            .r#await(pb::AwaitRequest {
                ids: vec![done.id.clone()],
                timeout: Some(secs(3600)),
                ..Default::default()
            })
            .await
            .expect("a one-hour Await is valid")
            .into_inner();
    assert!(!resp.timed_out);
    assert_eq!(status(&resp.agents[0]), pb::AgentStatus::Done);
    w.shutdown().await;
}

// ----- Cancel ----------------------------------------------------------------------

async fn cancel_err(client: &mut Client, req: pb::CancelRequest) -> tonic::Status {
    match client.cancel(req).await {
        Ok(r) => panic!("cancel accepted: {:?}", r.into_inner()),
        Err(e) => e,
    }
}

#[tokio::test]
async fn cancel_with_both_id_and_lead_id_is_invalid() {
    let mut w = World::start("").await;
    // Both name the live agent: a server that acted on either would cancel it.
    let err = cancel_err(
        &mut w.s.client,
        pb::CancelRequest {
            id: w.live.id.clone(),
            lead_id: "lead-v".into(),
            ..Default::default()
        },
    )
    .await;
    assert_invalid_by(&err, "id and lead_id", |f| f == "id" || f == "lead_id");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn cancel_with_neither_id_nor_lead_id_is_invalid() {
    let mut w = World::start("").await;
    let err = cancel_err(&mut w.s.client, pb::CancelRequest::default()).await;
    assert_invalid_by(&err, "id or lead_id", |f| f == "id" || f == "lead_id");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn cancel_with_a_malformed_id_is_invalid() {
    let mut w = World::start("").await;
    let err = cancel_err(
        &mut w.s.client,
        pb::CancelRequest {
            id: "x".into(),
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "id");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn cancel_with_a_lead_id_over_256_bytes_is_invalid() {
    let mut w = World::start("").await;
    let err = cancel_err(
        &mut w.s.client,
        pb::CancelRequest {
            lead_id: "l".repeat(257),
            ..Default::default()
        },
    )
    .await;
    assert_invalid(&err, "lead_id");
    w.assert_unchanged().await;
    w.shutdown().await;
}

// ----- Steer -----------------------------------------------------------------------

async fn steer_err(client: &mut Client, req: pb::SteerRequest) -> tonic::Status {
    match client.steer(req).await {
        Ok(r) => panic!("steer accepted: {:?}", r.into_inner()),
        Err(e) => e,
    }
}

#[tokio::test]
async fn steer_with_a_malformed_id_is_invalid() {
    let mut w = World::start("").await;
    let err = steer_err(
        &mut w.s.client,
        pb::SteerRequest {
            id: "x".into(),
            message: "hello".into(),
        },
    )
    .await;
    assert_invalid(&err, "id");
    w.assert_unchanged().await;
    w.shutdown().await;
}

#[tokio::test]
async fn steer_with_an_empty_message_is_invalid_and_delivers_nothing() {
    let mut w = World::start("").await;
    let err = steer_err(
        &mut w.s.client,
        pb::SteerRequest {
            id: w.live.id.clone(),
            message: String::new(),
        },
    )
    .await;
    assert_invalid(&err, "message");
    // The live agent waits for exactly one steer message: had the empty one
    // been delivered, it would have ended with "steer: " and the next one
    // would be refused or lost.
    let resp =
        w.s.client
            .steer(pb::SteerRequest {
                id: w.live.id.clone(),
                message: "real".into(),
            })
            .await
            .expect("the agent still waits for its steer message")
            .into_inner();
    assert_eq!(resp.delivery, pb::SteerDelivery::Delivered as i32);
    let done = await_all(&mut w.s.client, &[&w.live.id]).await.remove(0);
    assert_eq!(status(&done), pb::AgentStatus::Done);
    assert_eq!(done.result, "steer: real");
    w.shutdown().await;
}

// ----- WatchAgents -------------------------------------------------------------------

#[tokio::test]
async fn watch_with_a_malformed_filter_is_invalid() {
    let mut w = World::start("").await;
    for (req, field) in [
        (
            pb::WatchAgentsRequest {
                ids: vec!["x".into()],
                ..Default::default()
            },
            "ids",
        ),
        (
            pb::WatchAgentsRequest {
                parent_id: "nope".into(),
                ..Default::default()
            },
            "parent_id",
        ),
        (
            pb::WatchAgentsRequest {
                lead_id: "l".repeat(257),
                ..Default::default()
            },
            "lead_id",
        ),
    ] {
        let err = match w.s.client.watch_agents(req).await {
            Ok(_) => panic!("watch with a bad {field} accepted"),
            Err(e) => e,
        };
        assert_invalid_list(&err, field);
    }
    w.assert_unchanged().await;
    w.shutdown().await;
}
