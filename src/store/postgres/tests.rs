//! The PostgreSQL engine and lease against a live server
//! (`SUBAGENTD_TEST_POSTGRES`; skipped without one unless CI requires it).

use std::{io::Write, time::Duration};

use futures_util::future::try_join_all;
use uuid::Uuid;

use super::{
    connection::{config_of, connect, redacted, ConnectOptions, OrEngine, DEFAULT_CONNECT_TIMEOUT},
    engine::PostgresStore,
    schema::*,
};
use crate::{
    config::redact_url,
    scheduler::durable::{AgentState, ChangeSet},
    store::{
        memory::tests::conformance, rows, rows::tests::full_state, Batch, Store, StoreError,
        SCHEMA_VERSION,
    },
};

/// The server the tests create their databases in.
const SERVER_ENV: &str = "SUBAGENTD_TEST_POSTGRES";

/// A fresh database on the test server, dropped with this.
struct TestDb {
    server: String,
    name: String,
    url: String,
}

impl TestDb {
    /// None (after saying so) when no test server is configured.
    fn create() -> Option<Self> {
        let Ok(server) = std::env::var(SERVER_ENV) else {
            // CI sets this: there a missing server is a failure.
            assert!(
                std::env::var_os("SUBAGENTD_REQUIRE_POSTGRES").is_none(),
                "{SERVER_ENV} is not set but SUBAGENTD_REQUIRE_POSTGRES is"
            );
            eprintln!(
                "skipped: {SERVER_ENV} is not set (`eval \"$(.ci/postgres.sh start)\"` sets it)"
            );
            return None;
        };
        let name = format!("test_{}", Uuid::new_v4().simple());
        admin(&server, &format!("CREATE DATABASE {name}")).unwrap();
        let url = url_of(&server, None, &name);
        Some(Self { server, name, url })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = admin(&self.server, &sql) {
            eprintln!("could not drop the test database {}: {e}", self.name);
        }
    }
}

/// `server`'s URL with another password and database (its parameters,
/// such as `sslmode`, kept).
fn url_of(server: &str, password: Option<&str>, dbname: &str) -> String {
    let (scheme, rest) = server.split_once("://").unwrap();
    let query = rest.find('?').map_or("", |i| &rest[i..]);
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let (user, host) = authority.rsplit_once('@').unwrap();
    let user = user.split_once(':').map_or(user, |(user, _)| user);
    match password {
        Some(password) => format!("{scheme}://{user}:{password}@{host}/{dbname}{query}"),
        None => format!("{scheme}://{user}@{host}/{dbname}{query}"),
    }
}

/// Runs `sql` on its own connection to `url`.
fn admin(url: &str, sql: &str) -> Result<(), StoreError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = connect(url, &ConnectOptions::default()).await?;
        client.batch_execute(sql).await.or_engine(url)
    })
}

/// The schema version recorded in the database at `url`, read on a
/// connection of its own (opening a store would migrate first).
fn schema_version(url: &str) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = connect(url, &ConnectOptions::default()).await.unwrap();
        let row = client.query_one(GET_SCHEMA, &[&SCHEMA]).await.unwrap();
        u64::try_from(row.get::<_, i64>(0)).unwrap()
    })
}

fn open(url: &str) -> Result<PostgresStore, StoreError> {
    PostgresStore::open(url, &ConnectOptions::default(), 2)
}

#[test]
fn the_postgres_store_keeps_what_each_commit_wrote() {
    let Some(db) = TestDb::create() else { return };
    conformance(|| Box::new(open(&db.url).unwrap()));
}

#[test]
fn a_thousand_agents_commit_and_load_back_in_admission_order() {
    let Some(db) = TestDb::create() else { return };
    let states: Vec<_> = (1..=1000).rev().map(full_state).collect();
    let mut batch = Batch::default();
    batch.add(&ChangeSet {
        agents: states.clone(),
        ..Default::default()
    });
    open(&db.url).unwrap().commit(&batch).unwrap();
    let got = open(&db.url).unwrap().load().unwrap();
    let seqs: Vec<u64> = got
        .agents
        .iter()
        .map(|row| rows::agent_seq(row).unwrap())
        .collect();
    assert_eq!(seqs, (1..=1000).collect::<Vec<_>>());
}

