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
use tokio_postgres::NoTls;
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

/// subagentd config for `run`: nothing limits throughput (nor the number of
/// watchers: the lead-watched scenario opens 200), finished agents go away
/// soon enough that a long run does not fill memory, and watchers get a
/// ring deep enough to ride out scheduling hiccups of a shared machine.
macro_rules! throughput_config {
    () => {
        r#"# written by subagentd-bench run
[limits]
max_background_agents = 4000000000
default_concurrency = 0
max_concurrent_per_parent = 0
max_watchers_per_tenant = 0

[runs]
finished_retention = "30s"

[watch]
subscriber_buffer = 65536
"#
    };
}
pub const THROUGHPUT_CONFIG: &str = throughput_config!();

/// The key every `bg-spawn-keyed` call carries (a fixed one: it is valid
/// only on the bench's own loopback server, for one run).
pub const BENCH_KEY: &str = "sa_bench_c3ViYWdlbnRkLWJlbmNoIGZpeGVkIGtleTogMzIgYnk";

/// [`THROUGHPUT_CONFIG`] with authentication required and [`BENCH_KEY`] a
/// frontend's key (its SHA-256 below; a test checks they match).
pub const THROUGHPUT_KEYED_CONFIG: &str = concat!(
    throughput_config!(),
    r#"
[auth]
mode = "required"

[auth.keys.bench]
sha256 = "5053ed529564d06b6d19b66ec2b2852995ecd0f907a12983b5eb49743cd355d6"
tenant = "bench"
roles = ["frontend"]
"#
);

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
        config_toml: std::borrow::Cow<'static, str>,
        /// Where it keeps its state.
        store: BenchStore,
    },
}

/// The `[store]` of a subagentd under test. Each server process gets a
/// store of its own, so no run reads what an earlier one wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BenchStore {
    /// `backend = "memory"`: nothing is written (what the scenarios measured
    /// before issue 13).
    Memory,
    /// `backend = "embedded"` in a fresh data directory under the temp dir,
    /// removed when the server process is dropped.
    Embedded,
    /// `backend = "postgres"` in a fresh database `bench_<uuid>` created on
    /// the server at `server_url` (`--postgres-url`), dropped when the
    /// server is stopped.
    Postgres {
        /// A database on the server the bench may `CREATE DATABASE` from.
        server_url: String,
    },
    /// `backend = "postgres"` in the database of another bench server (a
    /// standby next to its leader); that server creates and drops it.
    PostgresShared {
        /// The database's URL.
        url: String,
    },
}

/// The store's commit counters (`subagentd_store_commits_total`,
/// `subagentd_store_changes_total`) at one scrape, or the difference of
/// two.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Completed commits.
    pub commits: u64,
    /// Change sets those commits wrote.
    pub changes: u64,
}

impl CommitCounts {
    /// What happened between `before` and `self`.
    pub fn since(self, before: Self) -> Self {
        Self {
            commits: self.commits.saturating_sub(before.commits),
            changes: self.changes.saturating_sub(before.changes),
        }
    }
}

/// A server child process. Dropping it kills the process, so an early return
/// or a panic never leaves a server running.
#[derive(Debug)]
pub struct ServerProcess {
    label: &'static str,
    child: Child,
    addr: SocketAddr,
    /// subagentd's `GET /metrics` endpoint (None for the no-op server).
    metrics_addr: Option<SocketAddr>,
    log: TempPath,
    _config: Option<TempPath>,
    /// The embedded store's data directory. Declared after `child`, whose
    /// kill in [`Drop`] runs first: the directory goes once nobody writes.
    _data_dir: Option<TempPath>,
    /// The PostgreSQL store's database, dropped by [`ServerProcess::stop`].
    database: Option<BenchDatabase>,
}

