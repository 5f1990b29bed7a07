//! The MCP server (rmcp's `ServerHandler`): `initialize` with the
//! instructions, `tools/list` from the catalogue, `tools/call` run by
//! [`Tools`]. Where the tools' session comes from is a [`SessionSource`]:
//! one fixed session over stdio, one per HTTP request (its credential and
//! lead) under `/mcp`.

use std::{sync::Arc, time::Duration};

use futures_util::future::BoxFuture;
use rmcp::{
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
        ElicitationAction, ElicitationSchema, Implementation, ListToolsResult,
        PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
        ServerConfig, Tool,
    },
    service::{Peer, RequestContext},
    ErrorData, RoleServer, ServerHandler,
};
use serde_json::json;
use tonic::metadata::AsciiMetadataValue;

use super::{
    catalogue::{self, catalogue},
    tools::{CallContext, Host, Tools},
};
use crate::pb;

/// The `_meta` key a host (or SDK) sets to the id of its tool call, which
/// makes `agent_spawn` idempotent per tool call.
pub const TOOL_CALL_ID_META: &str = "subagentd/toolCallId";

/// Where a request's tools come from.
pub trait SessionSource: Send + Sync + 'static {
    /// The tools for the request whose HTTP parts are `parts` (None over
    /// stdio). An error is the text of a refusal (e.g. the server cannot be
    /// reached).
    fn tools(&self, parts: Option<&http::request::Parts>) -> BoxFuture<'_, Result<Tools, String>>;
}

/// One set of tools for every request (stdio: one process, one lead).
impl SessionSource for Tools {
    fn tools(&self, _parts: Option<&http::request::Parts>) -> BoxFuture<'_, Result<Tools, String>> {
        Box::pin(std::future::ready(Ok(self.clone())))
    }
}

/// The lead tools as an MCP server.
#[derive(Clone)]
pub struct LeadServer {
    source: Arc<dyn SessionSource>,
}

impl LeadServer {
    /// A server whose tools come from `source`.
    pub fn new(source: Arc<dyn SessionSource>) -> Self {
        Self { source }
    }

    async fn tools_for(&self, context: &RequestContext<RoleServer>) -> Result<Tools, String> {
        let parts = context.extensions.get::<http::request::Parts>();
        self.source.tools(parts).await
    }
}

impl ServerHandler for LeadServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("subagentd", env!("CARGO_PKG_VERSION")))
            .with_instructions(catalogue().instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .tools_for(&context)
            .await
            .map_err(|e| ErrorData::internal_error(e, None))?;
        Ok(ListToolsResult::with_all_items(catalogue::mcp_tools(
            &tools.settings.tools,
        )))
    }

    fn get_tool(&self, _name: &str) -> Option<Tool> {
        // The tools depend on the caller's server; arguments are checked by
        // the tools themselves.
        None
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The service out of reach (or refusing GetServerInfo) is a refusal
        // the model can read, not a protocol error.
        let tools = match self.tools_for(&context).await {
            Ok(tools) => tools,
            Err(why) => return Ok(CallToolResult::error(vec![ContentBlock::text(why)]).into()),
        };
        let call = CallContext {
            tool_call_id: meta_string(&context, TOOL_CALL_ID_META),
            traceparent: meta_string(&context, "traceparent")
                .and_then(|t| AsciiMetadataValue::try_from(t).ok()),
        };
        let host = PeerHost {
            peer: context.peer.clone(),
            progress: context.meta.get_progress_token(),
            elicit: context
                .client_capabilities()
                .is_some_and(|c| c.elicitation.is_some()),
        };
        let args = request.arguments.unwrap_or_default();
        let answer = tools
            .call(&request.name, &args, &call, &host)
            .await
            .map_err(|e| ErrorData::invalid_params(e.0, None))?;
        let content = vec![ContentBlock::text(answer.text)];
        let mut result = if answer.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        result.structured_content = answer.structured;
        Ok(result.into())
    }
}

fn meta_string(context: &RequestContext<RoleServer>, key: &str) -> Option<String> {
    context
        .meta
        .get(key)
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The host as a tool reaches it: progress notifications and elicitation
/// over the request's peer.
struct PeerHost {
    peer: Peer<RoleServer>,
    progress: Option<ProgressToken>,
    elicit: bool,
}

impl Host for PeerHost {
    fn progress(&self, elapsed: Duration, message: String) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(token) = self.progress.clone() else {
                return;
            };
            let param =
                ProgressNotificationParam::new(token, elapsed.as_secs_f64()).with_message(message);
            // A host that went away ends the call anyway.
            let _ = self.peer.notify_progress(param).await;
        })
    }

    fn can_elicit(&self) -> bool {
        self.elicit
    }

    fn ask_approval<'a>(&'a self, agent: &'a pb::Agent) -> BoxFuture<'a, Option<(bool, String)>> {
        Box::pin(async move {
            let approval = agent.approval.as_ref()?;
            let schema: ElicitationSchema = serde_json::from_value(json!({
                "type": "object",
                "properties": {
                    "decision": {
                        "type": "string",
                        "title": "Decision",
                        "enum": ["approve", "deny"],
                        "description": "approve lets the agent make the call; deny refuses it",
                    },
                    "note": {
                        "type": "string",
                        "title": "Note",
                        "description": "Optional: what the agent should know about the decision",
                    },
                },
                "required": ["decision"],
            }))
            .ok()?;
            let mut message = format!(
                "Sub-agent {} ({}) asks to call {}",
                agent.id,
                if agent.description.is_empty() {
                    agent.agent.as_str()
                } else {
                    agent.description.as_str()
                },
                approval.tool_name
            );
            if !approval.detail.is_empty() {
                message.push_str(": ");
                message.push_str(&approval.detail);
            }
            let answer = self
                .peer
                .create_elicitation(ElicitRequestParams::FormElicitationParams {
                    meta: None,
                    message,
                    requested_schema: schema,
                })
                .await
                .ok()?;
            if answer.action != ElicitationAction::Accept {
                return None;
            }
            let content = answer.content?;
            let approved = match content.get("decision")?.as_str()? {
                "approve" => true,
                "deny" => false,
                _ => return None,
            };
            let note = content
                .get("note")
                .and_then(|n| n.as_str())
                .unwrap_or_default()
                .to_owned();
            Some((approved, note))
        })
    }
}
