//! What a server is and is configured with (GetServerInfo).

use std::sync::Arc;

use crate::config::{AgentTypeConfig, McpConfig, RunnerKind};
use crate::pb;

/// The name config and clients use for a runner.
pub fn runner_name(runner: RunnerKind) -> &'static str {
    match runner {
        RunnerKind::Simulated => "simulated",
        RunnerKind::Worker => "worker",
        RunnerKind::Command => "command",
        RunnerKind::Openai => "openai",
    }
}

/// The answer to GetServerInfo: `version`, the agent types, by name, and
/// the `[mcp]` settings.
pub fn server_info_to_pb(
    version: &str,
    agent_types: &[(String, Arc<AgentTypeConfig>)],
    mcp: &McpConfig,
) -> pb::GetServerInfoResponse {
    pb::GetServerInfoResponse {
        version: version.to_owned(),
        mcp: Some(pb::McpSettings {
            approvals: mcp.approvals.as_str().to_owned(),
            max_await: prost_types::Duration::try_from(mcp.max_await).ok(),
            max_result_chars: u32::try_from(mcp.max_result_chars).unwrap_or(u32::MAX),
        }),
        agent_types: agent_types
            .iter()
            .map(|(name, t)| pb::AgentTypeInfo {
                name: name.clone(),
                description: t.description.clone().unwrap_or_default(),
                runner: runner_name(t.runner).to_owned(),
                default_model: t.default_model.clone().unwrap_or_default(),
                continuable: t.continuable(),
            })
            .collect(),
    }
}
