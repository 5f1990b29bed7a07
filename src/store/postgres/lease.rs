//! The leader lease of servers that share one PostgreSQL store.
//!
//! One row, `subagentd_lease`: who holds it, its epoch and when it
//! expires. Expiry is the database's clock, never a server's, so hosts
//! whose clocks disagree still agree on who holds the lease. Each take-over
//! raises the epoch, so an epoch names one leadership; a leader's commits
//! check theirs ([`super::engine::PostgresStore::fenced`]), and a
//! deposed leader's writes fail and change nothing.
//!
//! A holder's own deadline is local and conservative: the lease lasts
//! `ttl` from the moment the request that took or renewed it was *sent*,
//! which is no later than the database's `clock_timestamp()` when it ran.
//! A holder that stops acting by [`Lease::valid_until`] therefore stops
//! before any other server can take the lease.
//!
//! The client is async (it runs on the server's runtime, next to the
//! election timers), unlike the blocking [`super::Store`]: renewals must
//! never queue behind a commit.
//!
//! A release also notifies the channel `subagentd_lease`; every client
//! listens on it, so standbys learn of a released lease within a round
//! trip instead of at their next poll.

use std::{sync::Arc, time::Duration};

use futures_util::StreamExt;
use tokio::{sync::Notify, time::Instant};
use tokio_postgres::AsyncMessage;

use super::{
    connection::{config_of, redacted, ConnectOptions, OrEngine},
    schema::{CREATE_LEASE, DDL_LOCK, DDL_LOCK_KEY},
};
use crate::store::StoreError;

/// Takes the lease when nobody holds it or its holder let it expire. Two
/// servers racing both lock the one row; the second sees the first's fresh
/// expiry and takes nothing.
const ACQUIRE: &str = "INSERT INTO subagentd_lease AS l (id, holder, epoch, expires_at) \
     VALUES (1, $1, 1, clock_timestamp() + $2::bigint * interval '1 millisecond') \
     ON CONFLICT (id) DO UPDATE \
     SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at \
     WHERE l.expires_at <= clock_timestamp() \
     RETURNING epoch";

/// Extends a lease that is still this epoch's and not yet expired: once it
/// has expired another server may be taking it, so it is never revived.
const RENEW: &str = "UPDATE subagentd_lease \
     SET expires_at = clock_timestamp() + $2::bigint * interval '1 millisecond' \
     WHERE id = 1 AND epoch = $1 AND expires_at > clock_timestamp() \
     RETURNING epoch";

/// Ends a lease now, so that a standby can take it at once rather than at
/// its expiry. The epoch stays: the next holder's is larger.
const RELEASE: &str = "UPDATE subagentd_lease SET expires_at = clock_timestamp() \
     WHERE id = 1 AND epoch = $1 AND expires_at > clock_timestamp()";

/// Wakes the standbys (delivered when the release's transaction commits).
const NOTIFY: &str = "SELECT pg_notify('subagentd_lease', $1::bigint::text)";
const LISTEN: &str = "LISTEN subagentd_lease";

const CURRENT: &str = "SELECT holder, epoch, \
     GREATEST(EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000, 0)::float8 \
     FROM subagentd_lease WHERE id = 1";

/// A lease this server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The leadership's fencing token: larger than every epoch before it.
    pub epoch: u64,
    /// When this server must have stopped acting as leader unless it
    /// renewed the lease first (see the module docs).
    pub valid_until: Instant,
}

/// The lease as the database records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Who took it (a server's advertised address and instance id).
    pub holder: String,
    /// Its epoch.
    pub epoch: u64,
    /// How long until it expires by the database's clock (zero: expired or
    /// released, free to take).
    pub remaining: Duration,
}

/// A connection for lease calls, apart from the store's pool.
pub struct LeaseClient {
    client: tokio_postgres::Client,
    where_: String,
    /// Signalled on every notification of a release.
    released: Arc<Notify>,
}

impl std::fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClient")
            .field("where_", &self.where_)
            .finish_non_exhaustive()
    }
}

