//! A fresh database per test on the throwaway PostgreSQL server CI starts
//! (`.ci/postgres.sh`, which sets `SUBAGENTD_TEST_POSTGRES`).

use subagentd::store::postgres::{connect, ConnectOptions};

/// The server the tests create their databases in.
const SERVER_ENV: &str = "SUBAGENTD_TEST_POSTGRES";

/// A database created for one test; dropped with this value.
pub struct Database {
    server: String,
    /// Its name.
    pub name: String,
    /// Its URL (no password: the test server trusts loopback).
    pub url: String,
}

impl Database {
    /// None (after saying so) when no test server is configured; CI sets
    /// `SUBAGENTD_REQUIRE_POSTGRES`, and then that is a failure.
    pub async fn create() -> Option<Self> {
        let Ok(server) = std::env::var(SERVER_ENV) else {
            assert!(
                std::env::var_os("SUBAGENTD_REQUIRE_POSTGRES").is_none(),
                "{SERVER_ENV} is not set but SUBAGENTD_REQUIRE_POSTGRES is"
            );
            eprintln!(
                "skipped: {SERVER_ENV} is not set (`eval \"$(.ci/postgres.sh start)\"` sets it)"
            );
            return None;
        };
        let name = format!("test_{}", uuid::Uuid::new_v4().simple());
        admin(&server, &format!("CREATE DATABASE {name}")).await;
        // The same server and parameters (`sslmode`, `sslrootcert`, …),
        // another database.
        let (base, query) = server
            .split_once('?')
            .map_or((server.as_str(), String::new()), |(b, q)| {
                (b, format!("?{q}"))
            });
        let base = base.rsplit_once('/').map_or(base, |(base, _)| base);
        let url = format!("{base}/{name}{query}");
        Some(Self { server, name, url })
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let (server, sql) = (
            self.server.clone(),
            format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        // Drop may run inside a runtime: use a thread with its own.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(admin(&server, &sql));
        })
        .join();
    }
}

/// Runs `sql` on a connection made as the server makes its own (TLS too).
async fn admin(url: &str, sql: &str) {
    let client = connect(url, &ConnectOptions::default())
        .await
        .unwrap_or_else(|e| panic!("cannot reach the test PostgreSQL server at {url}: {e}"));
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}
