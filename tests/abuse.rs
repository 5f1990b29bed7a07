//! Limits against abuse, each exceeded over loopback gRPC, and the server
//! still serving other clients afterwards: message size, header list
//! size, streams per connection, rapid stream resets, unanswered
//! keepalive PINGs, watchers per tenant.

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

/// An HTTP/2 frame: the 9-byte header, then `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const FLAG_ACK: u8 = 0x1;

/// A peer speaking HTTP/2 by hand, so that it can do what every HTTP/2
/// library refuses to: reset streams before the server could accept
/// them, or withhold the PING ACK.
struct RawPeer {
    tcp: tokio::net::TcpStream,
}

impl RawPeer {
    /// Connects and sends the client preface and empty SETTINGS.
    async fn connect(addr: std::net::SocketAddr) -> Self {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        tcp.write_all(&hello).await.unwrap();
        Self { tcp }
    }

    /// The next frame (type, flags, payload), acknowledging the server's
    /// SETTINGS as a live peer does; None when the server closed.
    async fn next(&mut self) -> Option<(u8, u8, Vec<u8>)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut header = [0u8; 9];
        self.tcp.read_exact(&mut header).await.ok()?;
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        self.tcp.read_exact(&mut payload).await.ok()?;
        if header[3] == SETTINGS && header[4] & FLAG_ACK == 0 {
            let ack = frame(SETTINGS, FLAG_ACK, 0, &[]);
            self.tcp.write_all(&ack).await.ok()?;
        }
        Some((header[3], header[4], payload))
    }
}

/// CVE-2023-44487: a client that opens streams and resets them at once
/// makes the server do work for requests nobody waits for. Past
/// `max_pending_reset_streams` streams reset before the server accepted
/// them, the connection is closed with GOAWAY ENHANCE_YOUR_CALM; other
/// clients go on.
#[tokio::test]
async fn rapid_stream_resets_close_the_connection() {
    use tokio::io::AsyncWriteExt;
    const HEADERS: u8 = 0x1;
    const RST_STREAM: u8 = 0x3;
    const END_HEADERS: u8 = 0x4;
    const CANCEL: u32 = 0x8;
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    let s = TestServer::start("[server]\nmax_pending_reset_streams = 20\n").await;
    let mut peer = RawPeer::connect(s.handle.addr()).await;
    // HPACK: :method POST, :scheme http (static table entries 3 and 6),
    // :path (name entry 4) and content-type (name entry 31) as literals.
    let path = b"/subagents.v1.AgentService/Status";
    let mut block = vec![0x83, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend_from_slice(&[0x0f, 0x10, 16]);
    block.extend_from_slice(b"application/grpc");
    // Each stream's HEADERS and its RST_STREAM in one write, 1,000 of
    // them: every reset arrives before the server could accept its stream.
    let mut attack = Vec::new();
    for i in 0..1000u32 {
        let stream = 2 * i + 1;
        attack.extend(frame(HEADERS, END_HEADERS, stream, &block));
        attack.extend(frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
    }
    let _ = peer.tcp.write_all(&attack).await;
    let goaway = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some((kind, _, payload)) = peer.next().await {
            if kind == GOAWAY {
                return Some(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
            }
        }
        None
    })
    .await
    .expect("the server answers the resets");
    assert_eq!(goaway, Some(ENHANCE_YOUR_CALM), "GOAWAY ENHANCE_YOUR_CALM");
    still_serves(&s, None).await;
}

/// A peer that stops answering PINGs (a dead worker's host, a half-open
/// connection) is closed after `keepalive_interval` + `keepalive_timeout`,
/// which ends its calls; other clients go on.
#[tokio::test]
async fn a_peer_that_does_not_answer_pings_is_disconnected() {
    let s =
        TestServer::start("[server]\nkeepalive_interval = \"1s\"\nkeepalive_timeout = \"1s\"\n")
            .await;
    let started = tokio::time::Instant::now();
    let mut peer = RawPeer::connect(s.handle.addr()).await;
    let mut pinged_at = None;
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some((kind, flags, _)) = peer.next().await {
            // Its PINGs are not acknowledged.
            if kind == PING && flags & FLAG_ACK == 0 {
                pinged_at.get_or_insert_with(tokio::time::Instant::now);
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server closed the connection");
    let pinged_at = pinged_at.expect("the server sent a keepalive PING");
    assert!(
        pinged_at - started >= Duration::from_millis(900),
        "the first PING waits for the interval: {:?}",
        pinged_at - started
    );
    still_serves(&s, None).await;
}