impl LeaseClient {
    /// Connects to the database at `url` (password and TLS as for the store)
    /// and creates the lease table if missing. Its connection task runs on
    /// the caller's runtime.
    pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Self, StoreError> {
        let where_ = redacted(url);
        let (config, tls) = config_of(url, options)?;
        let (mut client, mut connection) = config.connect(tls).await.or_engine(&where_)?;
        let released = Arc::new(Notify::new());
        let wake = released.clone();
        // Driving the connection by its messages (not as a plain future)
        // is what delivers notifications.
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(_) = message {
                    wake.notify_one();
                }
            }
        });
        let tx = client.transaction().await.or_engine(&where_)?;
        tx.execute(DDL_LOCK, &[&DDL_LOCK_KEY])
            .await
            .or_engine(&where_)?;
        tx.batch_execute(CREATE_LEASE).await.or_engine(&where_)?;
        tx.commit().await.or_engine(&where_)?;
        client.batch_execute(LISTEN).await.or_engine(&where_)?;
        Ok(Self {
            client,
            where_,
            released,
        })
    }

    /// Resolves at the next notification that some server released the
    /// lease.
    pub async fn released(&self) {
        self.released.notified().await;
    }

    /// True once the connection is gone; every call fails from then on.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Takes the lease for `holder` for `ttl` if it is free or expired;
    /// `None` while another holder's lease lasts.
    pub async fn try_acquire(
        &self,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let sent = Instant::now();
        let row = self
            .client
            .query_opt(ACQUIRE, &[&holder, &millis(ttl)])
            .await
            .or_engine(&self.where_)?;
        row.map(|row| {
            Ok(Lease {
                epoch: epoch_of(row.try_get(0).or_engine(&self.where_)?)?,
                valid_until: sent + ttl,
            })
        })
        .transpose()
    }

    /// Extends `lease` by `ttl` from now; `None` when it was lost (it
    /// expired, or another server holds a later epoch).
    pub async fn renew(&self, lease: Lease, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let sent = Instant::now();
        let epoch = signed(lease.epoch)?;
        let row = self
            .client
            .query_opt(RENEW, &[&epoch, &millis(ttl)])
            .await
            .or_engine(&self.where_)?;
        Ok(row.map(|_| Lease {
            epoch: lease.epoch,
            valid_until: sent + ttl,
        }))
    }

    /// Gives `lease` up now and wakes the standbys; nothing when it was
    /// already lost.
    pub async fn release(&self, lease: Lease) -> Result<(), StoreError> {
        let epoch = signed(lease.epoch)?;
        let released = self
            .client
            .execute(RELEASE, &[&epoch])
            .await
            .or_engine(&self.where_)?;
        if released > 0 {
            self.client
                .execute(NOTIFY, &[&epoch])
                .await
                .or_engine(&self.where_)?;
        }
        Ok(())
    }

    /// The lease as recorded, if anyone ever took it.
    pub async fn current(&self) -> Result<Option<LeaseRecord>, StoreError> {
        let row = self
            .client
            .query_opt(CURRENT, &[])
            .await
            .or_engine(&self.where_)?;
        row.map(|row| {
            let w = self.where_.as_str();
            let remaining: f64 = row.try_get(2).or_engine(w)?;
            Ok(LeaseRecord {
                holder: row.try_get(0).or_engine(w)?,
                epoch: epoch_of(row.try_get(1).or_engine(w)?)?,
                remaining: Duration::from_secs_f64(remaining.max(0.0) / 1000.0),
            })
        })
        .transpose()
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn signed(epoch: u64) -> Result<i64, StoreError> {
    i64::try_from(epoch)
        .map_err(|_| StoreError::Engine(format!("epoch {epoch} does not fit a bigint")))
}

fn epoch_of(epoch: i64) -> Result<u64, StoreError> {
    u64::try_from(epoch)
        .map_err(|_| StoreError::Corrupt(format!("lease epoch is negative ({epoch})")))
}
