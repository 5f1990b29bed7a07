//! TLS over loopback gRPC: `[server.tls]` with a CA made at test time;
//! plaintext and wrong-CA clients refused; client certificates mapped to
//! principals by SAN (`[[auth.certs]]`); certificate rotation without a
//! restart and without dropping open connections; the metrics endpoint
//! behind a bearer token and TLS.

mod common;

use std::time::Duration;

use common::{
    auth::{key, with_key},
    bg, error_info,
    tls::{connect, connect_to_name, Ca, Files},
};
use subagentd::{
    config::{Config, ConfigSource},
    pb,
    server::{self, ServerHandle},
};
use tonic::Code;

/// A server started from a config file in `files`, which tests rewrite.
struct TlsServer {
    handle: ServerHandle,
    files: Files,
}

impl TlsServer {
    async fn start(files: Files, toml: &str) -> Self {
        let source = write_config(&files, toml);
        let mut config: Config = source.load().expect("test config is valid");
        config.server.shutdown_grace = Duration::ZERO;
        config.http.listen = "127.0.0.1:0".into();
        config.store.backend = subagentd::config::StoreBackend::Memory;
        let handle = server::start(config, source).await.expect("server starts");
        Self { handle, files }
    }

    /// A server of `toml` as written, in its own config file `name` (the
    /// HA test runs two on one database).
    async fn start_as(files: &Files, name: &str, toml: &str) -> ServerHandle {
        let path = files.write(name, toml);
        let source = ConfigSource {
            file: Some(path.into()),
            listen: Some("127.0.0.1:0".into()),
        };
        let mut config: Config = source.load().expect("test config is valid");
        config.server.shutdown_grace = Duration::ZERO;
        config.http.listen = "127.0.0.1:0".into();
        server::start(config, source).await.expect("server starts")
    }

    fn rewrite_and_reload(&self, toml: &str) {
        write_config(&self.files, toml);
        self.handle.reload().expect("reloaded config is valid");
    }
}

fn write_config(files: &Files, toml: &str) -> ConfigSource {
    let path = files.write("subagentd.toml", toml);
    ConfigSource {
        file: Some(path.into()),
        listen: Some("127.0.0.1:0".into()),
    }
}

const AGENTS: &str = r#"
[limits]
max_background_agents = 10

[agents.simulated]
runner = "simulated"

[telemetry]
metrics_listen = "127.0.0.1:0"
"#;

/// The call failed in the transport (the server refused the handshake),
/// with `alert` in the cause when given; the server answered nothing.
fn assert_transport_refused(err: &tonic::Status, alert: &str) {
    assert!(
        matches!(err.code(), Code::Unknown | Code::Unavailable),
        "{err:?}"
    );
    let cause = format!("{:?}", std::error::Error::source(err));
    assert!(cause.contains(alert), "expected {alert} in {cause}");
    assert!(err.metadata().get("grpc-status").is_none(), "{err:?}");
}

fn status_request() -> pb::StatusRequest {
    pb::StatusRequest::default()
}

#[tokio::test]
async fn tls_serves_verified_clients_and_refuses_plaintext_and_wrong_cas() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let tls = files.server_tls(&ca.server(), None, "none");
    let s = TlsServer::start(files, &format!("{AGENTS}\n[server.tls]\n{tls}")).await;
    let addr = s.handle.addr();

    let mut client = connect(addr, &ca, None).await.expect("TLS client connects");
    let agent = client
        .spawn(bg("openai/gpt-4o", "hello over tls"))
        .await
        .expect("Spawn over TLS")
        .into_inner()
        .agent
        .unwrap();
    let listed = client.status(status_request()).await.unwrap().into_inner();
    assert!(listed.agents.iter().any(|a| a.id == agent.id));

    // A plaintext client gets no answer from a TLS listener.
    let plain = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut plain = pb::agent_service_client::AgentServiceClient::new(channel);
        let err = plain.status(status_request()).await.unwrap_err();
        assert_transport_refused(&err, "");
    }

    // A client that trusts another CA refuses the server's certificate.
    let other = Ca::new("other ca");
    assert!(connect(addr, &other, None).await.is_err());

    // The server stays healthy for verified clients.
    let mut again = connect(addr, &ca, None).await.unwrap();
    again.status(status_request()).await.unwrap();
}

