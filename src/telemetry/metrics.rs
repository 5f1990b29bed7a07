//! Prometheus metrics: `GET /metrics` on `[telemetry] metrics_listen`.
//!
//! Scheduler numbers (agents per bucket and state, limits, spawned and
//! finished counters, queue-wait and run-duration histograms) are kept by
//! the core under the lock it already holds and read here at scrape time,
//! so admission pays no extra atomics or locks for them. The API's own
//! numbers (RPCs, rejections, lagging watchers) are prometheus-client
//! metrics updated where they happen. The store's commit counters are the
//! writer's atomics, also read at scrape time.

use std::{
    net::SocketAddr,
    sync::{atomic::Ordering, Arc, OnceLock},
    time::Duration,
};

use anyhow::Context as _;
use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _, NoLabelSet},
    metrics::{
        counter::Counter, family::Family, gauge::ConstGauge, histogram::Histogram, MetricType,
    },
    registry::{Registry, Unit},
};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    scheduler::{
        stats::{Histogram as CoreHistogram, FINISHED_STATUSES},
        Scheduler,
    },
    store::writer::CommitStats,
};

/// Labels of the RPC metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// Fully qualified service, e.g. `subagents.v1.AgentService`.
    pub service: &'static str,
    /// Method, e.g. `Spawn` (`unknown` for a path no service serves).
    pub method: &'static str,
    /// gRPC status code name, e.g. `OK`, `RESOURCE_EXHAUSTED`.
    pub code: &'static str,
}

/// Labels of the rejected-spawn counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The caller's tenant.
    pub tenant: String,
    /// The ErrorInfo reason, e.g. `GLOBAL_LIMIT_REACHED`.
    pub reason: &'static str,
}

/// RPC latency buckets, in seconds.
const RPC_BOUNDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0, 60.0,
];

/// The metrics the API layer updates. Cheap to clone (shared counters);
/// the default is a set nobody scrapes.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    rpc_requests: Family<RpcLabels, Counter>,
    rpc_duration: Family<RpcLabels, Histogram>,
    rejected: Family<ReasonLabels, Counter>,
    watch_lagged: Counter,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self {
            rpc_requests: Family::default(),
            rpc_duration: Family::new_with_constructor(|| Histogram::new(RPC_BOUNDS)),
            rejected: Family::default(),
            watch_lagged: Counter::default(),
        }
    }
}

impl ApiMetrics {
    /// One RPC ended with `labels.code` after `elapsed`.
    pub fn rpc(&self, labels: &RpcLabels, elapsed: Duration) {
        self.rpc_requests.get_or_create(labels).inc();
        self.rpc_duration
            .get_or_create(labels)
            .observe(elapsed.as_secs_f64());
    }

    /// The two series of `labels`, to update without a lookup: the RPC
    /// layer keeps those of each method's OK calls, which most calls are.
    pub fn rpc_series(&self, labels: &RpcLabels) -> RpcSeries {
        RpcSeries {
            requests: self.rpc_requests.get_or_create(labels).clone(),
            duration: self.rpc_duration.get_or_create(labels).clone(),
        }
    }

    /// A Spawn of `tenant` was refused with `reason`.
    pub fn spawn_rejected(&self, tenant: &str, reason: &'static str) {
        self.rejected
            .get_or_create(&ReasonLabels {
                tenant: tenant.to_owned(),
                reason,
            })
            .inc();
    }

    /// A WatchAgents subscriber was cut off for falling behind.
    pub fn watch_lagged(&self) {
        self.watch_lagged.inc();
    }
}

/// One label set's RPC counter and latency histogram (shared with the
/// families they came from).
#[derive(Debug, Clone)]
pub struct RpcSeries {
    requests: Counter,
    duration: Histogram,
}

impl RpcSeries {
    /// One RPC of these labels ended after `elapsed`.
    pub fn observe(&self, elapsed: Duration) {
        self.requests.inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}

/// Every metric, ready to encode.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    api: ApiMetrics,
    /// The store writer's counters, set once the writer runs (it starts
    /// after recovery, which is after the endpoint is up); unset with
    /// `backend = "memory"`, and then both counters read 0.
    commit_stats: Arc<OnceLock<Arc<CommitStats>>>,
    /// 1 while this server leads (always, without a PostgreSQL store).
    leader: prometheus_client::metrics::gauge::Gauge,
}

