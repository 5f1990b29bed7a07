//! What each tool does, over the gRPC API: arguments in (a JSON object the
//! catalogue describes), a call or two to the service, an answer out (text
//! the model reads, the same facts as `structuredContent` where the
//! catalogue declares an output schema, and `isError` for a refusal).
//!
//! Nothing here knows MCP's wire: the handler turns an [`Answer`] into a
//! `CallToolResult`, and a [`Host`] is how a tool reaches the user (progress
//! while it waits, an approval put to the user by elicitation).

use std::{fmt::Write as _, time::Duration};

use futures_util::future::BoxFuture;
use serde_json::{json, Map, Value};
use tonic::{metadata::AsciiMetadataValue, Status};

use super::{
    catalogue::ToolsConfig,
    refusal::refusal_text,
    render::{self, status_word},
    session::{Owner, Session},
};
use crate::pb;

/// `agent_spawn`'s longest `wait_seconds`.
pub const MAX_WAIT_SECONDS: u64 = 50;
/// `agent_await`'s default `timeout_seconds`.
pub const DEFAULT_AWAIT_SECONDS: f64 = 30.0;
/// `agent_status`'s default `limit`.
pub const DEFAULT_STATUS_LIMIT: usize = 20;
/// How often a waiting tool reports progress (when the call asked for it).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What `[mcp]` says, as GetServerInfo reports it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The tools' configuration (types, approvals).
    pub tools: ToolsConfig,
    /// `"human"` or `"lead"`.
    pub lead_approves: bool,
    /// The longest `agent_await`.
    pub max_await: Duration,
    /// Characters of a result shown before pointing to `agent_result`.
    pub max_result_chars: usize,
}

impl Settings {
    /// From a GetServerInfo answer.
    pub fn from_server_info(info: &pb::GetServerInfoResponse) -> Self {
        let tools = ToolsConfig::from_server_info(info);
        let mcp = info.mcp.clone().unwrap_or_default();
        let defaults = crate::config::McpConfig::default();
        Self {
            lead_approves: tools.lead_approves,
            tools,
            max_await: mcp
                .max_await
                .and_then(|d| Duration::try_from(d).ok())
                .filter(|d| !d.is_zero())
                .unwrap_or(defaults.max_await),
            max_result_chars: match mcp.max_result_chars {
                0 => defaults.max_result_chars,
                n => n as usize,
            },
        }
    }
}

/// What one tool call knows besides its arguments.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The host's id of this tool call (`_meta` `subagentd/toolCallId`):
    /// makes `agent_spawn` idempotent per tool call.
    pub tool_call_id: Option<String>,
    /// A W3C `traceparent` from `_meta`: the Spawn's trace context.
    pub traceparent: Option<AsciiMetadataValue>,
}

/// How a tool reaches the host while it works.
pub trait Host: Send + Sync {
    /// Reports progress of a wait (only when the call asked for progress).
    fn progress(&self, elapsed: Duration, message: String) -> BoxFuture<'_, ()>;
    /// Whether the client can put a form to the user (MCP elicitation).
    fn can_elicit(&self) -> bool;
    /// Puts `agent`'s pending approval to the user; the decision and note,
    /// or None when the user declined to answer.
    fn ask_approval<'a>(&'a self, agent: &'a pb::Agent) -> BoxFuture<'a, Option<(bool, String)>>;
}

/// A tool's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// What the model reads.
    pub text: String,
    /// The same facts as JSON, for tools with an output schema.
    pub structured: Option<Value>,
    /// A refusal: the text names the reason and what to do next.
    pub is_error: bool,
}

impl Answer {
    fn text(text: String) -> Self {
        Self {
            text,
            structured: None,
            is_error: false,
        }
    }

    /// `structured` as the structured content, and as text the same object
    /// field by field.
    fn structured(structured: Value) -> Self {
        Self {
            text: render::fields(&structured),
            structured: Some(structured),
            is_error: false,
        }
    }

    fn refused(status: &Status) -> Self {
        Self::error(refusal_text(status))
    }

