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

use std::{fmt, future::Future};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::future::{try_join4, try_join_all};
use tokio::runtime::Runtime;
use tokio_postgres::{types::ToSql, IsolationLevel, Statement};
use uuid::Uuid;

use super::{
    connection::{config_of, corrupt, engine, redacted, ConnectOptions, OrEngine},
    schema::*,
};
use crate::scheduler::durable::LogPosition;
use crate::store::{rows, Batch, Contents, Store, StoreError, SCHEMA_VERSION};

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
    pub(super) lock: Option<tokio_postgres::Client>,
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
            tx.batch_execute(CREATE_LEASE).await.or_engine(w)?;
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

    pub(super) fn block_on<F: Future>(&self, future: F) -> F::Output {
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

fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::Engine(format!("{what} {value} does not fit a bigint column")))
}

fn from_i64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} is negative ({value})")))
}
