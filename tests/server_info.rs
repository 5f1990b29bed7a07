//! GetServerInfo over loopback gRPC: the version and every configured agent
//! type (description, runner, default model, continuable) as a client that
//! adapts to the server reads them, after a reload too, and the `[mcp]`
//! settings; any authenticated caller may ask, an unauthenticated one may
//! not.

mod common;

use common::{
    auth::{config, key, with_key},
    error_info, TestServer,
};
use subagentd::pb;
use tonic::Code;

const TYPES: &str = r#"
[agents.simulated]
runner = "simulated"
description = "Scripted runs: the prompt says what to output."
default_model = "acme/small"

[agents.reviewer]
runner = "worker"
continuable = false
"#;

fn type_named<'a>(info: &'a pb::GetServerInfoResponse, name: &str) -> &'a pb::AgentTypeInfo {
    info.agent_types
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} in {info:?}"))
}

#[tokio::test]
async fn server_info_lists_the_version_and_every_agent_type_as_configured() {
    let s = TestServer::start_with_file(TYPES).await;
    let mut c = s.client.clone();
    let info = c
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    let names: Vec<&str> = info.agent_types.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["reviewer", "simulated"], "sorted by name");
    assert_eq!(
        type_named(&info, "simulated"),
        &pb::AgentTypeInfo {
            name: "simulated".into(),
            description: "Scripted runs: the prompt says what to output.".into(),
            runner: "simulated".into(),
            default_model: "acme/small".into(),
            continuable: true,
        }
    );
    assert_eq!(
        type_named(&info, "reviewer"),
        &pb::AgentTypeInfo {
            name: "reviewer".into(),
            description: String::new(),
            runner: "worker".into(),
            default_model: String::new(),
            continuable: false,
        }
    );
    assert_eq!(
        info.mcp,
        Some(pb::McpSettings {
            approvals: "human".into(),
            max_await: Some(prost_types::Duration {
                seconds: 50,
                nanos: 0
            }),
            max_result_chars: 8000,
        }),
        "the [mcp] defaults"
    );

    // A reload changes what it says at once.
    s.rewrite_and_reload(&format!(
        "{TYPES}\n[agents.writer]\nrunner = \"simulated\"\ndescription = \"Writes.\"\n"
    ))
    .unwrap();
    let info = c
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(type_named(&info, "writer").description, "Writes.");
    assert_eq!(info.agent_types.len(), 3);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn server_info_carries_the_mcp_settings_as_configured() {
    let s = TestServer::start(
        "[mcp]\napprovals = \"lead\"\nmax_await = \"20s\"\nmax_result_chars = 500\n",
    )
    .await;
    let info = s
        .client
        .clone()
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let mcp = info.mcp.expect("[mcp] settings");
    assert_eq!(mcp.approvals, "lead");
    assert_eq!(mcp.max_await.map(|d| d.seconds), Some(20));
    assert_eq!(mcp.max_result_chars, 500);
}

#[tokio::test]
async fn any_authenticated_caller_may_ask_and_nobody_else() {
    let keys: Vec<(&str, common::auth::Key)> =
        ["viewer", "frontend", "approver", "worker", "admin"]
            .into_iter()
            .map(|role| (role, key(role, "team-a", &[role], None)))
            .collect();
    let entries: Vec<(&str, &common::auth::Key)> = keys.iter().map(|(id, k)| (*id, k)).collect();
    let s = TestServer::start(&config(&entries, "")).await;
    let mut c = s.client.clone();
    for (role, k) in &keys {
        let info = c
            .get_server_info(with_key(pb::GetServerInfoRequest {}, &k.key))
            .await
            .unwrap_or_else(|e| panic!("{role}: {e:?}"))
            .into_inner();
        assert!(
            info.agent_types.iter().any(|t| t.name == "coder"),
            "{role}: {info:?}"
        );
    }
    let refused = c
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert_eq!(error_info(&refused).0, "UNAUTHENTICATED");
    s.handle.shutdown().await.unwrap();
}