    fn error(text: String) -> Self {
        Self {
            text,
            structured: None,
            is_error: true,
        }
    }
}

/// A call the arguments make malformed: a protocol error (invalid params),
/// not a tool result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadArguments(pub String);

/// The tools of one session.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The connection and whose agents.
    pub session: Session,
    /// `[mcp]` and the agent types.
    pub settings: Settings,
}

impl Tools {
    /// Runs tool `name` with `args`.
    pub async fn call(
        &self,
        name: &str,
        args: &Map<String, Value>,
        context: &CallContext,
        host: &dyn Host,
    ) -> Result<Answer, BadArguments> {
        let args = Args(args);
        match name {
            "agent_spawn" => self.spawn(args, context).await,
            "agent_status" => self.status(args, host).await,
            "agent_await" => self.await_agents(args, host).await,
            "agent_result" => self.result(args).await,
            "agent_cancel" => self.cancel(args).await,
            "agent_steer" => self.steer(args).await,
            "agent_approve" if self.settings.lead_approves => self.approve(args).await,
            "agent_approve" => Err(BadArguments(
                "agent_approve is not enabled here: approvals are for people ([mcp] approvals \
                 = \"human\")"
                    .to_owned(),
            )),
            other => Err(BadArguments(format!("no tool named {other:?}"))),
        }
    }

    async fn spawn(&self, args: Args<'_>, context: &CallContext) -> Result<Answer, BadArguments> {
        args.only(&[
            "prompt",
            "agent",
            "description",
            "model",
            "wait_seconds",
            "timeout_minutes",
            "continue_from",
            "fork",
        ])?;
        let prompt = args.required_string("prompt")?;
        let continue_from = args.string("continue_from")?.unwrap_or_default();
        let agent = match args.string("agent")? {
            Some(agent) => agent,
            // A continuation keeps its agent's type.
            None if !continue_from.is_empty() => String::new(),
            None => match self.settings.tools.agent_types.as_slice() {
                [only] => only.name.clone(),
                types => {
                    let known: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
                    return Ok(Answer::error(format!(
                        "Refused (INVALID_REQUEST): name the agent type in `agent`: one of {}.",
                        known.join(", ")
                    )));
                }
            },
        };
        let wait = args
            .integer("wait_seconds", 0, MAX_WAIT_SECONDS)?
            .unwrap_or(0);
        let timeout =
            args.integer("timeout_minutes", 1, u64::MAX / 60)?
                .map(|m| prost_types::Duration {
                    seconds: i64::try_from(m * 60).unwrap_or(i64::MAX),
                    nanos: 0,
                });
        let (lead_id, parent_id) = match &self.session.owner {
            Owner::Lead(lead) => (lead.clone(), String::new()),
            Owner::Agent(id) => (String::new(), id.clone()),
        };
        let request = pb::SpawnRequest {
            agent,
            model: args.string("model")?.unwrap_or_default(),
            prompt,
            description: args.string("description")?.unwrap_or_default(),
            parent_id,
            lead_id,
            background: true,
            timeout,
            // The host's tool-call id makes its retry return the first agent;
            // without one, a key of this call's own still makes the retries
            // of NO_LEADER and RECOVERING below start one agent.
            idempotency_key: idempotency_key(
                &self.session.owner,
                &context
                    .tool_call_id
                    .clone()
                    .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            ),
            continue_from,
            fork: args.boolean("fork")?.unwrap_or(false),
            ..Default::default()
        };
        let agent = match self
            .session
            .spawn(request, context.traceparent.as_ref())
            .await
        {
            Ok(agent) => agent,
            Err(status) => return Ok(Answer::refused(&status)),
        };
        let agent = if wait > 0 && !render::is_settled(&agent) {
            let waited = self
                .session
                .await_agents(pb::AwaitRequest {
                    ids: vec![agent.id.clone()],
                    timeout: Some(seconds(wait as f64)),
                    collect: true,
                    ..Default::default()
                })
                .await;
            match waited {
                Ok(answer) => answer.agents.into_iter().next().unwrap_or(agent),
                Err(status) => return Ok(Answer::refused(&status)),
            }
        } else if wait > 0 {
            // Settled at once (or found by its idempotency key): shown
            // now, so collected now.
            match self.collect(&agent).await {
                Ok(agent) => agent,
                Err(status) => return Ok(Answer::refused(&status)),
            }
        } else {
            agent
        };
        let mut answer = Answer::structured(self.spawned(&agent));
        if let Some(offset) = answer
            .structured
            .as_ref()
            .and_then(|s| s["result_offset"].as_u64())
        {
            answer.text.push_str(&format!(
                "\n[result cut at {offset} characters: read on with agent_result id \"{}\" \
                 offset {offset}]",
                agent.id
            ));
        }
        Ok(answer)
    }