fn cert_principals(client_auth: &str, files: &Files, ca: &Ca, extra: &str) -> String {
    let tls = files.server_tls(&ca.server(), Some(ca), client_auth);
    format!(
        r#"{AGENTS}
[server.tls]
{tls}
[auth]
mode = "required"

[[auth.certs]]
san = "spiffe://test/ns/agents/sa/frontend"
tenant = "team-a"
roles = ["frontend"]

[[auth.certs]]
san = "spiffe://test/ns/agents/sa/viewer"
tenant = "team-b"
roles = ["viewer"]
{extra}"#
    )
}

#[tokio::test]
async fn client_certificates_are_principals_by_their_san() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let toml = cert_principals("required", &files, &ca, "");
    let s = TlsServer::start(files, &toml).await;
    let addr = s.handle.addr();

    // A frontend certificate spawns into its tenant.
    let frontend = ca.client(&["spiffe://test/ns/agents/sa/frontend"]);
    let mut c = connect(addr, &ca, Some(&frontend)).await.unwrap();
    let agent = c
        .spawn(bg("openai/gpt-4o", "by certificate"))
        .await
        .expect("a mapped certificate's principal may Spawn")
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(agent.tenant, "team-a");

    // A viewer certificate of another tenant: its roles and its tenant.
    let viewer = ca.client(&["spiffe://test/ns/agents/sa/viewer"]);
    let mut v = connect(addr, &ca, Some(&viewer)).await.unwrap();
    let err = v.spawn(bg("openai/gpt-4o", "no")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let listed = v.status(status_request()).await.unwrap().into_inner();
    assert!(
        listed.agents.is_empty(),
        "team-b sees none of team-a's agents"
    );

    // A valid certificate that no entry maps is an unknown credential.
    let stranger = ca.client(&["spiffe://test/ns/other/sa/nobody"]);
    let mut x = connect(addr, &ca, Some(&stranger)).await.unwrap();
    let err = x.status(status_request()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let (reason, meta) = error_info(&err);
    assert_eq!(reason, "UNAUTHENTICATED");
    assert_eq!(meta["cause"], "unknown");

    // client_auth = "required": no certificate, or one another CA signed,
    // fails the handshake (the first call, with rustls' TLS 1.3).
    let rogue = Ca::new("rogue ca").client(&["spiffe://test/ns/agents/sa/frontend"]);
    for (identity, alert) in [(None, "CertificateRequired"), (Some(&rogue), "UnknownCA")] {
        if let Ok(mut c) = connect(addr, &ca, identity).await {
            let err = c.status(status_request()).await.unwrap_err();
            assert_transport_refused(&err, alert);
        }
    }
    // ... and the server still serves the rest.
    c.status(status_request()).await.unwrap();
}

#[tokio::test]
async fn optional_client_auth_takes_keys_and_certificates() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let viewer_key = key("view", "team-b", &["viewer"], None);
    let extra = format!("\n[auth.keys.view]\n{}", viewer_key.entry);
    let toml = cert_principals("optional", &files, &ca, &extra);
    let s = TlsServer::start(files, &toml).await;
    let addr = s.handle.addr();

    // No certificate: an API key authenticates; nothing is missing.
    let mut c = connect(addr, &ca, None).await.unwrap();
    c.status(with_key(status_request(), &viewer_key.key))
        .await
        .expect("a key over TLS without a client certificate");
    let err = c.status(status_request()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(error_info(&err).1["cause"], "missing");

    // A certificate: its principal.
    let frontend = ca.client(&["spiffe://test/ns/agents/sa/frontend"]);
    let mut f = connect(addr, &ca, Some(&frontend)).await.unwrap();
    let agent = f
        .spawn(bg("openai/gpt-4o", "optional"))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(agent.tenant, "team-a");

    // A presented certificate must still be valid.
    let rogue = Ca::new("rogue ca").client(&["spiffe://test/ns/agents/sa/frontend"]);
    if let Ok(mut r) = connect(addr, &ca, Some(&rogue)).await {
        let err = r.status(status_request()).await.unwrap_err();
        assert_transport_refused(&err, "UnknownCA");
    }
}

#[tokio::test]
async fn a_removed_certificate_entry_ends_its_open_watch() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let toml = cert_principals("required", &files, &ca, "");
    let s = TlsServer::start(files, &toml).await;
    let viewer = ca.client(&["spiffe://test/ns/agents/sa/viewer"]);
    let mut v = connect(s.handle.addr(), &ca, Some(&viewer)).await.unwrap();
    let mut stream = v
        .watch_agents(pb::WatchAgentsRequest::default())
        .await
        .expect("the viewer may watch")
        .into_inner();

    // The viewer's entry goes; the frontend's stays.
    let without = toml.replace(
        "[[auth.certs]]\nsan = \"spiffe://test/ns/agents/sa/viewer\"\ntenant = \"team-b\"\nroles = [\"viewer\"]\n",
        "",
    );
    assert_ne!(without, toml);
    s.rewrite_and_reload(&without);
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => panic!("the watch ended without a status"),
            Ok(Err(status)) => break status,
            Err(_) => panic!("the watch outlived its certificate's entry"),
        }
    };
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(error_info(&ended).1["cause"], "unknown");
}

