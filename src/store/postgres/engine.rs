//! The PostgreSQL store: five tables in a database of the operator's.
//!
//! The engine moves the same encoded rows as the embedded one:
//! `subagentd_agents` (id → row, plus its admission sequence so that a load
//! comes back in admission order), `subagentd_events` (sequence → row) and
//! `subagentd_meta` (the counters and the schema version),
//! `subagentd_conversations` (id → transcript row), and the leader
//! lease `subagentd_lease` ([`super::lease`]). A commit is one
//! transaction, a handful of pipelined statements whatever its size:
//! multi-row writes go through `UNNEST` of array parameters, so a batch of
//! a thousand agents is one statement, not a thousand round trips.
//!
//! One server per database: the store holds a session-level advisory lock
//! for its lifetime, on a connection of its own that the pool never
//! recycles. A second server finds it taken and refuses to start
//! ([`StoreError::InUse`]). If that connection is lost, so is the lock:
//! once the store sees it closed, it refuses to commit.

use std::{fmt, future::Future, str::FromStr, time::Duration};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::future::{try_join4, try_join_all};
use tokio::runtime::Runtime;
use tokio_postgres::{types::ToSql, IsolationLevel, Statement};
use uuid::Uuid;

pub use super::tls::ConnectOptions;
use super::tls::{split_url, Tls};
use crate::store::{rows, Batch, Contents, Store, StoreError, SCHEMA_VERSION};
use crate::{config::redact_url, scheduler::durable::LogPosition};

/// How long connecting to the server may take when the URL does not say
/// (`connect_timeout`): a server that is down fails the start, or the
/// commit that needed a new connection, instead of hanging for minutes.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The advisory lock that makes one server per database. Any fixed number
/// would do; this one is the FNV-1a hash of "subagentd", so it is unlikely
/// to be a number another application in the same database locks.
const LOCK_KEY: i64 = fnv1a(b"subagentd") as i64;

/// Serializes schema changes between servers starting at once:
/// `CREATE TABLE IF NOT EXISTS` is not safe against a concurrent create of
/// the same table (the loser fails with "already exists"), so every
/// transaction that creates or migrates tables first takes this
/// transaction-scoped lock (key: the FNV-1a hash of "subagentd-ddl").
pub(super) const DDL_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";
pub(super) const DDL_LOCK_KEY: i64 = fnv1a(b"subagentd-ddl") as i64;

const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

// The keys of `subagentd_meta`, as in the embedded store's `meta` table.
const SCHEMA: &str = "schema_version";
const LAST_SEQUENCE: &str = "last_sequence";
const EVICTED_THROUGH: &str = "evicted_through";
const NEXT_ADMISSION: &str = "next_admission";

const CREATE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS subagentd_agents (
        id uuid PRIMARY KEY,
        seq bigint NOT NULL,
        row bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS subagentd_events (
        seq bigint PRIMARY KEY,
        row bytea NOT NULL
    );
    CREATE TABLE IF NOT EXISTS subagentd_meta (
        key text PRIMARY KEY,
        value bigint NOT NULL
    );
    CREATE TABLE IF NOT EXISTS subagentd_conversations (
        id uuid PRIMARY KEY,
        row bytea NOT NULL
    );";

/// Migrations from each older schema version to the next: entry `i`
/// upgrades version `i + 1` to `i + 2`, as SQL run inside the transaction
/// that records the new version.
const MIGRATIONS: &[&str] = &[
    // 1 → 2: a field added to agent rows, which version 1 rows lack (see
    // SCHEMA_VERSION): nothing to rewrite.
    "",
    // 2 → 3: the leader lease, whose table `prepare` creates with the
    // others in every version.
    "",
    // 3 → 4: the conversations table, which `prepare` creates with the
    // others; older agent rows need no rewrite.
    "",
];
// One per version step, or a database of the missing step's version would
// be recorded as current without its migration.
const _: () = assert!(MIGRATIONS.len() == SCHEMA_VERSION as usize - 1);

const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1)";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
const GET_SCHEMA: &str = "SELECT value FROM subagentd_meta WHERE key = $1";
const PUT_META: &str = "INSERT INTO subagentd_meta (key, value) \
     SELECT * FROM UNNEST($1::text[], $2::bigint[]) \
     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value";

