//! `subagentd mcp`: the lead tools as an MCP server over stdio, a client of
//! a running server with the same address, credential and TLS flags as the
//! other client subcommands. Logs go to stderr only (stdout is the
//! protocol). At end of input it exits, leaving the lead's agents running
//! under their deadlines unless `--cancel-on-exit`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use rmcp::ServiceExt as _;
use tonic::transport::Endpoint;

use futures_util::future::BoxFuture;

use super::{
    handler::{LeadServer, SessionSource},
    session::{Owner, Session},
    tools::{Settings, Tools},
};
use crate::client::{bearer_header, normalize_addr, TlsArgs, DEFAULT_ADDR};
use crate::pb;

/// Set in the environment of a run subagentd started (the `command`
/// runner): an MCP server inside it spawns children of that agent.
pub const AGENT_ID_ENV: &str = "SUBAGENTD_AGENT_ID";

/// How long to wait for the server's connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Flags of `subagentd mcp`.
#[derive(clap::Args, Debug, Clone)]
pub struct McpArgs {
    /// Server address, e.g. http://127.0.0.1:50051; "host:port" without a
    /// scheme means http.
    #[arg(long, env = "SUBAGENTD_ADDR", default_value = DEFAULT_ADDR, value_name = "URL")]
    pub addr: String,
    /// API key (or JWT) sent as `authorization: Bearer <key>`.
    #[arg(
        long,
        env = "SUBAGENTD_TOKEN",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The lead whose agents the tools spawn, list and wait on. Default: a
    /// new lead per process (`mcp-<uuid>`, printed to stderr). Ignored
    /// inside a run subagentd started (`SUBAGENTD_AGENT_ID` set): there
    /// the tools act on that agent's children.
    #[arg(long, env = "SUBAGENTD_LEAD_ID", value_name = "ID")]
    pub lead_id: Option<String>,
    /// At end of input, cancel this lead's (or agent's) live agents instead
    /// of leaving them to their deadlines.
    #[arg(long)]
    pub cancel_on_exit: bool,
}

/// Serves MCP on stdin/stdout until end of input.
pub async fn run(args: McpArgs) -> anyhow::Result<()> {
    let owner = match std::env::var(AGENT_ID_ENV).ok().filter(|v| !v.is_empty()) {
        Some(agent) => Owner::Agent(agent),
        None => Owner::Lead(args.lead_id.clone().unwrap_or_else(|| {
            let lead = format!("mcp-{}", uuid::Uuid::new_v4());
            eprintln!("subagentd mcp: lead id {lead}");
            lead
        })),
    };
    let credential = bearer_header(args.token.as_deref())?;
    let (url, tls) = args.tls.secure(normalize_addr(&args.addr))?;
    let mut endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| format!("invalid address {}", args.addr))?
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(config) = tls {
        endpoint = endpoint.tls_config(config)?;
    }
    // Lazily: a host starts its MCP servers before it needs them, and the
    // subagentd server may come up (or elect a leader) a moment later: the
    // first call reads its configuration, and a call before that is
    // possible answers why not.
    let channel = endpoint.connect_lazy();
    let session = Session::new(channel, credential, owner);
    let source = Arc::new(StdioSource {
        session: session.clone(),
        settings: parking_lot::Mutex::new(None),
    });
    let server = LeadServer::new(source)
        .serve(rmcp::transport::stdio())
        .await
        .context("starting MCP over stdio")?;
    server.waiting().await.context("serving MCP over stdio")?;
    if args.cancel_on_exit {
        cancel_all(&session).await;
    }
    Ok(())
}

/// One session for the process, and the server's configuration
/// (GetServerInfo) as the first call that could read it found it, read again
/// after [`SETTINGS_TTL`] so a reload of the server's agent types reaches
/// the tools.
struct StdioSource {
    session: Session,
    settings: parking_lot::Mutex<Option<(Instant, Settings)>>,
}

/// How long `subagentd mcp` keeps the server's configuration.
const SETTINGS_TTL: Duration = Duration::from_secs(30);

impl SessionSource for StdioSource {
    fn tools(&self, _parts: Option<&http::request::Parts>) -> BoxFuture<'_, Result<Tools, String>> {
        Box::pin(async move {
            let cached = self.settings.lock().clone();
            let settings = match cached {
                Some((read, settings)) if read.elapsed() < SETTINGS_TTL => settings,
                stale => match self.session.server_info().await {
                    Ok(info) => {
                        let settings = Settings::from_server_info(&info);
                        *self.settings.lock() = Some((Instant::now(), settings.clone()));
                        settings
                    }
                    // What was read before still serves while the server
                    // cannot answer.
                    Err(_) if stale.is_some() => stale.expect("checked").1,
                    Err(status) => {
                        let why = super::refusal::refusal_text(&status);
                        eprintln!("subagentd mcp: reading the server's configuration: {why}");
                        return Err(why);
                    }
                },
            };
            Ok(Tools {
                session: self.session.clone(),
                settings,
            })
        })
    }
}

/// Cancels the owner's live agents (`--cancel-on-exit`).
async fn cancel_all(session: &Session) {
    let reason = format!("the MCP session of {} ended", session.owner.describe());
    let outcome = match &session.owner {
        Owner::Lead(lead) => session
            .cancel(pb::CancelRequest {
                lead_id: lead.clone(),
                reason,
                ..Default::default()
            })
            .await
            .map(|_| ()),
        Owner::Agent(id) => session.cancel_children(id, &reason).await,
    };
    if let Err(status) = outcome {
        eprintln!(
            "subagentd mcp: --cancel-on-exit: {}",
            super::refusal::refusal_text(&status)
        );
    }
}
