//! The guard on the cost of a background Spawn (issue 36): heap
//! allocations per Spawn on the server's threads, against a budget
//! committed here, and the same for the no-op tonic server so the figure is
//! also a ratio to what gRPC itself costs.
//!
//! Timings drift ±15 % on the machines CI runs on, and they have no
//! hardware counters; allocations do not drift. A counting global allocator
//! counts only on threads of the server's own runtime (its workers and its
//! blocking pool), so the client driving it costs nothing. Each figure is
//! (cost of 3N Spawns − cost of N Spawns) ÷ 2N on one warm server, so start-
//! up, connections and the wait for the runs to end cancel out.
//!
//! When a change lowers a figure, lower its budget with the new figure (one
//! line). When it fails: the message gives the figure; find the new
//! allocations with `valgrind --tool=dhat` or the callgrind script
//! (`scripts/spawn-instructions.sh`), or raise the budget in the same
//! commit that says what the Spawn path bought with them.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    future::Future,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use subagentd::{
    config::{Config, ConfigSource, StoreBackend},
    pb::{self, agent_service_client::AgentServiceClient},
    server,
};
use tokio::runtime::Runtime;
use tonic::transport::Channel;

/// Allocations per background Spawn on the server's threads (memory store,
/// the simulated runner, no watchers, no authentication) beyond the no-op
/// server's per call: what subagentd adds to gRPC. Guarded apart from the
/// total so that ~3 more allocations (a clone of the request) fail it.
const SPAWN_OWN_ALLOCATIONS: f64 = 27.7;
/// Bytes allocated per background Spawn beyond the no-op server's.
const SPAWN_OWN_BYTES: f64 = 13_480.0;
/// Allocations per call of the no-op server (the same request and an
/// answer of the same size): what gRPC (tonic, hyper, h2) itself costs. It
/// moves with their versions, not with this code.
const NOOP_ALLOCATIONS: f64 = 42.0;
/// How far over a budget a figure may go before the guard fails.
const TOLERANCE: f64 = 1.10;

/// Spawns in the shorter phase; the longer one makes three times as many.
const N: usize = 1_000;
/// Concurrent callers, spread over [`CHANNELS`] connections.
const CALLERS: usize = 16;
const CHANNELS: usize = 4;

struct Counting;

thread_local! {
    /// Whether this thread is one of the measured server's.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

fn count(size: usize) {
    // `try_with`: a thread being torn down has no thread-locals left.
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Relaxed);
        BYTES.fetch_add(size as u64, Relaxed);
    }
}

// A global allocator is an unsafe trait: no crate counts per thread, which
// is what leaves the driving client out of the figures.
// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters only observe.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A grown buffer is a new allocation as far as cost goes.
        count(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Debug, Clone, Copy)]
struct Cost {
    allocations: u64,
    bytes: u64,
}

fn counted() -> Cost {
    Cost {
        allocations: ALLOCATIONS.load(Relaxed),
        bytes: BYTES.load(Relaxed),
    }
}

/// The measured server's runtime: every thread it starts is counted.
fn server_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| COUNTED.with(|c| c.set(true)))
        .build()
        .unwrap()
}

/// The driver's runtime, on the test's own (uncounted) thread.
fn client_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn clients(addr: std::net::SocketAddr) -> Vec<AgentServiceClient<Channel>> {
    let mut clients = Vec::new();
    for _ in 0..CHANNELS {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("client connects");
        clients.push(AgentServiceClient::new(channel));
    }
    clients
}

fn request() -> pb::SpawnRequest {
    pb::SpawnRequest {
        agent: "simulated".into(),
        model: "bench/m".into(),
        prompt: "hi".into(),
        background: true,
        ..Default::default()
    }
}

/// `n` background Spawns from [`CALLERS`] concurrent callers.
async fn spawns(clients: &[AgentServiceClient<Channel>], n: usize) {
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let mut client = clients[caller % clients.len()].clone();
        let share = n / CALLERS + usize::from(caller < n % CALLERS);
        callers.spawn(async move {
            for _ in 0..share {
                client.spawn(request()).await.expect("Spawn succeeds");
            }
        });
    }
    while let Some(done) = callers.join_next().await {
        done.unwrap();
    }
}

/// Cost per operation.
#[derive(Debug, Clone, Copy)]
struct PerCall {
    allocations: f64,
    bytes: f64,
}

