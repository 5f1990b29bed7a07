//! The Prometheus endpoint, scraped over HTTP during a scenario.

mod common;

use common::*;
use subagentd::pb;
use tonic::Code;

const CONFIG: &str = "\
[limits]
max_background_agents = 3
max_concurrent_per_parent = 0
[limits.model_concurrency]
\"acme/slow\" = 1
";

#[tokio::test]
async fn a_scrape_shows_queued_agents_rejections_and_run_histograms() {
    let mut s = TestServer::start(CONFIG).await;
    let mut watch_client = s.new_client().await;
    let mut events = watch(
        &mut watch_client,
        pb::WatchAgentsRequest {
            ..Default::default()
        },
    )
    .await;

    // One runs in the bucket of limit 1, two wait behind it.
    let first = spawn(&mut s.client, bg("acme/slow", "wait_steer")).await;
    let second = spawn(&mut s.client, bg("acme/slow", "wait_steer")).await;
    let third = spawn(&mut s.client, bg("acme/slow", "done")).await;
    let m = scrape(&s).await;
    let bucket = |state: &str| {
        format!(
            "subagentd_bucket_agents{{tenant=\"default\",bucket=\"acme/slow\",state=\"{state}\"}}"
        )
    };
    assert_eq!(value(&m, &bucket("running")), 1.0);
    assert_eq!(value(&m, &bucket("queued")), 2.0);
    assert_eq!(
        value(&m, "subagentd_agents{tenant=\"default\",state=\"queued\"}"),
        2.0
    );
    assert_eq!(value(&m, "subagentd_background_agents"), 3.0);
    assert_eq!(
        value(&m, "subagentd_bucket_limit{bucket=\"acme/slow\"}"),
        1.0
    );
    assert_eq!(
        value(&m, "subagentd_limit{limit=\"max_background_agents\"}"),
        3.0
    );
    assert_eq!(value(&m, "subagentd_watch_subscribers"), 1.0);

    // The global cap: refused at once, counted by reason.
    let refused = s
        .client
        .spawn(bg("acme/other", "x"))
        .await
        .expect_err("over the global cap");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    let m = scrape(&s).await;
    assert_eq!(
        value(
            &m,
            "subagentd_agents_rejected_total{tenant=\"default\",reason=\"GLOBAL_LIMIT_REACHED\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "subagentd_rpc_requests_total{service=\"subagents.v1.AgentService\",method=\"Spawn\",code=\"RESOURCE_EXHAUSTED\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "subagentd_rpc_requests_total{service=\"subagents.v1.AgentService\",method=\"Spawn\",code=\"OK\"}"
        ),
        3.0
    );

    // Let all three run to the end.
    steer(&mut s.client, &first.id, "go").await;
    wait_for_event(&mut events, &second.id, pb::AgentEventKind::Started).await;
    steer(&mut s.client, &second.id, "go").await;
    await_all(&mut s.client, &[&first.id, &second.id, &third.id]).await;
    let m = scrape(&s).await;
    assert_eq!(
        value(
            &m,
            "subagentd_queue_wait_seconds_count{tenant=\"default\",bucket=\"acme/slow\"}"
        ),
        3.0
    );
    assert_eq!(
        value(
            &m,
            "subagentd_run_duration_seconds_count{tenant=\"default\",bucket=\"acme/slow\"}"
        ),
        3.0
    );
    assert_eq!(
        value(
            &m,
            "subagentd_queue_wait_seconds_bucket{le=\"+Inf\",tenant=\"default\",bucket=\"acme/slow\"}"
        ),
        3.0
    );
    assert_eq!(
        value(
            &m,
            "subagentd_agents_finished_total{tenant=\"default\",bucket=\"acme/slow\",status=\"DONE\"}"
        ),
        3.0
    );
    assert_eq!(
        value(
            &m,
            "subagentd_agents_spawned_total{tenant=\"default\",bucket=\"acme/slow\"}"
        ),
        3.0
    );
    assert_eq!(value(&m, &bucket("running")), 0.0);
    assert_eq!(value(&m, &bucket("queued")), 0.0);
    assert_eq!(value(&m, "subagentd_background_agents"), 0.0);
    // The queued agents waited; the histogram's sum says so.
    assert!(
        value(
            &m,
            "subagentd_queue_wait_seconds_sum{tenant=\"default\",bucket=\"acme/slow\"}"
        ) > 0.0
    );
    // Await and Steer are counted too (the watch stream is still open).
    assert!(
        value(
            &m,
            "subagentd_rpc_requests_total{service=\"subagents.v1.AgentService\",method=\"Steer\",code=\"OK\"}"
        ) >= 2.0
    );
    drop(events);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unknown_path_is_not_a_metrics_label_and_other_paths_are_404() {
    let s = TestServer::start("").await;
    let addr = s.handle.metrics_addr().unwrap();
    let other = reqwest::get(format!("http://{addr}/other")).await.unwrap();
    assert_eq!(other.status(), 404);
    // A method no service serves: UNIMPLEMENTED, labelled "unknown".
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.handle.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/made.Up/Method");
    let err = grpc
        .unary::<_, pb::StatusResponse, _>(
            tonic::Request::new(pb::StatusRequest::default()),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("no such method");
    assert_eq!(err.code(), Code::Unimplemented);
    let m = scrape(&s).await;
    assert_eq!(
        value(
            &m,
            "subagentd_rpc_requests_total{service=\"unknown\",method=\"unknown\",code=\"UNIMPLEMENTED\"}"
        ),
        1.0
    );
    assert!(m.keys().all(|k| !k.contains("made.Up")));
}

/// The shipped Grafana dashboard reads only metrics this server exports.
#[tokio::test]
async fn every_metric_the_grafana_dashboard_reads_is_exported() {
    let mut s = TestServer::start("").await;
    // Labelled RPC and rejection series exist once something was counted.
    let refused = s.client.spawn(bg("no-slash", "x")).await;
    assert_eq!(
        refused.expect_err("bad model").code(),
        Code::InvalidArgument
    );
    let addr = s.handle.metrics_addr().unwrap();
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Family names with their series suffixes, as PromQL may name them.
    let mut exported = std::collections::BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            match kind {
                "counter" => {
                    exported.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        exported.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    exported.insert(name.to_owned());
                }
            }
        }
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/grafana/subagentd-dashboard.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut read = std::collections::BTreeSet::new();
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("subagentd_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            read.insert(name);
        }
    }
    let missing: Vec<_> = read.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "dashboard reads {missing:?}; exported {exported:?}"
    );
    assert!(read.len() >= 10, "{read:?}");
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| collect_exprs(i, out)),
        _ => {}
    }
}

