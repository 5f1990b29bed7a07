//! The `openai` runner: each run is a streamed chat completion on an
//! OpenAI-compatible server (OpenAI, vLLM, Ollama, llama.cpp server, …).
//!
//! A continuation sends its conversation's earlier turns first (see
//! [`history_messages`]), then its prompt.
//!
//! Each streamed delta is reported as output and the final completion's
//! text is the result; token usage comes from the stream's usage chunk.
//! Steer messages that arrive while a completion streams become the next
//! user turns once it ends, so the run ends only when a completion finishes
//! with no steer pending. HTTP 429 and 5xx (and failed connections) are
//! retried with bounded exponential backoff that honours `Retry-After`;
//! other 4xx fail the run with `PROVIDER_<status>`. Cancel and deadline
//! drop the run's future, which aborts the request.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::{future::BoxFuture, StreamExt};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Run, RunOutcome, Runner};
use crate::config::AgentTypeConfig;
use crate::scheduler::{
    conversation::{EntryKind, History},
    AgentError, TurnVerdict, Usage, CODE_TURN_LIMIT,
};

/// Requests per completion, retries included.
pub const MAX_ATTEMPTS: u32 = 4;
/// First retry delay; doubles per retry.
const BASE_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between attempts, `Retry-After` included.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct OpenAiRunner {
    client: reqwest::Client,
}

impl OpenAiRunner {
    /// A runner with its own connection pool.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Runner for OpenAiRunner {
    fn run(&self, run: Run) -> BoxFuture<'static, RunOutcome> {
        let (client, reporter) = (self.client.clone(), run.reporter.clone());
        Box::pin(async move {
            chat(client, run).await.map_err(|failure| {
                if failure.retryable {
                    reporter.retryable_failure();
                }
                failure.error
            })
        })
    }
}

/// The server's model name for a `provider/model`.
pub fn server_model(cfg: &AgentTypeConfig, model: &str) -> String {
    cfg.model_map.get(model).cloned().unwrap_or_else(|| {
        model
            .split_once('/')
            .map_or(model, |(_, name)| name)
            .to_owned()
    })
}

/// How a run failed, and whether another model may not fail so: rate
/// limited or out of quota, 5xx or overloaded, unknown model, missing or
/// refused credentials, or the provider unreachable. Classified by HTTP
/// status and the provider's error code, never its message.
#[derive(Debug)]
struct Failure {
    error: AgentError,
    retryable: bool,
}

impl From<AgentError> for Failure {
    fn from(error: AgentError) -> Self {
        Self {
            error,
            retryable: false,
        }
    }
}

impl Failure {
    fn retryable(error: AgentError) -> Self {
        Self {
            error,
            retryable: true,
        }
    }
}

/// Provider error codes (`error.code` or `error.type`) that another model
/// may not hit, whatever the status they come with.
const FALLBACK_CODES: &[&str] = &[
    "rate_limit_exceeded",
    "insufficient_quota",
    "model_not_found",
    "overloaded_error",
    "rate_limit_error",
    "server_error",
    "invalid_api_key",
];

/// Whether a provider's answer `status` (with its error `code`) is one
/// another model may not give.
pub(crate) fn falls_back(status: StatusCode, code: Option<&str>) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
        || status == StatusCode::UNAUTHORIZED
        || status == StatusCode::FORBIDDEN
        || status == StatusCode::NOT_FOUND
        || code.is_some_and(|c| FALLBACK_CODES.contains(&c))
}

