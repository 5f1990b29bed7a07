//! The lead tools over MCP (issue 33), through rmcp's client: `subagentd
//! mcp` as a child process against a test server with the simulated
//! runner. Tool listing, background spawn and the inbox await (timed out,
//! then the result once, then nothing new), refusals as `isError` with
//! their reason, steer delivered and buffered, cancel one and all,
//! continue and fork, and a spawn made idempotent by its tool-call id —
//! each of these over stdio and over `/mcp` alike.

mod common;

use common::*;
use rmcp::{
    model::{CallToolRequestParams, CallToolResult, JsonObject, RequestMetaObject},
    service::RunningService,
    transport::{ConfigureCommandExt, TokioChildProcess},
    RoleClient, ServiceExt,
};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ()>;

/// How a test's MCP client reaches the tools.
#[derive(Debug, Clone, Copy)]
enum Via {
    /// `subagentd mcp` as a child process.
    Stdio,
    /// The server's `/mcp`, the lead in the `subagentd-lead-id` header.
    Http,
}

/// An MCP client of `lead`'s tools on `server`, `via` stdio or HTTP.
async fn connect(via: Via, server: &TestServer, lead: &str) -> Client {
    match via {
        Via::Stdio => mcp(server, lead).await,
        Via::Http => {
            let mut headers = std::collections::HashMap::new();
            headers.insert(
                http::HeaderName::from_static("subagentd-lead-id"),
                http::HeaderValue::from_str(lead).unwrap(),
            );
            let url = format!("http://{}/mcp", server.handle.http_addr().expect("[http]"));
            let transport = rmcp::transport::StreamableHttpClientTransport::from_config(
                rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url)
                    .custom_headers(headers),
            );
            ().serve(transport).await.expect("MCP initialize over HTTP")
        }
    }
}

/// Each scenario named, as a module of two tests: over stdio and over HTTP.
macro_rules! over_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn over_stdio() {
                super::$name(super::Via::Stdio).await
            }
            #[tokio::test]
            async fn over_http() {
                super::$name(super::Via::Http).await
            }
        }
    )*};
}

over_both!(
    the_tools_list_in_catalogue_order_with_the_configured_types,
    spawn_in_the_background_then_await_the_result_once,
    a_long_result_is_cut_with_a_pointer_to_agent_result,
    refusals_are_tool_errors_that_say_what_to_do,
    steer_is_delivered_to_a_running_agent_and_buffered_for_a_queued_one,
    cancel_one_then_all_and_a_finished_one_is_reported_as_such,
    continue_and_fork_a_finished_agent,
    a_spawn_retried_with_the_same_tool_call_id_returns_the_first_agent,
    without_elicitation_the_approval_is_named_with_the_command_to_decide_it,
    with_lead_approvals_the_model_decides_with_agent_approve,
    a_traceparent_in_meta_becomes_the_spawns_trace,
);

/// `subagentd mcp` for `lead` against `server`.
async fn mcp(server: &TestServer, lead: &str) -> Client {
    mcp_with(server, lead, &[]).await
}

/// `subagentd mcp` for `lead` against `server`, with `extra` flags.
async fn mcp_with(server: &TestServer, lead: &str, extra: &[&str]) -> Client {
    let addr = server.handle.addr().to_string();
    let lead = lead.to_owned();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
        c.args(["mcp", "--addr", &addr, "--lead-id", &lead])
            .args(extra)
            .env_remove("SUBAGENTD_AGENT_ID")
            .env_remove("SUBAGENTD_TOKEN");
    });
    ().serve(TokioChildProcess::new(command).expect("spawn subagentd mcp"))
        .await
        .expect("MCP initialize")
}

fn args(value: Value) -> JsonObject {
    value.as_object().expect("an object").clone()
}

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    call_meta(client, tool, arguments, None).await
}

async fn call_meta(
    client: &Client,
    tool: &str,
    arguments: Value,
    meta: Option<Value>,
) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args(arguments));
    params.meta = meta.map(|m| RequestMetaObject::from(args(m)));
    client
        .call_tool(params)
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