    /// Collects `agent` (an Await by its id with `collect`, which returns at
    /// once since it is settled).
    async fn collect(&self, agent: &pb::Agent) -> Result<pb::Agent, Status> {
        let answer = self
            .session
            .await_agents(pb::AwaitRequest {
                ids: vec![agent.id.clone()],
                timeout: Some(seconds(0.0)),
                collect: true,
                ..Default::default()
            })
            .await?;
        Ok(answer
            .agents
            .into_iter()
            .next()
            .unwrap_or_else(|| agent.clone()))
    }

    fn spawned(&self, agent: &pb::Agent) -> Value {
        let settled = render::is_settled(agent);
        let (result, offset) = if settled && !agent.result.is_empty() {
            let (shown, next) = render::cut(&agent.result, 0, self.settings.max_result_chars);
            (Some(shown), next)
        } else {
            (None, None)
        };
        json!({
            "id": agent.id,
            "status": status_word(agent.status),
            "agent": agent.agent,
            "model": agent.model,
            "description": agent.description,
            "queue_reason": non_empty(&agent.queue_reason),
            "result": result,
            "result_offset": offset,
            "error": agent.error.as_ref().map(render::error_line),
        })
    }

    async fn status(&self, args: Args<'_>, host: &dyn Host) -> Result<Answer, BadArguments> {
        args.only(&["ids", "limit"])?;
        let limit = args
            .integer("limit", 1, 100)?
            .map_or(DEFAULT_STATUS_LIMIT, |n| n as usize);
        let listed = match args.string_list("ids", 100)? {
            Some(ids) => self
                .session
                .status(pb::StatusRequest {
                    ids,
                    ..Default::default()
                })
                .await
                .map(|answer| answer.agents),
            None => self.listing(limit).await,
        };
        let mut agents = match listed {
            Ok(agents) => agents,
            Err(status) => return Ok(Answer::refused(&status)),
        };
        // A pending approval is put to the user here too, where the host
        // can ask (bounded by `[mcp] max_await`).
        let pending: Vec<pb::Agent> = agents
            .iter()
            .filter(|a| a.status == pb::AgentStatus::AwaitingApproval as i32)
            .cloned()
            .collect();
        if !pending.is_empty() && !self.settings.lead_approves && host.can_elicit() {
            let deadline = tokio::time::Instant::now() + self.settings.max_await;
            let mut decided = false;
            for agent in &pending {
                decided |= matches!(self.ask(host, agent, deadline).await, Some(Ok(_)));
            }
            if decided {
                agents = self.refresh(&agents).await;
            }
        }
        let rows: Vec<Value> = agents.iter().map(render::status_row).collect();
        Ok(Answer::structured(json!({ "agents": rows })))
    }

    /// The default `agent_status` rows: the owner's live agents, then its
    /// settled uncollected ones, then the most recent others; at most
    /// `limit`. Live and uncollected agents are asked for by the filters
    /// that find them, so a long-lived lead's newest agents are never
    /// beyond a page.
    async fn listing(&self, limit: usize) -> Result<Vec<pb::Agent>, Status> {
        let mut agents = self.session.live().await?;
        agents.extend(
            self.session
                .owned(pb::StatusRequest {
                    uncollected: true,
                    ..Default::default()
                })
                .await?
                .into_iter()
                .filter(|a| a.status != pb::AgentStatus::AwaitingApproval as i32),
        );
        if agents.len() < limit {
            let recent = self
                .session
                .owned(pb::StatusRequest {
                    statuses: vec![
                        pb::AgentStatus::Done as i32,
                        pb::AgentStatus::Failed as i32,
                        pb::AgentStatus::Cancelled as i32,
                    ],
                    ..Default::default()
                })
                .await?;
            agents.extend(recent.into_iter().filter(|a| a.collected_time.is_some()));
        }
        Ok(render::listing_order(agents, limit))
    }

