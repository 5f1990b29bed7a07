//! Shared helpers: a real server on 127.0.0.1:0 and a generated client.
#![allow(dead_code)]

pub mod auth;
pub mod child;
pub mod cli;
pub mod openai;
pub mod otlp;
pub mod postgres;
pub mod tls;
pub mod worker;

use std::time::Duration;

use subagentd::{
    config::{Config, ConfigSource},
    pb::{self, agent_service_client::AgentServiceClient},
    server::{self, ServerHandle},
};
use tonic::transport::Channel;

/// Tests keep nothing unless they configure a store: servers of parallel
/// tests would otherwise share `./subagentd-data` (and its lock).
fn memory_unless_configured(config: &mut Config, toml: &str) {
    if !toml.contains("[store]") {
        config.store.backend = subagentd::config::StoreBackend::Memory;
    }
}

/// A server started for one test, with a connected client.
pub struct TestServer {
    pub handle: ServerHandle,
    pub client: AgentServiceClient<Channel>,
    /// The config file, when the server was started from one (for reload tests).
    pub config_file: Option<tempfile::NamedTempFile>,
}

impl TestServer {
    /// Starts a server with `toml` as its config (listening on 127.0.0.1:0).
    pub async fn start(toml: &str) -> Self {
        let mut config: Config = ConfigSource::from_toml_str(toml).expect("test config is valid");
        config.server.listen = "127.0.0.1:0".into();
        config.telemetry.metrics_listen = "127.0.0.1:0".into();
        config.http.listen = "127.0.0.1:0".into();
        // Tests that stop a server with agents still running do not wait.
        config.server.shutdown_grace = Duration::ZERO;
        memory_unless_configured(&mut config, toml);
        Self::start_config(config, ConfigSource::default(), None).await
    }

    /// Starts a server from a config file that the test may rewrite and
    /// reload with [`TestServer::reload`].
    pub async fn start_with_file(toml: &str) -> Self {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), toml).unwrap();
        let source = ConfigSource {
            file: Some(file.path().to_owned()),
            listen: Some("127.0.0.1:0".into()),
        };
        let mut config = source.load().expect("test config is valid");
        config.telemetry.metrics_listen = "127.0.0.1:0".into();
        config.http.listen = "127.0.0.1:0".into();
        config.server.shutdown_grace = Duration::ZERO;
        memory_unless_configured(&mut config, toml);
        Self::start_config(config, source, Some(file)).await
    }

    async fn start_config(
        config: Config,
        source: ConfigSource,
        config_file: Option<tempfile::NamedTempFile>,
    ) -> Self {
        let handle = server::start(config, source).await.expect("server starts");
        let client = connect(handle.addr()).await;
        Self {
            handle,
            client,
            config_file,
        }
    }

    /// Another client on its own connection.
    pub async fn new_client(&self) -> AgentServiceClient<Channel> {
        connect(self.handle.addr()).await
    }

    /// Rewrites the config file and reloads it, as SIGHUP does.
    pub fn rewrite_and_reload(&self, toml: &str) -> Result<Config, subagentd::config::ConfigError> {
        let file = self.config_file.as_ref().expect("started with a file");
        std::fs::write(file.path(), toml).unwrap();
        self.handle.reload()
    }
}

pub async fn connect(addr: std::net::SocketAddr) -> AgentServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("client connects");
    AgentServiceClient::new(channel)
}

/// A background SpawnRequest of the simulated agent on `model`.
pub fn bg(model: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: "simulated".into(),
        model: model.into(),
        prompt: prompt.into(),
        background: true,
        ..Default::default()
    }
}

/// A foreground SpawnRequest of the simulated agent on `model`.
pub fn fg(model: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        background: false,
        ..bg(model, prompt)
    }
}

/// Spawns and returns the agent, panicking on error.
pub async fn spawn(client: &mut AgentServiceClient<Channel>, req: pb::SpawnRequest) -> pb::Agent {
    client
        .spawn(req)
        .await
        .expect("spawn succeeds")
        .into_inner()
        .agent
        .expect("agent set")
}

/// Awaits all `ids` (default 30 s timeout) and returns them.
pub async fn await_all(client: &mut AgentServiceClient<Channel>, ids: &[&str]) -> Vec<pb::Agent> {
    let resp = client
        .r#await(pb::AwaitRequest {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            timeout: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            mode: pb::AwaitMode::All as i32,
            ..Default::default()
        })
        .await
        .expect("await succeeds")
        .into_inner();
    assert!(!resp.timed_out, "await timed out");
    resp.agents
}

/// Reads one agent.
pub async fn status_of(client: &mut AgentServiceClient<Channel>, id: &str) -> pb::Agent {
    client
        .status(pb::StatusRequest {
            ids: vec![id.to_owned()],
            ..Default::default()
        })
        .await
        .expect("status succeeds")
        .into_inner()
        .agents
        .remove(0)
}

/// Cancels one agent.
pub async fn cancel(client: &mut AgentServiceClient<Channel>, id: &str) -> Vec<pb::Agent> {
    client
        .cancel(pb::CancelRequest {
            id: id.to_owned(),
            ..Default::default()
        })
        .await
        .expect("cancel succeeds")
        .into_inner()
        .agents
}

