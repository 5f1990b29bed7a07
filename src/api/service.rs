//! `subagents.v1.AgentService`: thin handlers that parse, delegate to the
//! scheduler and convert back.

use std::{pin::Pin, sync::Arc, time::SystemTime};

use bytes::Bytes;
use futures_util::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{
    auth,
    deadline::CallDeadline,
    status::{reason_of, watch_lagged},
};
use crate::config::McpConfig;
use crate::pb::{self, agent_service_server::AgentService};
use crate::scheduler::{trace::SpawnTrace, Error, Event, Received, Scheduler, WatchLive};
use crate::telemetry::metrics::ApiMetrics;
use crate::wire;

/// The gRPC service over a [`Scheduler`].
#[derive(Debug, Clone)]
pub struct AgentServiceImpl {
    scheduler: Scheduler,
    /// Cancelled at shutdown so watch streams end cleanly.
    shutdown: CancellationToken,
    metrics: ApiMetrics,
    /// `[mcp]`, for GetServerInfo (read at start).
    mcp: McpConfig,
}

impl AgentServiceImpl {
    /// A service over `scheduler`; watch streams end when `shutdown` fires.
    pub fn new(scheduler: Scheduler, shutdown: CancellationToken) -> Self {
        Self {
            scheduler,
            shutdown,
            metrics: ApiMetrics::default(),
            mcp: McpConfig::default(),
        }
    }

    /// Answers GetServerInfo with these `[mcp]` settings.
    pub fn with_mcp(mut self, mcp: McpConfig) -> Self {
        self.mcp = mcp;
        self
    }

    /// Counts rejected Spawns and lagging watchers into `metrics`.
    pub fn with_metrics(mut self, metrics: ApiMetrics) -> Self {
        self.metrics = metrics;
        self
    }
}

const STATUS: &str = "/subagents.v1.AgentService/Status";
const WATCH: &str = "/subagents.v1.AgentService/WatchAgents";

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchAgentsResponse, Status>> + Send>>;

/// WatchAgents responses already encoded (see [`super::watch_route`]).
pub type EncodedWatchStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;

impl AgentServiceImpl {
    /// Opens a watch whose items are encoded WatchAgentsResponse messages.
    pub fn watch_encoded(
        &self,
        request: Request<pb::WatchAgentsRequest>,
    ) -> Result<EncodedWatchStream, Status> {
        let principal = auth::principal(&request);
        let revocation = auth::revocation(&request);
        let tenant = auth::listed_tenant(&principal, &request.get_ref().tenant, WATCH)?;
        let q = wire::parse_watch(request.into_inner(), tenant)?;
        let sub = self.scheduler.watch_agents(&q, principal.tenant.clone())?;
        let state = WatchState {
            initial_ticket: Some(sub.ticket),
            initial: sub.initial.into_iter(),
            live: sub.live,
            shutdown: self.shutdown.clone(),
            done: false,
            metrics: self.metrics.clone(),
            revocation,
        };
        Ok(Box::pin(futures_util::stream::unfold(
            state,
            WatchState::next,
        )))
    }
}

