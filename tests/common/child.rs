//! The built binary as a child process, as an operator runs it: a server
//! or a worker with its own config file, JSON log lines on stderr, signals.

use std::{process::Stdio, time::Duration};

use subagentd::pb::agent_service_client::AgentServiceClient;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, ChildStderr, Command},
    sync::mpsc,
};
use tonic::transport::Channel;

/// How long a child server may take to start, answer or exit.
pub const CHILD_WAIT: Duration = Duration::from_secs(30);

/// `subagentd serve` with a config file, on 127.0.0.1:0, metrics on a free
/// port, JSON logs at info.
pub struct ChildServer {
    process: Process,
    /// The gRPC address it listens on.
    pub addr: String,
    /// Its metrics endpoint's address.
    pub metrics: String,
    /// Its `[http]` listener's address (`/mcp`).
    pub http: String,
    _config: tempfile::NamedTempFile,
}

/// A `subagentd` child process whose JSON log lines on stderr the test
/// reads.
struct Process {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line `log_line` read, for tests that scan the whole log.
    seen: Vec<String>,
}

impl Process {
    /// Starts `command` (`subagentd` with its arguments) with JSON logs at
    /// info.
    fn spawn(mut command: Command) -> Self {
        command
            .env("SUBAGENTD_TELEMETRY__LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("subagentd starts");
        // Read stderr to the end, so the process never blocks on a full pipe.
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(forward(child.stderr.take().unwrap(), tx));
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    async fn exit_status(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(CHILD_WAIT, self.child.wait())
            .await
            .expect("the process exits")
            .unwrap()
    }

    /// SIGTERM, the exit status, and every line the process wrote.
    async fn stop_with_logs(mut self) -> (std::process::ExitStatus, Vec<String>) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = tokio::time::timeout(CHILD_WAIT, self.child.wait())
            .await
            .expect("the process exits")
            .unwrap();
        // The forwarder ends at the end of stderr: every line is here then.
        while let Some(line) = self.lines.recv().await {
            self.seen.push(line);
        }
        (status, self.seen)
    }

    async fn log_line(&mut self, wanted: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let found = tokio::time::timeout(CHILD_WAIT, async {
            loop {
                let line = self.lines.recv().await.expect("the process runs");
                self.seen.push(line.clone());
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    panic!("log line is not JSON: {line}");
                };
                if wanted(&v) {
                    return v;
                }
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            // What the process said instead, to see why.
            let recent = &self.seen[self.seen.len().saturating_sub(30)..];
            panic!(
                "the log line did not appear within {CHILD_WAIT:?}; the last lines:\n{}",
                recent.join("\n")
            )
        })
    }
}

/// `subagentd worker --server <addr> --config <file>`, JSON logs at info.
pub struct ChildWorker {
    process: Process,
    _config: tempfile::NamedTempFile,
}

impl ChildWorker {
    /// Starts it against `server` with `config_toml` and waits until the
    /// server welcomed it.
    pub async fn start(server: &str, config_toml: &str) -> Self {
        let mut worker = Self::start_unconnected(server, config_toml);
        worker.connected().await;
        worker
    }

    /// Starts it without waiting for anything.
    pub fn start_unconnected(server: &str, config_toml: &str) -> Self {
        Self::start_unconnected_with_env(server, config_toml, &[])
    }

    /// Starts it with extra environment variables, without waiting.
    pub fn start_unconnected_with_env(
        server: &str,
        config_toml: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), config_toml).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_subagentd"));
        command
            .arg("worker")
            .args(["--server", server])
            .arg("--config")
            .arg(config.path())
            .env_remove("SUBAGENTD_TOKEN")
            .envs(env.iter().copied());
        Self {
            process: Process::spawn(command),
            _config: config,
        }
    }

    /// Waits until a session is welcomed (again, after a reconnect).
    pub async fn connected(&mut self) -> serde_json::Value {
        self.log_line(|v| v["message"] == "connected to the server")
            .await
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        self.process.signal(signal);
    }

    /// Waits for the process to exit.
    pub async fn exit_status(self) -> std::process::ExitStatus {
        self.process.exit_status().await
    }

    /// JSON log lines until one passes `wanted`.
    pub async fn log_line(
        &mut self,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.process.log_line(wanted).await
    }
}

