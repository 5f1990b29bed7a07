//! Issue 13 §5: kill -9 under load, repeated. Concurrent clients spawn
//! (with idempotency keys), cancel, steer and approve while recording every call the
//! server acknowledged; a watcher records every event it saw; the server is
//! SIGKILLed at a random moment and restarted on the same store. After each
//! restart: every acknowledged spawn exists in a legal state, each key
//! returns its first agent, acknowledged cancels, steers and approvals took effect, the
//! server passed its own recount (it refuses to serve otherwise), and a
//! watch resumed after the last event seen is gap-free. `CRASH_CYCLES`
//! (default 5) cycles per backend.

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use common::child::ChildServer;
use nix::sys::signal::Signal;
use parking_lot::Mutex;
use subagentd::pb::{self, agent_service_client::AgentServiceClient};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// What the clients were told, by the server that was then killed.
#[derive(Default, Clone)]
struct Acknowledged {
    /// Idempotency key → the agent its Spawn returned.
    spawns: BTreeMap<String, String>,
    /// Agents a Cancel answered as cancelled.
    cancelled: Vec<String>,
    /// Agent → the steer message the server buffered or delivered.
    steered: HashMap<String, String>,
    /// Agents whose pending approval an Approve answered as approved.
    approved: Vec<String>,
}

fn cycles() -> usize {
    std::env::var("CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// A small pseudo-random number (no dependency; quality does not matter).
fn random(below: u64) -> u64 {
    u64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap()) % below
}

const CONFIG_TAIL: &str = "
[limits]
max_background_agents = 100000
default_concurrency = 2
max_concurrent_per_parent = 0

[runs]
finished_retention = \"1h\"
";

#[tokio::test]
async fn kill_9_under_load_loses_nothing_acknowledged_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!(
        "[store]\nbackend = \"embedded\"\npath = \"{}\"\n",
        dir.path().display()
    );
    crash_cycles(&format!("{store}{CONFIG_TAIL}")).await;
}

#[tokio::test]
async fn kill_9_under_load_loses_nothing_acknowledged_postgres() {
    let Some(db) = common::postgres::Database::create().await else {
        return;
    };
    let store = format!("[store]\nbackend = \"postgres\"\nurl = \"{}\"\n", db.url);
    crash_cycles(&format!("{store}{CONFIG_TAIL}")).await;
}

async fn crash_cycles(toml: &str) {
    let all = Arc::new(Mutex::new(Acknowledged::default()));
    let mut last_seen = 0;
    for cycle in 0..cycles() {
        let server = ChildServer::start(toml, &[]).await;
        let acknowledged = all.lock().clone();
        check_after_restart(&server, &acknowledged, last_seen, cycle).await;
        last_seen = load_then_kill(server, &all, cycle).await;
    }
    let server = ChildServer::start(toml, &[]).await;
    let acknowledged = all.lock().clone();
    check_after_restart(&server, &acknowledged, last_seen, cycles()).await;
    // Otherwise the checks above checked nothing of that kind.
    assert!(
        [
            acknowledged.cancelled.len(),
            acknowledged.steered.len(),
            acknowledged.approved.len(),
        ]
        .iter()
        .all(|n| *n > 0),
        "every kind of call was acknowledged at least once"
    );
    assert_eq!(server.stop().await.code(), Some(0));
}