fn structured(result: &CallToolResult) -> &Value {
    assert_ne!(result.is_error, Some(true), "refused: {}", text(result));
    result
        .structured_content
        .as_ref()
        .expect("structured content")
}

/// A spawn with every optional argument null but these.
fn spawn_args(prompt: &str, extra: Value) -> Value {
    let mut all = json!({
        "prompt": prompt, "agent": "simulated", "description": null, "model": "acme/m1",
        "wait_seconds": null, "timeout_minutes": null, "continue_from": null, "fork": null,
    });
    for (k, v) in extra.as_object().unwrap() {
        all[k] = v.clone();
    }
    all
}

async fn spawn_bg(client: &Client, prompt: &str) -> String {
    let result = call(client, "agent_spawn", spawn_args(prompt, json!({}))).await;
    structured(&result)["id"].as_str().unwrap().to_owned()
}

fn await_args(timeout: f64) -> Value {
    json!({"ids": null, "mode": null, "timeout_seconds": timeout})
}

async fn the_tools_list_in_catalogue_order_with_the_configured_types(via: Via) {
    let server = TestServer::start("").await;
    let client = connect(via, &server, "lead-list").await;
    let info = client.peer_info().expect("server info");
    assert!(info
        .instructions
        .as_deref()
        .is_some_and(|i| i.contains("agent_await")));
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "agent_spawn",
            "agent_status",
            "agent_await",
            "agent_result",
            "agent_cancel",
            "agent_steer"
        ],
        "agent_approve only with [mcp] approvals = \"lead\""
    );
    assert_eq!(
        tools[0].input_schema["properties"]["agent"]["enum"],
        json!(["simulated", null])
    );
    let again = client.list_all_tools().await.unwrap();
    assert_eq!(
        serde_json::to_value(&tools).unwrap(),
        serde_json::to_value(&again).unwrap(),
        "a stable tools/list"
    );
    client.cancel().await.unwrap();
}

async fn spawn_in_the_background_then_await_the_result_once(via: Via) {
    let mut server = TestServer::start("").await;
    let client = connect(via, &server, "lead-await").await;
    let spawned = call(
        &client,
        "agent_spawn",
        spawn_args("wait_steer\noutput hi", json!({})),
    )
    .await;
    let agent = structured(&spawned).clone();
    let id = agent["id"].as_str().unwrap().to_owned();
    assert_eq!(
        uuid::Uuid::parse_str(&id).unwrap().to_string(),
        id,
        "a full UUID"
    );
    assert_eq!(agent["status"], "running");
    assert!(text(&spawned).contains(&format!("id: {id}")));

    // Nothing finished yet: a timeout is a normal answer naming what runs.
    let waited = call(&client, "agent_await", await_args(0.2)).await;
    assert_eq!(waited.is_error, Some(false));
    let body = text(&waited);
    assert!(body.contains("timed out"), "{body}");
    assert!(
        body.contains(&format!("Still running (1):\n- {id} [running]")),
        "{body}"
    );
    assert!(waited.structured_content.is_none(), "await is prose");

    steer(&mut server.client, &id, "go").await;
    let done = call(&client, "agent_await", await_args(10.0)).await;
    let body = text(&done);
    assert!(body.contains(&format!("## {id} [done]")), "{body}");
    assert!(body.contains("steer: go\nhi"), "{body}");
    assert!(status_of(&mut server.client, &id)
        .await
        .collected_time
        .is_some());

    let again = call(&client, "agent_await", await_args(0.3)).await;
    let body = text(&again);
    assert!(body.contains("timed out"), "no repeat: {body}");
    assert!(!body.contains(&id), "no repeat: {body}");

    // agent_status shows it, collected; agent_result pages through it.
    let listed = call(&client, "agent_status", json!({"ids": null, "limit": null})).await;
    let rows = structured(&listed)["agents"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["collected"], true);
    assert_eq!(rows[0]["result_preview"], "steer: go\nhi");
    let page = call(
        &client,
        "agent_result",
        json!({"id": id, "offset": 3, "max_chars": 4, "transcript": null}),
    )
    .await;
    let body = text(&page);
    assert!(body.contains("er: "), "{body}");
    assert!(body.contains("offset 7"), "{body}");
    client.cancel().await.unwrap();
}

