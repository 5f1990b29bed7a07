//! A small OpenAI-wire-compatible server (axum on 127.0.0.1:0) for the
//! `openai` runner's tests: it records every request (headers and JSON
//! body), reports its arrival on a channel, and answers as a script says.
//! Streams that must stay open wait on a gate the test opens, or hold
//! forever with a guard that signals when the server drops the response
//! body, so no test sleeps to wait for state.

use std::{
    collections::VecDeque,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::State,
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{
        sse::{Event, Sse},
        IntoResponse, Response,
    },
    routing::post,
    Json, Router,
};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, Notify};

/// How long anything the tests wait for may take.
pub const GUARD: Duration = Duration::from_secs(10);

/// One request the fake server received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Value,
    /// When it arrived.
    pub at: Instant,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header"))
    }

    /// The request's messages as (role, content) pairs.
    pub fn messages(&self) -> Vec<(String, String)> {
        self.body["messages"]
            .as_array()
            .expect("messages is an array")
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().expect("role").to_owned(),
                    m["content"].as_str().expect("content").to_owned(),
                )
            })
            .collect()
    }
}

/// Signals its oneshot when dropped: put in a held-open stream, it tells
/// the test that the server dropped the response body (the client left).
pub struct DropSignal(pub Option<oneshot::Sender<()>>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// One step of a streamed completion.
pub enum Piece {
    /// A chunk whose delta carries this content.
    Text(String),
    /// The final usage chunk (`choices: []`).
    Usage { prompt: u64, completion: u64 },
    /// Waits until the gate is notified.
    Gate(Arc<Notify>),
    /// Never goes on; drops the signal when the stream is dropped.
    Hold(DropSignal),
}

/// How the fake server answers one request.
pub enum Reply {
    /// 200 with an SSE stream: a role chunk, the pieces, a finish chunk
    /// and `data: [DONE]` (unless a piece holds forever).
    Stream(Vec<Piece>),
    /// An error status with a body and maybe `Retry-After`.
    Error {
        status: u16,
        retry_after: Option<&'static str>,
        body: String,
    },
}

pub fn text(t: &str) -> Piece {
    Piece::Text(t.to_owned())
}

/// A normal completion of `chunks` with the given usage.
pub fn completion(chunks: &[&str], prompt: u64, completion: u64) -> Reply {
    let mut pieces: Vec<Piece> = chunks.iter().map(|c| text(c)).collect();
    pieces.push(Piece::Usage { prompt, completion });
    Reply::Stream(pieces)
}

/// An OpenAI-style error reply.
pub fn error_reply(
    status: u16,
    retry_after: Option<&'static str>,
    message: &str,
    kind: &str,
) -> Reply {
    Reply::Error {
        status,
        retry_after,
        body: json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
            .to_string(),
    }
}

/// Builds the reply to request number `n` (0-based).
pub type Script = Arc<dyn Fn(usize) -> Reply + Send + Sync>;

#[derive(Clone)]
struct FakeState {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub arrived: mpsc::UnboundedSender<usize>,
    pub script: Script,
}

/// A running fake server; aborted when dropped.
pub struct Fake {
    pub base_url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub arrived: mpsc::UnboundedReceiver<usize>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    pub async fn start(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let state = FakeState {
            seen: seen.clone(),
            arrived: arrived_tx,
            script: Arc::new(script),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake server binds");
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake server runs");
        });
        Self {
            base_url: format!("http://{addr}/v1"),
            seen,
            arrived,
            task,
        }
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until request number `n` (0-based) has arrived.
    pub async fn wait_for_request(&mut self, n: usize) {
        tokio::time::timeout(GUARD, async {
            loop {
                let got = self.arrived.recv().await.expect("fake server alive");
                if got >= n {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("request #{n} arrives within {GUARD:?}"));
    }
}

async fn chat_completions(
    State(state): State<FakeState>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let n = {
        let mut seen = state.seen.lock().unwrap();
        seen.push(Seen {
            headers,
            body,
            at: Instant::now(),
        });
        seen.len() - 1
    };
    let _ = state.arrived.send(n);
    match (state.script)(n) {
        Reply::Stream(pieces) => sse(pieces),
        Reply::Error {
            status,
            retry_after,
            body,
        } => {
            let mut response = (
                StatusCode::from_u16(status).unwrap(),
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response();
            if let Some(after) = retry_after {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static(after));
            }
            response
        }
    }
}

fn chunk(delta: Value, finish_reason: Value) -> Event {
    Event::default().data(
        json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        })
        .to_string(),
    )
}

/// The OpenAI streaming format over SSE.
fn sse(pieces: Vec<Piece>) -> Response {
    enum Step {
        Event(Event),
        Piece(Piece),
    }
    let mut steps = VecDeque::new();
    steps.push_back(Step::Event(chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )));
    steps.extend(pieces.into_iter().map(Step::Piece));
    steps.push_back(Step::Event(chunk(json!({}), json!("stop"))));
    steps.push_back(Step::Event(Event::default().data("[DONE]")));
    let stream = futures_util::stream::unfold(steps, |mut steps| async move {
        loop {
            let event = match steps.pop_front()? {
                Step::Event(event) => event,
                Step::Piece(Piece::Text(t)) => chunk(json!({"content": t}), Value::Null),
                Step::Piece(Piece::Usage { prompt, completion }) => Event::default().data(
                    json!({
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "total_tokens": prompt + completion,
                        },
                    })
                    .to_string(),
                ),
                Step::Piece(Piece::Gate(gate)) => {
                    gate.notified().await;
                    continue;
                }
                Step::Piece(Piece::Hold(signal)) => {
                    let _signal = signal;
                    std::future::pending::<()>().await;
                    continue;
                }
            };
            return Some((Ok::<_, Infallible>(event), steps));
        }
    });
    Sse::new(stream).into_response()
}