    async fn await_agents(&self, args: Args<'_>, host: &dyn Host) -> Result<Answer, BadArguments> {
        args.only(&["ids", "mode", "timeout_seconds"])?;
        let ids = args.string_list("ids", 100)?;
        let mode = match args.string("mode")?.as_deref() {
            None | Some("any") => pb::AwaitMode::Any,
            Some("all") => pb::AwaitMode::All,
            Some(other) => {
                return Err(BadArguments(format!(
                    "mode must be \"any\" or \"all\", not {other:?}"
                )))
            }
        };
        let asked = args
            .number("timeout_seconds")?
            .unwrap_or(DEFAULT_AWAIT_SECONDS);
        let limit = self.settings.max_await.as_secs_f64();
        let timeout = asked.clamp(0.0, limit);
        let started = tokio::time::Instant::now();
        let deadline = started + Duration::from_secs_f64(timeout);
        let mut notes: Vec<String> = Vec::new();
        let mut collect = true;
        let (agents, timed_out) = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut request = pb::AwaitRequest {
                mode: mode as i32,
                timeout: Some(seconds(left.as_secs_f64())),
                collect,
                ..Default::default()
            };
            match (&ids, &self.session.owner) {
                (Some(ids), _) => request.ids = ids.clone(),
                (None, Owner::Lead(lead)) => request.lead_id = lead.clone(),
                (None, Owner::Agent(id)) => request.parent_id = id.clone(),
            }
            let answer =
                match with_progress(host, started, self.session.await_agents(request)).await {
                    Ok(answer) => answer,
                    // A viewer may wait and look, not collect.
                    Err(status) if collect && status.code() == tonic::Code::PermissionDenied => {
                        collect = false;
                        notes.push(
                            "(This credential may not collect results: what follows will be \
                         returned again.)"
                                .to_owned(),
                        );
                        continue;
                    }
                    Err(status) => return Ok(Answer::refused(&status)),
                };
            let pending: Vec<&pb::Agent> = answer
                .agents
                .iter()
                .filter(|a| a.status == pb::AgentStatus::AwaitingApproval as i32)
                .collect();
            let finished = answer.agents.len() > pending.len();
            // Results already collected are shown now, before anything can
            // hold the answer up; a pending approval is then put to the
            // user on the next call.
            if pending.is_empty()
                || finished
                || self.settings.lead_approves
                || !host.can_elicit()
                || left.is_zero()
            {
                break (answer.agents, answer.timed_out);
            }
            let mut decided_all = true;
            for agent in pending {
                match self.ask(host, agent, deadline).await {
                    Some(Ok(note)) => notes.push(note),
                    Some(Err(refused)) => {
                        notes.push(refused);
                        decided_all = false;
                    }
                    None => decided_all = false,
                }
            }
            if !decided_all {
                let refreshed = self.refresh(&answer.agents).await;
                break (refreshed, answer.timed_out);
            }
            // Every approval decided: the agents went back to their queue;
            // wait on.
        };
        let live = match &ids {
            Some(_) => Vec::new(),
            None => self.session.live().await.unwrap_or_default(),
        };
        Ok(Answer::text(render::await_text(
            &render::AwaitView {
                settled: &agents,
                live: &live,
                timed_out,
                waited: started.elapsed(),
                max_result_chars: self.settings.max_result_chars,
                lead_approves: self.settings.lead_approves,
                by_ids: ids.is_some(),
            },
            &notes,
        )))
    }

    /// Puts `agent`'s approval to the user (waiting until `deadline` at
    /// most) and applies the decision: what was decided, the refusal of the
    /// decision, or None when the user did not answer in time.
    async fn ask(
        &self,
        host: &dyn Host,
        agent: &pb::Agent,
        deadline: tokio::time::Instant,
    ) -> Option<Result<String, String>> {
        let approval = agent.approval.as_ref()?;
        let (approved, note) = tokio::time::timeout_at(deadline, host.ask_approval(agent))
            .await
            .ok()
            .flatten()?;
        let decision = if approved {
            pb::ApprovalDecision::Approve
        } else {
            pb::ApprovalDecision::Deny
        };
        let answer = self
            .session
            .approve(pb::ApproveRequest {
                id: agent.id.clone(),
                approval_id: approval.id.clone(),
                decision: decision as i32,
                note,
            })
            .await;
        Some(match answer {
            Ok(_) => Ok(format!(
                "The user {} {}'s call of {}.",
                if approved { "approved" } else { "denied" },
                agent.id,
                approval.tool_name
            )),
            Err(status) => Err(format!(
                "The user's decision on {}'s call of {} was not applied: {}",
                agent.id,
                approval.tool_name,
                refusal_text(&status)
            )),
        })
    }

    /// The agents as they are now (after decisions); `agents` itself where
    /// reading fails.
    async fn refresh(&self, agents: &[pb::Agent]) -> Vec<pb::Agent> {
        if agents.is_empty() {
            return Vec::new();
        }
        let request = pb::StatusRequest {
            ids: agents.iter().map(|a| a.id.clone()).collect(),
            ..Default::default()
        };
        match self.session.status(request).await {
            Ok(answer) => answer.agents,
            Err(_) => agents.to_vec(),
        }
    }

    async fn result(&self, args: Args<'_>) -> Result<Answer, BadArguments> {
        args.only(&["id", "offset", "max_chars", "transcript"])?;
        let id = args.required_string("id")?;
        let offset = args.integer("offset", 0, u64::MAX)?.unwrap_or(0) as usize;
        // At most ten times the server's cut: one call must not flood the
        // model's context whatever it asks for.
        let most = self.settings.max_result_chars * 10;
        let max_chars = args
            .integer("max_chars", 1, u64::MAX)?
            .map_or(self.settings.max_result_chars, |n| (n as usize).min(most));
        if args.boolean("transcript")?.unwrap_or(false) {
            let answer = self
                .session
                .transcript(pb::GetTranscriptRequest {
                    agent_id: id.clone(),
                    page_token: if offset == 0 {
                        String::new()
                    } else {
                        offset.to_string()
                    },
                    page_size: 100,
                    ..Default::default()
                })
                .await;
            return Ok(match answer {
                Ok(page) => Answer::text(render::transcript_text(&id, offset, &page, max_chars)),
                Err(status) => Answer::refused(&status),
            });
        }
        let answer = self
            .session
            .status(pb::StatusRequest {
                ids: vec![id.clone()],
                ..Default::default()
            })
            .await;
        Ok(match answer {
            Ok(answer) => match answer.agents.first() {
                Some(agent) => Answer::text(render::result_page(agent, offset, max_chars)),
                None => Answer::error(format!("Refused (AGENT_NOT_FOUND): no agent {id}.")),
            },
            Err(status) => Answer::refused(&status),
        })
    }

    async fn cancel(&self, args: Args<'_>) -> Result<Answer, BadArguments> {
        args.only(&["id", "all", "reason"])?;
        let id = args.string("id")?;
        let all = args.boolean("all")?.unwrap_or(false);
        let reason = args
            .string("reason")?
            .unwrap_or_else(|| format!("cancelled by {}", self.session.owner.describe()));
        let targets: Vec<pb::CancelRequest> = match (id, all) {
            (Some(id), false) => vec![pb::CancelRequest {
                id,
                reason: reason.clone(),
                ..Default::default()
            }],
            (None, true) => match &self.session.owner {
                Owner::Lead(lead) => vec![pb::CancelRequest {
                    lead_id: lead.clone(),
                    reason: reason.clone(),
                    ..Default::default()
                }],
                // The children of this agent, each with its subtree.
                Owner::Agent(_) => match self.session.live().await {
                    Ok(live) => live
                        .into_iter()
                        .map(|a| pb::CancelRequest {
                            id: a.id,
                            reason: reason.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    Err(status) => return Ok(Answer::refused(&status)),
                },
            },
            _ => {
                return Err(BadArguments(
                    "set exactly one of id and all: true".to_owned(),
                ))
            }
        };
        let mut cancelled = Vec::new();
        let mut finished = Vec::new();
        for target in targets {
            let one = (!target.id.is_empty()).then(|| target.id.clone());
            match self.session.cancel(target).await {
                Ok(answer) => {
                    if let (Some(id), true) = (&one, answer.agents.is_empty()) {
                        finished.push(id.clone());
                    }
                    cancelled.extend(answer.agents.into_iter().map(|a| a.id));
                }
                Err(status) => return Ok(Answer::refused(&status)),
            }
        }
        Ok(Answer::structured(json!({
            "cancelled": cancelled,
            "already_finished": finished,
        })))
    }

    async fn steer(&self, args: Args<'_>) -> Result<Answer, BadArguments> {
        args.only(&["id", "message"])?;
        let id = args.required_string("id")?;
        let message = args.required_string("message")?;
        let answer = self
            .session
            .steer(pb::SteerRequest {
                id: id.clone(),
                message,
            })
            .await;
        Ok(match answer {
            Ok(answer) => {
                let delivery = match pb::SteerDelivery::try_from(answer.delivery) {
                    Ok(pb::SteerDelivery::Buffered) => "buffered",
                    _ => "delivered",
                };
                Answer::structured(json!({ "id": id, "delivery": delivery }))
            }
            Err(status) => Answer::refused(&status),
        })
    }

    async fn approve(&self, args: Args<'_>) -> Result<Answer, BadArguments> {
        args.only(&["id", "approval_id", "decision", "note"])?;
        let id = args.required_string("id")?;
        let approval_id = args.required_string("approval_id")?;
        let decision = match args.required_string("decision")?.as_str() {
            "approve" => pb::ApprovalDecision::Approve,
            "deny" => pb::ApprovalDecision::Deny,
            other => {
                return Err(BadArguments(format!(
                    "decision must be \"approve\" or \"deny\", not {other:?}"
                )))
            }
        };
        let answer = self
            .session
            .approve(pb::ApproveRequest {
                id,
                approval_id,
                decision: decision as i32,
                note: args.string("note")?.unwrap_or_default(),
            })
            .await;
        Ok(match answer {
            Ok(agent) => Answer::structured(json!({
                "id": agent.id,
                "status": status_word(agent.status),
                "decision": if decision == pb::ApprovalDecision::Approve { "approve" } else { "deny" },
                "agent": agent.agent,
                "description": agent.description,
                "queue_reason": non_empty(&agent.queue_reason),
            })),
            Err(status) => Answer::refused(&status),
        })
    }
}

/// Runs `call`, reporting progress every [`PROGRESS_EVERY`] until it ends.
async fn with_progress<T>(
    host: &dyn Host,
    started: tokio::time::Instant,
    call: impl std::future::Future<Output = T>,
) -> T {
    let mut call = std::pin::pin!(call);
    let mut ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            out = &mut call => return out,
            _ = ticks.tick() => {
                let elapsed = started.elapsed();
                host.progress(elapsed, format!("waited {}s", elapsed.as_secs())).await;
            }
        }
    }
}

