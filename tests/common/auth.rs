//! API keys for tests: generated keys with their config entries, a config
//! that requires them, and requests and worker sessions that carry them.

use subagentd::{
    auth::keys,
    pb::{self, connect_request, worker_service_client::WorkerServiceClient},
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{transport::Channel, Request};

/// A key (generated per run) and its config entry.
pub struct Key {
    pub key: String,
    pub entry: String,
}

pub fn key(id: &str, tenant: &str, roles: &[&str], agent_types: Option<&[&str]>) -> Key {
    let key = keys::generate(id).unwrap();
    let roles: Vec<String> = roles.iter().map(|r| format!("{r:?}")).collect();
    let mut entry = format!(
        "sha256 = \"{}\"\ntenant = \"{tenant}\"\nroles = [{}]\n",
        keys::digest_hex(&keys::digest(&key)),
        roles.join(", ")
    );
    if let Some(types) = agent_types {
        let types: Vec<String> = types.iter().map(|t| format!("{t:?}")).collect();
        entry.push_str(&format!("agent_types = [{}]\n", types.join(", ")));
    }
    Key { key, entry }
}

pub fn config(keys: &[(&str, &Key)], extra: &str) -> String {
    let mut toml = String::from(
        r#"
[limits]
max_background_agents = 20

[agents.simulated]
runner = "simulated"

[agents.coder]
runner = "worker"

[agents.writer]
runner = "worker"

[auth]
mode = "required"
"#,
    );
    toml.push_str(extra);
    for (id, k) in keys {
        toml.push_str(&format!("\n[auth.keys.{id}]\n{}", k.entry));
    }
    toml
}

pub fn with_key<T>(message: T, key: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    request
}

/// A worker session with `hello`, authenticated by `key`: the sender for
/// its later messages and the server's stream, after the first answer
/// (the welcome; Err for a refused hello).
pub async fn open_worker_with(
    addr: std::net::SocketAddr,
    key: &str,
    hello: pb::WorkerHello,
) -> Result<
    (
        mpsc::UnboundedSender<pb::ConnectRequest>,
        tonic::Streaming<pb::ConnectResponse>,
    ),
    tonic::Status,
> {
    open_worker_as(addr, Some(key), hello).await
}

/// [`open_worker_with`], with no credential at all when `key` is None.
pub async fn open_worker_as(
    addr: std::net::SocketAddr,
    key: Option<&str>,
    hello: pb::WorkerHello,
) -> Result<
    (
        mpsc::UnboundedSender<pb::ConnectRequest>,
        tonic::Streaming<pb::ConnectResponse>,
    ),
    tonic::Status,
> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(pb::ConnectRequest {
        message: Some(connect_request::Message::Hello(hello)),
    })
    .unwrap();
    let messages = UnboundedReceiverStream::new(rx);
    let request = match key {
        Some(key) => with_key(messages, key),
        None => Request::new(messages),
    };
    let mut stream = WorkerServiceClient::new(channel)
        .connect(request)
        .await?
        .into_inner();
    match stream.message().await? {
        Some(_) => Ok((tx, stream)),
        None => panic!("the session ended without an answer"),
    }
}

/// A worker session serving `agents` with capacity 1.
pub async fn open_worker(
    addr: std::net::SocketAddr,
    key: &str,
    agents: &[&str],
) -> Result<tonic::Streaming<pb::ConnectResponse>, tonic::Status> {
    let hello = pb::WorkerHello {
        name: "w".into(),
        agents: agents.iter().map(|a| (*a).into()).collect(),
        capacity: 1,
        ..Default::default()
    };
    let (tx, stream) = open_worker_with(addr, key, hello).await?;
    // The sender stays open for the session's life (leaked on purpose:
    // the test ends with the server).
    std::mem::forget(tx);
    Ok(stream)
}