impl ChildServer {
    /// Starts it with `config_toml` and the extra environment `env`, and
    /// waits until it listens.
    pub async fn start(config_toml: &str, env: &[(&str, &str)]) -> Self {
        let server = Self::start_unready(config_toml, env).await;
        server.wait_serving().await;
        server
    }

    /// Starts it and waits until it listens, not until it serves.
    pub async fn start_unready(config_toml: &str, env: &[(&str, &str)]) -> Self {
        Self::start_at("127.0.0.1:0", config_toml, env).await
    }

    /// Starts it listening on `listen` and waits until it serves.
    pub async fn start_listening(listen: &str, config_toml: &str, env: &[(&str, &str)]) -> Self {
        let server = Self::start_at(listen, config_toml, env).await;
        server.wait_serving().await;
        server
    }

    async fn start_at(listen: &str, config_toml: &str, env: &[(&str, &str)]) -> Self {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), config_toml).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_subagentd"));
        command
            .arg("serve")
            .arg("--config")
            .arg(config.path())
            .args(["--listen", listen])
            .env("SUBAGENTD_TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")
            .env("SUBAGENTD_HTTP__LISTEN", "127.0.0.1:0")
            .envs(memory_unless_configured(config_toml, env))
            .envs(env.iter().copied());
        let mut server = Self {
            process: Process::spawn(command),
            addr: String::new(),
            metrics: String::new(),
            http: String::new(),
            _config: config,
        };
        let listening = server
            .log_line(|v| {
                v["message"] == "subagentd listening"
                    || v["message"] == "subagentd listening as a standby; electing a leader"
            })
            .await;
        server.addr = listening["addr"].as_str().unwrap().to_owned();
        server.metrics = listening["metrics"].as_str().unwrap_or_default().to_owned();
        server.http = listening["http"].as_str().unwrap_or_default().to_owned();
        server
    }

    /// Waits (on a health Watch) until its AgentService is SERVING: it
    /// leads and recovered, or it is a standby that reaches the leader.
    pub async fn wait_serving(&self) {
        use tonic_health::pb::{
            health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
        };
        let mut health = HealthClient::new(self.channel().await);
        let mut updates = health
            .watch(HealthCheckRequest {
                service: "subagents.v1.AgentService".into(),
            })
            .await
            .expect("Health.Watch")
            .into_inner();
        tokio::time::timeout(CHILD_WAIT, async {
            while let Some(update) = updates.message().await.expect("health update") {
                if update.status == ServingStatus::Serving as i32 {
                    return;
                }
            }
            panic!("health watch ended before SERVING");
        })
        .await
        .expect("server becomes SERVING");
    }

    /// A new connection to it.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// An AgentService client on a new connection.
    pub async fn client(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel().await)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        self.process.signal(signal);
    }

    /// Waits for the process to exit.
    pub async fn exit_status(self) -> std::process::ExitStatus {
        self.process.exit_status().await
    }

    /// SIGTERM, then the exit status.
    pub async fn stop(self) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.exit_status().await
    }

    /// SIGTERM, then the exit status and every log line it wrote.
    pub async fn stop_with_logs(self) -> (std::process::ExitStatus, Vec<String>) {
        self.process.stop_with_logs().await
    }

    /// JSON log lines until one passes `wanted` (every line must be JSON).
    pub async fn log_line(
        &mut self,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.process.log_line(wanted).await
    }
}

async fn forward(stderr: ChildStderr, tx: mpsc::UnboundedSender<String>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = tx.send(line);
    }
}

/// `SUBAGENTD_STORE__BACKEND=memory` unless the test configures a store:
/// servers of parallel tests would otherwise share `./subagentd-data`.
fn memory_unless_configured(
    config_toml: &str,
    env: &[(&str, &str)],
) -> Option<(&'static str, &'static str)> {
    let configured = config_toml.contains("[store]")
        || env.iter().any(|(k, _)| k.starts_with("SUBAGENTD_STORE__"));
    (!configured).then_some(("SUBAGENTD_STORE__BACKEND", "memory"))
}
