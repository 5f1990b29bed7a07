//! PostgreSQL over TLS against a real server that speaks only TLS
//! (`.ci/postgres.sh start-tls`: a test CA, a certificate for `localhost`
//! only, plain text rejected, the role `certuser` logging in by client
//! certificate): each `sslmode` with libpq's meaning, the CA and client
//! certificate from the URL or from `[store]`, refusals that say why, and
//! the lease and the store over TLS in a real server.
//!
//! Skipped without SUBAGENTD_TEST_POSTGRES_TLS unless
//! SUBAGENTD_REQUIRE_POSTGRES is set (CI).

mod common;

use std::path::PathBuf;

use common::child::ChildServer;
use subagentd::{
    pb,
    store::postgres::{connect, ConnectOptions},
};

/// The TLS test server: its port and the folder with the test PKI.
struct TlsServer {
    port: u16,
    pki: PathBuf,
}

impl TlsServer {
    fn get() -> Option<Self> {
        let (Ok(url), Ok(pki)) = (
            std::env::var("SUBAGENTD_TEST_POSTGRES_TLS"),
            std::env::var("SUBAGENTD_TEST_POSTGRES_TLS_PKI"),
        ) else {
            assert!(
                std::env::var_os("SUBAGENTD_REQUIRE_POSTGRES").is_none(),
                "SUBAGENTD_TEST_POSTGRES_TLS(_PKI) is not set but SUBAGENTD_REQUIRE_POSTGRES is"
            );
            eprintln!(
                "skipped: `eval \"$(.ci/postgres.sh start-tls)\"` sets SUBAGENTD_TEST_POSTGRES_TLS"
            );
            return None;
        };
        let port = url
            .split_once("@localhost:")
            .and_then(|(_, rest)| rest.split_once('/'))
            .and_then(|(port, _)| port.parse().ok())
            .unwrap_or_else(|| panic!("no localhost port in {url}"));
        Some(Self {
            port,
            pki: pki.into(),
        })
    }

    fn file(&self, name: &str) -> String {
        self.pki.join(name).display().to_string()
    }

    /// A URL of the server by `host` (the certificate is for localhost),
    /// as `user`, with `params`.
    fn url(&self, host: &str, user: &str, params: &str) -> String {
        let addr = if host == "localhost" {
            // The server listens on IPv4 loopback only.
            "&hostaddr=127.0.0.1"
        } else {
            ""
        };
        format!(
            "postgres://{user}@{host}:{}/postgres?connect_timeout=5{addr}&{params}",
            self.port
        )
    }
}