/// Connects with `ca` until it works or `within` passes; Err(last error).
async fn connects_within(
    addr: std::net::SocketAddr,
    ca: &Ca,
    within: Duration,
) -> Result<Duration, String> {
    let started = tokio::time::Instant::now();
    loop {
        match connect(addr, ca, None).await {
            Ok(mut c) => match c.status(status_request()).await {
                Ok(_) => return Ok(started.elapsed()),
                Err(e) if started.elapsed() > within => return Err(e.to_string()),
                Err(_) => {}
            },
            Err(e) if started.elapsed() > within => return Err(e.to_string()),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn rotated_certificates_take_effect_without_dropping_connections() {
    let old_ca = Ca::new("old ca");
    let files = Files::new();
    let tls = files.server_tls(&old_ca.server(), None, "none");
    let toml = format!("{AGENTS}\n[server.tls]\n{tls}");
    let s = TlsServer::start(files, &toml).await;
    let addr = s.handle.addr();
    let mut open = connect(addr, &old_ca, None).await.unwrap();
    open.status(status_request()).await.unwrap();

    // A rotated Secret: new files under the same names. The periodic
    // check picks them up within 10 s, without SIGHUP.
    let new_ca = Ca::new("new ca");
    let rotated = new_ca.server();
    s.files.write("server.crt", &rotated.cert);
    s.files.write("server.key", &rotated.key);
    let took = connects_within(addr, &new_ca, Duration::from_secs(10))
        .await
        .expect("the rotated certificate is served within 10 s");
    assert!(took <= Duration::from_secs(11), "{took:?}");
    assert!(
        connect(addr, &old_ca, None).await.is_err()
            || connect(addr, &old_ca, None)
                .await
                .unwrap()
                .status(status_request())
                .await
                .is_err(),
        "new connections get the new certificate"
    );
    // The connection opened before the rotation still works.
    open.status(status_request())
        .await
        .expect("an open connection survives the rotation");

    // SIGHUP (a reload) applies a change at once; a key that does not
    // match its certificate is refused and the last good pair stays.
    let third = Ca::new("third ca");
    let pair = third.server();
    s.files.write("server.crt", &pair.cert);
    s.files.write("server.key", &rotated.key);
    s.handle.reload().unwrap();
    connects_within(addr, &new_ca, Duration::ZERO)
        .await
        .expect("a mismatched pair is refused; the last good one stays");
    s.files.write("server.key", &pair.key);
    s.handle.reload().unwrap();
    connects_within(addr, &third, Duration::ZERO)
        .await
        .expect("SIGHUP applies the new pair at once");
}

#[tokio::test]
async fn the_metrics_endpoint_takes_a_token_and_tls() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let token = files.write("metrics-token", "first-token\n");
    let tls = files.server_tls(&ca.server(), None, "none");
    let toml = format!(
        "{AGENTS}metrics_token_file = {token:?}\nmetrics_tls = true\n\n[server.tls]\n{tls}"
    );
    let s = TlsServer::start(files, &toml).await;
    let metrics = s.handle.metrics_addr().unwrap();
    let url = format!("https://localhost:{}/metrics", metrics.port());
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .resolve("localhost", metrics)
        .build()
        .unwrap();

    let scrape = |bearer: Option<&'static str>| {
        let mut request = http.get(&url);
        if let Some(token) = bearer {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.expect("the endpoint answers").status() }
    };
    assert_eq!(scrape(None).await, 401);
    assert_eq!(scrape(Some("wrong-token")).await, 401);
    assert_eq!(scrape(Some("first-token")).await, 200);

    // A rotated token works at the next scrape; the old one no longer.
    s.files.write("metrics-token", "second-token");
    assert_eq!(scrape(Some("first-token")).await, 401);
    assert_eq!(scrape(Some("second-token")).await, 200);

    // Plain HTTP gets no metrics from a TLS endpoint.
    let plain = reqwest::get(format!("http://{metrics}/metrics")).await;
    assert!(plain.map(|r| r.status() != 200).unwrap_or(true));
}

#[test]
fn tls_config_errors_name_the_key() {
    let check = |toml: &str| ConfigSource::from_toml_str(toml).unwrap_err().to_string();
    assert!(check("[server.tls]\ncert_file = \"a.pem\"\n").contains("server.tls.key_file"));
    assert!(check(
        "[server.tls]\ncert_file = \"a\"\nkey_file = \"b\"\nclient_auth = \"required\"\n"
    )
    .contains("server.tls.client_ca_file"));
    assert!(check(
        "[auth]\nmode = \"required\"\n[[auth.certs]]\nsan = \"spiffe://x\"\ntenant = \"t\"\nroles = [\"viewer\"]\n"
    )
    .contains("auth.certs"));
    assert!(check("[telemetry]\nmetrics_tls = true\n").contains("telemetry.metrics_tls"));
}

#[tokio::test]
async fn the_cli_speaks_tls_with_a_ca_file_and_a_client_certificate() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let toml = cert_principals("required", &files, &ca, "");
    let s = TlsServer::start(files, &toml).await;
    let frontend = ca.client(&["spiffe://test/ns/agents/sa/frontend"]);
    let ca_file = s.files.write("ca.crt", &ca.pem);
    let cert_file = s.files.write("frontend.crt", &frontend.cert);
    let key_file = s.files.write("frontend.key", &frontend.key);
    let addr = s.handle.addr().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "spawn".to_owned(),
            "--addr".to_owned(),
            addr.clone(),
            "--json".to_owned(),
            "--agent".to_owned(),
            "simulated".to_owned(),
            "--model".to_owned(),
            "openai/gpt-4o".to_owned(),
            "--background".to_owned(),
            "--prompt".to_owned(),
            "from the cli".to_owned(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        common::cli::subagentd_async(args)
    };

    let ok = run(&[
        "--ca-file",
        &ca_file,
        "--cert-file",
        &cert_file,
        "--key-file",
        &key_file,
    ])
    .await;
    assert!(ok.status.success(), "{}", common::cli::stderr(&ok));
    let agent: serde_json::Value =
        serde_json::from_str(common::cli::stdout(&ok).lines().next().unwrap()).unwrap();
    assert_eq!(agent["tenant"], "team-a", "{agent}");

    // Without the client certificate the handshake is refused, and the
    // CLI says so and exits 1.
    let refused = run(&["--ca-file", &ca_file]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        common::cli::stderr(&refused).contains("error:"),
        "{}",
        common::cli::stderr(&refused)
    );
}