impl Metrics {
    /// Metrics over `scheduler`'s numbers and a fresh set of API metrics.
    pub fn new(scheduler: Scheduler) -> Self {
        let api = ApiMetrics::default();
        let mut registry = Registry::with_prefix("subagentd");
        registry.register(
            "rpc_requests",
            "gRPC calls handled, by service, method and status code",
            api.rpc_requests.clone(),
        );
        registry.register_with_unit(
            "rpc_duration",
            "gRPC call latency (for streams, until the stream ends), by service, method and status code",
            Unit::Seconds,
            api.rpc_duration.clone(),
        );
        registry.register(
            "agents_rejected",
            "Spawn calls refused, by ErrorInfo reason",
            api.rejected.clone(),
        );
        registry.register(
            "watch_subscribers_lagged",
            "WatchAgents subscribers cut off (RESOURCE_EXHAUSTED WATCH_LAGGED) for falling behind",
            api.watch_lagged.clone(),
        );
        registry.register_collector(Box::new(SchedulerCollector { scheduler }));
        let commit_stats = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(StoreCollector {
            stats: commit_stats.clone(),
        }));
        let leader = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "leader",
            "1 while this server is the leader (schedules and runs agents), 0 on a standby",
            leader.clone(),
        );
        Self {
            registry,
            api,
            commit_stats,
            leader,
        }
    }

    /// Sets `subagentd_leader`.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Exports the store writer's commit counters from now on. Only the
    /// first call counts (a server has one writer).
    pub fn set_commit_stats(&self, stats: Arc<CommitStats>) {
        let _ = self.commit_stats.set(stats);
    }

    /// The handles the API layer updates.
    pub fn api(&self) -> ApiMetrics {
        self.api.clone()
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Reads the scheduler's numbers at scrape time.
#[derive(Debug)]
struct SchedulerCollector {
    scheduler: Scheduler,
}

/// What one scrape copies out of the core (the lock is held only for the
/// copy, not for the encoding).
struct Snapshot {
    buckets: Vec<BucketRow>,
    live_background: u32,
    tenants_live: Vec<(String, u32)>,
    limits: Vec<(&'static str, u32)>,
    watch_subscribers: usize,
}

struct BucketRow {
    tenant: String,
    bucket: String,
    limit: u32,
    queued: u32,
    running: u32,
    awaiting: u32,
    spawned: u64,
    finished: [u64; 3],
    queue_wait: CoreHistogram,
    run_duration: CoreHistogram,
}

impl SchedulerCollector {
    fn snapshot(&self) -> Snapshot {
        self.scheduler.inspect(|core| {
            let l = core.limits();
            let mut buckets: Vec<BucketRow> = core
                .stats()
                .buckets()
                .map(|(tenant, key, s)| BucketRow {
                    tenant: tenant.to_string(),
                    bucket: key.to_string(),
                    limit: core.limit_of_bucket(key),
                    queued: s.queued,
                    running: s.running,
                    awaiting: s.awaiting_approval,
                    spawned: s.spawned,
                    finished: s.finished,
                    queue_wait: s.queue_wait.clone(),
                    run_duration: s.run_duration.clone(),
                })
                .collect();
            buckets.sort_by(|a, b| (&a.bucket, &a.tenant).cmp(&(&b.bucket, &b.tenant)));
            Snapshot {
                buckets,
                live_background: core.live_background(),
                tenants_live: {
                    let mut t: Vec<(String, u32)> = core
                        .live_background_by_tenant()
                        .map(|(t, n)| (t.to_owned(), n))
                        .collect();
                    t.sort();
                    t
                },
                limits: vec![
                    ("max_background_agents", l.max_background_agents),
                    ("default_concurrency", l.default_concurrency),
                    ("max_concurrent_per_parent", l.max_concurrent_per_parent),
                    ("max_depth", l.max_depth),
                    (
                        "max_live_descendants_per_root",
                        l.max_live_descendants_per_root,
                    ),
                ],
                watch_subscribers: core.watch_subscribers(),
            }
        })
    }
}

/// The label set of a gauge without labels.
const NO_LABELS: [(&str, &str); 0] = [];

fn gauge<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(&BucketRow, &CoreHistogram)],
) -> Result<(), std::fmt::Error> {
    let unit = Unit::Seconds;
    let mut metric = encoder.encode_descriptor(name, help, Some(&unit), MetricType::Histogram)?;
    for (row, h) in rows {
        let labels = [
            ("tenant", row.tenant.as_str()),
            ("bucket", row.bucket.as_str()),
        ];
        metric
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(h.sum(), h.count(), &h.buckets(), None)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for SchedulerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.snapshot();
        let states = |r: &BucketRow| {
            [
                ("queued", r.queued),
                ("running", r.running),
                ("awaiting_approval", r.awaiting),
            ]
        };
        let mut by_tenant: std::collections::BTreeMap<&str, [i64; 3]> = Default::default();
        for r in &s.buckets {
            let sums = by_tenant.entry(r.tenant.as_str()).or_default();
            for (i, (_, n)) in states(r).into_iter().enumerate() {
                sums[i] += i64::from(n);
            }
        }
        gauge(
            &mut encoder,
            "bucket_agents",
            "Live agents per tenant, bucket and state (queued, running, awaiting_approval)",
            s.buckets.iter().flat_map(|r| {
                states(r).map(|(state, n)| {
                    (
                        [
                            ("tenant", r.tenant.as_str()),
                            ("bucket", r.bucket.as_str()),
                            ("state", state),
                        ],
                        i64::from(n),
                    )
                })
            }),
        )?;
        gauge(
            &mut encoder,
            "agents",
            "Live agents across all buckets, by tenant and state",
            by_tenant.iter().flat_map(|(tenant, sums)| {
                ["queued", "running", "awaiting_approval"]
                    .into_iter()
                    .zip(*sums)
                    .map(|(state, n)| ([("tenant", *tenant), ("state", state)], n))
            }),
        )?;
        gauge(
            &mut encoder,
            "background_agents",
            "Live background agents: the usage of [limits] max_background_agents",
            [(NO_LABELS, i64::from(s.live_background))],
        )?;
        gauge(
            &mut encoder,
            "tenant_background_agents",
            "Live background agents per tenant: the usage of [tenants.NAME] max_background_agents",
            s.tenants_live
                .iter()
                .map(|(tenant, n)| ([("tenant", tenant.as_str())], i64::from(*n))),
        )?;
        gauge(
            &mut encoder,
            "limit",
            "Configured value of each [limits] key (0 = unlimited where the key allows it)",
            s.limits
                .iter()
                .map(|(name, v)| ([("limit", *name)], i64::from(*v))),
        )?;
        gauge(
            &mut encoder,
            "bucket_limit",
            "Running-agent limit of each bucket (model entry, provider entry or default; 0 = unlimited)",
            // One row per bucket, however many tenants use it (rows are
            // sorted by bucket).
            s.buckets
                .iter()
                .enumerate()
                .filter(|(i, r)| *i == 0 || s.buckets[i - 1].bucket != r.bucket)
                .map(|(_, r)| ([("bucket", r.bucket.as_str())], i64::from(r.limit))),
        )?;
        gauge(
            &mut encoder,
            "watch_subscribers",
            "Open WatchAgents streams",
            [(NO_LABELS, s.watch_subscribers as i64)],
        )?;

        let mut spawned = encoder.encode_descriptor(
            "agents_spawned",
            "Agents admitted, by tenant and bucket",
            None,
            MetricType::Counter,
        )?;
        for r in &s.buckets {
            let labels = [("tenant", r.tenant.as_str()), ("bucket", r.bucket.as_str())];
            spawned
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&r.spawned, None)?;
        }
        let mut finished = encoder.encode_descriptor(
            "agents_finished",
            "Agents ended, by tenant, bucket and terminal status (DONE, FAILED, CANCELLED)",
            None,
            MetricType::Counter,
        )?;
        for r in &s.buckets {
            for (status, n) in FINISHED_STATUSES.iter().zip(r.finished) {
                let labels = [
                    ("tenant", r.tenant.as_str()),
                    ("bucket", r.bucket.as_str()),
                    ("status", status.name()),
                ];
                finished
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
            }
        }
        let waits: Vec<(&BucketRow, &CoreHistogram)> =
            s.buckets.iter().map(|r| (r, &r.queue_wait)).collect();
        histogram(
            &mut encoder,
            "queue_wait",
            "Time from admission to first start, by tenant and bucket",
            &waits,
        )?;
        let runs: Vec<(&BucketRow, &CoreHistogram)> =
            s.buckets.iter().map(|r| (r, &r.run_duration)).collect();
        histogram(
            &mut encoder,
            "run_duration",
            "Time from first start to the end, by tenant and bucket",
            &runs,
        )
    }
}