async fn a_long_result_is_cut_with_a_pointer_to_agent_result(via: Via) {
    let server = TestServer::start("[mcp]\nmax_result_chars = 200\n").await;
    let client = connect(via, &server, "lead-long").await;
    let long = "x".repeat(500);
    let spawned = call(
        &client,
        "agent_spawn",
        spawn_args(&format!("output {long}"), json!({"wait_seconds": 10})),
    )
    .await;
    let agent = structured(&spawned);
    assert_eq!(agent["status"], "done");
    assert_eq!(agent["result"].as_str().unwrap().len(), 200);
    assert_eq!(agent["result_offset"], 200);
    let id = agent["id"].as_str().unwrap().to_owned();
    // Returned by the spawn, so collected: the inbox has nothing.
    let waited = call(&client, "agent_await", await_args(0.2)).await;
    assert!(!text(&waited).contains(&id), "{}", text(&waited));
    let rest = call(
        &client,
        "agent_result",
        json!({"id": id, "offset": 200, "max_chars": null, "transcript": null}),
    )
    .await;
    let body = text(&rest);
    assert!(body.contains("characters 200–400 of 500"), "{body}");
    assert!(body.contains("offset 400"), "{body}");
    client.cancel().await.unwrap();
}

async fn refusals_are_tool_errors_that_say_what_to_do(via: Via) {
    let server = TestServer::start("[limits]\nmax_background_agents = 1\n").await;
    let client = connect(via, &server, "lead-refused").await;
    spawn_bg(&client, "wait_steer").await;
    let refused = call(&client, "agent_spawn", spawn_args("wait_steer", json!({}))).await;
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(
        text(&refused),
        "Refused (GLOBAL_LIMIT_REACHED): 1 of 1 background agents are live \
         (limits.max_background_agents). Wait with agent_await, or cancel one."
    );
    let unknown = call(
        &client,
        "agent_spawn",
        spawn_args("hi", json!({"agent": "nosuch"})),
    )
    .await;
    assert_eq!(unknown.is_error, Some(true));
    assert!(
        text(&unknown).contains("UNKNOWN_AGENT_TYPE"),
        "{}",
        text(&unknown)
    );
    assert!(text(&unknown).contains("simulated"), "{}", text(&unknown));
    // A malformed call is a protocol error, not a tool result.
    let mut params =
        CallToolRequestParams::new("agent_spawn").with_arguments(args(json!({"prompt": 42})));
    params.meta = None;
    assert!(client.call_tool(params).await.is_err());
    client.cancel().await.unwrap();
}

async fn steer_is_delivered_to_a_running_agent_and_buffered_for_a_queued_one(via: Via) {
    let server = TestServer::start("[limits]\ndefault_concurrency = 1\n").await;
    let client = connect(via, &server, "lead-steer").await;
    let running = spawn_bg(&client, "wait_steer\noutput one").await;
    let queued = spawn_bg(&client, "wait_steer\noutput two").await;
    let status = call(
        &client,
        "agent_status",
        json!({"ids": [queued], "limit": null}),
    )
    .await;
    let row = &structured(&status)["agents"][0];
    assert_eq!(row["status"], "queued");
    assert!(
        row["queue_reason"].as_str().unwrap().contains("1/1"),
        "{row}"
    );
    let steer = |id: &str| json!({"id": id, "message": "go"});
    // The queued one first: steering the running one frees its slot.
    let buffered = call(&client, "agent_steer", steer(&queued)).await;
    assert_eq!(structured(&buffered)["delivery"], "buffered");
    let delivered = call(&client, "agent_steer", steer(&running)).await;
    assert_eq!(structured(&delivered)["delivery"], "delivered");
    let all = call(
        &client,
        "agent_await",
        json!({"ids": null, "mode": "all", "timeout_seconds": 20}),
    )
    .await;
    let body = text(&all);
    assert!(body.contains(&format!("## {running} [done]")), "{body}");
    assert!(body.contains(&format!("## {queued} [done]")), "{body}");
    // A finished agent: an error pointing to continue_from.
    let late = call(&client, "agent_steer", steer(&running)).await;
    assert_eq!(late.is_error, Some(true));
    assert!(text(&late).contains("continue_from"), "{}", text(&late));
    client.cancel().await.unwrap();
}

