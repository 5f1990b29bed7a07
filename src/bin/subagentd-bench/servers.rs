//! The servers under test, each a child process on a free loopback port.
//!
//! Why child processes: the server's CPU time and peak RSS must be read apart
//! from the load client's (see [`crate::procfs`]), and each scenario gets a
//! fresh process so its peak RSS is its own.

pub mod noop;

use std::{
    fs::File,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, Context};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};

use crate::procfs::{self, Pid};

/// Health-check service name both servers report SERVING for once ready.
pub const SERVICE_NAME: &str = subagentd::server::SERVICE_NAME;

/// How long a server may take to exit after SIGTERM before it is killed.
/// subagentd waits up to 5 s for connections to drain; twice that is plenty.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between readiness probes and exit polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// subagentd config for `run`: nothing limits throughput, finished agents go
/// away soon enough that a long run does not fill memory, and watchers get a
/// ring deep enough to ride out scheduling hiccups of a shared machine.
pub const THROUGHPUT_CONFIG: &str = r#"# written by subagentd-bench run
[limits]
max_background_agents = 4000000000
default_concurrency = 0
max_concurrent_per_parent = 0

[runs]
finished_retention = "30s"

[watch]
subscriber_buffer = 65536
"#;

/// subagentd config for `memory`: wide limits and a retention longer than
/// any measurement, so every spawned agent is still held when RSS is read.
/// Watch settings stay at their defaults (part of the idle RSS).
pub const MEMORY_CONFIG: &str = r#"# written by subagentd-bench memory
[limits]
max_background_agents = 4000000000
default_concurrency = 0
max_concurrent_per_parent = 0

[runs]
finished_retention = "1h"
"#;

/// Which server to start.
#[derive(Debug, Clone)]
pub enum ServerKind {
    /// This binary's hidden `noop-server` subcommand.
    Noop,
    /// `BIN serve --config <file with TOML> --listen …`.
    Subagentd {
        /// The subagentd binary.
        bin: PathBuf,
        /// Config file contents.
        config_toml: &'static str,
    },
}

/// A server child process. Dropping it kills the process, so an early return
/// or a panic never leaves a server running.
#[derive(Debug)]
pub struct ServerProcess {
    label: &'static str,
    child: Child,
    addr: SocketAddr,
    log: TempFile,
    _config: Option<TempFile>,
}