/// Cost per operation: (cost of 3N − cost of N) ÷ 2N, where `phase(n)`
/// performs n operations and returns once the server is idle again.
fn per_operation<F: Future<Output = ()>>(
    rt: &Runtime,
    mut phase: impl FnMut(usize) -> F,
) -> PerCall {
    let mut measure = |n: usize| {
        let before = counted();
        rt.block_on(phase(n));
        let after = counted();
        [
            after.allocations - before.allocations,
            after.bytes - before.bytes,
        ]
    };
    // Warm up: buffers, maps and pools reach their working size.
    measure(N);
    let small = measure(N);
    let large = measure(3 * N);
    let per = |i: usize| (large[i] as f64 - small[i] as f64) / (2 * N) as f64;
    PerCall {
        allocations: per(0),
        bytes: per(1),
    }
}

fn subagentd_config() -> Config {
    let mut config: Config = ConfigSource::from_toml_str(
        r#"
[limits]
max_background_agents = 4000000000
default_concurrency = 0
max_concurrent_per_parent = 0

[runs]
finished_retention = "1h"
"#,
    )
    .unwrap();
    config.server.listen = "127.0.0.1:0".into();
    config.telemetry.metrics_listen = String::new();
    config.http.listen = String::new();
    config.server.shutdown_grace = Duration::ZERO;
    config.store.backend = StoreBackend::Memory;
    config
}

fn check(what: &str, figure: f64, budget: f64) -> Option<String> {
    let limit = budget * TOLERANCE;
    (figure > limit).then(|| {
        format!(
            "{what}: {figure:.1} per call, over the budget {budget:.1} (+{:.0} % allowed, so ≤ {limit:.1})",
            (TOLERANCE - 1.0) * 100.0
        )
    })
}

#[test]
fn a_background_spawn_allocates_within_its_budget() {
    let client_rt = client_runtime();

    // The no-op server.
    let noop_rt = server_runtime();
    let listener = noop_rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let noop_addr = listener.local_addr().unwrap();
    let (stop_noop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = noop_rt.spawn(server::baseline::serve_noop(listener, async {
        let _ = stopped.await;
    }));
    let noop_clients = client_rt.block_on(clients(noop_addr));
    let noop = per_operation(&client_rt, |n| spawns(&noop_clients, n));
    // Awaited on the client's runtime, which must run for its connections
    // to close (the server drains them before it stops).
    drop(noop_clients);
    let _ = stop_noop.send(());
    client_rt.block_on(serving).unwrap().unwrap();
    drop(noop_rt);

    // subagentd.
    let server_rt = server_runtime();
    let handle = server_rt
        .block_on(server::start(subagentd_config(), ConfigSource::default()))
        .expect("server starts");
    let spawn_clients = client_rt.block_on(clients(handle.addr()));
    let spawn = per_operation(&client_rt, |n| {
        let (clients, handle) = (&spawn_clients, &handle);
        async move {
            spawns(clients, n).await;
            // Until every run has ended, read in-process (this thread is not
            // counted): a watcher or an Await would cost the server
            // allocations per agent.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let live = handle.scheduler().inspect(|core| core.live_background());
                if live == 0 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{live} runs still live a minute after their Spawns were answered"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    drop(spawn_clients);
    client_rt
        .block_on(server_rt.spawn(handle.shutdown()))
        .unwrap()
        .unwrap();

    let (own_allocations, own_bytes) = (
        spawn.allocations - noop.allocations,
        spawn.bytes - noop.bytes,
    );
    println!(
        "per background Spawn: {:.1} allocations, {:.0} bytes ({own_allocations:.1} and \
         {own_bytes:.0} beyond the no-op call); per no-op call: {:.1} allocations, \
         {:.0} bytes; ratio {:.2} (allocations)",
        spawn.allocations,
        spawn.bytes,
        noop.allocations,
        noop.bytes,
        spawn.allocations / noop.allocations
    );
    let failures: Vec<String> = [
        check(
            "allocations per background Spawn beyond the no-op call",
            own_allocations,
            SPAWN_OWN_ALLOCATIONS,
        ),
        check(
            "bytes allocated per background Spawn beyond the no-op call",
            own_bytes,
            SPAWN_OWN_BYTES,
        ),
        check(
            "allocations per no-op call",
            noop.allocations,
            NOOP_ALLOCATIONS,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