/// Runs four clients and a watcher, kills the server at a random moment
/// and returns the last event sequence the watcher saw.
async fn load_then_kill(server: ChildServer, all: &Arc<Mutex<Acknowledged>>, cycle: usize) -> u64 {
    let mut watch = server
        .client()
        .await
        .watch_agents(pb::WatchAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let seen = Arc::new(Mutex::new(Vec::<u64>::new()));
    let watcher = {
        let seen = seen.clone();
        tokio::spawn(async move {
            while let Some(Ok(event)) = watch.next().await {
                seen.lock().push(event.sequence);
            }
        })
    };
    let mut clients = Vec::new();
    for n in 0..4 {
        let client = server.client().await;
        let all = all.clone();
        clients.push(tokio::spawn(client_loop(client, all, cycle, n)));
    }
    tokio::time::sleep(Duration::from_millis(50 + random(400))).await;
    server.signal(Signal::SIGKILL);
    let _ = server.exit_status().await;
    for c in clients {
        c.await.unwrap();
    }
    watcher.await.unwrap();
    let seen = seen.lock();
    assert!(
        seen.windows(2).all(|w| w[1] == w[0] + 1),
        "cycle {cycle}: the live watch has gaps: {seen:?}"
    );
    seen.last().copied().unwrap_or(0)
}

/// Spawns, cancels and steers until the server dies, recording each
/// acknowledged call (and only those).
async fn client_loop(
    mut client: AgentServiceClient<Channel>,
    all: Arc<Mutex<Acknowledged>>,
    cycle: usize,
    n: usize,
) {
    for i in 0.. {
        let key = format!("c{cycle}-w{n}-{i}");
        let approves = i % 3 == 2 && i % 5 != 1;
        let prompt = if i % 3 == 0 {
            "wait_steer\noutput steered"
        } else if approves {
            "approve shell\nsleep 20\noutput done"
        } else {
            "sleep 20\noutput done"
        };
        let Ok(answer) = client
            .spawn(pb::SpawnRequest {
                idempotency_key: key.clone(),
                ..common::bg("acme/m", prompt)
            })
            .await
        else {
            return;
        };
        let agent = answer.into_inner().agent.unwrap();
        all.lock().spawns.insert(key, agent.id.clone());
        if i % 3 == 0 {
            let message = format!("go {}", agent.id);
            if client
                .steer(pb::SteerRequest {
                    id: agent.id.clone(),
                    message: message.clone(),
                })
                .await
                .is_err()
            {
                return;
            }
            all.lock().steered.insert(agent.id.clone(), message);
        } else if i % 5 == 1 {
            match client
                .cancel(pb::CancelRequest {
                    id: agent.id.clone(),
                    reason: "crash test".into(),
                    ..Default::default()
                })
                .await
            {
                Ok(answer) => {
                    let cancelled = answer.into_inner().agents;
                    let mut all = all.lock();
                    all.cancelled.extend(cancelled.into_iter().map(|a| a.id));
                }
                Err(_) => return,
            }
        } else if approves {
            // Await returns once the agent settles: here, at its approval.
            let Ok(waited) = client
                .r#await(pb::AwaitRequest {
                    ids: vec![agent.id.clone()],
                    timeout: Some(prost_types::Duration {
                        seconds: 10,
                        nanos: 0,
                    }),
                    ..Default::default()
                })
                .await
            else {
                return;
            };
            let Some(pending) = waited.into_inner().agents.remove(0).approval else {
                continue;
            };
            match client
                .approve(pb::ApproveRequest {
                    id: agent.id.clone(),
                    approval_id: pending.id,
                    decision: pb::ApprovalDecision::Approve as i32,
                    note: String::new(),
                })
                .await
            {
                Ok(_) => all.lock().approved.push(agent.id.clone()),
                Err(e) if e.code() == tonic::Code::FailedPrecondition => {
                    panic!("Approve of the pending approval Await showed: {e}")
                }
                // The server died mid-call.
                Err(_) => return,
            }
        }
    }
}

async fn check_after_restart(
    server: &ChildServer,
    all: &Acknowledged,
    last_seen: u64,
    cycle: usize,
) {
    let mut client = server.client().await;
    // A watch resumed after the last event seen: every retained event after
    // it, in order, none missing (no snapshots or progress here, so
    // lifecycle sequences are consecutive).
    let mut resumed = client
        .watch_agents(pb::WatchAgentsRequest {
            after_sequence: last_seen,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Every acknowledged spawn exists in a legal state.
    let ids: Vec<String> = all.spawns.values().cloned().collect();
    let mut found = HashMap::new();
    for chunk in ids.chunks(100) {
        let agents = client
            .status(pb::StatusRequest {
                ids: chunk.to_vec(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: an acknowledged agent is gone: {e}"))
            .into_inner()
            .agents;
        for a in agents {
            assert_ne!(
                a.status,
                pb::AgentStatus::Unspecified as i32,
                "cycle {cycle}"
            );
            found.insert(a.id.clone(), a);
        }
    }
    assert_eq!(found.len(), ids.len(), "cycle {cycle}");
    for id in &all.cancelled {
        assert_eq!(
            found[id].status,
            pb::AgentStatus::Cancelled as i32,
            "cycle {cycle}: an acknowledged cancel of {id} was lost"
        );
    }
    // Acknowledged steers are kept: a buffered one reaches the run; one
    // delivered to a run the crash interrupted shows in its events.
    for (id, message) in &all.steered {
        let a = &found[id];
        let done = a.status == pb::AgentStatus::Done as i32;
        assert!(
            !done || a.result.contains(message.as_str()),
            "cycle {cycle}: {id} finished without its acknowledged steer: {:?}",
            a.result
        );
    }
    // An acknowledged approval took effect: the run went on past it and
    // either finished with the approval's output or was interrupted by a
    // restart (retry_on_restart = 0) — never a run that starts over and
    // asks again, never a decision lost with the agent still waiting.
    for id in &all.approved {
        let a = &found[id];
        let ok = if a.status == pb::AgentStatus::Done as i32 {
            a.result.contains("approved: shell")
        } else {
            a.status == pb::AgentStatus::Failed as i32
                && a.error
                    .as_ref()
                    .is_some_and(|e| e.code == "SERVER_RESTARTED")
        };
        assert!(
            ok,
            "cycle {cycle}: {id} after its acknowledged approval: {a:?}"
        );
    }
    // Each key returns its first agent (a sample: every key would make the
    // test quadratic over cycles).
    for (key, id) in all.spawns.iter().rev().take(20) {
        let again = common::spawn(
            &mut client,
            pb::SpawnRequest {
                idempotency_key: key.clone(),
                ..common::bg("acme/m", "sleep 1")
            },
        )
        .await;
        assert_eq!(
            &again.id, id,
            "cycle {cycle}: key {key} returned another agent"
        );
    }
    let mut previous = last_seen;
    // The replay is everything up to what was durable; then live events
    // follow. Read until a short quiet spell (the replay comes at once).
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(300), resumed.next()).await
    {
        let event = event.unwrap();
        assert_eq!(
            event.sequence,
            previous + 1,
            "cycle {cycle}: resumed after {last_seen}, gap or repeat"
        );
        previous = event.sequence;
    }
}