/// Reads the store writer's counters at scrape time.
#[derive(Debug)]
struct StoreCollector {
    stats: Arc<OnceLock<Arc<CommitStats>>>,
}

impl prometheus_client::collector::Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (commits, changes) = self.stats.get().map_or((0, 0), |s| {
            (
                s.commits.load(Ordering::Relaxed),
                s.changes.load(Ordering::Relaxed),
            )
        });
        for (name, help, value) in [
            (
                "store_commits",
                "Store commits (one durable write each: one fsync with the embedded store, \
                 one transaction with PostgreSQL); 0 with backend = \"memory\"",
                commits,
            ),
            (
                "store_changes",
                "Changes (changed agent records, lifecycle events, removals) written by \
                 those commits: changes ÷ commits is the group-commit batch size",
                changes,
            ),
        ] {
            encoder
                .encode_descriptor(name, help, None, MetricType::Counter)?
                .encode_counter::<NoLabelSet, _, u64>(&value, None)?;
        }
        Ok(())
    }
}

/// How the metrics endpoint is guarded.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// `[telemetry] metrics_token_file`: scrapes present its token.
    pub token_file: Option<String>,
    /// `[telemetry] metrics_tls`: the gRPC listener's certificate (and
    /// client-certificate rules).
    pub tls: Option<Arc<crate::tls::Acceptor>>,
}

