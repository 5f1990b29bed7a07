//! An OTLP trace receiver in the test: opentelemetry-proto's TraceService
//! over real gRPC on 127.0.0.1:0, keeping every span it is sent.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        trace_service_server::{TraceService, TraceServiceServer},
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    },
    common::v1::KeyValue,
    trace::v1::Span,
};
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;

/// How long a span may take to arrive.
const WAIT: Duration = Duration::from_secs(20);

/// A received span and its resource's attributes.
type WithResource = (Span, Vec<KeyValue>);

/// Every span received.
#[derive(Clone, Default)]
struct Received {
    spans: Arc<Mutex<Vec<WithResource>>>,
    count: Arc<Mutex<Option<watch::Sender<usize>>>>,
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push((span, resource.clone()));
                }
            }
        }
        if let Some(tx) = self.count.lock().unwrap().as_ref() {
            tx.send_replace(spans.len());
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

pub struct Receiver {
    pub addr: std::net::SocketAddr,
    received: Received,
    count: watch::Receiver<usize>,
}

impl Receiver {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, count) = watch::channel(0);
        let received = Received::default();
        *received.count.lock().unwrap() = Some(tx);
        let service = TraceServiceServer::new(received.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Self {
            addr,
            received,
            count,
        }
    }

    pub fn spans(&self) -> Vec<Span> {
        let spans = self.received.spans.lock().unwrap();
        spans.iter().map(|(s, _)| s.clone()).collect()
    }

    /// Waits (on exports, not on a clock) until `found` finds what it looks
    /// for in the spans received so far.
    pub async fn wait_for<T>(&mut self, what: &str, found: impl Fn(&[Span]) -> Option<T>) -> T {
        let waited = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(t) = found(&self.spans()) {
                    return t;
                }
                self.count.changed().await.expect("receiver alive");
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            let names: Vec<String> = self.spans().iter().map(|s| s.name.clone()).collect();
            panic!("no {what} within {WAIT:?}; received {names:?}")
        })
    }

    pub fn resource_of(&self, span_id: &[u8]) -> Vec<KeyValue> {
        let spans = self.received.spans.lock().unwrap();
        spans
            .iter()
            .find(|(s, _)| s.span_id == span_id)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }
}
