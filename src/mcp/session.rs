//! Who the tools act for and how they reach the service: a gRPC client,
//! the caller's credential (the same one on every call), and the lead (or
//! the agent, when nested) whose agents the tools list and wait on.
//!
//! `NO_LEADER` and `RECOVERING` are retried here, a few times with backoff,
//! before a tool reports them: both mean "a moment", and a Spawn retried
//! carries the same idempotency key, so it never starts twice.

use std::time::Duration;

use tonic::{metadata::AsciiMetadataValue, transport::Channel, Request, Response, Status};
use tonic_types::StatusExt;

use crate::pb::{self, agent_service_client::AgentServiceClient};

/// Tries of a call answered `NO_LEADER` or `RECOVERING`, the first included.
const TRIES: u32 = 5;
/// The first wait between tries; doubled each time (0.2 + 0.4 + 0.8 + 1.6 s).
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// Whose agents the tools act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A lead: its root agents (spawned with this `lead_id`, no parent).
    Lead(String),
    /// An agent this MCP server runs inside (`SUBAGENTD_AGENT_ID`): its
    /// direct children.
    Agent(String),
}

impl Owner {
    /// How it reads in a tool's text.
    pub fn describe(&self) -> String {
        match self {
            Self::Lead(lead) => format!("lead {lead}"),
            Self::Agent(id) => format!("agent {id}"),
        }
    }
}

/// A connection to the service on behalf of one caller.
#[derive(Debug, Clone)]
pub struct Session {
    client: AgentServiceClient<Channel>,
    credential: Option<AsciiMetadataValue>,
    /// The `subagentd-tenant` header: which of a JWT's tenants to act in.
    tenant: Option<AsciiMetadataValue>,
    /// Other headers every call carries (`/mcp`: the caller's certificate
    /// SANs).
    headers: Vec<(&'static str, AsciiMetadataValue)>,
    /// Whose agents.
    pub owner: Owner,
}

impl Session {
    /// Calls over `channel` with `credential` (an `authorization` value) on
    /// behalf of `owner`.
    pub fn new(channel: Channel, credential: Option<AsciiMetadataValue>, owner: Owner) -> Self {
        Self {
            client: AgentServiceClient::new(channel)
                .max_decoding_message_size(crate::client::MAX_RESPONSE_BYTES),
            credential,
            tenant: None,
            headers: Vec::new(),
            owner,
        }
    }