async fn chat(client: reqwest::Client, mut run: Run) -> Result<String, Failure> {
    let cfg = run.agent_type.clone();
    let base = cfg
        .base_url
        .as_deref()
        .unwrap_or_default()
        .trim_end_matches('/');
    let request = Request {
        client: &client,
        url: format!("{base}/chat/completions"),
        // Missing credentials: another provider's may be there.
        key: api_key(&cfg).map_err(Failure::retryable)?,
        model: server_model(&cfg, &run.agent.model),
        cfg: &cfg,
        traceparent: run.traceparent(),
    };
    let mut messages = Vec::new();
    if let Some(system) = &cfg.system_prompt {
        messages.push(json!({"role": "system", "content": system}));
    }
    if let Some(history) = &run.history {
        messages.extend(history_messages(history));
    }
    messages.push(json!({"role": "user", "content": &*run.prompt}));
    loop {
        match run.reporter.turn_started() {
            TurnVerdict::Go => {}
            TurnVerdict::WrapUp(message) => {
                messages.push(json!({"role": "user", "content": &*message}));
            }
            // Ended by the scheduler, which drops this future.
            TurnVerdict::Stop => return Err(AgentError::new(CODE_TURN_LIMIT, "turn limit").into()),
        }
        let text = request.complete(&messages, &run).await?;
        messages.push(json!({"role": "assistant", "content": text}));
        let mut steered = false;
        while let Some(message) = run.steer.try_recv() {
            messages.push(json!({"role": "user", "content": message}));
            steered = true;
        }
        if !steered {
            return Ok(text);
        }
    }
}

/// A continuation's earlier turns as chat messages: prompts and steer
/// messages are the user's, each turn's output the assistant's (a turn
/// that ended with no output adds none). Tool calls are kept by name only,
/// so they are not replayed. Elided entries are announced in a system
/// message.
pub fn history_messages(history: &History) -> Vec<Value> {
    let mut messages = Vec::new();
    if history.elided.entries > 0 || history.elided.bytes > 0 {
        messages.push(json!({
            "role": "system",
            "content": format!(
                "{} earlier entries of this conversation ({} bytes) were elided.",
                history.elided.entries, history.elided.bytes
            ),
        }));
    }
    for (_, _, entry) in &history.entries {
        match entry.kind {
            EntryKind::Prompt | EntryKind::Steer => {
                messages.push(json!({"role": "user", "content": &*entry.text}));
            }
            EntryKind::Result { .. } if !entry.text.is_empty() => {
                messages.push(json!({"role": "assistant", "content": &*entry.text}));
            }
            EntryKind::Result { .. } | EntryKind::ToolCall => {}
        }
    }
    messages
}

fn api_key(cfg: &AgentTypeConfig) -> Result<Option<String>, AgentError> {
    let Some(var) = &cfg.api_key_env else {
        return Ok(None);
    };
    match std::env::var(var) {
        Ok(key) if !key.is_empty() => Ok(Some(key)),
        _ => Err(AgentError::new(
            "PROVIDER_CONFIG",
            format!("api_key_env names {var}, which is not set in the server's environment"),
        )),
    }
}

struct Request<'a> {
    client: &'a reqwest::Client,
    url: String,
    key: Option<String>,
    model: String,
    cfg: &'a AgentTypeConfig,
    traceparent: Option<String>,
}