async fn cancel_one_then_all_and_a_finished_one_is_reported_as_such(via: Via) {
    let server = TestServer::start("").await;
    let client = connect(via, &server, "lead-cancel").await;
    let one = spawn_bg(&client, "wait_steer").await;
    let two = spawn_bg(&client, "wait_steer").await;
    let three = spawn_bg(&client, "wait_steer").await;
    let cancel = |id: Value, all: Value| json!({"id": id, "all": all, "reason": null});
    let first = call(&client, "agent_cancel", cancel(json!(one), Value::Null)).await;
    assert_eq!(structured(&first)["cancelled"], json!([one]));
    let again = call(&client, "agent_cancel", cancel(json!(one), Value::Null)).await;
    assert_eq!(structured(&again)["already_finished"], json!([one]));
    let rest = call(&client, "agent_cancel", cancel(Value::Null, json!(true))).await;
    let mut cancelled: Vec<String> =
        serde_json::from_value(structured(&rest)["cancelled"].clone()).unwrap();
    cancelled.sort();
    let mut expected = vec![two, three];
    expected.sort();
    assert_eq!(cancelled, expected);
    client.cancel().await.unwrap();
}

async fn continue_and_fork_a_finished_agent(via: Via) {
    let server = TestServer::start("").await;
    let client = connect(via, &server, "lead-continue").await;
    let first = call(
        &client,
        "agent_spawn",
        spawn_args("output first", json!({"wait_seconds": 10})),
    )
    .await;
    let first_id = structured(&first)["id"].as_str().unwrap().to_owned();
    let next = call(
        &client,
        "agent_spawn",
        spawn_args(
            "history\noutput second",
            json!({"agent": null, "model": null, "continue_from": first_id, "wait_seconds": 10}),
        ),
    )
    .await;
    let next = structured(&next).clone();
    assert_eq!(next["status"], "done");
    assert!(
        next["result"]
            .as_str()
            .unwrap()
            .contains("turn 1 result: first"),
        "{next}"
    );
    // The first turn was continued: continuing it again names the latest.
    let stale = call(
        &client,
        "agent_spawn",
        spawn_args(
            "output again",
            json!({"agent": null, "model": null, "continue_from": first_id}),
        ),
    )
    .await;
    assert_eq!(stale.is_error, Some(true));
    assert!(
        text(&stale).contains(next["id"].as_str().unwrap()),
        "{}",
        text(&stale)
    );
    let fork = call(
        &client,
        "agent_spawn",
        spawn_args(
            "output branch",
            json!({"agent": null, "model": null, "continue_from": first_id, "fork": true}),
        ),
    )
    .await;
    assert_ne!(structured(&fork)["id"], next["id"]);
    client.cancel().await.unwrap();
}

async fn a_spawn_retried_with_the_same_tool_call_id_returns_the_first_agent(via: Via) {
    let server = TestServer::start("").await;
    let client = connect(via, &server, "lead-idempotent").await;
    let meta = || Some(json!({"subagentd/toolCallId": "call_abc"}));
    let first = call_meta(
        &client,
        "agent_spawn",
        spawn_args("wait_steer", json!({})),
        meta(),
    )
    .await;
    let retry = call_meta(
        &client,
        "agent_spawn",
        spawn_args("wait_steer", json!({})),
        meta(),
    )
    .await;
    assert_eq!(structured(&first)["id"], structured(&retry)["id"]);
    let other = call_meta(
        &client,
        "agent_spawn",
        spawn_args("wait_steer", json!({})),
        Some(json!({"subagentd/toolCallId": "call_def"})),
    )
    .await;
    assert_ne!(structured(&first)["id"], structured(&other)["id"]);
    client.cancel().await.unwrap();
}

