//! Ends a service's open streams when the server shuts down.
//!
//! Graceful shutdown waits for open streams before it closes connections.
//! Our own streams (WatchAgents, worker sessions) end themselves; the health
//! service's Watch streams never do, so one probe client holding one open
//! would hold the exit back for the whole connection drain. This wrapper
//! finishes such a stream with status OK once shutdown begins, after any
//! message already waiting (the NOT_SERVING update) has been sent.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{codegen::BoxFuture, server::NamedService};
use tower::Service;

/// `S`, with the response bodies of its server-streaming methods (named in
/// `streaming`) ended at `shutdown`; unary answers are left alone.
#[derive(Debug, Clone)]
pub struct EndOnShutdown<S> {
    inner: S,
    shutdown: CancellationToken,
    streaming: &'static [&'static str],
}

impl<S> EndOnShutdown<S> {
    /// Wraps `inner`, whose streaming methods are the paths `streaming`.
    pub fn new(inner: S, shutdown: CancellationToken, streaming: &'static [&'static str]) -> Self {
        Self {
            inner,
            shutdown,
            streaming,
        }
    }
}

impl<S: NamedService> NamedService for EndOnShutdown<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for EndOnShutdown<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let streaming = self.streaming.contains(&req.uri().path());
        let response = self.inner.call(req);
        let shutdown = self.shutdown.clone();
        Box::pin(async move {
            let response = response.await?;
            if !streaming {
                return Ok(response);
            }
            Ok(response.map(|inner| {
                tonic::body::Body::new(EndingBody {
                    inner,
                    shutdown: Box::pin(shutdown.cancelled_owned()),
                    done: false,
                })
            }))
        })
    }
}

struct EndingBody {
    inner: tonic::body::Body,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    done: bool,
}

impl Body for EndingBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        // What the stream already has goes first.
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if frame.is_none() {
                self.done = true;
            }
            return Poll::Ready(frame);
        }
        if self.shutdown.as_mut().poll(cx).is_ready() {
            self.done = true;
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}
