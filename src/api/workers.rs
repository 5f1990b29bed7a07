//! `subagents.v1.WorkerService`: one session per connected worker. The
//! handler validates the hello, registers the worker with the scheduler and
//! then only converts: the worker's reports go to the scheduler, the
//! scheduler's commands go to the worker.

use std::{pin::Pin, sync::Arc};

use futures_util::{Stream, StreamExt};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use crate::pb::{self, worker_service_server::WorkerService};
use crate::scheduler::{Scheduler, WorkerId};
use crate::wire;

/// The gRPC service over a [`Scheduler`].
#[derive(Debug, Clone)]
pub struct WorkerServiceImpl {
    scheduler: Scheduler,
    /// Cancelled at shutdown: sessions stop reading.
    shutdown: CancellationToken,
}

impl WorkerServiceImpl {
    /// A service over `scheduler`; sessions end when `shutdown` fires.
    pub fn new(scheduler: Scheduler, shutdown: CancellationToken) -> Self {
        Self {
            scheduler,
            shutdown,
        }
    }
}

type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::ConnectResponse, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerService for WorkerServiceImpl {
    type ConnectStream = ConnectStream;

    async fn connect(
        &self,
        request: Request<Streaming<pb::ConnectRequest>>,
    ) -> Result<Response<ConnectStream>, Status> {
        let principal = super::auth::principal(&request);
        let revocation = super::auth::revocation(&request);
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await
            .map_err(super::status::undecodable_is_invalid)?
            .ok_or_else(|| {
                Status::from(crate::scheduler::Error::invalid(
                    "hello",
                    "the stream ended before the worker's `hello`",
                ))
            })?;
        let (mut hello, held) = wire::parse_hello(first, &self.scheduler.worker_agent_types())?;
        hello.tenant = principal.tenant.clone();
        let denied: Vec<String> = hello
            .agents
            .iter()
            .filter(|t| !principal.may_serve(t))
            .map(|t| t.to_string())
            .collect();
        if !denied.is_empty() {
            return Err(crate::auth::AuthError::AgentTypesDenied { types: denied }.into());
        }
        let name = hello.name.clone();
        let agents = hello.agents.join(",");
        let capacity = hello.capacity;
        let (commands, outbound) = tokio::sync::mpsc::unbounded_channel();
        let ended = Arc::new(parking_lot::Mutex::new(None));
        let worker_id = self.scheduler.register_worker(hello, commands, &held);
        let tenant = &principal.tenant;
        info!(%worker_id, %name, %tenant, %agents, capacity, held = held.len(), "worker connected");
        let session = Session {
            scheduler: self.scheduler.clone(),
            worker_id,
            name: name.to_string(),
            revocation,
            ended: ended.clone(),
        };
        tokio::spawn(session.run(inbound, self.shutdown.clone()));
        let welcome = futures_util::stream::once(async move { wire::welcome_to_pb(worker_id) });
        // The command channel closes when the scheduler forgets the worker
        // (its session ended), which ends this stream: with OK, or with
        // the status the session ended with.
        let commands = UnboundedReceiverStream::new(outbound).map(wire::worker_command_to_pb);
        let last = futures_util::stream::once(async move { ended.lock().take() })
            .filter_map(|status| async move { status.map(Err) });
        Ok(Response::new(Box::pin(
            welcome.chain(commands).map(Ok).chain(last),
        )))
    }
}

/// The reading half of a worker session. However it ends — the worker
/// closed its side, the connection broke or stopped answering keepalive
/// pings, the server shuts down — the worker is lost exactly once (on drop).
struct Session {
    scheduler: Scheduler,
    worker_id: WorkerId,
    name: String,
    /// The worker's credential: the session ends once it is revoked.
    revocation: Option<crate::auth::Revocation>,
    /// Why the server ended the session, for the worker's stream.
    ended: Arc<parking_lot::Mutex<Option<Status>>>,
}

impl Session {
    async fn run(
        mut self,
        mut inbound: Streaming<pb::ConnectRequest>,
        shutdown: CancellationToken,
    ) {
        loop {
            let message = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                refusal = super::auth::revoked(&mut self.revocation) => {
                    warn!(worker_id = %self.worker_id, name = %self.name, %refusal, "worker's credential no longer accepted: session ended");
                    *self.ended.lock() = Some(refusal.into());
                    return;
                }
                m = inbound.message() => m,
            };
            let request = match message {
                Ok(Some(request)) => request,
                Ok(None) => {
                    info!(worker_id = %self.worker_id, name = %self.name, "worker closed its session");
                    return;
                }
                Err(status) => {
                    warn!(worker_id = %self.worker_id, name = %self.name, %status, "worker session broke");
                    let status = super::status::undecodable_is_invalid(status);
                    if status.code() == tonic::Code::InvalidArgument {
                        // The worker sent bytes that are no message: say so.
                        *self.ended.lock() = Some(status);
                    }
                    return;
                }
            };
            match request.message {
                Some(pb::connect_request::Message::Event(event)) => self.apply(event),
                Some(pb::connect_request::Message::Drain(drain)) => {
                    if self.scheduler.drain_worker(self.worker_id) {
                        info!(
                            worker_id = %self.worker_id, name = %self.name, reason = %drain.reason,
                            "worker draining: no new runs for it"
                        );
                    }
                }
                Some(pb::connect_request::Message::Hello(_)) => {
                    warn!(worker_id = %self.worker_id, "a second hello is ignored");
                }
                None => warn!(worker_id = %self.worker_id, "an empty message is ignored"),
            }
        }
    }

    fn apply(&self, event: pb::RunEvent) {
        let number = crate::scheduler::ReportNumber {
            seq: event.seq,
            attempt: event.attempt,
        };
        match wire::worker_event_from_pb(event) {
            Ok((agent, event)) => {
                let kind = worker_event_name(&event);
                if !self
                    .scheduler
                    .worker_report(self.worker_id, agent, number, event)
                {
                    // Normal after a cancel or deadline (the worker had not
                    // seen the stop yet), but worth seeing when it is not.
                    info!(
                        worker_id = %self.worker_id, %agent, kind,
                        "worker report ignored: not a live run of this worker"
                    );
                }
            }
            Err(why) => warn!(worker_id = %self.worker_id, %why, "worker report ignored"),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let runs = self.scheduler.worker_lost(self.worker_id);
        info!(worker_id = %self.worker_id, name = %self.name, runs, "worker lost");
    }
}

fn worker_event_name(event: &crate::scheduler::WorkerEvent) -> &'static str {
    use crate::scheduler::WorkerEvent as E;
    match event {
        E::Output(_) => "output",
        E::ToolCall { .. } => "tool_call",
        E::Usage(_) => "usage",
        E::ApprovalRequest { .. } => "approval_request",
        E::TurnStarted => "turn_started",
        E::Workspace(_) => "workspace",
        E::Done { .. } => "done",
        E::Failed { .. } => "failed",
    }
}
