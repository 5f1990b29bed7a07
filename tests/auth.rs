//! Authentication and roles over loopback gRPC: API keys from the config
//! and from a keys directory, UNAUTHENTICATED with its cause,
//! PERMISSION_DENIED with the roles a method needs, open health and
//! reflection, worker keys limited to their agent types, and the refusal
//! to listen unauthenticated on a non-loopback address.

mod common;

use std::time::{Duration, Instant};

use common::{
    auth::{config, key, open_worker, with_key},
    bg, error_info, TestServer,
};
use subagentd::{
    auth::keys,
    config::{Config, ConfigSource},
    pb,
};
use tonic::{transport::Channel, Code, Request};

fn with_header<T>(message: T, value: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", value.parse().unwrap());
    request
}

fn status_req() -> pb::StatusRequest {
    pb::StatusRequest::default()
}

fn assert_unauthenticated(status: &tonic::Status, cause: &str) {
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let (reason, meta) = error_info(status);
    assert_eq!(reason, "UNAUTHENTICATED");
    assert_eq!(
        meta.get("cause").map(String::as_str),
        Some(cause),
        "{meta:?}"
    );
}

fn assert_denied(status: &tonic::Status, required: &str) {
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let (reason, meta) = error_info(status);
    assert_eq!(reason, "PERMISSION_DENIED");
    assert_eq!(
        meta.get("required_roles").map(String::as_str),
        Some(required),
        "{meta:?}"
    );
}