#[tonic::async_trait]
impl AgentService for AgentServiceImpl {
    async fn spawn(
        &self,
        request: Request<pb::SpawnRequest>,
    ) -> Result<Response<pb::SpawnResponse>, Status> {
        let trace = SpawnTrace {
            caller: wire::trace_context_from(request.metadata()),
            rpc: crate::telemetry::current_span_context(),
        };
        let deadline = request
            .extensions()
            .get::<CallDeadline>()
            .map(CallDeadline::passes_at);
        let principal = auth::principal(&request);
        let spawned = async {
            let mut spec = wire::parse_spawn(request.into_inner())?;
            spec.trace = trace;
            spec.tenant = principal.tenant.clone();
            if let Some(base) = &spec.workspace_base {
                // The scheduler runs no git: the ref is checked here, so
                // nothing is created for one the repository lacks (a retry
                // gets its agent back, whatever became of the ref).
                if let Some(agent_type) = self.scheduler.agent_type(&spec.agent) {
                    if !self.scheduler.is_retry(&spec) {
                        crate::runner::workspace::check_base(&agent_type, base).await?;
                    }
                }
            }
            if spec.background {
                self.scheduler.spawn(spec).await
            } else {
                self.scheduler.spawn_foreground(spec, deadline).await
            }
        }
        .await;
        let agent = spawned
            .inspect_err(|e| self.metrics.spawn_rejected(&principal.tenant, reason_of(e)))?;
        Ok(Response::new(pb::SpawnResponse {
            agent: Some(wire::agent_to_pb(&agent, SystemTime::now())),
        }))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let principal = auth::principal(&request);
        let tenant = auth::listed_tenant(&principal, &request.get_ref().tenant, STATUS)?;
        let scope = auth::scope_of(&principal);
        let response = match wire::parse_status(request.into_inner(), tenant)? {
            wire::StatusQuery::Ids(ids) => pb::StatusResponse {
                agents: wire::agents_to_pb(&self.scheduler.status(&scope, &ids, "ids").await?),
                next_page_token: String::new(),
            },
            wire::StatusQuery::List {
                filter,
                after,
                limit,
            } => {
                let page = self.scheduler.list(&filter, after, limit).await?;
                pb::StatusResponse {
                    agents: wire::agents_to_pb(&page.agents),
                    next_page_token: page.next_after.map(|s| s.to_string()).unwrap_or_default(),
                }
            }
        };
        Ok(Response::new(response))
    }

    async fn get_transcript(
        &self,
        request: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::GetTranscriptResponse>, Status> {
        let scope = auth::scope_of(&auth::principal(&request));
        let q = wire::parse_get_transcript(request.into_inner())?;
        let page = self
            .scheduler
            .transcript(&scope, q.target, q.after, q.limit)
            .await?;
        Ok(Response::new(wire::transcript_to_pb(&page)))
    }

    async fn get_server_info(
        &self,
        _request: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        Ok(Response::new(wire::server_info_to_pb(
            env!("CARGO_PKG_VERSION"),
            &self.scheduler.agent_types(),
            &self.mcp,
        )))
    }

    async fn r#await(
        &self,
        request: Request<pb::AwaitRequest>,
    ) -> Result<Response<pb::AwaitResponse>, Status> {
        let principal = auth::principal(&request);
        let scope = auth::scope_of(&principal);
        let q = wire::parse_await(request.into_inner())?;
        if q.collect {
            auth::may_collect(&principal)?;
        }
        let (agents, timed_out) = match &q.target {
            wire::AwaitTarget::Ids(ids) => {
                let (mut agents, timed_out) = self
                    .scheduler
                    .await_agents(&scope, ids, Some(q.timeout), q.mode)
                    .await?;
                if q.collect {
                    self.scheduler.collect(&mut agents).await?;
                }
                (agents, timed_out)
            }
            // A lead id names a lead of the caller's own tenant, as in
            // Cancel.
            wire::AwaitTarget::Inbox(of) => {
                self.scheduler
                    .await_inbox(&scope, &principal.tenant, of, q.timeout, q.mode, q.collect)
                    .await?
            }
        };
        Ok(Response::new(pb::AwaitResponse {
            agents: wire::agents_to_pb(&agents),
            timed_out,
        }))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let principal = auth::principal(&request);
        let (target, reason) = wire::parse_cancel(request.into_inner())?;
        let cancelled = match target {
            wire::CancelTarget::Agent(id) => {
                let scope = auth::scope_of(&principal);
                self.scheduler.cancel(&scope, id, &reason).await?
            }
            // A lead id names a lead of the caller's own tenant, an admin's
            // too: the same lead id in two tenants names two unrelated leads.
            wire::CancelTarget::Lead(lead) => {
                self.scheduler
                    .cancel_lead(&principal.tenant, &lead, &reason)
                    .await?
            }
        };
        Ok(Response::new(pb::CancelResponse {
            agents: wire::agents_to_pb(&cancelled),
        }))
    }