#[test]
fn a_pooled_connection_the_server_closed_is_replaced_before_a_commit_uses_it() {
    let Some(db) = TestDb::create() else { return };
    let mut store = open(&db.url).unwrap();
    let (a, b) = (full_state(1), full_state(2));
    let commit = |store: &mut PostgresStore, state: &AgentState| {
        let mut batch = Batch::default();
        batch.add(&ChangeSet {
            agents: vec![state.clone()],
            ..Default::default()
        });
        store.commit(&batch)
    };
    commit(&mut store, &a).unwrap();
    let lock_pid: i32 = store
        .block_on(
            store
                .lock
                .as_ref()
                .unwrap()
                .query_one("SELECT pg_backend_pid()", &[]),
        )
        .unwrap()
        .get(0);
    // Every connection of the pool, as an idle timeout or a restarted
    // proxy would; waiting (up to 5 s) until each is gone.
    admin(
        &db.url,
        &format!(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), {lock_pid})"
        ),
    )
    .unwrap();
    commit(&mut store, &b).unwrap();
    let got = store.load().unwrap().decode().unwrap();
    assert_eq!(got.agents, vec![a, b]);
}

#[test]
fn a_second_open_of_the_same_database_fails_naming_it_until_the_first_is_dropped() {
    let Some(db) = TestDb::create() else { return };
    // `-A trust` ignores the password; it is there to be redacted.
    let url = url_of(
        &std::env::var(SERVER_ENV).unwrap(),
        Some("hunter2"),
        &db.name,
    );
    let first = open(&url).unwrap();
    assert!(
        !first.describe().contains("hunter2"),
        "{}",
        first.describe()
    );
    let err = open(&url).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::InUse { .. }), "{err:?}");
    assert!(msg.contains(&redact_url(&url)), "{msg}");
    assert!(msg.contains(":***@") && !msg.contains("hunter2"), "{msg}");
    drop(first);
    open(&url).unwrap();
}

#[test]
fn a_database_of_a_newer_schema_is_refused_naming_both_versions() {
    let Some(db) = TestDb::create() else { return };
    drop(open(&db.url).unwrap());
    let newer = SCHEMA_VERSION + 1;
    admin(
        &db.url,
        &format!("UPDATE subagentd_meta SET value = {newer} WHERE key = '{SCHEMA}'"),
    )
    .unwrap();
    let err = open(&db.url).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, StoreError::NewerSchema { found, supported, .. }
            if found == newer && supported == SCHEMA_VERSION),
        "{msg}"
    );
    assert!(msg.contains(&db.url), "{msg}");
    assert!(msg.contains(&format!("schema version {newer}")), "{msg}");
    assert!(
        msg.contains(&format!("this subagentd's {SCHEMA_VERSION}")),
        "{msg}"
    );
    // The refused open changed nothing.
    let err = open(&db.url).unwrap_err();
    assert!(matches!(err, StoreError::NewerSchema { .. }), "{err:?}");
}

#[test]
fn a_database_of_schema_version_1_is_migrated_and_keeps_its_rows() {
    let Some(db) = TestDb::create() else { return };
    crate::store::memory::tests::migrates_from_version_1(
        || Box::new(open(&db.url).unwrap()),
        |v| {
            admin(
                &db.url,
                &format!("UPDATE subagentd_meta SET value = {v} WHERE key = '{SCHEMA}'"),
            )
            .unwrap()
        },
        || schema_version(&db.url),
    );
}

#[test]
fn a_new_database_records_the_current_schema_version() {
    let Some(db) = TestDb::create() else { return };
    let _store = open(&db.url).unwrap();
    assert_eq!(schema_version(&db.url), u64::from(SCHEMA_VERSION));
}

fn password_file(path: &std::path::Path) -> ConnectOptions {
    ConnectOptions {
        password_file: Some(path.to_owned()),
        ..ConnectOptions::default()
    }
}

#[test]
fn the_password_file_overrides_the_url_without_its_trailing_newline() {
    let url = "postgres://subagentd:in-the-url@127.0.0.1:55432/db";
    for (content, password) in [
        (&b"s3cret\n"[..], &b"s3cret"[..]),
        (b"s3cret\r\n", b"s3cret"),
        (b"s3cret", b"s3cret"),
        (b"two\n\n", b"two\n"),
    ] {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(content).unwrap();
        let (config, _) = config_of(url, &password_file(file.path())).unwrap();
        assert_eq!(config.get_password(), Some(password));
    }
    let (config, _) = config_of(url, &ConnectOptions::default()).unwrap();
    assert_eq!(config.get_password(), Some(&b"in-the-url"[..]));
    assert_eq!(config.get_connect_timeout(), Some(&DEFAULT_CONNECT_TIMEOUT));
}

