//! Limits against abuse, each exceeded over loopback gRPC, and the server
//! still serving other clients afterwards: message size, header list
//! size, streams per connection, watchers per tenant.

mod common;

use std::time::Duration;

use common::{
    auth::{config, key, with_key},
    bg, error_info, TestServer,
};
use subagentd::pb;
use tonic::{metadata::MetadataValue, Code};

/// A fresh connection still gets answers.
async fn still_serves(s: &TestServer, key: Option<&str>) {
    let mut c = s.new_client().await;
    let req = pb::StatusRequest::default();
    let req = match key {
        Some(k) => with_key(req, k),
        None => tonic::Request::new(req),
    };
    c.status(req).await.expect("the server still answers");
}

#[tokio::test]
async fn an_oversized_message_is_resource_exhausted() {
    // The limit follows max_prompt_bytes (+ 64 KiB for the other fields).
    let s = TestServer::start("[limits]\nmax_prompt_bytes = 1024\n").await;
    let mut c = s.client.clone();
    let big = "x".repeat(80 * 1024);
    let err = c
        .spawn(pb::SpawnRequest {
            labels: [("k".to_owned(), big)].into(),
            ..bg("acme/m", "hi")
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    // The same connection goes on.
    c.spawn(bg("acme/m", "hi")).await.expect("a small Spawn");
    still_serves(&s, None).await;
}

#[tokio::test]
async fn an_explicit_message_limit_wins() {
    let s = TestServer::start("[server]\nmax_message_bytes = 2048\n").await;
    let mut c = s.client.clone();
    let err = c.spawn(bg("acme/m", &"x".repeat(4096))).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    still_serves(&s, None).await;
}

#[tokio::test]
async fn an_oversized_header_list_is_refused() {
    let s = TestServer::start("[server]\nmax_header_list_bytes = 4096\n").await;
    let mut c = s.new_client().await;
    let mut req = tonic::Request::new(pb::StatusRequest::default());
    let value: MetadataValue<_> = "y".repeat(8 * 1024).parse().unwrap();
    req.metadata_mut().insert("x-padding", value);
    // Refused (how depends on the HTTP/2 stack: a reset stream or a 431),
    // never handled.
    c.status(req)
        .await
        .expect_err("a header list over the limit");
    still_serves(&s, None).await;
}

#[tokio::test]
async fn a_connection_gets_no_more_streams_than_the_limit() {
    let s = TestServer::start("[server]\nmax_concurrent_streams = 2\n").await;
    let c = s.new_client().await;
    // Two watches hold the connection's two streams.
    let mut open = Vec::new();
    for _ in 0..2 {
        open.push(
            c.clone()
                .watch_agents(pb::WatchAgentsRequest::default())
                .await
                .unwrap()
                .into_inner(),
        );
    }
    // A third call on it waits for a stream until its deadline.
    let mut req = tonic::Request::new(pb::StatusRequest::default());
    req.set_timeout(Duration::from_millis(300));
    let err = c.clone().status(req).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    // Other connections are served, and so is this one once a stream ends.
    still_serves(&s, None).await;
    open.pop();
    c.clone()
        .status(pb::StatusRequest::default())
        .await
        .expect("a freed stream serves the next call");
}

#[tokio::test]
async fn a_tenant_gets_no_more_watchers_than_the_limit() {
    let a = key("fronta", "team-a", &["frontend"], None);
    let b = key("frontb", "team-b", &["viewer"], None);
    let toml = config(&[("fronta", &a), ("frontb", &b)], "")
        .replace("[limits]\n", "[limits]\nmax_watchers_per_tenant = 2\n");
    let s = TestServer::start(&toml).await;
    let watch = |key: &str| {
        let mut c = s.client.clone();
        let req = with_key(pb::WatchAgentsRequest::default(), key);
        async move { c.watch_agents(req).await.map(|r| r.into_inner()) }
    };
    let mut open = vec![watch(&a.key).await.unwrap(), watch(&a.key).await.unwrap()];
    let err = watch(&a.key).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "WATCH_LIMIT_REACHED");
    assert_eq!(meta["tenant"], "team-a");
    assert_eq!(meta["limit"], "2");
    assert_eq!(meta["open"], "2");
    // Another tenant has its own count.
    let _b = watch(&b.key).await.expect("team-b watches");
    still_serves(&s, Some(&b.key)).await;
    // A closed stream frees its place once the server saw it end.
    drop(open.pop());
    let mut again = None;
    for _ in 0..100 {
        match watch(&a.key).await {
            Ok(stream) => {
                again = Some(stream);
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                tokio::task::yield_now().await;
            }
        }
    }
    assert!(again.is_some(), "the dropped watch's place was freed");
}
