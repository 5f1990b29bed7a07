//! The tool catalogue: names, descriptions and JSON Schemas, kept in one
//! file (`mcp/tools.json`) that the MCP server serves and the client
//! packages read. What depends on the server's config is filled in here:
//! the `agent` enum of `agent_spawn` (each type's description in the tool
//! description), and `agent_approve` only with `[mcp] approvals = "lead"`.

use std::sync::{Arc, LazyLock};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::pb;

/// The catalogue file, as the repository has it.
pub const CATALOGUE_JSON: &str = include_str!("../../mcp/tools.json");

/// The longest tool description, in bytes (what the hosts' models read).
pub const MAX_DESCRIPTION_BYTES: usize = 2048;

/// The tool only `[mcp] approvals = "lead"` lists.
pub const APPROVE_TOOL: &str = "agent_approve";

/// The catalogue file's content.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalogue {
    /// The server's `instructions`: how a lead model should use the tools.
    pub instructions: String,
    /// The tools, in `tools/list` order.
    pub tools: Vec<ToolEntry>,
}

/// One tool of the catalogue.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolEntry {
    /// `snake_case`, `agent_` prefix.
    pub name: String,
    /// What the model reads; the first sentence says what the tool is for.
    pub description: String,
    /// The arguments: a flat object, valid in OpenAI strict mode.
    pub input_schema: Map<String, Value>,
    /// The `structuredContent` it returns, when it returns any.
    #[serde(default)]
    pub output_schema: Option<Map<String, Value>>,
}

/// The catalogue, parsed once (a broken file fails every MCP test, and
/// `tests/mcp_catalogue.rs` says why).
pub fn catalogue() -> &'static Catalogue {
    static CATALOGUE: LazyLock<Catalogue> = LazyLock::new(|| {
        serde_json::from_str(CATALOGUE_JSON).expect("mcp/tools.json is a valid catalogue")
    });
    &CATALOGUE
}

/// What of a server's configuration shapes the tools.
#[derive(Debug, Clone, Default)]
pub struct ToolsConfig {
    /// The agent types, sorted by name.
    pub agent_types: Vec<pb::AgentTypeInfo>,
    /// Whether `agent_approve` is listed (`[mcp] approvals = "lead"`).
    pub lead_approves: bool,
}

impl ToolsConfig {
    /// From a GetServerInfo answer.
    pub fn from_server_info(info: &pb::GetServerInfoResponse) -> Self {
        Self {
            agent_types: info.agent_types.clone(),
            lead_approves: info.mcp.as_ref().is_some_and(|m| m.approvals == "lead"),
        }
    }
}

/// The tools this server offers, in catalogue order.
pub fn tools(config: &ToolsConfig) -> Vec<ToolEntry> {
    catalogue()
        .tools
        .iter()
        .filter(|t| t.name != APPROVE_TOOL || config.lead_approves)
        .map(|t| match t.name.as_str() {
            "agent_spawn" => with_agent_types(t.clone(), &config.agent_types),
            _ => t.clone(),
        })
        .collect()
}

/// The tools as rmcp serves them.
pub fn mcp_tools(config: &ToolsConfig) -> Vec<rmcp::model::Tool> {
    tools(config)
        .into_iter()
        .map(|t| {
            let mut tool = rmcp::model::Tool::new(t.name, t.description, Arc::new(t.input_schema));
            if let Some(schema) = t.output_schema {
                tool = tool.with_raw_output_schema(Arc::new(schema));
            }
            tool
        })
        .collect()
}

/// `agent_spawn` with the `agent` enum of the configured types and each
/// type's description, cut to fit [`MAX_DESCRIPTION_BYTES`].
fn with_agent_types(mut tool: ToolEntry, types: &[pb::AgentTypeInfo]) -> ToolEntry {
    let names: Vec<Value> = types
        .iter()
        .map(|t| Value::String(t.name.clone()))
        .chain([Value::Null])
        .collect();
    if let Some(Value::Object(agent)) = tool
        .input_schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("agent"))
    {
        agent.insert("enum".into(), Value::Array(names));
        if types.len() == 1 {
            agent.insert(
                "description".into(),
                Value::String(format!(
                    "The agent type: {}; null means the same.",
                    types[0].name
                )),
            );
        }
    }
    let mut description = tool.description;
    description.push_str("\n\nAgent types:");
    for t in types {
        let mut line = format!("\n- {}", t.name);
        if !t.description.is_empty() {
            line.push_str(": ");
            line.push_str(&t.description);
        }
        if !t.default_model.is_empty() {
            line.push_str(&format!(" (default model {})", t.default_model));
        }
        let room = MAX_DESCRIPTION_BYTES.saturating_sub(description.len());
        let mark = '…'.len_utf8();
        if line.len() > room {
            if room <= mark {
                break;
            }
            // Cut at a character boundary, leaving room for the mark.
            let mut end = room - mark;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
            line.push('…');
            description.push_str(&line);
            break;
        }
        description.push_str(&line);
    }
    tool.description = description;
    tool
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_type(name: &str, description: &str) -> pb::AgentTypeInfo {
        pb::AgentTypeInfo {
            name: name.into(),
            description: description.into(),
            runner: "simulated".into(),
            default_model: "acme/m".into(),
            continuable: true,
        }
    }

    #[test]
    fn spawn_lists_the_configured_types_and_approve_only_for_a_lead() {
        let config = ToolsConfig {
            agent_types: vec![agent_type("coder", "writes code"), agent_type("scout", "")],
            lead_approves: false,
        };
        let tools = tools(&config);
        let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
        assert!(!names.contains(&APPROVE_TOOL));
        let spawn = &tools[0];
        assert_eq!(
            spawn.input_schema["properties"]["agent"]["enum"],
            serde_json::json!(["coder", "scout", null])
        );
        assert!(spawn
            .description
            .contains("- coder: writes code (default model acme/m)"));
        let lead = ToolsConfig {
            lead_approves: true,
            ..config
        };
        assert!(super::tools(&lead).iter().any(|t| t.name == APPROVE_TOOL));
    }

    #[test]
    fn many_long_type_descriptions_are_cut_to_the_limit() {
        let long = "x".repeat(1000);
        let config = ToolsConfig {
            agent_types: (0..5)
                .map(|i| agent_type(&format!("t{i}"), &long))
                .collect(),
            lead_approves: false,
        };
        let spawn = tools(&config).remove(0);
        assert!(spawn.description.len() <= MAX_DESCRIPTION_BYTES);
        assert!(spawn.description.ends_with('…'));
    }
}