    /// Sends `name: value` with every call.
    pub fn with_header(mut self, name: &'static str, value: AsciiMetadataValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Acts in `tenant` (the `subagentd-tenant` header, for a JWT that
    /// grants several).
    pub fn with_tenant(mut self, tenant: Option<AsciiMetadataValue>) -> Self {
        self.tenant = tenant;
        self
    }

    /// `message` as a request carrying the credential and, when given, the
    /// caller's W3C trace context.
    fn request<T>(&self, message: T, traceparent: Option<&AsciiMetadataValue>) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(value) = &self.credential {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        if let Some(value) = &self.tenant {
            request
                .metadata_mut()
                .insert(crate::auth::jwt::TENANT_HEADER, value.clone());
        }
        for (name, value) in &self.headers {
            request.metadata_mut().insert(*name, value.clone());
        }
        if let Some(value) = traceparent {
            request.metadata_mut().insert("traceparent", value.clone());
        }
        request
    }

    /// Runs `call` until it answers anything but `NO_LEADER`/`RECOVERING`,
    /// or [`TRIES`] times.
    async fn retried<T: Clone, R, F>(
        &self,
        message: T,
        traceparent: Option<&AsciiMetadataValue>,
        call: F,
    ) -> Result<R, Status>
    where
        F: AsyncFn(AgentServiceClient<Channel>, Request<T>) -> Result<Response<R>, Status>,
    {
        let mut backoff = FIRST_BACKOFF;
        let mut tries = 1;
        loop {
            let answer = call(
                self.client.clone(),
                self.request(message.clone(), traceparent),
            )
            .await;
            match answer {
                Err(status) if tries < TRIES && is_transient(&status) => {
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    tries += 1;
                }
                other => return other.map(Response::into_inner),
            }
        }
    }

    /// GetServerInfo.
    pub async fn server_info(&self) -> Result<pb::GetServerInfoResponse, Status> {
        self.retried(pb::GetServerInfoRequest {}, None, async |mut c, r| {
            c.get_server_info(r).await
        })
        .await
    }

    /// Spawn, with the caller's trace context.
    pub async fn spawn(
        &self,
        req: pb::SpawnRequest,
        traceparent: Option<&AsciiMetadataValue>,
    ) -> Result<pb::Agent, Status> {
        let answer = self
            .retried(req, traceparent, async |mut c, r| c.spawn(r).await)
            .await?;
        answer
            .agent
            .ok_or_else(|| Status::internal("SpawnResponse without its agent"))
    }

    /// Status.
    pub async fn status(&self, req: pb::StatusRequest) -> Result<pb::StatusResponse, Status> {
        self.retried(req, None, async |mut c, r| c.status(r).await)
            .await
    }

    /// Await.
    pub async fn await_agents(&self, req: pb::AwaitRequest) -> Result<pb::AwaitResponse, Status> {
        self.retried(req, None, async |mut c, r| c.r#await(r).await)
            .await
    }

    /// Cancel.
    pub async fn cancel(&self, req: pb::CancelRequest) -> Result<pb::CancelResponse, Status> {
        self.retried(req, None, async |mut c, r| c.cancel(r).await)
            .await
    }

    /// Every agent `request` lists, following page tokens.
    pub async fn list_all(&self, mut request: pb::StatusRequest) -> Result<Vec<pb::Agent>, Status> {
        request.page_size = 1000;
        let mut agents = Vec::new();
        loop {
            let page = self.status(request.clone()).await?;
            agents.extend(page.agents);
            if page.next_page_token.is_empty() {
                return Ok(agents);
            }
            request.page_token = page.next_page_token;
        }
    }

    /// The owner's own agents (a lead's roots, an agent's direct children)
    /// among those `filter` lists: the lead filter lists every depth.
    pub async fn owned(&self, mut filter: pb::StatusRequest) -> Result<Vec<pb::Agent>, Status> {
        match &self.owner {
            Owner::Lead(lead) => filter.lead_id = lead.clone(),
            Owner::Agent(id) => filter.parent_id = id.clone(),
        }
        let roots_only = matches!(self.owner, Owner::Lead(_));
        let mut agents = self.list_all(filter).await?;
        if roots_only {
            agents.retain(|a| a.parent_id.is_empty());
        }
        Ok(agents)
    }

    /// The owner's live agents (queued, running, awaiting approval).
    pub async fn live(&self) -> Result<Vec<pb::Agent>, Status> {
        self.owned(pb::StatusRequest {
            statuses: vec![
                pb::AgentStatus::Queued as i32,
                pb::AgentStatus::Running as i32,
                pb::AgentStatus::AwaitingApproval as i32,
            ],
            ..Default::default()
        })
        .await
    }

    /// Cancels each live direct child of `parent` (with its subtree).
    pub async fn cancel_children(&self, parent: &str, reason: &str) -> Result<(), Status> {
        let live = self
            .list_all(pb::StatusRequest {
                parent_id: parent.to_owned(),
                statuses: vec![
                    pb::AgentStatus::Queued as i32,
                    pb::AgentStatus::Running as i32,
                    pb::AgentStatus::AwaitingApproval as i32,
                ],
                ..Default::default()
            })
            .await?;
        for child in live {
            self.cancel(pb::CancelRequest {
                id: child.id,
                reason: reason.to_owned(),
                ..Default::default()
            })
            .await?;
        }
        Ok(())
    }

    /// Steer.
    pub async fn steer(&self, req: pb::SteerRequest) -> Result<pb::SteerResponse, Status> {
        self.retried(req, None, async |mut c, r| c.steer(r).await)
            .await
    }

    /// Approve.
    pub async fn approve(&self, req: pb::ApproveRequest) -> Result<pb::Agent, Status> {
        let answer = self
            .retried(req, None, async |mut c, r| c.approve(r).await)
            .await?;
        answer
            .agent
            .ok_or_else(|| Status::internal("ApproveResponse without its agent"))
    }

    /// GetTranscript.
    pub async fn transcript(
        &self,
        req: pb::GetTranscriptRequest,
    ) -> Result<pb::GetTranscriptResponse, Status> {
        self.retried(req, None, async |mut c, r| c.get_transcript(r).await)
            .await
    }
}

/// The `ErrorInfo` reason of `status`, if it carries one.
pub fn reason(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .map(|info| info.reason.clone())
}

fn is_transient(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable
        && matches!(reason(status).as_deref(), Some("NO_LEADER" | "RECOVERING"))
}