impl Request<'_> {
    /// One streamed completion of `messages`; its text.
    async fn complete(&self, messages: &[Value], run: &Run) -> Result<String, Failure> {
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(max) = self.cfg.max_tokens {
            body["max_tokens"] = json!(max);
        }
        if let Some(t) = self.cfg.temperature {
            body["temperature"] = json!(t);
        }
        let response = self.send(&body).await?;
        let mut events = response.bytes_stream().eventsource();
        let mut text = String::new();
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| {
                AgentError::new(
                    "PROVIDER_STREAM",
                    format!("the completion stream broke: {e}"),
                )
            })?;
            let data = event.data.trim();
            if data == "[DONE]" {
                break;
            }
            if data.is_empty() {
                continue;
            }
            let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
                AgentError::new(
                    "PROVIDER_STREAM",
                    format!("unreadable completion chunk ({e}): {}", truncate(data)),
                )
            })?;
            if let Some(error) = chunk.error {
                let retryable = error.code().is_some_and(|c| FALLBACK_CODES.contains(&c));
                return Err(Failure {
                    error: AgentError::new("PROVIDER_ERROR", error.message),
                    retryable,
                });
            }
            for choice in &chunk.choices {
                if let Some(delta) = choice.delta.as_ref().and_then(|d| d.content.as_deref()) {
                    if !delta.is_empty() {
                        run.reporter.output(delta);
                        text.push_str(delta);
                    }
                }
            }
            if let Some(u) = chunk.usage {
                run.reporter.usage(Usage {
                    input_tokens: u.prompt_tokens,
                    output_tokens: u.completion_tokens,
                    tool_calls: 0,
                });
            }
        }
        Ok(text)
    }

    /// POSTs `body`, retrying 429, 5xx and failed connections.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, Failure> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut request = self
                .client
                .post(&self.url)
                .timeout(self.cfg.request_timeout())
                .json(body);
            if let Some(key) = &self.key {
                request = request.bearer_auth(key);
            }
            if let Some(traceparent) = &self.traceparent {
                request = request.header("traceparent", traceparent);
            }
            let retry_in = match request.send().await {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) if retryable(response.status()) && attempt < MAX_ATTEMPTS => {
                    backoff(attempt, retry_after(&response))
                }
                Ok(response) => return Err(provider_error(response).await),
                Err(e) if attempt < MAX_ATTEMPTS && (e.is_connect() || e.is_timeout()) => {
                    backoff(attempt, None)
                }
                Err(e) => {
                    return Err(Failure::retryable(AgentError::new(
                        "PROVIDER_UNREACHABLE",
                        format!("{}: {e} (after {attempt} attempts)", self.url),
                    )))
                }
            };
            tokio::time::sleep(retry_in).await;
        }
    }
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// `Retry-After` in seconds, if the server sent one.
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response.headers().get(reqwest::header::RETRY_AFTER)?;
    let seconds: f64 = value.to_str().ok()?.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// The wait before attempt `attempt + 1`: the server's `Retry-After` if
/// given, else 0.5 s doubling per attempt; at most 30 s either way.
fn backoff(attempt: u32, retry_after: Option<Duration>) -> Duration {
    retry_after
        .unwrap_or_else(|| BASE_BACKOFF * 2u32.saturating_pow(attempt.saturating_sub(1)))
        .min(MAX_BACKOFF)
}

/// FAILED `PROVIDER_<status>` with the provider's own message.
async fn provider_error(response: reqwest::Response) -> Failure {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<ErrorBody>(&body)
        .ok()
        .map(|b| b.error);
    let retryable = falls_back(status, detail.as_ref().and_then(ErrorDetail::code));
    let message = detail
        .map(|d| d.message)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| {
            if body.trim().is_empty() {
                status.to_string()
            } else {
                truncate(body.trim()).to_owned()
            }
        });
    Failure {
        error: AgentError::new(&format!("PROVIDER_{}", status.as_u16()), message),
        retryable,
    }
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(2000);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<ChunkUsage>,
    error: Option<ErrorDetail>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    delta: Option<Delta>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    message: String,
    /// OpenAI's `code` (a string, or null) and `type`; other servers set
    /// one or the other.
    #[serde(default)]
    code: Option<Value>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

impl ErrorDetail {
    fn code(&self) -> Option<&str> {
        self.code
            .as_ref()
            .and_then(Value::as_str)
            .or(self.kind.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_model_is_the_mapped_name_or_the_part_after_the_provider() {
        let mut cfg = AgentTypeConfig::of(crate::config::RunnerKind::Openai);
        assert_eq!(server_model(&cfg, "ollama/qwen2.5:7b"), "qwen2.5:7b");
        assert_eq!(server_model(&cfg, "vllm/org/model"), "org/model");
        cfg.model_map
            .insert("openai/fast".into(), "gpt-4.1-mini".into());
        assert_eq!(server_model(&cfg, "openai/fast"), "gpt-4.1-mini");
    }

    #[test]
    fn backoff_doubles_and_honours_retry_after_within_bounds() {
        assert_eq!(backoff(1, None), Duration::from_millis(500));
        assert_eq!(backoff(3, None), Duration::from_secs(2));
        assert_eq!(
            backoff(1, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(backoff(1, Some(Duration::from_secs(600))), MAX_BACKOFF);
        assert_eq!(backoff(30, None), MAX_BACKOFF);
    }
}
