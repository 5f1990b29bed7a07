//! The AgentService router: the generated server for every method, except
//! WatchAgents, which is served with a codec that writes pre-encoded events.
//!
//! Why: with many watchers every event is sent many times. The generated
//! route would convert and encode the same event once per subscriber (about
//! 1 µs each, measured: BENCHMARKS.md); here the first subscriber that sends
//! an event encodes it into [`Event::wire`](crate::scheduler::Event) and
//! every other one copies those bytes. The bytes on the wire are exactly
//! what the generated code would write, so clients see no difference.

use std::{convert::Infallible, sync::Arc};

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use tonic::{
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError},
    server::{Grpc, NamedService, ServerStreamingService},
    Status,
};

use super::service::{AgentServiceImpl, EncodedWatchStream};
use crate::pb::{self, agent_service_server::AgentServiceServer};

const WATCH_PATH: &str = "/subagents.v1.AgentService/WatchAgents";

/// `subagents.v1.AgentService`, with the fast WatchAgents route.
#[derive(Debug, Clone)]
pub struct AgentServiceRouter {
    generated: AgentServiceServer<AgentServiceImpl>,
    service: Arc<AgentServiceImpl>,
    max_message_bytes: usize,
}

impl AgentServiceRouter {
    /// Routes for `service`, decoding requests of at most
    /// `max_message_bytes` (a larger one is RESOURCE_EXHAUSTED).
    pub fn new(service: AgentServiceImpl, max_message_bytes: usize) -> Self {
        Self {
            generated: AgentServiceServer::new(service.clone())
                .max_decoding_message_size(max_message_bytes),
            service: Arc::new(service),
            max_message_bytes,
        }
    }
}

impl NamedService for AgentServiceRouter {
    const NAME: &'static str = <AgentServiceServer<AgentServiceImpl> as NamedService>::NAME;
}

impl<B> Service<http::Request<B>> for AgentServiceRouter
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != WATCH_PATH {
            let answer = self.generated.call(req);
            return Box::pin(async move { answer.await.map(prescribed_codes) });
        }
        let method = WatchRoute(self.service.clone());
        let limit = self.max_message_bytes;
        Box::pin(async move {
            let mut grpc = Grpc::new(WireCodec).max_decoding_message_size(limit);
            Ok(prescribed_codes(grpc.server_streaming(method, req).await))
        })
    }
}

/// Rewrites the two refusals tonic makes while decoding a request into the
/// codes the gRPC status definitions prescribe: a request over the message
/// size limit is RESOURCE_EXHAUSTED (tonic: OUT_OF_RANGE), and one whose
/// bytes are not a valid message is INVALID_ARGUMENT (tonic: INTERNAL,
/// which tells a client the server broke). A request is decoded before
/// anything is sent, so either refusal is a trailers-only answer: its
/// status is in the headers.
fn prescribed_codes(
    mut answer: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = answer.headers_mut();
    let status = headers.get("grpc-status").map(|s| s.as_bytes().to_vec());
    let says = |needles: &[&[u8]]| {
        headers.get("grpc-message").is_some_and(|m| {
            let m = m.as_bytes();
            needles
                .iter()
                .any(|needle| m.windows(needle.len()).any(|w| w == *needle))
        })
    };
    let rewrite = match status.as_deref() {
        Some(b"11")
            if says(&[
                b"message%20length%20too%20large",
                b"message length too large",
            ]) =>
        {
            Some("8") // RESOURCE_EXHAUSTED
        }
        Some(b"13") if says(&[b"failed%20to%20decode", b"failed to decode"]) => {
            Some("3") // INVALID_ARGUMENT
        }
        _ => None,
    };
    if let Some(code) = rewrite {
        headers.insert("grpc-status", http::HeaderValue::from_static(code));
    }
    answer
}

struct WatchRoute(Arc<AgentServiceImpl>);

impl ServerStreamingService<pb::WatchAgentsRequest> for WatchRoute {
    type Response = Bytes;
    type ResponseStream = EncodedWatchStream;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<pb::WatchAgentsRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.watch_encoded(request).map(tonic::Response::new) })
    }
}

/// Decodes WatchAgentsRequest like the generated codec; encodes by copying
/// an already-encoded message.
#[derive(Debug, Clone, Copy, Default)]
struct WireCodec;

impl Codec for WireCodec {
    type Encode = Bytes;
    type Decode = pb::WatchAgentsRequest;
    type Encoder = WireCodec;
    type Decoder = WireCodec;

    fn encoder(&mut self) -> Self::Encoder {
        WireCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireCodec
    }
}

impl Encoder for WireCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for WireCodec {
    type Item = pb::WatchAgentsRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let request =
            pb::WatchAgentsRequest::decode(src.copy_to_bytes(src.remaining())).map_err(|e| {
                Status::invalid_argument(format!("cannot decode WatchAgentsRequest: {e}"))
            })?;
        Ok(Some(request))
    }
}