#[tokio::test]
async fn calls_without_a_valid_key_are_unauthenticated_with_their_cause() {
    let front = key("front", "team-a", &["frontend"], None);
    let s = TestServer::start(&config(&[("front", &front)], "")).await;
    let mut c = s.client.clone();

    let missing = c.status(status_req()).await.unwrap_err();
    assert_unauthenticated(&missing, "missing");
    let spawn = c.spawn(bg("openai/gpt-4o", "hi")).await.unwrap_err();
    assert_unauthenticated(&spawn, "missing");

    for bad in [
        front.key.clone(),                 // no scheme
        "Basic dXNlcjpwYXNz".to_owned(),   // another scheme
        "Bearer sa_front_tooshort".into(), // not a key's shape
        "Bearer eyJhbGciOi.x.y".into(),    // not a key at all
    ] {
        let err = c.status(with_header(status_req(), &bad)).await.unwrap_err();
        assert_unauthenticated(&err, "malformed");
    }

    // A wrong secret for a known id and an unknown id: the same answer.
    let wrong_secret = keys::generate("front").unwrap();
    let unknown_id = keys::generate("nobody").unwrap();
    let a = c
        .status(with_key(status_req(), &wrong_secret))
        .await
        .unwrap_err();
    let b = c
        .status(with_key(status_req(), &unknown_id))
        .await
        .unwrap_err();
    assert_unauthenticated(&a, "unknown");
    assert_unauthenticated(&b, "unknown");
    assert_eq!(a.message(), b.message());
    assert_eq!(a.details(), b.details());
    // The secret is never echoed.
    let secret = &wrong_secret["sa_front_".len()..];
    assert!(!a.message().contains(secret));

    // The right key works.
    let agent = c
        .spawn(with_key(bg("openai/gpt-4o", "hi"), &front.key))
        .await
        .expect("a frontend key spawns")
        .into_inner()
        .agent
        .unwrap();
    let listed = c
        .status(with_key(
            pb::StatusRequest {
                ids: vec![agent.id.clone()],
                ..Default::default()
            },
            &front.key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.agents.len(), 1);
}

#[tokio::test]
async fn each_role_calls_only_its_methods() {
    let viewer = key("viewer", "team-a", &["viewer"], None);
    let front = key("front", "team-a", &["frontend"], None);
    let approver = key("appr", "team-a", &["approver"], None);
    let admin = key("admin", "team-a", &["admin"], None);
    let worker = key("worker", "team-a", &["worker"], None);
    let s = TestServer::start(&config(
        &[
            ("viewer", &viewer),
            ("front", &front),
            ("appr", &approver),
            ("admin", &admin),
            ("worker", &worker),
        ],
        "",
    ))
    .await;
    let mut c = s.client.clone();
    let target = c
        .spawn(with_key(
            pb::SpawnRequest {
                prompt: "sleep 60000".into(),
                ..bg("openai/gpt-4o", "")
            },
            &front.key,
        ))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    let id = target.id.clone();

    // Readers: every role but worker.
    for k in [&viewer, &front, &approver, &admin] {
        c.status(with_key(status_req(), &k.key)).await.unwrap();
        let awaited = c
            .r#await(with_key(
                pb::AwaitRequest {
                    ids: vec![id.clone()],
                    timeout: Some(prost_types::Duration {
                        seconds: 0,
                        nanos: 1_000_000,
                    }),
                    ..Default::default()
                },
                &k.key,
            ))
            .await;
        assert!(awaited.is_ok(), "{awaited:?}");
        let watch = c
            .watch_agents(with_key(
                pb::WatchAgentsRequest {
                    ids: vec![id.clone()],
                    include_snapshot: true,
                    ..Default::default()
                },
                &k.key,
            ))
            .await;
        assert!(watch.is_ok(), "{watch:?}");
    }
    let err = c
        .status(with_key(status_req(), &worker.key))
        .await
        .unwrap_err();
    assert_denied(&err, "viewer,frontend,approver,admin");

    // Spawn: frontend and admin.
    for k in [&viewer, &approver, &worker] {
        let err = c
            .spawn(with_key(bg("openai/gpt-4o", "hi"), &k.key))
            .await
            .unwrap_err();
        assert_denied(&err, "frontend,admin");
    }
    c.spawn(with_key(bg("openai/gpt-4o", "hi"), &admin.key))
        .await
        .expect("admin spawns");

    // Steer: frontend and admin (an operator unsticks an agent).
    let steer = |key: &str| {
        with_key(
            pb::SteerRequest {
                id: id.clone(),
                message: "go on".into(),
            },
            key,
        )
    };
    for k in [&viewer, &approver, &worker] {
        let err = c.steer(steer(&k.key)).await.unwrap_err();
        assert_denied(&err, "frontend,admin");
    }
    c.steer(steer(&front.key)).await.expect("frontend steers");
    c.steer(steer(&admin.key)).await.expect("admin steers");

    // Approve: approver and admin. The agent awaits no approval, so an
    // allowed caller gets past the policy to FAILED_PRECONDITION.
    let approve = |key: &str| {
        with_key(
            pb::ApproveRequest {
                id: id.clone(),
                approval_id: uuid::Uuid::now_v7().to_string(),
                decision: pb::ApprovalDecision::Approve as i32,
                ..Default::default()
            },
            key,
        )
    };
    for k in [&viewer, &front, &worker] {
        let err = c.approve(approve(&k.key)).await.unwrap_err();
        assert_denied(&err, "approver,admin");
    }
    for k in [&approver, &admin] {
        let err = c.approve(approve(&k.key)).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    }

    // Cancel: frontend and admin.
    let cancel = |key: &str| {
        with_key(
            pb::CancelRequest {
                id: id.clone(),
                ..Default::default()
            },
            key,
        )
    };
    for k in [&viewer, &approver, &worker] {
        let err = c.cancel(cancel(&k.key)).await.unwrap_err();
        assert_denied(&err, "frontend,admin");
    }
    let cancelled = c.cancel(cancel(&admin.key)).await.unwrap().into_inner();
    assert_eq!(cancelled.agents.len(), 1);

    // A method the policy table does not list: refused for every role.
    let channel = Channel::from_shared(format!("http://{}", s.handle.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    for k in [&viewer, &front, &approver, &admin, &worker] {
        grpc.ready().await.unwrap();
        let err = grpc
            .unary::<_, pb::StatusResponse, _>(
                with_key(status_req(), &k.key),
                http::uri::PathAndQuery::from_static("/subagents.v1.AgentService/Nope"),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .expect_err("an unlisted method");
        assert_denied(&err, "");
    }
}

#[tokio::test]
async fn health_and_reflection_need_no_credential() {
    let front = key("front", "team-a", &["frontend"], None);
    let s = TestServer::start(&config(&[("front", &front)], "")).await;
    let channel = Channel::from_shared(format!("http://{}", s.handle.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: subagentd::server::SERVICE_NAME.into(),
        })
        .await
        .expect("health needs no credential")
        .into_inner();
    assert_eq!(
        serving.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut reflection = ServerReflectionClient::new(channel);
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]))
        .await
        .expect("reflection needs no credential")
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("{answer:?}");
    };
    assert!(list
        .service
        .iter()
        .any(|s| s.name == "subagents.v1.AgentService"));
}