#[test]
fn a_missing_password_file_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent");
    let Err(err) = config_of("postgres://u@h/db", &password_file(&path)) else {
        panic!("read a missing file");
    };
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn a_bad_url_is_an_error_that_does_not_show_the_password() {
    for url in [
        "postgres://subagentd:hunter2@127.0.0.1:notaport/db",
        "postgres://subagentd:hun/ter2@127.0.0.1:notaport/db",
        "postgres://subagentd@127.0.0.1/db?password=hunter2&no_such_option=1",
        "host=127.0.0.1 password=hunter2 no_such_option=1",
    ] {
        let Err(err) = config_of(url, &ConnectOptions::default()) else {
            panic!("{url} parsed");
        };
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Engine(_)), "{err:?}");
        assert!(
            msg.contains("not a valid PostgreSQL connection URL"),
            "{msg}"
        );
        assert!(!msg.contains("hunter2") && !msg.contains("ter2"), "{msg}");
        assert!(
            msg.contains("port") || msg.contains("no_such_option"),
            "{msg}"
        );
    }
}

#[test]
fn a_url_is_shown_as_redact_url_shows_it_and_never_with_its_password() {
    for url in [
        "postgres://subagentd@127.0.0.1:55432/db",
        "postgres://subagentd:hunter2@127.0.0.1:55432/db",
        "postgresql://u:p@[::1]:5432/db",
    ] {
        assert_eq!(redacted(url), redact_url(url));
    }
    assert_eq!(
        redacted("postgres://u:hun/ter2@h:1/db"),
        "postgres://u:***@h:1/db"
    );
    assert_eq!(
        redacted("postgres://u@h/db?password=x"),
        "postgres://u@h/db?password=***"
    );
    assert_eq!(redacted("host=h password=x"), "host=h password=***");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn commit_one(store: &mut PostgresStore, state: &AgentState) -> Result<(), StoreError> {
    let mut batch = Batch::default();
    batch.add(&ChangeSet {
        agents: vec![state.clone()],
        ..Default::default()
    });
    store.commit(&batch)
}

#[test]
fn the_lease_goes_to_one_server_at_a_time_and_each_take_over_raises_its_epoch() {
    use crate::store::postgres::lease::LeaseClient;
    let Some(db) = TestDb::create() else { return };
    let rt = runtime();
    rt.block_on(async {
        let ttl = Duration::from_secs(30);
        let options = ConnectOptions::default();
        let clients: Vec<LeaseClient> =
            try_join_all((0..8).map(|_| LeaseClient::connect(&db.url, &options)))
                .await
                .unwrap();
        assert_eq!(clients[0].current().await.unwrap(), None);

        // Eight servers race for a free lease: exactly one gets it.
        let won = try_join_all(
            clients
                .iter()
                .enumerate()
                .map(|(i, c)| async move { c.try_acquire(&format!("server-{i}"), ttl).await }),
        )
        .await
        .unwrap();
        let winners: Vec<usize> = (0..8).filter(|i| won[*i].is_some()).collect();
        assert_eq!(winners.len(), 1, "{won:?}");
        let (w, first) = (winners[0], won[winners[0]].unwrap());
        let record = clients[0].current().await.unwrap().unwrap();
        assert_eq!(
            (record.holder.as_str(), record.epoch),
            (format!("server-{w}").as_str(), first.epoch)
        );
        assert!(
            record.remaining > Duration::ZERO && record.remaining <= ttl,
            "{record:?}"
        );

        // Its renewals hold; nobody else takes it meanwhile.
        let renewed = clients[w].renew(first, ttl).await.unwrap().unwrap();
        assert_eq!(renewed.epoch, first.epoch);
        assert!(renewed.valid_until >= first.valid_until);
        let other = (w + 1) % 8;
        assert_eq!(clients[other].try_acquire("late", ttl).await.unwrap(), None);

        // Released, it is free at once, and the next epoch is larger.
        clients[w].release(renewed).await.unwrap();
        assert_eq!(
            clients[0].current().await.unwrap().unwrap().remaining,
            Duration::ZERO
        );
        let second = clients[other]
            .try_acquire("next", ttl)
            .await
            .unwrap()
            .unwrap();
        assert!(second.epoch > first.epoch, "{second:?} after {first:?}");
        // The old holder cannot renew or release what it lost.
        assert_eq!(clients[w].renew(renewed, ttl).await.unwrap(), None);
        clients[w].release(renewed).await.unwrap();
        assert_eq!(
            clients[0].current().await.unwrap().unwrap().epoch,
            second.epoch
        );
        assert!(clients[0].current().await.unwrap().unwrap().remaining > Duration::ZERO);
    });
}

#[test]
fn an_unrenewed_lease_expires_by_the_database_clock_and_is_never_revived() {
    use crate::store::postgres::lease::LeaseClient;
    let Some(db) = TestDb::create() else { return };
    let rt = runtime();
    rt.block_on(async {
        let (a, b) = (
            LeaseClient::connect(&db.url, &ConnectOptions::default())
                .await
                .unwrap(),
            LeaseClient::connect(&db.url, &ConnectOptions::default())
                .await
                .unwrap(),
        );
        let ttl = Duration::from_millis(300);
        let started = tokio::time::Instant::now();
        let held = a.try_acquire("a", ttl).await.unwrap().unwrap();
        // Polls until the lease is free: b must not get it before it
        // expires, and must get it then.
        let taken = loop {
            if let Some(lease) = b.try_acquire("b", Duration::from_secs(30)).await.unwrap() {
                break lease;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "never expired");
            tokio::task::yield_now().await;
        };
        // Expiry is by the database's wall clock, measured here by the
        // local monotonic one: the two may run apart by a few parts per
        // thousand (NTP slewing), so allow 10 ms of that.
        assert!(
            started.elapsed() + Duration::from_millis(10) >= ttl,
            "taken after {:?}",
            started.elapsed()
        );
        // The holder's own deadline had passed before it could be taken.
        assert!(held.valid_until <= tokio::time::Instant::now());
        assert!(taken.epoch > held.epoch);
        assert_eq!(a.renew(held, ttl).await.unwrap(), None);
    });
}

#[test]
fn a_deposed_leaders_commit_fails_and_writes_nothing() {
    use crate::store::postgres::lease::LeaseClient;
    let Some(db) = TestDb::create() else { return };
    let rt = runtime();
    let ttl = Duration::from_secs(30);
    let (a, b) = rt.block_on(async {
        (
            LeaseClient::connect(&db.url, &ConnectOptions::default())
                .await
                .unwrap(),
            LeaseClient::connect(&db.url, &ConnectOptions::default())
                .await
                .unwrap(),
        )
    });
    let first = rt.block_on(a.try_acquire("a", ttl)).unwrap().unwrap();
    let mut store = open(&db.url).unwrap().fenced(first.epoch);
    let (one, two) = (full_state(1), full_state(2));
    commit_one(&mut store, &one).unwrap();

    rt.block_on(a.release(first)).unwrap();
    let second = rt.block_on(b.try_acquire("b", ttl)).unwrap().unwrap();
    let err = commit_one(&mut store, &two).unwrap_err();
    assert!(
        matches!(err, StoreError::Deposed { epoch, current, .. }
            if epoch == first.epoch && current == Some(second.epoch)),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&format!("epoch {}", first.epoch)), "{msg}");
    assert_eq!(
        store.load().unwrap().decode().unwrap().agents,
        vec![one.clone()]
    );
    drop(store);

    // The new leader's store writes.
    let mut store = open(&db.url).unwrap().fenced(second.epoch);
    commit_one(&mut store, &two).unwrap();
    assert_eq!(
        store.load().unwrap().decode().unwrap().agents,
        vec![one, two]
    );
}