/// Waits (on a health Watch over TLS) until `addr` serves AgentService.
async fn serving(addr: std::net::SocketAddr, ca: &Ca) {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem)),
        )
        .unwrap()
        .connect()
        .await
        .expect("health over TLS");
    let mut updates = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: "subagents.v1.AgentService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(update) = updates.message().await.unwrap() {
            if update.status == ServingStatus::Serving as i32 {
                return;
            }
        }
    })
    .await
    .expect("the server becomes SERVING");
}

#[tokio::test]
async fn a_standby_forwards_over_tls_and_the_leader_acts_for_the_same_principal() {
    let Some(db) = common::postgres::Database::create().await else {
        return;
    };
    let ca = Ca::new("cluster ca");
    let files = Files::new();
    let frontend_b = key("frontb", "team-b", &["frontend"], None);
    let extra = format!(
        "\n[[auth.certs]]\nsan = \"spiffe://test/ns/agents/sa/admin\"\ntenant = \"ops\"\nroles = [\"admin\"]\n\n\
         [auth.keys.frontb]\n{}\n[store]\nbackend = \"postgres\"\nurl = \"{}\"\n\n[ha]\nlease_ttl = \"2s\"\n",
        frontend_b.entry, db.url
    );
    let toml = cert_principals("optional", &files, &ca, &extra);
    let leader = TlsServer::start_as(&files, "leader.toml", &toml).await;
    serving(leader.addr(), &ca).await;
    let standby = TlsServer::start_as(&files, "standby.toml", &toml).await;
    serving(standby.addr(), &ca).await;

    // A certificate principal through the standby: the leader acts for it.
    let frontend = ca.client(&["spiffe://test/ns/agents/sa/frontend"]);
    let mut via_standby = connect(standby.addr(), &ca, Some(&frontend)).await.unwrap();
    let agent = via_standby
        .spawn(bg("openai/gpt-4o", "through the standby"))
        .await
        .expect("a forwarded Spawn")
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(agent.tenant, "team-a");
    let mut at_leader = connect(leader.addr(), &ca, Some(&frontend)).await.unwrap();
    let seen = at_leader
        .status(status_request())
        .await
        .unwrap()
        .into_inner();
    assert!(seen.agents.iter().any(|a| a.id == agent.id));

    // An API key through the standby: its own tenant, not the standby's.
    let mut keyed = connect(standby.addr(), &ca, None).await.unwrap();
    let b = keyed
        .spawn(with_key(bg("openai/gpt-4o", "keyed"), &frontend_b.key))
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(b.tenant, "team-b");
    let listed = keyed
        .status(with_key(status_request(), &frontend_b.key))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.agents.iter().all(|a| a.tenant == "team-b"));
    assert!(listed.agents.iter().any(|a| a.id == b.id));

    // A client that is not a replica cannot claim another identity with
    // the forwarded-SANs header, at the leader or at the standby.
    let viewer = ca.client(&["spiffe://test/ns/agents/sa/viewer"]);
    for addr in [leader.addr(), standby.addr()] {
        let mut v = connect(addr, &ca, Some(&viewer)).await.unwrap();
        let mut request = tonic::Request::new(pb::CancelRequest {
            id: agent.id.clone(),
            ..Default::default()
        });
        request.metadata_mut().insert(
            "subagentd-forwarded-sans",
            "spiffe://test/ns/agents/sa/admin".parse().unwrap(),
        );
        let err = v.cancel(request).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    }

    // The replicas' certificate rotates to one with other names. The
    // standby then presents the new one to the leader too (the leader
    // trusts forwarded identities only from a certificate with its own
    // names): forwarding works again within the files' poll, on a new
    // channel.
    let rotated = ca.server_named(&["replica.subagentd.test"]);
    files.write("server.crt", &rotated.cert);
    files.write("server.key", &rotated.key);
    let started = tokio::time::Instant::now();
    let last = loop {
        let attempt = async {
            let mut c = connect_to_name(
                standby.addr(),
                Some("replica.subagentd.test"),
                &ca,
                Some(&frontend),
            )
            .await
            .map_err(|e| e.to_string())?;
            c.spawn(bg("openai/gpt-4o", "after the rotation"))
                .await
                .map_err(|e| format!("{e:?}"))
        };
        match attempt.await {
            Ok(answer) => {
                assert_eq!(answer.into_inner().agent.unwrap().tenant, "team-a");
                break None;
            }
            Err(e) if started.elapsed() > Duration::from_secs(15) => break Some(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert_eq!(
        last, None,
        "a forwarded Spawn works with the rotated certificate"
    );
    leader.abort().await;
    standby.abort().await;
}

#[tokio::test]
async fn subagentd_worker_connects_with_its_client_certificate() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let extra = "\n[[auth.certs]]\nsan = \"spiffe://test/ns/agents/sa/worker\"\ntenant = \"team-a\"\nroles = [\"worker\"]\n\n[agents.script]\nrunner = \"worker\"\n";
    let toml = cert_principals("required", &files, &ca, extra);
    let s = TlsServer::start(files, &toml).await;
    let worker = ca.client(&["spiffe://test/ns/agents/sa/worker"]);
    let ca_file = s.files.write("ca.crt", &ca.pem);
    let cert_file = s.files.write("worker.crt", &worker.cert);
    let key_file = s.files.write("worker.key", &worker.key);
    let mut process = common::child::ChildWorker::start_unconnected_with_env(
        &s.handle.addr().to_string(),
        "[worker]\nname = \"w1\"\n\n[agents.script]\nrunner = \"simulated\"\n",
        &[
            ("SUBAGENTD_CA_FILE", &ca_file),
            ("SUBAGENTD_CERT_FILE", &cert_file),
            ("SUBAGENTD_KEY_FILE", &key_file),
        ],
    );
    process.connected().await;

    let frontend = ca.client(&["spiffe://test/ns/agents/sa/frontend"]);
    let mut c = connect(s.handle.addr(), &ca, Some(&frontend))
        .await
        .unwrap();
    let agent = c
        .spawn(pb::SpawnRequest {
            agent: "script".into(),
            ..bg("acme/gpt", "output served over mtls")
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    let done = c
        .r#await(pb::AwaitRequest {
            ids: vec![agent.id.clone()],
            timeout: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!done.timed_out);
    assert_eq!(
        done.agents[0].status,
        pb::AgentStatus::Done as i32,
        "{done:?}"
    );
    assert_eq!(done.agents[0].result, "served over mtls");
}

#[tokio::test]
async fn health_listen_serves_plaintext_health_and_nothing_else() {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let ca = Ca::new("test ca");
    let files = Files::new();
    let tls = files.server_tls(&ca.server(), None, "none");
    let toml =
        format!("{AGENTS}\n[server]\nhealth_listen = \"127.0.0.1:0\"\n\n[server.tls]\n{tls}");
    let s = TlsServer::start(files, &toml).await;
    let health = s.handle.health_addr().expect("health listener on");
    let channel = tonic::transport::Channel::from_shared(format!("http://{health}"))
        .unwrap()
        .connect()
        .await
        .expect("plaintext to the health port");
    let answer = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "subagents.v1.AgentService".into(),
        })
        .await
        .expect("health answers without TLS or credential")
        .into_inner();
    assert_eq!(answer.status, ServingStatus::Serving as i32);
    // Only health: the agent API is not on that port.
    let err = pb::agent_service_client::AgentServiceClient::new(channel)
        .status(status_request())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
}