#[tokio::test]
async fn worker_keys_serve_only_their_agent_types() {
    let coder = key("coder", "team-a", &["worker"], Some(&["coder"]));
    let any = key("any", "team-a", &["worker"], None);
    let front = key("front", "team-a", &["frontend"], None);
    let s = TestServer::start(&config(
        &[("coder", &coder), ("any", &any), ("front", &front)],
        "",
    ))
    .await;
    let addr = s.handle.addr();
    open_worker(addr, &coder.key, &["coder"])
        .await
        .expect("its own type");
    let err = open_worker(addr, &coder.key, &["coder", "writer"])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "PERMISSION_DENIED");
    assert_eq!(meta.get("agent_types").map(String::as_str), Some("writer"));
    open_worker(addr, &any.key, &["coder", "writer"])
        .await
        .expect("a key without agent_types serves every type");
    let err = open_worker(addr, &front.key, &["coder"]).await.unwrap_err();
    assert_denied(&err, "worker");
}

#[tokio::test]
async fn keys_dir_entries_take_effect_on_reload_and_within_ten_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let first = key("first", "team-a", &["viewer"], None);
    std::fs::write(dir.path().join("first"), &first.entry).unwrap();
    let toml = config(
        &[],
        &format!("keys_dir = {:?}\n", dir.path().display().to_string()),
    );
    let s = TestServer::start_with_file(&toml).await;
    let mut c = s.client.clone();
    c.status(with_key(status_req(), &first.key))
        .await
        .expect("a key from the directory");

    // SIGHUP re-reads at once.
    let second = key("second", "team-a", &["viewer"], None);
    std::fs::write(dir.path().join("second"), &second.entry).unwrap();
    std::fs::remove_file(dir.path().join("first")).unwrap();
    s.handle.reload().expect("reload");
    c.status(with_key(status_req(), &second.key))
        .await
        .expect("added key works after reload");
    let err = c
        .status(with_key(status_req(), &first.key))
        .await
        .unwrap_err();
    assert_unauthenticated(&err, "unknown");

    // Without a signal: a Secret's atomic swap (new ..data target, the
    // visible names are symlinks through it) is seen within 10 s.
    let third = key("third", "team-a", &["viewer"], None);
    let v1 = dir.path().join("..v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("third"), &third.entry).unwrap();
    std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/third", dir.path().join("third")).unwrap();
    std::fs::remove_file(dir.path().join("second")).unwrap();
    let since = Instant::now();
    loop {
        match c.status(with_key(status_req(), &third.key)).await {
            Ok(_) => break,
            Err(e) => {
                assert_unauthenticated(&e, "unknown");
                assert!(
                    since.elapsed() < Duration::from_secs(10),
                    "a new key file was not seen within 10 s"
                );
                // Polling the outcome, not waiting for a guess of it.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let err = c
        .status(with_key(status_req(), &second.key))
        .await
        .unwrap_err();
    assert_unauthenticated(&err, "unknown");
}

#[tokio::test]
async fn unauthenticated_serving_stays_on_loopback_unless_allowed() {
    let start = |toml: &str| {
        let mut config: Config = ConfigSource::from_toml_str(toml).unwrap();
        config.server.listen = "0.0.0.0:0".into();
        config.telemetry.metrics_listen = String::new();
        config.http.listen = String::new();
        config.store.backend = subagentd::config::StoreBackend::Memory;
        subagentd::server::start(config, ConfigSource::default())
    };
    let Err(refused) = start("").await else {
        panic!("an unauthenticated server started on 0.0.0.0");
    };
    let message = format!("{refused:#}");
    assert!(message.contains("without authentication"), "{message}");
    assert!(message.contains("allow_unauthenticated"), "{message}");

    let allowed = start("[auth]\nallow_unauthenticated = true\n")
        .await
        .expect("explicitly allowed");
    allowed.shutdown().await.unwrap();

    let front = key("front", "team-a", &["frontend"], None);
    let required = start(&config(&[("front", &front)], ""))
        .await
        .expect("authenticated serving may listen anywhere");
    required.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_revoked_key_ends_its_open_watch_and_worker_session() {
    let dir = tempfile::tempdir().unwrap();
    let viewer = key("viewer", "team-a", &["viewer"], None);
    let worker = key("worker", "team-a", &["worker"], None);
    let front = key("front", "team-a", &["frontend"], None);
    std::fs::write(dir.path().join("viewer"), &viewer.entry).unwrap();
    std::fs::write(dir.path().join("worker"), &worker.entry).unwrap();
    let toml = config(
        &[("front", &front)],
        &format!("keys_dir = {:?}\n", dir.path().display().to_string()),
    );
    let s = TestServer::start_with_file(&toml).await;
    let mut c = s.client.clone();
    let mut watch = c
        .watch_agents(with_key(pb::WatchAgentsRequest::default(), &viewer.key))
        .await
        .unwrap()
        .into_inner();
    let mut session = open_worker(s.handle.addr(), &worker.key, &["coder"])
        .await
        .unwrap();
    let run = c
        .spawn(with_key(
            pb::SpawnRequest {
                agent: "coder".into(),
                ..bg("openai/gpt-4o", "work")
            },
            &front.key,
        ))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    let assigned = session.message().await.unwrap().unwrap();
    assert!(
        matches!(
            assigned.message,
            Some(pb::connect_response::Message::Assign(_))
        ),
        "{assigned:?}"
    );
    // A key kept across the reload keeps its stream.
    let mut kept = c
        .watch_agents(with_key(
            pb::WatchAgentsRequest {
                ids: vec![run.id.clone()],
                ..Default::default()
            },
            &front.key,
        ))
        .await
        .unwrap()
        .into_inner();

    std::fs::remove_file(dir.path().join("viewer")).unwrap();
    std::fs::remove_file(dir.path().join("worker")).unwrap();
    s.handle.reload().expect("reload");

    // The watch ends UNAUTHENTICATED (after what it was sent before).
    let ended = loop {
        match watch.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the watch ended without a status"),
            Err(status) => break status,
        }
    };
    assert_unauthenticated(&ended, "unknown");
    // So does the worker's session, and its run follows the worker-lost
    // rules.
    let ended = loop {
        match session.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the session ended without a status"),
            Err(status) => break status,
        }
    };
    assert_unauthenticated(&ended, "unknown");
    let lost = loop {
        let event = kept
            .message()
            .await
            .unwrap()
            .expect("the kept watch goes on");
        let agent = event.agent.unwrap();
        if agent.status == pb::AgentStatus::Failed as i32 {
            break agent;
        }
    };
    assert_eq!(lost.error.unwrap().code, "WORKER_LOST");
}

#[tokio::test]
async fn a_command_run_calls_back_with_a_credential_that_ends_with_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let script = dir.path().join("spawner.sh");
    // Keeps the token where the test can try it after the run, then
    // spawns a child with nothing but its environment, then waits for a
    // steer.
    std::fs::write(
        &script,
        r#"printf '%s' "$SUBAGENTD_TOKEN" > "$TOKEN_FILE.tmp" && mv "$TOKEN_FILE.tmp" "$TOKEN_FILE" || exit 1
out=$("$SUBAGENTD_CLI" spawn --json --background --agent simulated --model acme/m1 --prompt hi --parent-id "$SUBAGENTD_AGENT_ID") || exit 1
printf 'child=%s\n' "$(printf '%s' "$out" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')"
read -r line
printf '%s\n' "$line"
"#,
    )
    .unwrap();
    let front = key("front", "team-a", &["frontend"], None);
    let toml = config(
        &[("front", &front)],
        &format!(
            r#"
[agents.spawner]
runner = "command"
command = ["sh", {script:?}, "{{prompt}}"]
prompt = "arg"
steer = "stdin"
env = {{ SUBAGENTD_CLI = {cli:?}, TOKEN_FILE = {token:?} }}
"#,
            script = script.display().to_string(),
            cli = env!("CARGO_BIN_EXE_subagentd"),
            token = token_file.display().to_string(),
        ),
    );
    let s = TestServer::start_with_file(&toml).await;
    let mut c = s.client.clone();
    let run = c
        .spawn(with_key(
            pb::SpawnRequest {
                agent: "spawner".into(),
                ..bg("acme/m1", "go")
            },
            &front.key,
        ))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    let mut tree = c
        .watch_agents(with_key(
            pb::WatchAgentsRequest {
                root_id: run.id.clone(),
                include_snapshot: true,
                ..Default::default()
            },
            &front.key,
        ))
        .await
        .unwrap()
        .into_inner();
    // The program spawned its child: the token file was written before.
    let child = loop {
        let event = tree.message().await.unwrap().expect("the watch goes on");
        if let Some(a) = event.agent.filter(|a| a.parent_id == run.id) {
            break a;
        }
    };
    assert_eq!(child.tenant, "team-a", "the run's tenant");
    assert_eq!(child.root_id, run.id);
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(
        token.starts_with("sar_"),
        "a run token, not a copy of a key"
    );
    assert!(!token.contains(&front.key));

    // While the run lives, its token reads its tenant and holds a stream.
    let seen = c
        .status(with_key(
            pb::StatusRequest {
                ids: vec![child.id.clone()],
                ..Default::default()
            },
            &token,
        ))
        .await
        .expect("the run's token acts as a frontend of its tenant")
        .into_inner();
    assert_eq!(seen.agents.len(), 1);
    let mut held = c
        .watch_agents(with_key(
            pb::WatchAgentsRequest {
                ids: vec![run.id.clone()],
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();

    c.steer(with_key(
        pb::SteerRequest {
            id: run.id.clone(),
            message: "finish".into(),
        },
        &front.key,
    ))
    .await
    .unwrap();
    let ended = loop {
        match held.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_unauthenticated(&ended, "unknown");
    let done = c
        .status(with_key(
            pb::StatusRequest {
                ids: vec![run.id.clone()],
                ..Default::default()
            },
            &front.key,
        ))
        .await
        .unwrap()
        .into_inner()
        .agents
        .remove(0);
    assert_eq!(done.status(), pb::AgentStatus::Done, "{done:?}");
    assert_eq!(done.result, format!("child={}\nfinish\n", child.id));
    // Once the run has ended its token is refused like one never issued.
    let refused = c
        .status(with_key(pb::StatusRequest::default(), &token))
        .await
        .unwrap_err();
    assert_unauthenticated(&refused, "unknown");
}