    async fn steer(
        &self,
        request: Request<pb::SteerRequest>,
    ) -> Result<Response<pb::SteerResponse>, Status> {
        let scope = auth::scope_of(&auth::principal(&request));
        let (id, message) = wire::parse_steer(request.into_inner())?;
        let (agent, delivery) = self.scheduler.steer(&scope, id, message).await?;
        Ok(Response::new(pb::SteerResponse {
            agent: Some(wire::agent_to_pb(&agent, SystemTime::now())),
            delivery: wire::delivery_to_pb(delivery) as i32,
        }))
    }

    async fn approve(
        &self,
        request: Request<pb::ApproveRequest>,
    ) -> Result<Response<pb::ApproveResponse>, Status> {
        let scope = auth::scope_of(&auth::principal(&request));
        let (id, approval_id, outcome) = wire::parse_approve(request.into_inner())?;
        let agent = self
            .scheduler
            .approve(&scope, id, approval_id, outcome)
            .await?;
        Ok(Response::new(pb::ApproveResponse {
            agent: Some(wire::agent_to_pb(&agent, SystemTime::now())),
        }))
    }

    type WatchAgentsStream = WatchStream;

    async fn watch_agents(
        &self,
        request: Request<pb::WatchAgentsRequest>,
    ) -> Result<Response<Self::WatchAgentsStream>, Status> {
        // The server mounts `watch_route`, which serves WatchAgents from
        // `watch_encoded` directly; this generated route decodes the same
        // bytes for anyone mounting the plain generated server.
        let encoded = self.watch_encoded(request)?;
        let decoded = futures_util::StreamExt::map(encoded, |item| {
            item.and_then(|bytes| {
                <pb::WatchAgentsResponse as prost::Message>::decode(bytes)
                    .map_err(|e| Status::internal(e.to_string()))
            })
        });
        Ok(Response::new(Box::pin(decoded)))
    }
}

/// One subscriber's position: initial events first, then live ones that
/// pass its filter.
struct WatchState {
    /// The subscription's own change (snapshot sequence numbers), waited
    /// for before the first event; None once waited.
    initial_ticket: Option<u64>,
    initial: std::vec::IntoIter<Arc<Event>>,
    /// Lifecycle events, plus progress if the subscriber asked for it,
    /// durable and filtered by the scheduler (`WatchLive::settle`).
    live: WatchLive,
    shutdown: CancellationToken,
    done: bool,
    metrics: ApiMetrics,
    /// The subscriber's credential: the stream ends UNAUTHENTICATED once
    /// it is revoked.
    revocation: Option<crate::auth::Revocation>,
}

impl WatchState {
    /// Ends the stream UNAVAILABLE `STORE_FAILED`: what follows was never
    /// written.
    fn store_failed(mut self) -> Option<(Result<Bytes, Status>, Self)> {
        self.done = true;
        Some((Err(Error::StoreFailed.into()), self))
    }

    async fn next(mut self) -> Option<(Result<Bytes, Status>, Self)> {
        if self.done {
            return None;
        }
        if let Some(ticket) = self.initial_ticket.take() {
            if self.live.initial_durable(ticket).await.is_err() {
                return self.store_failed();
            }
        }
        if let Some(event) = self.initial.next() {
            return Some((Ok(wire::event_wire(&event)), self));
        }
        loop {
            let received = if self.shutdown.is_cancelled() {
                // Shutting down: send what is already published (the
                // cancellations of the shutdown itself among it), then end
                // the stream cleanly.
                match self.live.try_recv() {
                    Received::Empty | Received::Closed => return None,
                    received => received,
                }
            } else {
                tokio::select! {
                    biased;
                    r = self.live.recv() => r,
                    () = self.shutdown.cancelled() => continue,
                    refusal = auth::revoked(&mut self.revocation) => {
                        self.done = true;
                        return Some((Err(refusal.into()), self));
                    }
                }
            };
            match received {
                Received::Event(event) => match self.live.settle(event).await {
                    Ok(Some(event)) => return Some((Ok(wire::event_wire(&event)), self)),
                    Ok(None) => {}
                    Err(_) => return self.store_failed(),
                },
                Received::Lagged(missed) => {
                    self.done = true;
                    self.metrics.watch_lagged();
                    let status = watch_lagged(missed, self.live.resume_after());
                    return Some((Err(status), self));
                }
                Received::Closed | Received::Empty => return None,
            }
        }
    }
}