/// `[http] tls = true`: `/mcp` over HTTPS with `[server.tls]`'s certificate,
/// its tools reaching the gRPC listener over TLS; plain HTTP gets nothing.
#[tokio::test]
async fn mcp_over_https_with_the_servers_certificate() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let tls = files.server_tls(&ca.server(), Some(&ca), "optional");
    let toml = format!("{AGENTS}\n[http]\ntls = true\n\n[server.tls]\n{tls}");
    let s = TlsServer::start(files, &toml).await;
    let addr = s.handle.http_addr().expect("/mcp");
    let url = format!("https://localhost:{}/mcp", addr.port());
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .resolve("localhost", addr)
        .build()
        .unwrap();
    // One JSON-RPC message; the answer to `id` (SSE or JSON), if any.
    let rpc = |session: Option<String>, body: serde_json::Value| {
        let mut request = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        async move {
            let response = request.send().await.expect("/mcp answers over TLS");
            assert!(response.status().is_success(), "{response:?}");
            let session = response
                .headers()
                .get("mcp-session-id")
                .map(|v| v.to_str().unwrap().to_owned());
            let text = response.text().await.unwrap();
            let answer = text
                .lines()
                .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v.get("id").is_some());
            (session, answer)
        }
    };
    let (session, init) = rpc(
        None,
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "tls-test", "version": "0"}}}),
    )
    .await;
    assert_eq!(init.unwrap()["result"]["serverInfo"]["name"], "subagentd");
    rpc(
        session.clone(),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (_, spawned) = rpc(
        session,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "agent_spawn", "arguments": {
                "prompt": "output over https", "agent": "simulated", "description": null,
                "model": "acme/m", "wait_seconds": 10, "timeout_minutes": null,
                "continue_from": null, "fork": null}}}),
    )
    .await;
    let result = &spawned.unwrap()["result"];
    assert_eq!(result["structuredContent"]["status"], "done", "{result}");
    assert_eq!(result["structuredContent"]["result"], "over https");

    let plain = reqwest::Client::new()
        .post(format!("http://{addr}/mcp"))
        .body("{}")
        .send()
        .await;
    assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true));
}