/// A unary call the client gives up on (its deadline, or a cancel) is
/// counted when the server drops it, not lost.
#[tokio::test]
async fn abandoned_unary_calls_are_counted() {
    let mut s = TestServer::start("").await;
    let waiting = spawn(&mut s.client, bg("acme/m", "wait_steer")).await;
    let id = waiting.id.clone();
    let await_req = move || pb::AwaitRequest {
        ids: vec![id.clone()],
        timeout: None,
        mode: pb::AwaitMode::All as i32,
        ..Default::default()
    };
    // A deadline: the client resets the call when it passes.
    let mut request = tonic::Request::new(await_req());
    request.set_timeout(std::time::Duration::from_millis(200));
    // tonic's channel enforces the deadline itself and answers CANCELLED
    // locally; what the server answers is in tests/deadlines.rs. What it
    // counts is checked below: DEADLINE_EXCEEDED, not CANCELLED.
    let err = s.client.r#await(request).await.expect_err("deadline");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    // The server dropped that call (its waiter is gone) ...
    let scheduler = s.handle.scheduler().clone();
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while scheduler.inspect(|c| c.waiter_count()) != 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the server kept the timed-out Await"
        );
        tokio::task::yield_now().await;
    }
    // A cancel: the caller drops the call while the server waits in it.
    let mut other = s.new_client().await;
    let call = tokio::spawn(async move { other.r#await(await_req()).await });
    while scheduler.inspect(|c| c.waiter_count()) == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the Await never arrived"
        );
        tokio::task::yield_now().await;
    }
    call.abort();
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while scheduler.inspect(|c| c.waiter_count()) != 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the server kept the abandoned Await"
        );
        tokio::task::yield_now().await;
    }

    let series = "subagentd_rpc_requests_total{service=\"subagents.v1.AgentService\",method=\"Await\",code=\"CANCELLED\"}";
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let m = scrape(&s).await;
        let cancelled = m.get(series).copied().unwrap_or(0.0);
        let deadline = m
            .get(&series.replace("CANCELLED", "DEADLINE_EXCEEDED"))
            .copied()
            .unwrap_or(0.0);
        if cancelled + deadline >= 2.0 {
            assert_eq!((deadline, cancelled), (1.0, 1.0), "{m:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "abandoned calls not counted: {:?}",
            m.iter()
                .filter(|(k, _)| k.contains("Await"))
                .collect::<Vec<_>>()
        );
        tokio::task::yield_now().await;
    }
    s.handle.shutdown().await.unwrap();
}

/// The store writer's commit counters: 0 without a store, and with one
/// every acknowledged spawn was committed (changes ≥ commits ≥ 1).
#[tokio::test]
async fn store_commit_counters_follow_the_writer() {
    let s = TestServer::start("").await;
    let m = scrape(&s).await;
    assert_eq!(value(&m, "subagentd_store_commits_total"), 0.0);
    assert_eq!(value(&m, "subagentd_store_changes_total"), 0.0);
    s.handle.shutdown().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[store]\nbackend = \"embedded\"\npath = \"{}\"\n",
        dir.path().display()
    );
    let mut s = TestServer::start(&toml).await;
    let before = scrape(&s).await;
    let a = spawn(&mut s.client, bg("acme/m", "done")).await;
    let b = spawn(&mut s.client, bg("acme/m", "done")).await;
    await_all(&mut s.client, &[&a.id, &b.id]).await;
    let after = scrape(&s).await;
    let commits = value(&after, "subagentd_store_commits_total")
        - value(&before, "subagentd_store_commits_total");
    let changes = value(&after, "subagentd_store_changes_total")
        - value(&before, "subagentd_store_changes_total");
    assert!(commits >= 1.0, "{commits} commits");
    assert!(changes >= commits, "{changes} changes in {commits} commits");
    s.handle.shutdown().await.unwrap();
}
