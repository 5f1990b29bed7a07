//! A worker whose network goes silent (no FIN, no RST — a frozen host or a
//! dropped route) is noticed by HTTP/2 keepalive alone: its runs fail with
//! WORKER_LOST and their slots free.

mod common;

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use common::*;
use subagentd::pb::{
    self, connect_request, connect_response, worker_service_client::WorkerServiceClient,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

/// A TCP proxy that can stop forwarding without closing either side: the
/// server's keepalive pings then go unanswered, as with a dead host.
struct FreezableProxy {
    addr: std::net::SocketAddr,
    frozen: Arc<AtomicBool>,
}

impl FreezableProxy {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream).await.unwrap();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, f.clone()));
                tokio::spawn(pipe(sr, cw, f.clone()));
            }
        });
        Self { addr, frozen }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }
}

/// Copies until frozen; then holds both sockets open and moves nothing.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            // Swallow this and everything after, keeping the sockets open.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_silently_dead_worker_is_lost_through_keepalive() {
    let mut s = TestServer::start(
        r#"
[server]
keepalive_interval = "200ms"
keepalive_timeout = "300ms"

[limits]
max_background_agents = 1

[agents.coder]
runner = "worker"
"#,
    )
    .await;
    let proxy = FreezableProxy::start(s.handle.addr()).await;

    let channel = Channel::from_shared(format!("http://{}", proxy.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(pb::ConnectRequest {
        message: Some(connect_request::Message::Hello(pb::WorkerHello {
            name: "frozen".into(),
            agents: vec!["coder".into()],
            capacity: 1,
            ..Default::default()
        })),
    })
    .unwrap();
    let mut stream = WorkerServiceClient::new(channel)
        .connect(UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let welcome = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        welcome.message,
        Some(connect_response::Message::Welcome(_))
    ));

    let a = spawn(
        &mut s.client,
        pb::SpawnRequest {
            agent: "coder".into(),
            ..bg("acme/m1", "work")
        },
    )
    .await;
    let assigned = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        assigned.message,
        Some(connect_response::Message::Assign(_))
    ));

    // The worker's host goes silent: nothing is closed, nothing arrives.
    proxy.freeze();
    let lost = await_all(&mut s.client, &[&a.id]).await;
    assert_eq!(status(&lost[0]), pb::AgentStatus::Failed, "{:?}", lost[0]);
    let error = lost[0].error.as_ref().expect("an error");
    assert_eq!(error.code, "WORKER_LOST");
    assert!(error.message.contains("frozen"), "{}", error.message);
    // Its global slot is free again.
    let next = spawn(
        &mut s.client,
        pb::SpawnRequest {
            agent: "coder".into(),
            ..bg("acme/m1", "work")
        },
    )
    .await;
    assert_eq!(status(&next), pb::AgentStatus::Queued);
    drop(tx);
    s.handle.shutdown().await.unwrap();
}