impl ServerProcess {
    /// Starts `kind` on a free loopback port and waits until its health check
    /// answers SERVING, at most `startup_timeout`.
    pub async fn start(kind: &ServerKind, startup_timeout: Duration) -> anyhow::Result<Self> {
        let addr = free_loopback_addr()?;
        let log = TempFile::new("server", "log");
        let log_file =
            File::create(&log.0).with_context(|| format!("cannot create {}", log.0.display()))?;
        let (label, mut command, config) = match kind {
            ServerKind::Noop => {
                let exe = std::env::current_exe().context("cannot find this binary")?;
                let mut command = Command::new(exe);
                command.arg("noop-server");
                ("noop server", command, None)
            }
            ServerKind::Subagentd { bin, config_toml } => {
                let config = TempFile::new("config", "toml");
                std::fs::write(&config.0, config_toml)
                    .with_context(|| format!("cannot write {}", config.0.display()))?;
                let mut command = Command::new(bin);
                command.arg("serve").arg("--config").arg(&config.0);
                ("subagentd", command, Some(config))
            }
        };
        command
            .arg("--listen")
            .arg(addr.to_string())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        // The config must be exactly the one above: SUBAGENTD_* variables
        // of the caller's shell would override it.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SUBAGENTD_") {
                command.env_remove(key);
            }
        }
        // Metrics on a free port; lifecycle log lines (one per ended agent
        // at info) off: the bench measures scheduling, not log volume.
        if config.is_some() {
            command
                .env("SUBAGENTD_TELEMETRY__METRICS_LISTEN", "127.0.0.1:0")
                .env("SUBAGENTD_SERVER__SHUTDOWN_GRACE", "0s")
                // What the scenarios have always measured: no store.
                .env("SUBAGENTD_STORE__BACKEND", "memory")
                .env("RUST_LOG", "warn");
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {label} ({:?})", command.get_program()))?;
        let mut server = Self {
            label,
            child,
            addr,
            log,
            _config: config,
        };
        server.wait_ready(startup_timeout).await?;
        Ok(server)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id, for [`procfs`].
    pub fn pid(&self) -> Pid {
        Pid::Other(self.child.id())
    }

    /// CPU ticks used so far (see [`procfs::cpu_ticks`]).
    pub fn cpu_ticks(&self) -> anyhow::Result<u64> {
        procfs::cpu_ticks(self.pid()).with_context(|| format!("cannot read {} CPU", self.label))
    }

    /// Current and peak RSS.
    pub fn memory(&self) -> anyhow::Result<procfs::Memory> {
        procfs::memory(self.pid()).with_context(|| format!("cannot read {} memory", self.label))
    }

    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before it was ready; its output:\n{}",
                    self.label,
                    self.log_tail()
                );
            }
            if is_serving(self.addr).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not report SERVING on {} within {timeout:?}; its output:\n{}",
                    self.label,
                    self.addr,
                    self.log_tail()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Stops it the way an operator does (SIGTERM, through the `kill`
    /// command to stay free of libc) and waits for it to exit. An exit other
    /// than status 0, or no exit within [`STOP_TIMEOUT`] (then it is
    /// killed), is an error: a server that cannot shut down cleanly after a
    /// benchmark is broken.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} had already exited ({status}); its output:\n{}",
                self.label,
                self.log_tail()
            );
        }
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .is_ok_and(|s| s.success());
        if !sent {
            self.child.kill()?;
        }
        let status = self.wait_exit(STOP_TIMEOUT).await?;
        match status {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!(
                "{} exited with {status} after SIGTERM; its output:\n{}",
                self.label,
                self.log_tail()
            ),
            None => {
                self.child.kill()?;
                self.child.wait()?;
                bail!(
                    "{} did not exit within {STOP_TIMEOUT:?} of SIGTERM and was killed",
                    self.label
                )
            }
        }
    }

    async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The last lines the server wrote, for error messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log.0).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        if tail.is_empty() {
            "(nothing)".to_owned()
        } else {
            tail
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The subagentd binary to measure: `--server-bin`, else `subagentd` next to
/// this binary. Errors say how to build it; warns when it is older than the
/// sources it was built from (a stale binary measures old code).
pub fn subagentd_bin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let bin = match explicit {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()
            .context("cannot find this binary")?
            .with_file_name("subagentd"),
    };
    if !bin.is_file() {
        let profile = if cfg!(debug_assertions) {
            "cargo build --bins"
        } else {
            "cargo build --release --bins"
        };
        bail!(
            "subagentd binary not found at {}: build it with `{profile}` \
             (`cargo run --bin subagentd-bench` builds only the bench), or pass --server-bin",
            bin.display()
        );
    }
    if explicit.is_none() {
        warn_if_stale(&bin);
    }
    Ok(bin)
}

fn warn_if_stale(bin: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (Ok(built), Some(newest)) = (
        bin.metadata().and_then(|m| m.modified()),
        newest_mtime(&src),
    ) else {
        return;
    };
    if newest > built {
        eprintln!(
            "warning: {} is older than the newest file in {}; rebuild with `cargo build{} --bins` \
             to measure the current code",
            bin.display(),
            src.display(),
            if cfg!(debug_assertions) {
                ""
            } else {
                " --release"
            }
        );
    }
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        // The bench's own sources do not make the server binary stale.
        if path.ends_with("bin") {
            continue;
        }
        let time = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(time);
    }
    newest
}

/// A free port on 127.0.0.1: bind port 0, note the port, let it go. Another
/// process could take it in between; on loopback of a test machine that is
/// rare enough, and the server would then fail to start and say so.
fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// One readiness probe: connect and ask grpc.health.v1 about the API.
async fn is_serving(addr: SocketAddr) -> bool {
    let probe = async {
        let channel = endpoint(addr).connect().await.ok()?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: SERVICE_NAME.to_owned(),
            })
            .await
            .ok()?;
        Some(reply.into_inner().status == ServingStatus::Serving as i32)
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a socket address is a valid URI")
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
}

/// `n` separate HTTP/2 connections to `addr`, connected now (so connection
/// setup is not timed).
pub async fn connect(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n {
        channels.push(
            endpoint(addr)
                .connect()
                .await
                .with_context(|| format!("cannot connect to {addr}"))?,
        );
    }
    Ok(channels)
}

/// A file in the temp folder, removed on drop.
#[derive(Debug)]
struct TempFile(PathBuf);

impl TempFile {
    fn new(kind: &str, ext: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!(
            "subagentd-bench-{}-{n}-{kind}.{ext}",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_configs_are_valid_subagentd_configs() {
        for toml in [THROUGHPUT_CONFIG, MEMORY_CONFIG] {
            let config = subagentd::config::ConfigSource::from_toml_str(toml).unwrap();
            assert_eq!(config.limits.max_background_agents, 4_000_000_000);
            assert_eq!(config.limits.default_concurrency, 0);
        }
    }
}