/// Serves `GET /metrics` on `addr` until `shutdown`. Returns the bound
/// address (useful with port 0) and the server task.
pub async fn serve(
    addr: &str,
    metrics: Arc<Metrics>,
    guard: Guard,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ([telemetry] metrics_listen)"))?;
    let bound = listener.local_addr()?;
    if let Some(file) = &guard.token_file {
        read_token(file).await.with_context(|| {
            format!("[telemetry] metrics_token_file = {file:?} must hold a token")
        })?;
    }
    let token_file: Option<Arc<str>> = guard.token_file.as_deref().map(Arc::from);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: http::HeaderMap| {
            let metrics = metrics.clone();
            let token_file = token_file.clone();
            async move {
                use axum::response::IntoResponse as _;
                if let Some(file) = token_file {
                    if let Err(refused) = check_token(&file, &headers).await {
                        return refused.into_response();
                    }
                }
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.encode(),
                )
                    .into_response()
            }
        }),
    );
    let task = tokio::spawn(async move {
        let served = match guard.tls {
            Some(acceptor) => {
                axum::serve(crate::tls::Http1Listener::new(listener, acceptor), app)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
            }
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok((bound, task))
}

/// The token in `file` (surrounding whitespace trimmed; a Secret's file
/// often ends in a newline).
async fn read_token(file: &str) -> anyhow::Result<String> {
    let text = tokio::fs::read_to_string(file).await?;
    let token = text.trim();
    anyhow::ensure!(!token.is_empty(), "the file is empty");
    Ok(token.to_owned())
}

type Refusal = (
    http::StatusCode,
    [(http::HeaderName, &'static str); 1],
    &'static str,
);

/// Checks a scrape's bearer token against the file, read at every scrape
/// so that a rotated Secret takes effect at once. Fails closed.
async fn check_token(file: &str, headers: &http::HeaderMap) -> Result<(), Refusal> {
    let challenge = (http::header::WWW_AUTHENTICATE, "Bearer");
    let expected = match read_token(file).await {
        Ok(token) => token,
        Err(e) => {
            tracing::error!(error = %e, file, "metrics token file unreadable; refusing scrapes");
            return Err((
                http::StatusCode::SERVICE_UNAVAILABLE,
                [challenge],
                "metrics token unavailable\n",
            ));
        }
    };
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let ok = presented.is_some_and(|token| {
        use sha2::Digest as _;
        // Equal-length digests, compared in constant time: neither the
        // token's bytes nor its length leak through timing.
        let a = sha2::Sha256::digest(token.as_bytes());
        let b = sha2::Sha256::digest(expected.as_bytes());
        bool::from(subtle::ConstantTimeEq::ct_eq(a.as_slice(), b.as_slice()))
    });
    if ok {
        Ok(())
    } else {
        Err((
            http::StatusCode::UNAUTHORIZED,
            [challenge],
            "GET /metrics needs `authorization: Bearer <token>`\n",
        ))
    }
}