// A server or database configured with `synchronous_commit = off` would
// acknowledge a COMMIT before its WAL is flushed; the Store contract is
// that `Ok` means durable, so each commit asks for the flush.
const SYNCHRONOUS_COMMIT: &str = "SET LOCAL synchronous_commit TO on";
const UPSERT_AGENTS: &str = "INSERT INTO subagentd_agents (id, seq, row) \
     SELECT * FROM UNNEST($1::uuid[], $2::bigint[], $3::bytea[]) \
     ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, row = EXCLUDED.row";
const DELETE_AGENTS: &str = "DELETE FROM subagentd_agents WHERE id = ANY($1::uuid[])";
const INSERT_EVENTS: &str = "INSERT INTO subagentd_events (seq, row) \
     SELECT * FROM UNNEST($1::bigint[], $2::bytea[]) \
     ON CONFLICT (seq) DO UPDATE SET row = EXCLUDED.row";
// Bounded below by the previous commit's `evicted_through`: the rows at or
// under it are gone, but until vacuum their dead index entries are not,
// and an unbounded `seq <= $2` would walk all of them on every commit.
const EVICT_EVENTS: &str = "DELETE FROM subagentd_events WHERE seq > $1 AND seq <= $2";
const UPSERT_CONVERSATIONS: &str = "INSERT INTO subagentd_conversations (id, row) \
     SELECT * FROM UNNEST($1::uuid[], $2::bytea[]) \
     ON CONFLICT (id) DO UPDATE SET row = EXCLUDED.row";
const DELETE_CONVERSATIONS: &str = "DELETE FROM subagentd_conversations WHERE id = ANY($1::uuid[])";

/// The lease's epoch, locked against a take-over until this commit ends:
/// a standby's take-over waits for the commit, and a commit after the
/// take-over sees the new epoch.
const FENCE: &str = "SELECT epoch FROM subagentd_lease WHERE id = 1 FOR SHARE";

const LOAD_AGENTS: &str = "SELECT row FROM subagentd_agents ORDER BY seq";
const LOAD_EVENTS: &str = "SELECT seq, row FROM subagentd_events ORDER BY seq";
const LOAD_META: &str = "SELECT key, value FROM subagentd_meta";
const LOAD_CONVERSATIONS: &str = "SELECT row FROM subagentd_conversations";