impl ServerProcess {
    /// Starts `kind` on a free loopback port and waits until its health check
    /// answers SERVING, at most `startup_timeout`.
    pub async fn start(kind: &ServerKind, startup_timeout: Duration) -> anyhow::Result<Self> {
        let addr = free_loopback_addr()?;
        let log = TempPath::new("server", ".log");
        let log_file =
            File::create(&log.0).with_context(|| format!("cannot create {}", log.0.display()))?;
        let mut data_dir = None;
        let mut database = None;
        let mut store_env: Vec<(&str, String)> = Vec::new();
        let (label, mut command, config) = match kind {
            ServerKind::Noop => {
                let exe = std::env::current_exe().context("cannot find this binary")?;
                let mut command = Command::new(exe);
                command.arg("noop-server");
                ("noop server", command, None)
            }
            ServerKind::Subagentd {
                bin,
                config_toml,
                store,
            } => {
                store_env.push(("SUBAGENTD_STORE__BACKEND", store.backend().to_owned()));
                match store {
                    BenchStore::Memory => {}
                    BenchStore::Embedded => {
                        let dir = TempPath::new("data", "");
                        store_env.push(("SUBAGENTD_STORE__PATH", dir.0.display().to_string()));
                        data_dir = Some(dir);
                    }
                    BenchStore::Postgres { server_url } => {
                        let db = BenchDatabase::create(server_url).await?;
                        store_env.push(("SUBAGENTD_STORE__URL", db.url.clone()));
                        database = Some(db);
                    }
                    BenchStore::PostgresShared { url } => {
                        store_env.push(("SUBAGENTD_STORE__URL", url.clone()));
                    }
                }
                let config = TempPath::new("config", ".toml");
                std::fs::write(&config.0, config_toml.as_bytes())
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
        // Metrics on a free port chosen here (the server logs its address
        // only at info, which is off); lifecycle log lines (one per ended
        // agent at info) off: the bench measures scheduling, not log volume.
        let metrics_addr = if config.is_some() {
            let metrics_addr = free_loopback_addr()?;
            command
                .env(
                    "SUBAGENTD_TELEMETRY__METRICS_LISTEN",
                    metrics_addr.to_string(),
                )
                .env("SUBAGENTD_SERVER__SHUTDOWN_GRACE", "0s")
                // No /mcp listener: it would contend for its fixed port.
                .env("SUBAGENTD_HTTP__LISTEN", "")
                .env("RUST_LOG", "warn")
                .envs(store_env);
            Some(metrics_addr)
        } else {
            None
        };
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {label} ({:?})", command.get_program()))?;
        let mut server = Self {
            label,
            child,
            addr,
            metrics_addr,
            log,
            _config: config,
            _data_dir: data_dir,
            database,
        };
        if let Err(e) = server.wait_ready(startup_timeout).await {
            server.discard().await;
            return Err(e);
        }
        Ok(server)
    }

    /// After a failed start: kill the process, drop its database.
    async fn discard(mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(db) = self.database.take() {
            if let Err(e) = db.remove().await {
                eprintln!("warning: {e:#}");
            }
        }
    }

    /// The store's commit counters now, from subagentd's metrics endpoint.
    pub async fn commit_counts(&self) -> anyhow::Result<CommitCounts> {
        let body = self.scrape().await?;
        parse_commit_counts(&body).context("in the answer of its metrics endpoint")
    }

    /// subagentd's metrics now (the Prometheus text exposition).
    pub async fn scrape(&self) -> anyhow::Result<String> {
        let addr = self
            .metrics_addr
            .with_context(|| format!("the {} has no metrics endpoint", self.label))?;
        let url = format!("http://{addr}/metrics");
        async {
            reqwest::Client::new()
                .get(&url)
                .timeout(Duration::from_secs(5))
                .send()
                .await?
                .error_for_status()?
                .text()
                .await
        }
        .await
        .with_context(|| format!("cannot scrape {url}"))
    }

    /// The URL of the PostgreSQL database it created, for a standby of it.
    pub fn database_url(&self) -> Option<&str> {
        self.database.as_ref().map(|db| db.url.as_str())
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
    /// A PostgreSQL store's database is dropped afterwards, whatever the
    /// exit was.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let stopped = self.stop_process().await;
        let dropped = match self.database.take() {
            Some(db) => db.remove().await,
            None => Ok(()),
        };
        match (stopped, dropped) {
            (Ok(()), dropped) => dropped,
            (Err(e), Ok(())) => Err(e),
            (Err(e), Err(drop)) => Err(e.context(format!("{drop:#}"))),
        }
    }

    async fn stop_process(&mut self) -> anyhow::Result<()> {
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

/// A path in the temp folder, removed (file or whole directory) on drop.
#[derive(Debug)]
struct TempPath(PathBuf);

impl TempPath {
    /// `subagentd-bench-<pid>-<n>-<kind><suffix>`; nothing is created.
    fn new(kind: &str, suffix: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!(
            "subagentd-bench-{}-{n}-{kind}{suffix}",
            std::process::id()
        )))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl BenchStore {
    /// The `[store] backend` value.
    pub fn backend(&self) -> &'static str {
        match self {
            BenchStore::Memory => "memory",
            BenchStore::Embedded => "embedded",
            BenchStore::Postgres { .. } | BenchStore::PostgresShared { .. } => "postgres",
        }
    }
}

/// A database created for one server process on the `--postgres-url`
/// server. [`BenchDatabase::remove`] drops it; if that never ran (a panic),
/// [`Drop`] tries on a thread of its own.
#[derive(Debug)]
struct BenchDatabase {
    server_url: String,
    name: String,
    /// Its URL, for `SUBAGENTD_STORE__URL`.
    url: String,
    removed: bool,
}

impl BenchDatabase {
    async fn create(server_url: &str) -> anyhow::Result<Self> {
        let name = format!("bench_{}", uuid::Uuid::new_v4().simple());
        let url = database_url(server_url, &name)?;
        admin(server_url, &format!("CREATE DATABASE {name}"))
            .await
            .context("creating the bench database (--postgres-url)")?;
        Ok(Self {
            server_url: server_url.to_owned(),
            name,
            url,
            removed: false,
        })
    }

    async fn remove(mut self) -> anyhow::Result<()> {
        self.removed = true;
        admin(&self.server_url, &self.drop_sql())
            .await
            .with_context(|| format!("dropping the bench database {}", self.name))
    }

    fn drop_sql(&self) -> String {
        format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)
    }
}

impl Drop for BenchDatabase {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let (server, sql, name) = (self.server_url.clone(), self.drop_sql(), self.name.clone());
        // Drop may run inside the runtime: a thread with its own.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(admin(&server, &sql)))
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: could not drop the bench database {name}; drop it by hand");
        }
    }
}

