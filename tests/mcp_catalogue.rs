//! The tool catalogue's lint (issue 33 §2): every schema valid for OpenAI
//! strict mode and Gemini (flat objects, `additionalProperties: false`,
//! every property required, optional ones nullable, no `$ref`, `oneOf`,
//! `anyOf` or `allOf`), descriptions at most 2 KB whose first sentence says
//! what the tool is for, `agent_`-prefixed snake_case names, instructions
//! at most 2 KB, and a stable order — for the file as it is and for the
//! tools a server with several agent types serves.

use serde_json::{Map, Value};
use subagentd::{
    mcp::catalogue::{self, catalogue, ToolEntry, ToolsConfig, MAX_DESCRIPTION_BYTES},
    pb,
};

const ORDER: [&str; 7] = [
    "agent_spawn",
    "agent_status",
    "agent_await",
    "agent_result",
    "agent_cancel",
    "agent_steer",
    "agent_approve",
];

fn several_types() -> ToolsConfig {
    ToolsConfig {
        agent_types: ["coder", "reviewer", "scout"]
            .iter()
            .map(|name| pb::AgentTypeInfo {
                name: (*name).into(),
                description: format!("the {name}: {}", "does things. ".repeat(60)),
                runner: "simulated".into(),
                default_model: "acme/m".into(),
                continuable: true,
            })
            .collect(),
        lead_approves: true,
    }
}

/// Every violation of the strict-mode rules in `schema` (an object schema
/// at `path`).
fn strict_violations(path: &str, schema: &Map<String, Value>, out: &mut Vec<String>) {
    for banned in ["$ref", "oneOf", "anyOf", "allOf", "$defs", "definitions"] {
        if schema.contains_key(banned) {
            out.push(format!("{path}: uses {banned}"));
        }
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => {
            out.push(format!("{path}: no type"));
            return;
        }
    };
    if types.contains(&"object") {
        if schema.get("additionalProperties") != Some(&Value::Bool(false)) {
            out.push(format!("{path}: additionalProperties is not false"));
        }
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut listed: Vec<&str> = properties.keys().map(String::as_str).collect();
        let mut req = required.clone();
        listed.sort_unstable();
        req.sort_unstable();
        if listed != req {
            out.push(format!(
                "{path}: required {req:?} is not every property {listed:?}"
            ));
        }
        for (name, property) in &properties {
            match property.as_object() {
                Some(p) => strict_violations(&format!("{path}.{name}"), p, out),
                None => out.push(format!("{path}.{name}: not a schema")),
            }
        }
    }
    if let Some(items) = schema.get("items") {
        match items.as_object() {
            Some(i) => strict_violations(&format!("{path}[]"), i, out),
            None => out.push(format!("{path}[]: not a schema")),
        }
    }
    if let Some(Value::Array(values)) = schema.get("enum") {
        if values.iter().any(Value::is_null) && !types.contains(&"null") {
            out.push(format!("{path}: null in enum but not in type"));
        }
    }
}

fn lint(tool: &ToolEntry) -> Vec<String> {
    let mut out = Vec::new();
    let name = &tool.name;
    let snake = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !name.starts_with("agent_") || !snake {
        out.push(format!("{name}: not an agent_ snake_case name"));
    }
    if tool.description.len() > MAX_DESCRIPTION_BYTES {
        out.push(format!(
            "{name}: description is {} bytes",
            tool.description.len()
        ));
    }
    let first = tool.description.split(". ").next().unwrap_or_default();
    if first.len() < 20 || first.len() > 400 {
        out.push(format!(
            "{name}: the first sentence should say what it is for: {first:?}"
        ));
    }
    strict_violations(&format!("{name}.input"), &tool.input_schema, &mut out);
    // An input schema is flat: no nested objects.
    if let Some(props) = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
    {
        for (p, schema) in props {
            if schema["type"] == "object"
                || schema["type"]
                    .as_array()
                    .is_some_and(|t| t.contains(&Value::from("object")))
            {
                out.push(format!(
                    "{name}.{p}: a nested object in a flat input schema"
                ));
            }
        }
    }
    if let Some(output) = &tool.output_schema {
        strict_violations(&format!("{name}.output"), output, &mut out);
    }
    out
}

#[test]
fn the_catalogue_file_and_the_served_tools_pass_the_lint() {
    let file = catalogue();
    assert!(
        file.instructions.len() <= 2048,
        "instructions are {} bytes",
        file.instructions.len()
    );
    let names: Vec<&str> = file.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ORDER, "tools/list order is the catalogue's");
    let served = catalogue::tools(&several_types());
    let mut violations: Vec<String> = file.tools.iter().chain(&served).flat_map(lint).collect();
    violations.dedup();
    assert!(violations.is_empty(), "{violations:#?}");
    // The served spawn carries the types' enum and descriptions, cut.
    let spawn = &served[0];
    assert_eq!(
        spawn.input_schema["properties"]["agent"]["enum"],
        serde_json::json!(["coder", "reviewer", "scout", null])
    );
    assert!(spawn.description.contains("- coder: the coder"));
}

#[test]
fn the_lint_catches_what_strict_mode_refuses() {
    let bad: ToolEntry = serde_json::from_value(serde_json::json!({
        "name": "spawnAgent",
        "description": "x",
        "inputSchema": {
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "b": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "c": {"type": "object", "properties": {}, "additionalProperties": false, "required": []}
            },
            "required": ["a"]
        }
    }))
    .unwrap();
    let found = lint(&bad).join("\n");
    for expected in [
        "not an agent_ snake_case name",
        "first sentence",
        "additionalProperties is not false",
        "is not every property",
        "uses anyOf",
        "a nested object",
    ] {
        assert!(found.contains(expected), "missed {expected:?} in:\n{found}");
    }
}

#[test]
fn the_file_the_client_packages_read_is_the_one_the_server_serves() {
    let on_disk =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/mcp/tools.json")).unwrap();
    assert_eq!(on_disk, catalogue::CATALOGUE_JSON);
}