/// An MCP client inside a command run: drives `subagentd mcp` over stdio
/// (newline-delimited JSON-RPC) and prints what `agent_spawn` and
/// `agent_await` answered, one JSON line each.
const NESTED_DRIVER: &str = r#"
import json, os, subprocess, sys
mcp = subprocess.Popen([os.environ["SUBAGENTD_BIN"], "mcp"], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True)
def send(message):
    mcp.stdin.write(json.dumps(message) + "\n")
    mcp.stdin.flush()
def answer(id):
    for line in mcp.stdout:
        message = json.loads(line)
        if message.get("id") == id:
            return message
    sys.exit("subagentd mcp ended early")
send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "nested", "version": "0"}}})
answer(1)
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "agent_spawn",
    "arguments": {"prompt": "output from the child", "agent": "simulated", "model": "acme/m1",
                  "description": "nested", "wait_seconds": None, "timeout_minutes": None,
                  "continue_from": None, "fork": None}}})
print(json.dumps(answer(2)["result"]["structuredContent"]))
send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "agent_await",
    "arguments": {"ids": None, "mode": "all", "timeout_seconds": 20}}})
print(json.dumps(answer(3)["result"]["content"][0]["text"]))
mcp.stdin.close()
sys.exit(mcp.wait())
"#;

#[tokio::test]
async fn a_nested_mcp_server_spawns_children_of_the_agent_it_runs_in() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("driver.py");
    std::fs::write(&script, NESTED_DRIVER).unwrap();
    let toml = format!(
        "[agents.simulated]\nrunner = \"simulated\"\n\n[agents.nester]\nrunner = \"command\"\n\
         command = [\"python3\", {}]\nenv = {{ SUBAGENTD_BIN = {} }}\n",
        serde_json::to_string(script.to_str().unwrap()).unwrap(),
        serde_json::to_string(env!("CARGO_BIN_EXE_subagentd")).unwrap()
    );
    let mut server = TestServer::start(&toml).await;
    let outer = spawn(
        &mut server.client,
        subagentd::pb::SpawnRequest {
            agent: "nester".into(),
            model: "acme/m1".into(),
            prompt: "go".into(),
            background: true,
            lead_id: "outer-lead".into(),
            ..Default::default()
        },
    )
    .await;
    let outer = await_all(&mut server.client, &[&outer.id]).await.remove(0);
    assert_eq!(
        status(&outer),
        subagentd::pb::AgentStatus::Done,
        "{outer:?}"
    );
    let mut lines = outer.result.lines();
    let spawned: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let child_id = spawned["id"].as_str().unwrap();
    let child = status_of(&mut server.client, child_id).await;
    assert_eq!(child.parent_id, outer.id, "a child of the agent it runs in");
    assert_eq!(child.depth, 2);
    assert_eq!(child.lead_id, "outer-lead", "in its parent's lead");
    let awaited: String = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert!(
        awaited.contains(&format!("## {child_id} [done]")) && awaited.contains("from the child"),
        "the inbox is the agent's children: {awaited}"
    );
    assert!(child.collected_time.is_some());
}

/// A client whose user answers every elicitation with `decision`.
#[derive(Clone)]
struct Approver {
    decision: &'static str,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl rmcp::ClientHandler for Approver {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        rmcp::model::ClientConfig::new(
            rmcp::model::ClientCapabilities::builder()
                .enable_elicitation()
                .build(),
            rmcp::model::Implementation::new("approver", "0.0.0"),
        )
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        if let rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } = &request {
            self.asked.lock().unwrap().push(message.clone());
        }
        Ok(
            rmcp::model::ElicitResult::new(rmcp::model::ElicitationAction::Accept)
                .with_content(json!({"decision": self.decision, "note": "from the test"})),
        )
    }
}