pub fn status(a: &pb::Agent) -> pb::AgentStatus {
    pb::AgentStatus::try_from(a.status).unwrap()
}

/// The ErrorInfo reason and metadata of a status.
pub fn error_info(s: &tonic::Status) -> (String, std::collections::HashMap<String, String>) {
    use tonic_types::StatusExt;
    let info = s
        .get_details_error_info()
        .expect("status carries ErrorInfo");
    assert_eq!(info.domain, "subagentd");
    (info.reason, info.metadata)
}

/// The BadRequest field names of a status.
pub fn violated_fields(s: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    s.get_details_bad_request()
        .expect("status carries BadRequest")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect()
}

/// A watch stream, for waiting on events instead of sleeping.
pub async fn watch(
    client: &mut AgentServiceClient<Channel>,
    req: pb::WatchAgentsRequest,
) -> tonic::Streaming<pb::WatchAgentsResponse> {
    client
        .watch_agents(req)
        .await
        .expect("watch starts")
        .into_inner()
}

/// Reads events until one of `kind` arrives for `id`; panics after 10 s.
pub async fn wait_for_event(
    stream: &mut tonic::Streaming<pb::WatchAgentsResponse>,
    id: &str,
    kind: pb::AgentEventKind,
) -> pb::WatchAgentsResponse {
    wait_for(stream, |ev| {
        ev.kind == kind as i32 && ev.agent.as_ref().map(|a| a.id.as_str()) == Some(id)
    })
    .await
}

/// Reads events until one passes `wanted`; panics after 10 s.
pub async fn wait_for(
    stream: &mut tonic::Streaming<pb::WatchAgentsResponse>,
    wanted: impl Fn(&pb::WatchAgentsResponse) -> bool,
) -> pb::WatchAgentsResponse {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ev = stream
                .message()
                .await
                .expect("stream ok")
                .expect("stream open");
            if wanted(&ev) {
                return ev;
            }
        }
    })
    .await
    .expect("event arrives within 10 s")
}

/// Every agent matching `req`, following page tokens (at most 100 pages).
pub async fn list_all(
    client: &mut AgentServiceClient<Channel>,
    req: pb::StatusRequest,
) -> Vec<pb::Agent> {
    let mut agents = Vec::new();
    let mut token = String::new();
    for _ in 0..100 {
        let resp = client
            .status(pb::StatusRequest {
                page_token: token,
                ..req.clone()
            })
            .await
            .expect("status succeeds")
            .into_inner();
        agents.extend(resp.agents);
        if resp.next_page_token.is_empty() {
            return agents;
        }
        token = resp.next_page_token;
    }
    panic!("listing did not end after 100 pages");
}

/// Steer, panicking on an error status.
pub async fn steer(
    client: &mut AgentServiceClient<Channel>,
    id: &str,
    message: &str,
) -> pb::SteerResponse {
    client
        .steer(pb::SteerRequest {
            id: id.to_owned(),
            message: message.to_owned(),
        })
        .await
        .expect("steer succeeds")
        .into_inner()
}

/// Asserts `traceparent` is a valid W3C version-00 value in trace
/// `trace_id` whose sampled flag is `sampled`, and returns its span id.
#[allow(dead_code)]
pub fn assert_traceparent_in(traceparent: &str, trace_id: &str, sampled: bool) -> String {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent:?}");
    let hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    assert_eq!(parts[0], "00", "{traceparent:?}");
    assert!(
        hex(trace_id, 32) && trace_id.bytes().any(|b| b != b'0'),
        "trace id {trace_id:?}"
    );
    assert_eq!(
        parts[1], trace_id,
        "{traceparent:?} is not in trace {trace_id}"
    );
    assert!(
        hex(parts[2], 16) && parts[2] != "0000000000000000",
        "{traceparent:?}"
    );
    assert_eq!(
        parts[3],
        if sampled { "01" } else { "00" },
        "{traceparent:?}"
    );
    parts[2].to_owned()
}

/// One scrape: `name{labels}` → value, as the text exposition prints them.
#[allow(dead_code)]
pub async fn scrape(s: &TestServer) -> std::collections::HashMap<String, f64> {
    let addr = s.handle.metrics_addr().expect("metrics endpoint on");
    let response = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape answers");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let body = response.text().await.unwrap();
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("series value");
            (series.to_owned(), value.parse().expect("numeric value"))
        })
        .collect()
}

#[allow(dead_code)]
pub fn value(scrape: &std::collections::HashMap<String, f64>, series: &str) -> f64 {
    *scrape
        .get(series)
        .unwrap_or_else(|| panic!("no {series} in {:#?}", scrape.keys().collect::<Vec<_>>()))
}

/// A plain HTTP/2 client that sends a call's `grpc-timeout` without
/// enforcing it (tonic's channel enforces it locally and answers CANCELLED
/// first): for tests of what the server answers when a deadline passes.
#[allow(dead_code)]
pub type UnenforcedClient = AgentServiceClient<
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        tonic::body::Body,
    >,
>;

/// An [`UnenforcedClient`] for the server at `addr`.
#[allow(dead_code)]
pub fn unenforced_client(addr: std::net::SocketAddr) -> UnenforcedClient {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let http2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    AgentServiceClient::with_origin(http2, format!("http://{addr}").parse().unwrap())
}
