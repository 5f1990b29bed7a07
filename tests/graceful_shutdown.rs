//! SIGTERM as a Kubernetes rollout sends it, against the built binary:
//! readiness flips at once, new Spawns are refused, running agents get
//! `[server] shutdown_grace` to finish, the rest are cancelled (watchers
//! see it), and the process exits 0; a second signal exits at once.

use std::{process::Stdio, time::Duration};

use subagentd::pb::{self, agent_service_client::AgentServiceClient, AgentEventKind as Kind};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tonic::{transport::Channel, Code, Streaming};
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};
use tonic_types::StatusExt;

const WAIT: Duration = Duration::from_secs(30);

struct Server {
    child: Child,
    channel: Channel,
    _config: tempfile::NamedTempFile,
}

impl Server {
    async fn start(config_toml: &str) -> Self {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), config_toml).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_subagentd"))
            .arg("serve")
            .arg("--config")
            .arg(config.path())
            .args(["--listen", "127.0.0.1:0"])
            .env("SUBAGENTD_TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")
            .env("SUBAGENTD_TELEMETRY__LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("subagentd starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = tokio::time::timeout(WAIT, async {
            loop {
                let line = lines.next_line().await.unwrap().expect("server runs");
                let v: serde_json::Value = serde_json::from_str(&line).expect("JSON log line");
                if v["message"] == "subagentd listening" {
                    return v["addr"].as_str().unwrap().to_owned();
                }
            }
        })
        .await
        .expect("server listens");
        // Keep draining stderr so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self {
            child,
            channel,
            _config: config,
        }
    }

    fn client(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel.clone())
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    async fn exit_status(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("server exits")
            .unwrap()
    }

    /// A Health.Watch stream of the server's overall status.
    async fn health(&self) -> Streaming<tonic_health::pb::HealthCheckResponse> {
        HealthClient::new(self.channel.clone())
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
    }
}

async fn next_health(stream: &mut Streaming<tonic_health::pb::HealthCheckResponse>) -> i32 {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("health update")
        .unwrap()
        .expect("health stream open")
        .status
}

fn bg(model: &str, prompt: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: "simulated".into(),
        model: model.into(),
        prompt: prompt.into(),
        background: true,
        ..Default::default()
    }
}

async fn spawn(client: &mut AgentServiceClient<Channel>, req: pb::SpawnRequest) -> pb::Agent {
    client.spawn(req).await.unwrap().into_inner().agent.unwrap()
}

/// Events until `done` says stop, or the stream ends.
async fn events_until(
    stream: &mut Streaming<pb::WatchAgentsResponse>,
    seen: &mut Vec<(String, i32, String)>,
    done: impl Fn(&[(String, i32, String)]) -> bool,
) {
    tokio::time::timeout(WAIT, async {
        while !done(seen) {
            let Some(ev) = stream.message().await.expect("stream ends cleanly") else {
                return;
            };
            let agent = ev.agent.unwrap_or_default();
            let message = agent.error.map(|e| e.message).unwrap_or_default();
            seen.push((agent.id, ev.kind, message));
        }
    })
    .await
    .expect("events arrive");
}

#[tokio::test]
async fn sigterm_drains_running_agents_then_cancels_the_rest_and_exits_zero() {
    let server = Server::start(
        "[server]\nshutdown_grace = \"2s\"\n\
         [limits]\nmax_background_agents = 10\ndefault_concurrency = 1\n",
    )
    .await;
    let mut client = server.client();
    let finishing = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    let queued = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    let still_running = spawn(&mut client, bg("acme/other", "wait_steer")).await;
    assert_eq!(queued.status, pb::AgentStatus::Queued as i32);
    assert_eq!(still_running.status, pb::AgentStatus::Running as i32);
    let mut watcher = client
        .watch_agents(pb::WatchAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut health = server.health().await;
    assert_eq!(
        next_health(&mut health).await,
        ServingStatus::Serving as i32
    );

    server.signal(nix::sys::signal::Signal::SIGTERM);

    // Readiness flips at once.
    assert_eq!(
        next_health(&mut health).await,
        ServingStatus::NotServing as i32
    );
    // New agents are refused, saying why.
    let refused = client
        .spawn(bg("acme/new", "hi"))
        .await
        .expect_err("no admissions while draining");
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(refused.message().contains("shutting down"), "{refused:?}");
    assert_eq!(
        refused.get_error_details().error_info().unwrap().reason,
        "SHUTTING_DOWN"
    );
    // A running agent may still finish, and other RPCs still work.
    client
        .steer(pb::SteerRequest {
            id: finishing.id.clone(),
            message: "done".into(),
        })
        .await
        .expect("steer while draining");
    let mut seen = Vec::new();
    events_until(&mut watcher, &mut seen, |seen| {
        [&queued.id, &still_running.id].iter().all(|id| {
            seen.iter()
                .any(|(a, k, _)| a == *id && *k == Kind::Cancelled as i32)
        })
    })
    .await;
    assert!(
        seen.contains(&(finishing.id.clone(), Kind::Done as i32, String::new())),
        "the running agent finished within the grace: {seen:?}"
    );
    for id in [&queued.id, &still_running.id] {
        assert!(
            seen.contains(&(
                id.clone(),
                Kind::Cancelled as i32,
                "server shutting down".into()
            )),
            "{id} cancelled after the grace: {seen:?}"
        );
    }
    assert!(
        !seen
            .iter()
            .any(|(a, k, _)| *a == queued.id && *k == Kind::Started as i32),
        "nothing queued starts while draining: {seen:?}"
    );
    // The watch stream then ends cleanly, so does the Health.Watch stream
    // (it would otherwise hold the exit back), and the process exits 0.
    events_until(&mut watcher, &mut seen, |_| false).await;
    let ended = tokio::time::timeout(WAIT, health.message())
        .await
        .expect("health stream ends");
    assert!(matches!(ended, Ok(None)), "{ended:?}");
    let status = server.exit_status().await;
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let server = Server::start("[server]\nshutdown_grace = \"10m\"\n").await;
    let mut client = server.client();
    let running = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    assert_eq!(running.status, pb::AgentStatus::Running as i32);
    let mut health = server.health().await;
    assert_eq!(
        next_health(&mut health).await,
        ServingStatus::Serving as i32
    );
    server.signal(nix::sys::signal::Signal::SIGTERM);
    // The first signal was taken: the server is draining (for 10 minutes).
    assert_eq!(
        next_health(&mut health).await,
        ServingStatus::NotServing as i32
    );
    server.signal(nix::sys::signal::Signal::SIGINT);
    let status = server.exit_status().await;
    assert_eq!(status.code(), Some(128 + 2), "{status:?}");
}
