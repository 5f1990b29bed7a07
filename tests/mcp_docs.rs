//! The host configuration snippets of docs/mcp.md, run: each fenced block
//! tagged `<host> stdio` or `<host> http` is parsed the way that host reads
//! its config, and what it describes is started against a test server
//! that requires an API key (the snippet's token placeholder replaced by a
//! real key, its addresses by the test server's): the stdio command is run
//! as the host would run it, the HTTP endpoint is called with the
//! snippet's headers. Each must list the tools and spawn under the
//! snippet's lead.

mod common;

use std::collections::HashMap;

use common::{auth, *};
use rmcp::{
    model::{CallToolRequestParams, CallToolResult},
    service::RunningService,
    transport::{
        streamable_http_client::StreamableHttpClientTransportConfig, ConfigureCommandExt,
        StreamableHttpClientTransport, TokioChildProcess,
    },
    RoleClient, ServiceExt,
};
use serde_json::{json, Value};

const HOSTS: [&str; 5] = ["claude-code", "codex", "opencode", "cursor", "gemini"];
/// How the snippets write "the API key from the environment".
const TOKEN_PLACEHOLDERS: [&str; 4] = [
    "${env:SUBAGENTD_TOKEN}",
    "${SUBAGENTD_TOKEN}",
    "{env:SUBAGENTD_TOKEN}",
    "$SUBAGENTD_TOKEN",
];

/// A snippet: (host, transport, language, text).
fn snippets() -> Vec<(String, String, String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/mcp.md")).unwrap();
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let words: Vec<&str> = info.split_whitespace().collect();
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        if let [lang, host, transport] = words[..] {
            out.push((host.into(), transport.into(), lang.into(), body.join("\n")));
        }
    }
    out
}

fn parse(lang: &str, text: &str) -> Value {
    match lang {
        "json" => serde_json::from_str(text).unwrap(),
        "toml" => serde_json::to_value(toml::from_str::<toml::Value>(text).unwrap()).unwrap(),
        other => panic!("a snippet in {other}"),
    }
}

fn fill(s: &str, key: &str, grpc: &str, http: &str) -> String {
    let mut s = s
        .replace("http://127.0.0.1:50051", &format!("http://{grpc}"))
        .replace("127.0.0.1:50080", http);
    for placeholder in TOKEN_PLACEHOLDERS {
        s = s.replace(placeholder, key);
    }
    s
}