#[tokio::test]
async fn a_pending_approval_is_put_to_the_user_and_the_wait_goes_on() {
    let server = TestServer::start("").await;
    let addr = server.handle.addr().to_string();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
        c.args(["mcp", "--addr", &addr, "--lead-id", "lead-elicit"])
            .env_remove("SUBAGENTD_AGENT_ID");
    });
    let approver = Approver {
        decision: "approve",
        asked: Default::default(),
    };
    let client = approver
        .clone()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap();
    let id = spawn_bg_with(&client, "approve shell\noutput after").await;
    let done = call_with(
        &client,
        "agent_await",
        json!({"ids": null, "mode": null, "timeout_seconds": 20}),
    )
    .await;
    let body = text(&done);
    assert!(
        body.contains(&format!("The user approved {id}'s call of shell.")),
        "{body}"
    );
    assert!(body.contains(&format!("## {id} [done]")), "{body}");
    assert!(body.contains("approved: shell"), "{body}");
    let asked = approver.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains("asks to call shell"), "{asked:?}");
    client.cancel().await.unwrap();
}

async fn without_elicitation_the_approval_is_named_with_the_command_to_decide_it(via: Via) {
    let server = TestServer::start("").await;
    let client = connect(via, &server, "lead-no-elicit").await;
    let id = spawn_bg(&client, "approve shell\noutput after").await;
    let pending = call(&client, "agent_await", await_args(20.0)).await;
    let body = text(&pending);
    assert!(
        body.contains(&format!("## {id} [awaiting_approval]")),
        "{body}"
    );
    assert!(
        body.contains(&format!("`subagentd approve {id} ")),
        "{body}"
    );
    // Still pending: agent_status shows the approval too.
    let status = call(&client, "agent_status", json!({"ids": [id], "limit": null})).await;
    let row = &structured(&status)["agents"][0];
    assert_eq!(row["approval_tool"], "shell");
    assert!(row["approval_id"].is_string());
    assert_eq!(row["collected"], false);
    client.cancel().await.unwrap();
}

async fn with_lead_approvals_the_model_decides_with_agent_approve(via: Via) {
    let server = TestServer::start("[mcp]\napprovals = \"lead\"\n").await;
    let client = connect(via, &server, "lead-decides").await;
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names.last().map(String::as_str), Some("agent_approve"));
    let id = spawn_bg(&client, "approve shell\noutput after").await;
    let pending = call(&client, "agent_await", await_args(20.0)).await;
    assert!(
        text(&pending).contains("Decide it with agent_approve"),
        "{}",
        text(&pending)
    );
    let status = call(&client, "agent_status", json!({"ids": [id], "limit": null})).await;
    let approval_id = structured(&status)["agents"][0]["approval_id"].clone();
    let decided = call(
        &client,
        "agent_approve",
        json!({"id": id, "approval_id": approval_id, "decision": "deny", "note": "not now"}),
    )
    .await;
    assert_eq!(structured(&decided)["decision"], "deny");
    let done = call(&client, "agent_await", await_args(20.0)).await;
    assert!(
        text(&done).contains("denied: shell: not now"),
        "{}",
        text(&done)
    );
    client.cancel().await.unwrap();
}

async fn spawn_bg_with<S: rmcp::service::Service<RoleClient>>(
    client: &RunningService<RoleClient, S>,
    prompt: &str,
) -> String {
    let result = call_with(client, "agent_spawn", spawn_args(prompt, json!({}))).await;
    structured(&result)["id"].as_str().unwrap().to_owned()
}

async fn call_with<S: rmcp::service::Service<RoleClient>>(
    client: &RunningService<RoleClient, S>,
    tool: &str,
    arguments: Value,
) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args(arguments)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

async fn a_traceparent_in_meta_becomes_the_spawns_trace(via: Via) {
    let mut server = TestServer::start("").await;
    let client = connect(via, &server, "lead-trace").await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let spawned = call_meta(
        &client,
        "agent_spawn",
        spawn_args("output traced", json!({})),
        Some(json!({"traceparent": format!("00-{trace}-00f067aa0ba902b7-01")})),
    )
    .await;
    let id = structured(&spawned)["id"].as_str().unwrap().to_owned();
    assert_eq!(status_of(&mut server.client, &id).await.trace_id, trace);
    client.cancel().await.unwrap();
}

