//! The baseline the Spawn path is measured against: a tonic server of
//! `subagents.v1.AgentService` whose Spawn does nothing but return a
//! prebuilt response.
//!
//! It answers "what does gRPC itself cost here": the same tonic version,
//! runtime flavour, HTTP/2 settings, request decoding and a response of the
//! same shape and size as subagentd's answer to a background Spawn. What
//! subagentd costs beyond it is the price of scheduling. `subagentd-bench`
//! runs it as a process (`noop-server`); the allocation guard
//! (`tests/spawn_cost.rs`) serves it in-process.

use std::{future::Future, pin::Pin, time::Duration};

use futures_util::Stream;
use tokio::net::TcpListener;
use tonic::{
    transport::{server::TcpIncoming, Server},
    Request, Response, Status,
};

use crate::pb::{
    self,
    agent_service_server::{AgentService, AgentServiceServer},
};

/// Same HTTP/2 keepalive settings as subagentd's server, so the only
/// difference is what the handler does.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// AgentService with a no-op Spawn; every other method is UNIMPLEMENTED.
#[derive(Debug, Clone)]
pub struct NoopAgentService {
    response: pb::SpawnResponse,
}

impl Default for NoopAgentService {
    fn default() -> Self {
        Self::new()
    }
}

impl NoopAgentService {
    /// A service answering every Spawn with [`typical_spawn_response`].
    pub fn new() -> Self {
        Self {
            response: typical_spawn_response(),
        }
    }
}

/// What subagentd answers to the bench's background Spawn (agent
/// `simulated`, model `bench/m`, prompt `hi`): a RUNNING root agent with a
/// UUID, timestamps, empty usage and its bucket. Same fields set, same
/// encoded size.
pub fn typical_spawn_response() -> pb::SpawnResponse {
    let id = uuid::Uuid::new_v4().to_string();
    let now = prost_types::Timestamp::from(std::time::SystemTime::now());
    pb::SpawnResponse {
        agent: Some(pb::Agent {
            id: id.clone(),
            agent: "simulated".to_owned(),
            model: "bench/m".to_owned(),
            root_id: id,
            depth: 1,
            status: pb::AgentStatus::Running as i32,
            created_at: Some(now),
            started_at: Some(now),
            usage: Some(pb::Usage::default()),
            background: true,
            bucket: "bench/m".to_owned(),
            ..Default::default()
        }),
    }
}

fn unimplemented() -> Status {
    Status::unimplemented("the no-op baseline server implements only Spawn")
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchAgentsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for NoopAgentService {
    async fn spawn(
        &self,
        _request: Request<pb::SpawnRequest>,
    ) -> Result<Response<pb::SpawnResponse>, Status> {
        Ok(Response::new(self.response.clone()))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Err(unimplemented())
    }

    async fn r#await(
        &self,
        _request: Request<pb::AwaitRequest>,
    ) -> Result<Response<pb::AwaitResponse>, Status> {
        Err(unimplemented())
    }

    async fn cancel(
        &self,
        _request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        Err(unimplemented())
    }

    async fn steer(
        &self,
        _request: Request<pb::SteerRequest>,
    ) -> Result<Response<pb::SteerResponse>, Status> {
        Err(unimplemented())
    }

    async fn approve(
        &self,
        _request: Request<pb::ApproveRequest>,
    ) -> Result<Response<pb::ApproveResponse>, Status> {
        Err(unimplemented())
    }

    async fn get_transcript(
        &self,
        _request: Request<pb::GetTranscriptRequest>,
    ) -> Result<Response<pb::GetTranscriptResponse>, Status> {
        Err(unimplemented())
    }

    async fn get_server_info(
        &self,
        _request: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        Err(unimplemented())
    }

    type WatchAgentsStream = WatchStream;

    async fn watch_agents(
        &self,
        _request: Request<pb::WatchAgentsRequest>,
    ) -> Result<Response<Self::WatchAgentsStream>, Status> {
        Err(unimplemented())
    }
}

/// Serves the no-op AgentService (and health) on `listener` until
/// `shutdown` completes.
pub async fn serve_noop(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<AgentServiceServer<NoopAgentService>>()
        .await;
    Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(health_service)
        .add_service(AgentServiceServer::new(NoopAgentService::new()))
        // TCP_NODELAY as subagentd's listener (and tonic's own `serve`):
        // without it small answers wait for the peer's delayed ACK.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn baseline_response_has_the_size_of_a_background_spawn_answer() {
        // id (36) + root_id (36) + names + two timestamps + flags: well over
        // 100 bytes, as subagentd's answer.
        let len = typical_spawn_response().encoded_len();
        assert!((120..200).contains(&len), "{len}");
    }
}