/// `/mcp` authenticates by client certificate as the gRPC listener does:
/// under `client_auth = "required"` a mapped certificate's principal
/// spawns into its tenant through the tools, without a bearer credential.
#[tokio::test]
async fn mcp_over_https_authenticates_by_client_certificate() {
    let ca = Ca::new("test ca");
    let files = Files::new();
    let toml = format!(
        "{}\n[http]\ntls = true\n",
        cert_principals("required", &files, &ca, "")
    );
    let s = TlsServer::start(files, &toml).await;
    let addr = s.handle.http_addr().expect("/mcp");
    let frontend = ca.client(&["spiffe://test/ns/agents/sa/frontend"]);
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .identity(
            reqwest::Identity::from_pem(format!("{}{}", frontend.cert, frontend.key).as_bytes())
                .unwrap(),
        )
        .resolve("localhost", addr)
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/mcp", addr.port());
    let rpc = |session: Option<String>, body: serde_json::Value| {
        let mut request = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        async move {
            let response = request.send().await.expect("/mcp answers");
            assert!(response.status().is_success(), "{response:?}");
            let session = response
                .headers()
                .get("mcp-session-id")
                .map(|v| v.to_str().unwrap().to_owned());
            let text = response.text().await.unwrap();
            let answer = text
                .lines()
                .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v.get("id").is_some());
            (session, answer)
        }
    };
    let (session, _) = rpc(
        None,
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "mtls-test", "version": "0"}}}),
    )
    .await;
    rpc(
        session.clone(),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (_, spawned) = rpc(
        session,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "agent_spawn", "arguments": {
                "prompt": "output by certificate", "agent": "simulated", "description": null,
                "model": "acme/m", "wait_seconds": 10, "timeout_minutes": null,
                "continue_from": null, "fork": null}}}),
    )
    .await;
    let result = &spawned.unwrap()["result"];
    assert_eq!(result["structuredContent"]["status"], "done", "{result}");
    let id = result["structuredContent"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The agent is the certificate principal's: its tenant, its lead.
    let mut c = connect(s.handle.addr(), &ca, Some(&frontend))
        .await
        .unwrap();
    let agent = c
        .status(pb::StatusRequest {
            ids: vec![id],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents
        .remove(0);
    assert_eq!(agent.tenant, "team-a");
    assert!(
        agent.lead_id.starts_with("cert:") || !agent.lead_id.is_empty(),
        "{}",
        agent.lead_id
    );
}