/// The Spawn idempotency key of a host's tool call: scoped to the owner,
/// since tool-call ids are unique only within one host's conversation.
fn idempotency_key(owner: &Owner, tool_call_id: &str) -> String {
    let mut key = String::from("mcp:");
    match owner {
        Owner::Lead(lead) => write!(key, "lead:{lead}:").expect("a String"),
        Owner::Agent(id) => write!(key, "agent:{id}:").expect("a String"),
    }
    key.push_str(tool_call_id);
    if key.len() > crate::wire::MAX_KEY_BYTES {
        // Too long to send whole: its SHA-256 keeps it unique per call, and
        // the same in every process and release.
        let digest = crate::auth::keys::digest(&key);
        key = format!("mcp:sha256:{}", crate::auth::keys::digest_hex(&digest));
    }
    key
}

fn seconds(s: f64) -> prost_types::Duration {
    let d = Duration::from_secs_f64(s.max(0.0));
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// A tool's arguments, read by name and type; a wrong type or an unknown
/// name makes the call malformed.
#[derive(Clone, Copy)]
struct Args<'a>(&'a Map<String, Value>);

impl Args<'_> {
    fn only(&self, known: &[&str]) -> Result<(), BadArguments> {
        match self.0.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(BadArguments(format!(
                "unknown argument {k:?}; this tool takes {}",
                known.join(", ")
            ))),
            None => Ok(()),
        }
    }

    fn value(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<String>, BadArguments> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(BadArguments(format!("{key} must be a string, not {other}"))),
        }
    }

    fn required_string(&self, key: &str) -> Result<String, BadArguments> {
        self.string(key)?
            .ok_or_else(|| BadArguments(format!("{key} is required")))
    }

    fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, BadArguments> {
        match self.value(key) {
            None => Ok(None),
            // Some hosts send every number as a double (10.0).
            Some(v) => match v.as_u64().or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64)
                    .map(|f| f as u64)
            }) {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(BadArguments(format!(
                    "{key} must be an integer from {min} to {max}, not {v}"
                ))),
            },
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, BadArguments> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(n) if n >= 0.0 && n.is_finite() => Ok(Some(n)),
                _ => Err(BadArguments(format!("{key} must be a number ≥ 0, not {v}"))),
            },
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, BadArguments> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(BadArguments(format!(
                "{key} must be true or false, not {other}"
            ))),
        }
    }

    fn string_list(&self, key: &str, max: usize) -> Result<Option<Vec<String>>, BadArguments> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Array(items)) if items.len() <= max => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(BadArguments(format!(
                        "{key} must hold strings, not {other}"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|ids| (!ids.is_empty()).then_some(ids)),
            Some(v) => Err(BadArguments(format!(
                "{key} must be a list of at most {max} ids, not {v}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotency_key_is_scoped_to_its_owner_and_fits() {
        let lead = Owner::Lead("l1".into());
        assert_eq!(idempotency_key(&lead, "call_1"), "mcp:lead:l1:call_1");
        let other = Owner::Lead("l2".into());
        assert_ne!(
            idempotency_key(&lead, "call_1"),
            idempotency_key(&other, "call_1")
        );
        let long = "x".repeat(400);
        let key = idempotency_key(&lead, &long);
        assert!(key.len() <= crate::wire::MAX_KEY_BYTES);
        assert_eq!(
            key,
            idempotency_key(&lead, &long),
            "the same call, the same key"
        );
        assert_ne!(key, idempotency_key(&lead, &"y".repeat(400)));
    }

    #[test]
    fn arguments_of_the_wrong_type_or_name_are_malformed() {
        let args = json!({"prompt": 3, "extra": true});
        let map = args.as_object().unwrap();
        let a = Args(map);
        assert!(a.only(&["prompt"]).unwrap_err().0.contains("\"extra\""));
        assert!(a
            .string("prompt")
            .unwrap_err()
            .0
            .contains("must be a string"));
        let args = json!({"wait_seconds": 51, "ids": [], "mode": null});
        let a = Args(args.as_object().unwrap());
        assert!(a.integer("wait_seconds", 0, 50).is_err());
        assert_eq!(a.string_list("ids", 100).unwrap(), None);
        assert_eq!(a.string("mode").unwrap(), None);
        // A host that sends every number as a double.
        let args = json!({"wait_seconds": 10.0, "limit": 2.5});
        let a = Args(args.as_object().unwrap());
        assert_eq!(a.integer("wait_seconds", 0, 50).unwrap(), Some(10));
        assert!(a.integer("limit", 1, 100).is_err());
    }
}
