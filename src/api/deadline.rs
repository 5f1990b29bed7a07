//! Call deadlines: a call whose `grpc-timeout` passes on the server ends
//! with `DEADLINE_EXCEEDED`, unary or streaming.
//!
//! Why a layer of our own: tonic's server enforces `grpc-timeout` too, but
//! only until the response head, and answers `CANCELLED: Timeout expired`,
//! where the gRPC status codes say a passed deadline is `DEADLINE_EXCEEDED`
//! (clients' retry and alerting rules key on it). This layer sits inside
//! tonic's and starts its timer first (it reads the header in `call`, which
//! tonic's runs before arming its own), so with both due in the same timer
//! tick this one answers: tonic polls the inner future before its timer.
//! A stream's deadline is kept after the head: its body then ends with
//! `DEADLINE_EXCEEDED` trailers. Either way the handler's future or stream
//! is dropped, which cancels a foreground agent and removes an Await's
//! waiter, as when the client goes away.

use std::{
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
    time::Duration,
};

use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Longest slack: a call the client abandons at most this long before the
/// server's deadline (or a tenth of its timeout, if less) ended by its
/// deadline. The client's clock started first (the header travelled to us),
/// so a client that resets the call at its deadline does so a little before
/// ours; that is still the deadline, not a cancel.
const MAX_SLACK: Duration = Duration::from_millis(50);

/// When a call must end, from its `grpc-timeout` header. Put into the
/// request's extensions by [`DeadlineLayer`] for handlers that want it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDeadline {
    /// The deadline on the server's clock.
    pub at: Instant,
    /// The timeout the client sent.
    pub timeout: Duration,
}

impl CallDeadline {
    /// The deadline of a call arriving now with these headers; None without
    /// a (valid) `grpc-timeout`.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<Self> {
        const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");
        let timeout = parse_grpc_timeout(headers.get(GRPC_TIMEOUT)?.to_str().ok()?)?;
        Some(Self {
            at: Instant::now() + timeout,
            timeout,
        })
    }

    /// From when a call that ends counts as ended by its deadline: the
    /// deadline less the slack (see [`MAX_SLACK`]).
    pub fn passes_at(&self) -> Instant {
        self.at - MAX_SLACK.min(self.timeout / 10)
    }

    /// Whether a call ending at `now` ended because its deadline passed.
    pub fn has_passed_at(&self, now: Instant) -> bool {
        now >= self.passes_at()
    }

    /// [`CallDeadline::has_passed_at`] now.
    pub fn has_passed(&self) -> bool {
        self.has_passed_at(Instant::now())
    }
}

/// Parses a `grpc-timeout` value: at most 8 digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`), as the gRPC over HTTP/2 spec defines it.
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn exceeded(deadline: &CallDeadline) -> tonic::Status {
    tonic::Status::deadline_exceeded(format!(
        "deadline exceeded: the call's grpc-timeout of {} passed",
        humantime::format_duration(deadline.timeout)
    ))
}

/// The layer (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService { inner }
    }
}

/// The service [`DeadlineLayer`] wraps around each gRPC service.
#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for DeadlineService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Body,
{
    type Response = http::Response<DeadlineBody<ResBody>>;
    type Error = S::Error;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        // The RPC layer outside this one has read the header already.
        // The RPC layer outside put it there; without it (this layer used
        // alone) it is read here.
        let deadline = match req.extensions().get::<CallDeadline>() {
            Some(deadline) => Some(*deadline),
            None => {
                let deadline = CallDeadline::from_headers(req.headers());
                if let Some(deadline) = deadline {
                    req.extensions_mut().insert(deadline);
                }
                deadline
            }
        };
        let timer = deadline.map(|deadline| Timer {
            deadline,
            sleep: None,
        });
        DeadlineFuture {
            inner: self.inner.call(req),
            timer,
        }
    }
}

/// A call's deadline and its timer, armed the first time the call is
/// still pending when polled: most unary calls answer at their first poll
/// and never need one (boxed: only calls that wait have one). Armed late,
/// it still fires at the deadline read when the call came in.
struct Timer {
    deadline: CallDeadline,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Timer {
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.deadline.at;
        self.sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)))
            .as_mut()
            .poll(cx)
    }
}

pin_project! {
    /// The response future of [`DeadlineService`].
    pub struct DeadlineFuture<F> {
        #[pin]
        inner: F,
        timer: Option<Timer>,
    }
}

impl<F, ResBody, E> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
    ResBody: Body,
{
    type Output = Result<http::Response<DeadlineBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.inner.poll(cx) {
            let timer = this.timer.take();
            return Poll::Ready(result.map(|response| {
                response.map(|inner| DeadlineBody {
                    inner: Some(inner),
                    timer,
                })
            }));
        }
        let Some(timer) = this.timer.as_mut() else {
            return Poll::Pending;
        };
        ready!(timer.poll_expired(cx));
        // The handler's future is dropped with this one.
        Poll::Ready(Ok(exceeded(&timer.deadline).into_http()))
    }
}

pin_project! {
    /// A response body that ends with `DEADLINE_EXCEEDED` trailers when its
    /// call's deadline passes first; empty for a trailers-only response.
    pub struct DeadlineBody<B> {
        #[pin]
        inner: Option<B>,
        timer: Option<Timer>,
    }
}

impl<B> Default for DeadlineBody<B> {
    fn default() -> Self {
        Self {
            inner: None,
            timer: None,
        }
    }
}

impl<B: Body> Body for DeadlineBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(frame) = inner.poll_frame(cx) {
            if matches!(frame, None | Some(Err(_))) {
                *this.timer = None;
            } else if let Some(Ok(f)) = &frame {
                if f.is_trailers() {
                    *this.timer = None;
                }
            }
            return Poll::Ready(frame);
        }
        let Some(timer) = this.timer.as_mut() else {
            return Poll::Pending;
        };
        ready!(timer.poll_expired(cx));
        let status = exceeded(&timer.deadline);
        *this.timer = None;
        // Drops the stream behind the body (a watch unsubscribes).
        this.inner.set(None);
        let mut trailers = http::HeaderMap::new();
        // Cannot fail: the message is ASCII and the status has no metadata.
        let _ = status.add_header(&mut trailers);
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_values_parse_by_the_spec() {
        assert_eq!(
            parse_grpc_timeout("1500m"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "123", "123456789m", "12x", "-1m", "1.5S", " 1S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_cancel_just_before_the_deadline_counts_as_the_deadline() {
        let now = Instant::now();
        let long = CallDeadline {
            at: now + Duration::from_secs(2),
            timeout: Duration::from_secs(2),
        };
        assert!(!long.has_passed_at(now));
        assert!(!long.has_passed_at(long.at - Duration::from_millis(51)));
        assert!(long.has_passed_at(long.at - Duration::from_millis(50)));
        assert!(long.has_passed_at(long.at + Duration::from_secs(1)));
        // Short timeouts get a tenth of their length.
        let short = CallDeadline {
            at: now + Duration::from_millis(100),
            timeout: Duration::from_millis(100),
        };
        assert!(!short.has_passed_at(short.at - Duration::from_millis(11)));
        assert!(short.has_passed_at(short.at - Duration::from_millis(10)));
    }
}