#[test]
fn a_version_2_database_gains_the_lease_table() {
    let Some(db) = TestDb::create() else { return };
    drop(open(&db.url).unwrap());
    admin(
        &db.url,
        &format!(
            "DROP TABLE subagentd_lease; UPDATE subagentd_meta SET value = 2 WHERE key = '{SCHEMA}'"
        ),
    )
    .unwrap();
    assert!(admin(&db.url, "SELECT 1 FROM subagentd_lease").is_err());
    drop(open(&db.url).unwrap());
    assert_eq!(schema_version(&db.url), u64::from(SCHEMA_VERSION));
    admin(&db.url, "SELECT 1 FROM subagentd_lease").unwrap();
}

#[test]
fn a_version_3_database_gains_the_conversations_table() {
    let Some(db) = TestDb::create() else { return };
    drop(open(&db.url).unwrap());
    admin(
        &db.url,
        &format!(
            "DROP TABLE subagentd_conversations; \
             UPDATE subagentd_meta SET value = 3 WHERE key = '{SCHEMA}'"
        ),
    )
    .unwrap();
    assert!(admin(&db.url, "SELECT 1 FROM subagentd_conversations").is_err());
    let mut store = open(&db.url).unwrap();
    assert_eq!(schema_version(&db.url), 4);
    admin(&db.url, "SELECT 1 FROM subagentd_conversations").unwrap();
    assert!(store.load().unwrap().conversations.is_empty());
}

#[test]
fn the_lock_key_is_the_fnv1a_hash_of_subagentd() {
    // Pinned: servers of different versions must agree on it.
    assert_eq!(LOCK_KEY, 0x7a3c_805f_7f6d_c996);
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
}
