//! `/mcp` on the `[http]` listener (issue 33 §4), through rmcp's streamable
//! HTTP client: the tools as over stdio, the lead from the
//! `subagentd-lead-id` header or the credential's principal, 401 without a
//! valid credential, the caller's roles applied (a viewer cannot spawn),
//! and the tenant's agents only.

mod common;

use std::collections::HashMap;

use common::{auth, *};
use rmcp::{
    model::{CallToolRequestParams, CallToolResult, JsonObject},
    service::RunningService,
    transport::{
        streamable_http_client::StreamableHttpClientTransportConfig, StreamableHttpClientTransport,
    },
    RoleClient, ServiceExt,
};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ()>;

async fn connect(
    addr: std::net::SocketAddr,
    key: Option<&str>,
    lead: Option<&str>,
) -> Result<Client, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"));
    if let Some(key) = key {
        config = config.auth_header(key);
    }
    if let Some(lead) = lead {
        let mut headers = HashMap::new();
        headers.insert(
            http::HeaderName::from_static("subagentd-lead-id"),
            http::HeaderValue::from_str(lead).unwrap(),
        );
        config = config.custom_headers(headers);
    }
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .map_err(|e| e.to_string())
}

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let arguments: JsonObject = arguments.as_object().unwrap().clone();
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn spawn_args(prompt: &str) -> Value {
    json!({
        "prompt": prompt, "agent": "simulated", "description": null, "model": "acme/m1",
        "wait_seconds": null, "timeout_minutes": null, "continue_from": null, "fork": null,
    })
}

fn spawned_id(result: &CallToolResult) -> String {
    assert_ne!(result.is_error, Some(true), "{}", text(result));
    result.structured_content.as_ref().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn mcp_over_http_spawns_under_the_lead_header_and_awaits_the_result() {
    let mut server = TestServer::start("").await;
    let http = server.handle.http_addr().expect("[http] is on by default");
    let client = connect(http, None, Some("http-lead")).await.unwrap();
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names.len(), 6, "{names:?}");
    let id = spawned_id(&call(&client, "agent_spawn", spawn_args("output over http")).await);
    let agent = status_of(&mut server.client, &id).await;
    assert_eq!(agent.lead_id, "http-lead");
    let done = call(
        &client,
        "agent_await",
        json!({"ids": null, "mode": null, "timeout_seconds": 10}),
    )
    .await;
    assert!(text(&done).contains("\nover http"), "{}", text(&done));

    // Without the header and without authentication: the shared lead.
    let shared = connect(http, None, None).await.unwrap();
    let id = spawned_id(&call(&shared, "agent_spawn", spawn_args("hi")).await);
    assert_eq!(status_of(&mut server.client, &id).await.lead_id, "mcp-http");
    client.cancel().await.unwrap();
    shared.cancel().await.unwrap();
}

#[tokio::test]
async fn mcp_over_http_authenticates_as_grpc_does() {
    let lead = auth::key("lead1", "team-a", &["frontend"], None);
    let viewer = auth::key("view1", "team-a", &["viewer"], None);
    let other = auth::key("lead2", "team-b", &["frontend"], None);
    let toml = auth::config(
        &[("lead1", &lead), ("view1", &viewer), ("lead2", &other)],
        "",
    );
    let mut server = TestServer::start(&toml).await;
    let http = server.handle.http_addr().unwrap();

    // No key, or a wrong one: 401 before any MCP.
    let plain = reqwest::Client::new()
        .post(format!("http://{http}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 401);
    assert_eq!(plain.headers()["www-authenticate"], "Bearer");
    assert!(connect(http, Some("sk_nope"), None).await.is_err());
    // A web page's request (with Origin) is refused whatever its key.
    let from_page = reqwest::Client::new()
        .post(format!("http://{http}/mcp"))
        .header("origin", "http://evil.example")
        .bearer_auth(&lead.key)
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(from_page.status(), 403);

    // The lead key spawns; the agent is in its tenant, under its principal.
    let client = connect(http, Some(&lead.key), None).await.unwrap();
    let id = spawned_id(&call(&client, "agent_spawn", spawn_args("wait_steer")).await);
    let agent = status_of_as(&mut server.client, &id, &lead.key).await;
    assert_eq!(agent.tenant, "team-a");
    assert_eq!(agent.lead_id, "key:lead1");

    // A viewer may look but not spawn: a tool error naming the reason.
    let viewing = connect(http, Some(&viewer.key), Some("key:lead1"))
        .await
        .unwrap();
    let refused = call(&viewing, "agent_spawn", spawn_args("hi")).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text(&refused).contains("PERMISSION_DENIED"),
        "{}",
        text(&refused)
    );
    let listed = call(
        &viewing,
        "agent_status",
        json!({"ids": null, "limit": null}),
    )
    .await;
    assert!(text(&listed).contains(&id), "{}", text(&listed));

    // Another tenant's key, naming the same lead, sees none of it.
    let stranger = connect(http, Some(&other.key), Some("key:lead1"))
        .await
        .unwrap();
    let listed = call(
        &stranger,
        "agent_status",
        json!({"ids": null, "limit": null}),
    )
    .await;
    assert!(!text(&listed).contains(&id), "{}", text(&listed));
    let refused = call(
        &stranger,
        "agent_cancel",
        json!({"id": id, "all": null, "reason": null}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text(&refused).contains("AGENT_NOT_FOUND"),
        "{}",
        text(&refused)
    );
    for c in [client, viewing, stranger] {
        c.cancel().await.unwrap();
    }
}

async fn status_of_as(
    client: &mut subagentd::pb::agent_service_client::AgentServiceClient<tonic::transport::Channel>,
    id: &str,
    key: &str,
) -> subagentd::pb::Agent {
    client
        .status(auth::with_key(
            subagentd::pb::StatusRequest {
                ids: vec![id.to_owned()],
                ..Default::default()
            },
            key,
        ))
        .await
        .expect("Status")
        .into_inner()
        .agents
        .remove(0)
}

#[tokio::test]
async fn an_open_http_listener_without_authentication_is_refused() {
    let mut config: subagentd::config::Config =
        subagentd::config::ConfigSource::from_toml_str("").unwrap();
    config.server.listen = "127.0.0.1:0".into();
    config.telemetry.metrics_listen = String::new();
    config.http.listen = "0.0.0.0:0".into();
    config.store.backend = subagentd::config::StoreBackend::Memory;
    let refused = subagentd::server::start(config, subagentd::config::ConfigSource::default())
        .await
        .expect_err("an unauthenticated /mcp on 0.0.0.0");
    assert!(
        refused.to_string().contains("without authentication"),
        "{refused}"
    );
}