/// The server entry of a host's config.
fn entry<'a>(host: &str, config: &'a Value) -> &'a Value {
    match host {
        "codex" => &config["mcp_servers"]["subagentd"],
        "opencode" => &config["mcp"]["subagentd"],
        _ => &config["mcpServers"]["subagentd"],
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn env_of(v: &Value) -> Vec<(String, String)> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The program, arguments and environment a host runs for a stdio entry.
fn stdio_command(host: &str, entry: &Value) -> (String, Vec<String>, Vec<(String, String)>) {
    match host {
        "opencode" => {
            assert_eq!(entry["type"], "local");
            let command = strings(&entry["command"]);
            (
                command[0].clone(),
                command[1..].to_vec(),
                env_of(&entry["environment"]),
            )
        }
        _ => (
            entry["command"].as_str().unwrap().to_owned(),
            strings(&entry["args"]),
            env_of(&entry["env"]),
        ),
    }
}

/// The URL and headers a host sends for an HTTP entry (`${…}` filled in).
fn http_endpoint(host: &str, entry: &Value, key: &str) -> (String, Vec<(String, String)>) {
    let (url, mut headers) = match host {
        "codex" => (&entry["url"], env_of(&entry["http_headers"])),
        "gemini" => (&entry["httpUrl"], env_of(&entry["headers"])),
        "claude-code" => {
            assert_eq!(entry["type"], "http");
            (&entry["url"], env_of(&entry["headers"]))
        }
        "opencode" => {
            assert_eq!(entry["type"], "remote");
            (&entry["url"], env_of(&entry["headers"]))
        }
        _ => (&entry["url"], env_of(&entry["headers"])),
    };
    if let Some(var) = entry["bearer_token_env_var"].as_str() {
        assert_eq!(var, "SUBAGENTD_TOKEN");
        headers.push(("Authorization".into(), format!("Bearer {key}")));
    }
    (url.as_str().unwrap().to_owned(), headers)
}

async fn exercise<S: rmcp::service::Service<RoleClient>>(
    what: &str,
    client: RunningService<RoleClient, S>,
    server: &mut TestServer,
    key: &str,
    lead: &str,
) {
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 6, "{what}");
    let args = json!({
        "prompt": "output hello", "agent": "simulated", "description": null, "model": "acme/m1",
        "wait_seconds": 10, "timeout_minutes": null, "continue_from": null, "fork": null,
    });
    let result: CallToolResult = client
        .call_tool(
            CallToolRequestParams::new("agent_spawn")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{what}: {result:?}");
    let spawned = result.structured_content.unwrap();
    assert_eq!(spawned["status"], "done", "{what}");
    let agent = server
        .client
        .status(auth::with_key(
            subagentd::pb::StatusRequest {
                ids: vec![spawned["id"].as_str().unwrap().to_owned()],
                ..Default::default()
            },
            key,
        ))
        .await
        .unwrap()
        .into_inner()
        .agents
        .remove(0);
    assert_eq!(agent.lead_id, lead, "{what}: the snippet's lead");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn every_host_snippet_in_the_docs_reaches_a_server_that_requires_a_key() {
    let frontend = auth::key("docs", "default", &["frontend"], None);
    let toml = auth::config(&[("docs", &frontend)], "");
    let mut server = TestServer::start(&toml).await;
    let grpc = server.handle.addr().to_string();
    let http = server.handle.http_addr().unwrap().to_string();
    let snippets = snippets();
    let covered: Vec<(String, String)> = snippets
        .iter()
        .map(|(h, t, _, _)| (h.clone(), t.clone()))
        .collect();
    for host in HOSTS {
        for transport in ["stdio", "http"] {
            assert!(
                covered.contains(&(host.to_owned(), transport.to_owned())),
                "docs/mcp.md has no {host} {transport} snippet"
            );
        }
    }
    for (host, transport, lang, text) in snippets {
        let what = format!("{host} {transport}");
        let config = parse(&lang, &fill(&text, &frontend.key, &grpc, &http));
        let entry = entry(&host, &config);
        assert!(entry.is_object(), "{what}: no subagentd entry");
        if transport == "stdio" {
            let (program, args, env) = stdio_command(&host, entry);
            assert_eq!(program, "subagentd", "{what}");
            let lead = args
                .windows(2)
                .find(|w| w[0] == "--lead-id")
                .map(|w| w[1].clone())
                .unwrap_or_else(|| panic!("{what}: give the lead an id"));
            let mut env = env;
            // Codex forwards the variables `env_vars` names from its own
            // environment.
            for var in strings(&entry["env_vars"]) {
                assert_eq!(var, "SUBAGENTD_TOKEN", "{what}");
                env.push((var, frontend.key.clone()));
            }
            let command =
                tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd")).configure(|c| {
                    c.args(&args)
                        .env_remove("SUBAGENTD_TOKEN")
                        .env_remove("SUBAGENTD_ADDR")
                        .env_remove("SUBAGENTD_AGENT_ID")
                        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                });
            let client =
                ().serve(TokioChildProcess::new(command).unwrap())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            exercise(&what, client, &mut server, &frontend.key, &lead).await;
        } else {
            let (url, headers) = http_endpoint(&host, entry, &frontend.key);
            assert!(url.ends_with("/mcp"), "{what}: {url}");
            let mut config = StreamableHttpClientTransportConfig::with_uri(url);
            let mut custom = HashMap::new();
            let mut lead = String::new();
            for (name, value) in headers {
                if name.eq_ignore_ascii_case("authorization") {
                    let token = value.strip_prefix("Bearer ").expect("a bearer header");
                    config = config.auth_header(token);
                } else {
                    if name == "subagentd-lead-id" {
                        lead = value.clone();
                    }
                    custom.insert(
                        http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                        http::HeaderValue::from_str(&value).unwrap(),
                    );
                }
            }
            assert!(!lead.is_empty(), "{what}: give the lead an id");
            let client = ()
                .serve(StreamableHttpClientTransport::from_config(
                    config.custom_headers(custom),
                ))
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            exercise(&what, client, &mut server, &frontend.key, &lead).await;
        }
    }
}
