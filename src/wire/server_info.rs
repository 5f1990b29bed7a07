//! What a server is and is configured with (GetServerInfo).

use std::sync::Arc;

use crate::config::{AgentTypeConfig, RunnerKind};
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

/// The answer to GetServerInfo: `version` and the agent types, by name.
pub fn server_info_to_pb(
    version: &str,
    agent_types: &[(String, Arc<AgentTypeConfig>)],
) -> pb::GetServerInfoResponse {
    pb::GetServerInfoResponse {
        version: version.to_owned(),
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
