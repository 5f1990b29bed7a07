//! SIGTERM as a Kubernetes rollout sends it, against the built binary:
//! readiness flips at once, new Spawns are refused, running agents get
//! `[server] shutdown_grace` to finish, the rest are cancelled (watchers
//! see it), and the process exits 0; a second signal exits at once.

mod common;

use common::{
    bg,
    child::{ChildServer, CHILD_WAIT as WAIT},
    spawn,
};
use subagentd::pb::{self, AgentEventKind as Kind};
use tonic::{Code, Streaming};
use tonic_health::pb::{
    health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
};
use tonic_types::StatusExt;

/// A Health.Watch stream of the server's overall status.
async fn health(server: &ChildServer) -> Streaming<tonic_health::pb::HealthCheckResponse> {
    HealthClient::new(server.channel().await)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn next_health(stream: &mut Streaming<tonic_health::pb::HealthCheckResponse>) -> i32 {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("health update")
        .unwrap()
        .expect("health stream open")
        .status
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
    let server = ChildServer::start(
        "[server]\nshutdown_grace = \"2s\"\n\
         [limits]\nmax_background_agents = 10\ndefault_concurrency = 1\n",
        &[],
    )
    .await;
    let mut client = server.client().await;
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
    let mut health = health(&server).await;
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
    let server = ChildServer::start("[server]\nshutdown_grace = \"10m\"\n", &[]).await;
    let mut client = server.client().await;
    let running = spawn(&mut client, bg("acme/m", "wait_steer")).await;
    assert_eq!(running.status, pb::AgentStatus::Running as i32);
    let mut health = health(&server).await;
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