/// Connects to `url` with `options` and answers (TLS in use, user), or
/// the error's text.
async fn session(url: &str, options: &ConnectOptions) -> Result<(bool, String), String> {
    let client = connect(url, options).await.map_err(|e| e.to_string())?;
    let row = client
        .query_one(
            "SELECT ssl, current_user::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok((row.get(0), row.get(1)))
}

async fn over_tls(url: &str, options: &ConnectOptions) -> String {
    let (ssl, user) = session(url, options)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    assert!(ssl, "{url}: connected without TLS");
    user
}

async fn refused(url: &str, options: &ConnectOptions) -> String {
    match session(url, options).await {
        Ok(answer) => panic!("{url} connected: {answer:?}"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn prefer_and_require_connect_over_tls_without_checking_the_certificate() {
    let Some(s) = TlsServer::get() else { return };
    let none = ConnectOptions::default();
    // The default is `prefer` (as libpq): TLS, since the server offers it.
    over_tls(
        &s.url("127.0.0.1", "subagentd", "application_name=t"),
        &none,
    )
    .await;
    // `require` checks nothing: a host name the certificate does not name.
    over_tls(&s.url("127.0.0.1", "subagentd", "sslmode=require"), &none).await;
    // A server that accepts only TLS refuses `disable`, and says so.
    let err = refused(&s.url("127.0.0.1", "subagentd", "sslmode=disable"), &none).await;
    assert!(err.contains("no encryption"), "{err}");
}

#[tokio::test]
async fn verify_full_checks_the_host_name_and_verify_ca_the_chain_only() {
    let Some(s) = TlsServer::get() else { return };
    let none = ConnectOptions::default();
    let ca = format!("sslrootcert={}", s.file("ca.crt"));
    over_tls(
        &s.url(
            "localhost",
            "subagentd",
            &format!("sslmode=verify-full&{ca}"),
        ),
        &none,
    )
    .await;
    let err = refused(
        &s.url(
            "127.0.0.1",
            "subagentd",
            &format!("sslmode=verify-full&{ca}"),
        ),
        &none,
    )
    .await;
    assert!(
        err.contains("certificate not valid for name \"127.0.0.1\"") && err.contains("localhost"),
        "says which name and which it is valid for: {err}"
    );
    // verify-ca, and require with a CA file (libpq's rule): the chain is
    // checked, the host name is not.
    for mode in ["verify-ca", "require"] {
        over_tls(
            &s.url("127.0.0.1", "subagentd", &format!("sslmode={mode}&{ca}")),
            &none,
        )
        .await;
        let other = format!("sslmode={mode}&sslrootcert={}", s.file("other-ca.crt"));
        let err = refused(&s.url("localhost", "subagentd", &other), &none).await;
        assert!(
            err.contains("UnknownIssuer"),
            "{mode}: says the chain is not trusted: {err}"
        );
    }
}

#[tokio::test]
async fn the_ca_and_the_client_certificate_come_from_the_store_keys_or_the_url() {
    let Some(s) = TlsServer::get() else { return };
    let keys = ConnectOptions {
        ca_file: Some(s.pki.join("ca.crt")),
        cert_file: Some(s.pki.join("client.crt")),
        key_file: Some(s.pki.join("client.key")),
        ..ConnectOptions::default()
    };
    // `certuser` logs in by certificate (`cert` in pg_hba.conf).
    let user = over_tls(
        &s.url("localhost", "certuser", "sslmode=verify-full"),
        &keys,
    )
    .await;
    assert_eq!(user, "certuser");
    let in_url = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        s.file("ca.crt"),
        s.file("client.crt"),
        s.file("client.key")
    );
    let user = over_tls(
        &s.url("localhost", "certuser", &in_url),
        &ConnectOptions::default(),
    )
    .await;
    assert_eq!(user, "certuser");
    // The URL's CA wins over the key's: the wrong one in the URL fails.
    let wrong = format!("sslmode=verify-full&sslrootcert={}", s.file("other-ca.crt"));
    let err = refused(&s.url("localhost", "certuser", &wrong), &keys).await;
    assert!(err.contains("UnknownIssuer"), "{err}");
    // Without a certificate `certuser` is refused by the server.
    let ca_only = ConnectOptions {
        ca_file: keys.ca_file.clone(),
        ..ConnectOptions::default()
    };
    let err = refused(
        &s.url("localhost", "certuser", "sslmode=verify-full"),
        &ca_only,
    )
    .await;
    assert!(err.contains("certificate"), "{err}");
}

#[tokio::test]
async fn a_server_leads_and_stores_over_tls_with_the_ca_from_its_config() {
    let Some(s) = TlsServer::get() else { return };
    let name = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let admin = connect(
        &s.url(
            "localhost",
            "subagentd",
            &format!("sslmode=verify-full&sslrootcert={}", s.file("ca.crt")),
        ),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = format!(
        "postgres://subagentd@localhost:{}/{name}?hostaddr=127.0.0.1&sslmode=verify-full",
        s.port
    );
    let toml = format!(
        "[store]\nbackend = \"postgres\"\nurl = \"{url}\"\ntls_ca_file = \"{}\"\n\n\
         [ha]\nlease_ttl = \"2s\"\n\n[server]\nshutdown_grace = \"0s\"\n\n\
         [agents.simulated]\nrunner = \"simulated\"\n",
        s.file("ca.crt")
    );
    let mut server = ChildServer::start_unready(&toml, &[]).await;
    server
        .log_line(|v| v["message"] == "leading: serving")
        .await;
    let mut client = server.client().await;
    let spawned = common::spawn(&mut client, common::bg("acme/m", "output over tls")).await;
    let done = common::await_all(&mut client, &[&spawned.id]).await;
    assert_eq!(common::status(&done[0]), pb::AgentStatus::Done);
    assert_eq!(done[0].result, "over tls");
    assert_eq!(server.stop().await.code(), Some(0));

    // The same server by a name its certificate lacks: it stays up,
    // NOT_SERVING, and logs why it cannot reach the lease.
    let wrong = toml.replace("@localhost:", "@127.0.0.1:");
    let mut server = ChildServer::start_unready(&wrong, &[]).await;
    let line = server
        .log_line(|v| v["message"] == "cannot reach the lease; retrying")
        .await;
    let error = line["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("certificate not valid for name \"127.0.0.1\""),
        "{line}"
    );
    assert_eq!(server.stop().await.code(), Some(0));
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .unwrap();
}