/// An open PostgreSQL store; holds the database's advisory lock until
/// dropped.
///
/// The [`Store`] trait is blocking: its one caller is the store's writer
/// thread (and recovery before it starts), never an async task. The
/// client is async, so the store owns a small current-thread runtime and
/// blocks on it for each call; the connection tasks run on that runtime,
/// only while a call is in progress, which is also the only time they have
/// work. It keeps the database's I/O off the server's runtime, where a
/// blocking caller would stall other tasks, and needs no handle to it.
/// Every method blocks: call them from a plain thread, not from inside an
/// async context (where `block_on` panics).
pub struct PostgresStore {
    /// Present until dropped (see `Drop`).
    runtime: Option<Runtime>,
    pool: Pool,
    /// The connection holding the advisory lock, outside the pool (`None`
    /// for a leader's store: the lease excludes other servers instead).
    lock: Option<tokio_postgres::Client>,
    /// The URL, its password redacted.
    where_: String,
    /// `evicted_through` as of this store's last commit; `None` before its
    /// first (so that one deletes everything up to its own).
    evicted_through: Option<i64>,
    /// The epoch of the lease this server leads by; its commits write only
    /// while the database records that epoch. `None`: unfenced.
    fence: Option<u64>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("where_", &self.where_)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Opens the store in the database at `url` (`postgres://user@host:port/db`,
    /// or a libpq key=value string), creating its tables if missing,
    /// migrating an older schema and refusing a newer one.
    ///
    /// `options`: the password file, when set, holds the password (one
    /// trailing newline is trimmed; it overrides a password in `url`),
    /// and the TLS files (`sslmode` and the rest: [`super::postgres_tls`]).
    /// `pool_size` (at least one) is how many pooled connections loads and
    /// commits use, besides the one that holds the lock. Connecting gives up after
    /// [`DEFAULT_CONNECT_TIMEOUT`] unless the URL sets `connect_timeout`.
    ///
    /// Errors: [`StoreError::InUse`] when another server holds the
    /// database, [`StoreError::NewerSchema`], or [`StoreError::Engine`]
    /// (a bad URL, an unreadable password file, the server unreachable or
    /// refusing). No error contains the password.
    pub fn open(url: &str, options: &ConnectOptions, pool_size: u32) -> Result<Self, StoreError> {
        Self::open_with(url, options, pool_size, true)
    }

    /// Opens the store for the leader of lease `epoch`: as [`Self::open`]
    /// but without the advisory lock (a deposed leader, frozen with its
    /// connection open, would hold it forever) and [`Self::fenced`]: the
    /// lease is what keeps other servers out.
    pub fn open_leader(
        url: &str,
        options: &ConnectOptions,
        pool_size: u32,
        epoch: u64,
    ) -> Result<Self, StoreError> {
        Ok(Self::open_with(url, options, pool_size, false)?.fenced(epoch))
    }

    fn open_with(
        url: &str,
        options: &ConnectOptions,
        pool_size: u32,
        exclusive: bool,
    ) -> Result<Self, StoreError> {
        let where_ = redacted(url);
        let (config, tls) = config_of(url, options)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Engine(format!("cannot start the postgres client: {e}")))?;
        let lock = if !exclusive {
            None
        } else {
            Some(runtime.block_on(async {
                let (client, connection) = config.connect(tls.clone()).await.or_engine(&where_)?;
                tokio::spawn(connection);
                let row = client
                    .query_one(TRY_LOCK, &[&LOCK_KEY])
                    .await
                    .or_engine(&where_)?;
                match row.try_get::<_, bool>(0) {
                    Ok(true) => Ok(client),
                    Ok(false) => Err(StoreError::InUse {
                        where_: where_.clone(),
                    }),
                    Err(e) => Err(engine(&where_, e)),
                }
            })?)
        };
        let manager = Manager::from_config(
            config,
            tls,
            // A pooled connection the server or a proxy closed while idle
            // looks open until its task runs, and the connection tasks
            // only run while a call blocks on the runtime. An empty query
            // before each use (one round trip) finds such a connection
            // dead, and the pool opens a fresh one; otherwise the next
            // commit would fail, and a failed commit stops the store.
            ManagerConfig {
                recycling_method: RecyclingMethod::Verified,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(usize::try_from(pool_size.max(1)).unwrap_or(usize::MAX))
            .build()
            .or_engine(&where_)?;
        let store = Self {
            runtime: Some(runtime),
            pool,
            lock,
            where_,
            evicted_through: None,
            fence: None,
        };
        store.prepare()?;
        Ok(store)
    }

    /// Creates the tables and records the schema version of a new store;
    /// migrates an older one; refuses a newer one. One transaction.
    fn prepare(&self) -> Result<(), StoreError> {
        let w = self.where_.as_str();
        self.block_on(async {
            let mut client = self.pool.get().await.or_engine(w)?;
            let tx = client.transaction().await.or_engine(w)?;
            tx.execute(DDL_LOCK, &[&DDL_LOCK_KEY]).await.or_engine(w)?;
            tx.batch_execute(CREATE_TABLES).await.or_engine(w)?;
            tx.batch_execute(super::lease::CREATE).await.or_engine(w)?;
            let found = tx.query_opt(GET_SCHEMA, &[&SCHEMA]).await.or_engine(w)?;
            if let Some(row) = found {
                let found = row.try_get::<_, i64>(0).or_engine(w)?;
                let found = u32::try_from(found).unwrap_or(u32::MAX);
                if found > SCHEMA_VERSION {
                    return Err(StoreError::NewerSchema {
                        where_: self.where_.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                for migrate in MIGRATIONS.iter().skip((found.max(1) - 1) as usize) {
                    tx.batch_execute(migrate).await.or_engine(w)?;
                }
            }
            let (keys, values): (&[&str], &[i64]) = (&[SCHEMA], &[i64::from(SCHEMA_VERSION)]);
            tx.execute(PUT_META, &[&keys, &values]).await.or_engine(w)?;
            tx.commit().await.or_engine(w)
        })
    }

    /// Commits only while the lease the database records has `epoch`
    /// (the one this server took, see [`super::lease`]); after a take-over
    /// a commit rolls back and fails with [`StoreError::Deposed`].
    #[must_use]
    pub fn fenced(mut self, epoch: u64) -> Self {
        self.fence = Some(epoch);
        self
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime
            .as_ref()
            .expect("the runtime lives until the store is dropped")
            .block_on(future)
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Inside an async context, where blocking panics: closing the
            // connection releases the lock once the server notices.
            runtime.shutdown_background();
            return;
        }
        // Unlock explicitly rather than by closing the connection, so that
        // a successor opening the database right after (a restart, a test)
        // finds the lock free instead of racing the server's cleanup.
        if let Some(lock) = &self.lock {
            let _ = runtime.block_on(lock.execute(UNLOCK, &[&LOCK_KEY]));
        }
    }
}

impl Store for PostgresStore {
    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        if self
            .lock
            .as_ref()
            .is_some_and(tokio_postgres::Client::is_closed)
        {
            return Err(StoreError::Engine(format!(
                "postgres store {}: lost the connection that holds the database's lock, \
                 so another server may be using it: not committing",
                self.where_
            )));
        }
        let mut ids: Vec<Uuid> = Vec::with_capacity(batch.agents.len());
        let mut seqs: Vec<i64> = Vec::with_capacity(batch.agents.len());
        let mut agent_rows: Vec<&[u8]> = Vec::with_capacity(batch.agents.len());
        let mut removed: Vec<Uuid> = Vec::new();
        for (id, row) in &batch.agents {
            match row {
                Some(row) => {
                    ids.push(*id);
                    seqs.push(to_i64(rows::agent_seq(row)?, "an admission sequence")?);
                    agent_rows.push(row);
                }
                None => removed.push(*id),
            }
        }
        let mut conversation_ids: Vec<Uuid> = Vec::new();
        let mut conversation_rows: Vec<&[u8]> = Vec::new();
        let mut conversations_removed: Vec<Uuid> = Vec::new();
        for (id, row) in &batch.conversations {
            match row {
                Some(row) => {
                    conversation_ids.push(*id);
                    conversation_rows.push(row);
                }
                None => conversations_removed.push(*id),
            }
        }
        let event_seqs = batch
            .events
            .iter()
            .map(|(seq, _)| to_i64(*seq, "an event sequence"))
            .collect::<Result<Vec<_>, _>>()?;
        let event_rows: Vec<&[u8]> = batch.events.iter().map(|(_, row)| &row[..]).collect();
        let p = batch.position;
        let evicted_through = to_i64(p.evicted_through, "evicted_through")?;
        let evicted_before = self.evicted_through.unwrap_or(i64::MIN);
        let keys: &[&str] = &[LAST_SEQUENCE, EVICTED_THROUGH, NEXT_ADMISSION];
        let values: &[i64] = &[
            to_i64(p.last_sequence, "last_sequence")?,
            evicted_through,
            to_i64(p.next_admission, "next_admission")?,
        ];

        let w = self.where_.as_str();
        self.block_on(async {
            let mut client = self.pool.get().await.or_engine(w)?;
            let tx = client.transaction().await.or_engine(w)?;
            // Prepared once per pooled connection, then cached.
            let mut prepared = Vec::with_capacity(8);
            for sql in [
                SYNCHRONOUS_COMMIT,
                UPSERT_AGENTS,
                DELETE_AGENTS,
                INSERT_EVENTS,
                EVICT_EVENTS,
                PUT_META,
                UPSERT_CONVERSATIONS,
                DELETE_CONVERSATIONS,
            ] {
                prepared.push(tx.prepare_cached(sql).await.or_engine(w)?);
            }
            let params: [&[&(dyn ToSql + Sync)]; 8] = [
                &[],
                &[&ids, &seqs, &agent_rows],
                &[&removed],
                &[&event_seqs, &event_rows],
                &[&evicted_before, &evicted_through],
                &[&keys, &values],
                &[&conversation_ids, &conversation_rows],
                &[&conversations_removed],
            ];
            // In this order, as in the embedded store: events of this
            // batch up to `evicted_through` are deleted too. Pipelined:
            // all are sent before the first answer is awaited, and the
            // server runs them in order; if one fails, the rest fail and
            // dropping the transaction rolls it back.
            let fence = async {
                match self.fence {
                    Some(_) => tx.query_opt(FENCE, &[]).await.map(Some),
                    None => Ok(None),
                }
            };
            let (fence, _) = futures_util::future::try_join(
                fence,
                try_join_all(
                    prepared
                        .iter()
                        .zip(params)
                        .map(|(statement, params)| tx.execute(statement, params)),
                ),
            )
            .await
            .or_engine(w)?;
            if let (Some(epoch), Some(row)) = (self.fence, fence) {
                let current = row
                    .map(|row| row.try_get::<_, i64>(0).map_err(corrupt))
                    .transpose()?
                    .and_then(|e| u64::try_from(e).ok());
                if current != Some(epoch) {
                    // Dropping the transaction rolls every statement back.
                    return Err(StoreError::Deposed {
                        where_: self.where_.clone(),
                        epoch,
                        current,
                    });
                }
            }
            // Returns once the server has flushed the commit to its WAL. A
            // connection lost now leaves the outcome unknown: an Engine
            // error, never retried.
            tx.commit().await.or_engine(w)
        })?;
        self.evicted_through = Some(evicted_through);
        Ok(())
    }

    fn load(&mut self) -> Result<Contents, StoreError> {
        let w = self.where_.as_str();
        self.block_on(async {
            let mut client = self.pool.get().await.or_engine(w)?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .or_engine(w)?;
            let statements: [Statement; 4] = [
                tx.prepare_cached(LOAD_AGENTS).await.or_engine(w)?,
                tx.prepare_cached(LOAD_EVENTS).await.or_engine(w)?,
                tx.prepare_cached(LOAD_META).await.or_engine(w)?,
                tx.prepare_cached(LOAD_CONVERSATIONS).await.or_engine(w)?,
            ];
            let (agents, events, meta, conversations) = try_join4(
                tx.query(&statements[0], &[]),
                tx.query(&statements[1], &[]),
                tx.query(&statements[2], &[]),
                tx.query(&statements[3], &[]),
            )
            .await
            .or_engine(w)?;
            tx.commit().await.or_engine(w)?;

            let agents = agents
                .iter()
                .map(|row| row.try_get::<_, Vec<u8>>(0).map_err(corrupt))
                .collect::<Result<Vec<_>, _>>()?;
            let events = events
                .iter()
                .map(|row| {
                    let seq = row.try_get::<_, i64>(0).map_err(corrupt)?;
                    Ok((
                        from_i64(seq, "an event sequence")?,
                        row.try_get(1).map_err(corrupt)?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let mut position = LogPosition::default();
            for row in &meta {
                let key = row.try_get::<_, &str>(0).map_err(corrupt)?;
                let value = from_i64(row.try_get(1).map_err(corrupt)?, key)?;
                match key {
                    LAST_SEQUENCE => position.last_sequence = value,
                    EVICTED_THROUGH => position.evicted_through = value,
                    NEXT_ADMISSION => position.next_admission = value,
                    _ => {}
                }
            }
            let conversations = conversations
                .iter()
                .map(|row| row.try_get::<_, Vec<u8>>(0).map_err(corrupt))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Contents {
                agents,
                events,
                position,
                conversations,
            })
        })
    }

    fn describe(&self) -> String {
        format!("postgres store {}", self.where_)
    }
}

/// The client configuration of `url` and its TLS connector: the URL's
/// TLS parameters and `options`' files ([`super::postgres_tls`]), the
/// password from `options.password_file` (its one trailing newline
/// trimmed) if set, and the defaults subagentd adds:
/// [`DEFAULT_CONNECT_TIMEOUT`] and the application name `subagentd`,
/// unless the URL sets them.
pub(super) fn config_of(
    url: &str,
    options: &ConnectOptions,
) -> Result<(tokio_postgres::Config, Tls), StoreError> {
    let invalid = |e: &dyn std::fmt::Display| {
        StoreError::Engine(format!(
            "{} is not a valid PostgreSQL connection URL: {e}",
            redacted(url),
        ))
    };
    let (rest, tls) = split_url(url, options).map_err(|e| invalid(&e))?;
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| invalid(&chain(&e)))?;
    // Every sslmode was taken out above; one left over would be silently
    // replaced by ours (a TLS requirement lost): refuse instead.
    if config.get_ssl_mode() != tokio_postgres::config::SslMode::Prefer {
        return Err(invalid(&"an sslmode that could not be read"));
    }
    config.ssl_mode(tls.client_mode());
    let connector = tls.connector().map_err(|e| {
        StoreError::Engine(format!(
            "postgres store {}: sslmode={}: {e}",
            redacted(url),
            tls.mode
        ))
    })?;
    if let Some(path) = &options.password_file {
        let bytes = std::fs::read(path).map_err(|e| {
            StoreError::Engine(format!(
                "cannot read the password file {}: {e}",
                path.display()
            ))
        })?;
        let password = bytes
            .strip_suffix(b"\r\n")
            .or_else(|| bytes.strip_suffix(b"\n"))
            .unwrap_or(&bytes);
        config.password(password);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("subagentd");
    }
    Ok((config, connector))
}

/// A client of the database at `url` (as the store connects: TLS and
/// password per `options`), its connection driven by a task of the
/// caller's runtime. For tools and tests that need a plain connection.
pub async fn connect(
    url: &str,
    options: &ConnectOptions,
) -> Result<tokio_postgres::Client, StoreError> {
    let where_ = redacted(url);
    let (config, tls) = config_of(url, options)?;
    let (client, connection) = config.connect(tls).await.or_engine(&where_)?;
    tokio::spawn(connection);
    Ok(client)
}

/// `url` fit for a message (see [`redact_url`]: never its password).
pub(super) fn redacted(url: &str) -> String {
    redact_url(url)
}

fn engine(where_: &str, e: impl std::error::Error) -> StoreError {
    StoreError::Engine(format!("postgres store {where_}: {}", chain(&e)))
}

/// `.or_engine(where_)`: any error of the client or the pool as
/// [`StoreError::Engine`], naming the (redacted) URL.
pub(super) trait OrEngine<T> {
    fn or_engine(self, where_: &str) -> Result<T, StoreError>;
}

impl<T, E: std::error::Error> OrEngine<T> for Result<T, E> {
    fn or_engine(self, where_: &str) -> Result<T, StoreError> {
        self.map_err(|e| engine(where_, e))
    }
}

fn corrupt(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("postgres store: {}", chain(&e)))
}

/// `e` and its sources: tokio-postgres says only "db error" or "invalid
/// configuration" itself and keeps what the server or the parser said in
/// the source.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // The pool's error repeats its cause in its own message.
        if !text.ends_with(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::Engine(format!("{what} {value} does not fit a bigint column")))
}

fn from_i64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} is negative ({value})")))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::{
        scheduler::durable::{AgentState, ChangeSet},
        store::{memory::tests::conformance, rows::tests::full_state},
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
}