/// Counts the progress notifications it receives.
#[derive(Clone, Default)]
struct ProgressCounter(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl rmcp::ClientHandler for ProgressCounter {
    async fn on_progress(
        &self,
        _params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_long_await_sends_progress_while_it_waits() {
    let server = TestServer::start("").await;
    let addr = server.handle.addr().to_string();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
        c.args(["mcp", "--addr", &addr, "--lead-id", "lead-progress"])
            .env_remove("SUBAGENTD_AGENT_ID");
    });
    let counter = ProgressCounter::default();
    let client = counter
        .clone()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap();
    spawn_bg_with(&client, "wait_steer").await;
    // Nothing finishes: the await runs to its timeout, past one progress
    // interval (5 s).
    let waited = call_with(&client, "agent_await", await_args(6.0)).await;
    assert!(text(&waited).contains("timed out"), "{}", text(&waited));
    assert!(
        counter.0.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "no progress notification"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn at_end_of_input_the_agents_run_on_unless_cancel_on_exit() {
    let mut server = TestServer::start("").await;
    let client = mcp(&server, "lead-stays").await;
    let kept = spawn_bg(&client, "wait_steer").await;
    client.cancel().await.unwrap();
    let client = mcp_with(&server, "lead-goes", &["--cancel-on-exit"]).await;
    let gone = spawn_bg(&client, "wait_steer").await;
    client.cancel().await.unwrap();
    let ended = await_all(&mut server.client, &[&gone]).await.remove(0);
    assert_eq!(status(&ended), subagentd::pb::AgentStatus::Cancelled);
    assert!(
        ended
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("MCP session of lead lead-goes ended"),
        "{ended:?}"
    );
    assert_eq!(
        status(&status_of(&mut server.client, &kept).await),
        subagentd::pb::AgentStatus::Running,
        "left to its deadline"
    );
}

/// With a key that may spawn but not approve (`frontend` only), the user's
/// decision is refused: the answer says so once, without asking again.
#[tokio::test]
async fn a_decision_the_credential_may_not_apply_is_reported_not_asked_again() {
    let frontend = common::auth::key("fe", "default", &["frontend"], None);
    let server = TestServer::start(&common::auth::config(&[("fe", &frontend)], "")).await;
    let addr = server.handle.addr().to_string();
    let key = frontend.key.clone();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
        c.args([
            "mcp",
            "--addr",
            &addr,
            "--lead-id",
            "lead-no-approver",
            "--token",
            &key,
        ])
        .env_remove("SUBAGENTD_AGENT_ID");
    });
    let approver = Approver {
        decision: "approve",
        asked: Default::default(),
    };
    let client = approver
        .clone()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap();
    let id = spawn_bg_with(&client, "approve shell\noutput after").await;
    let answer = call_with(&client, "agent_await", await_args(20.0)).await;
    let body = text(&answer);
    assert!(body.contains("was not applied"), "{body}");
    assert!(body.contains("PERMISSION_DENIED"), "{body}");
    assert!(
        body.contains(&format!("## {id} [awaiting_approval]")),
        "{body}"
    );
    assert_eq!(approver.asked.lock().unwrap().len(), 1, "asked once");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn agent_status_puts_a_pending_approval_to_the_user_too() {
    let mut server = TestServer::start("").await;
    let addr = server.handle.addr().to_string();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
        c.args(["mcp", "--addr", &addr, "--lead-id", "lead-status-asks"])
            .env_remove("SUBAGENTD_AGENT_ID");
    });
    let approver = Approver {
        decision: "approve",
        asked: Default::default(),
    };
    let client = approver
        .clone()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap();
    let id = spawn_bg_with(&client, "approve shell\noutput after").await;
    // Settled: awaiting approval.
    let paused = await_all(&mut server.client, &[&id]).await.remove(0);
    assert_eq!(
        status(&paused),
        subagentd::pb::AgentStatus::AwaitingApproval
    );
    let listed = call_with(&client, "agent_status", json!({"ids": [id], "limit": null})).await;
    let row = &structured(&listed)["agents"][0];
    assert_ne!(row["status"], "awaiting_approval", "{row}");
    assert!(row["approval_id"].is_null(), "{row}");
    assert_eq!(approver.asked.lock().unwrap().len(), 1);
    client.cancel().await.unwrap();
}
