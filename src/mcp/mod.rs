//! The lead tools over MCP: any agent host (Claude Code, Codex CLI,
//! opencode, Cursor, Gemini CLI, an SDK) gets spawn, status, await, result,
//! cancel, steer and approve as tools. A client of the gRPC API like the
//! CLI: `subagentd mcp` serves it over stdio; the server mounts the same
//! handler at `/mcp` on its `[http]` listener, calling its own gRPC API
//! with each caller's credential.
//!
//! - `catalogue`: the tools' names, descriptions and schemas (`mcp/tools.json`).
//! - `session`: the gRPC client, credential and owner (lead or agent).
//! - `tools`: what each tool does; `render` and `refusal`: how it reads.
//! - `handler`: rmcp's `ServerHandler`; `stdio`: `subagentd mcp`.

pub mod catalogue;
pub mod handler;
pub mod refusal;
pub mod render;
pub mod session;
pub mod stdio;
pub mod tools;

pub use self::handler::{LeadServer, SessionSource, TOOL_CALL_ID_META};
pub use self::session::{Owner, Session};
pub use self::stdio::{run, McpArgs, AGENT_ID_ENV};
pub use self::tools::{Settings, Tools};