/// Runs one statement on the server at `url`.
async fn admin(url: &str, sql: &str) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("cannot connect to {}", subagentd::config::redact_url(url)))?;
    let connection = tokio::spawn(connection);
    let done = client
        .batch_execute(sql)
        .await
        .with_context(|| format!("{sql} failed"));
    drop(client);
    let _ = connection.await;
    done
}

/// `server_url` with its database replaced by `name` (user, host, port and
/// query parameters kept).
fn database_url(server_url: &str, name: &str) -> anyhow::Result<String> {
    let Some((scheme, rest)) = server_url.split_once("://") else {
        bail!(
            "--postgres-url must look like postgres://user@host:port/db (got {:?})",
            subagentd::config::redact_url(server_url)
        );
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let query = tail.find('?').map_or("", |at| &tail[at..]);
    Ok(format!("{scheme}://{authority}/{name}{query}"))
}

/// The two store counters of a Prometheus text exposition.
fn parse_commit_counts(body: &str) -> anyhow::Result<CommitCounts> {
    let find = |series: &str| -> anyhow::Result<u64> {
        body.lines()
            .find_map(|line| {
                let (name, value) = line.split_once(' ')?;
                (name == series).then(|| value.trim().parse::<f64>().ok())
            })
            .flatten()
            .map(|v| v as u64)
            .with_context(|| format!("no {series} (is the server older than issue 13?)"))
    };
    Ok(CommitCounts {
        commits: find("subagentd_store_commits_total")?,
        changes: find("subagentd_store_changes_total")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_configs_are_valid_subagentd_configs() {
        for toml in [THROUGHPUT_CONFIG, THROUGHPUT_KEYED_CONFIG, MEMORY_CONFIG] {
            let config = subagentd::config::ConfigSource::from_toml_str(toml).unwrap();
            assert_eq!(config.limits.max_background_agents, 4_000_000_000);
            assert_eq!(config.limits.default_concurrency, 0);
        }
    }

    #[test]
    fn the_keyed_config_holds_the_bench_keys_digest() {
        use subagentd::auth::keys;
        assert!(keys::parse(BENCH_KEY).is_some(), "a well-formed key");
        let digest = keys::digest_hex(&keys::digest(BENCH_KEY));
        assert!(THROUGHPUT_KEYED_CONFIG.contains(&format!("sha256 = \"{digest}\"")));
    }

    #[test]
    fn the_bench_database_replaces_only_the_database_of_the_url() {
        assert_eq!(
            database_url("postgres://subagentd@127.0.0.1:55432/postgres", "bench_1").unwrap(),
            "postgres://subagentd@127.0.0.1:55432/bench_1"
        );
        assert_eq!(
            database_url("postgresql://u:pw@db:5432", "bench_2").unwrap(),
            "postgresql://u:pw@db:5432/bench_2"
        );
        assert_eq!(
            database_url("postgres://u@db/x?sslmode=disable", "bench_3").unwrap(),
            "postgres://u@db/bench_3?sslmode=disable"
        );
        assert!(database_url("db:5432", "bench_4").is_err());
    }

    #[test]
    fn commit_counts_are_read_from_a_scrape() {
        let body = "# HELP subagentd_store_commits Store commits.\n\
                    # TYPE subagentd_store_commits counter\n\
                    subagentd_store_commits_total 12\n\
                    # TYPE subagentd_store_changes counter\n\
                    subagentd_store_changes_total 345\n\
                    # EOF\n";
        let counts = parse_commit_counts(body).unwrap();
        assert_eq!(
            counts,
            CommitCounts {
                commits: 12,
                changes: 345
            }
        );
        assert_eq!(
            CommitCounts {
                commits: 20,
                changes: 400
            }
            .since(counts),
            CommitCounts {
                commits: 8,
                changes: 55
            }
        );
        assert!(parse_commit_counts("# EOF\n").is_err());
    }

    #[test]
    fn each_store_names_its_backend() {
        for (store, backend) in [
            (BenchStore::Memory, "memory"),
            (BenchStore::Embedded, "embedded"),
            (
                BenchStore::Postgres {
                    server_url: "postgres://x@y/z".into(),
                },
                "postgres",
            ),
        ] {
            let toml = format!("{THROUGHPUT_CONFIG}\n[store]\nbackend = \"{backend}\"\nurl = \"postgres://x@y/z\"\n");
            let config = subagentd::config::ConfigSource::from_toml_str(&toml).unwrap();
            assert_eq!(serde_json::to_value(config.store.backend).unwrap(), backend);
            assert_eq!(store.backend(), backend);
        }
    }
}
